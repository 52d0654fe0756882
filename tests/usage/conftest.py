"""Fixtures of the usage recorder tests: a real recorder on 127.0.0.1:0 with a temporary data
directory, its stub, and the spans it finished."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami.accounting.v1 import usage_pb2_grpc
from services.common.config import CommonConfig
from services.usage.__main__ import UsageRecorder, start
from services.usage.config import UsageConfig

RPC_TIMEOUT_S = 10.0


@dataclass
class RunningRecorder:
    """A recorder started in this process, with a client."""

    app: UsageRecorder
    channel: grpc.Channel
    stub: usage_pb2_grpc.UsageRecorderStub
    spans: InMemorySpanExporter
    data_dir: Path

    def stop(self) -> None:
        self.channel.close()
        self.app.stop(grace_s=0)


StartRecorder = Callable[..., RunningRecorder]


def recorder_config(data_dir: Path, **overrides: object) -> UsageConfig:
    """A stand-alone config: 127.0.0.1:0, metrics off, journal in ``data_dir``."""
    common = CommonConfig(listen_addr="127.0.0.1:0", metrics_addr=None, tls=None, log_level="INFO")
    options: dict[str, object] = {"common": common, "data_dir": data_dir, "identity": "test"}
    options.update(overrides)
    return UsageConfig(**options)  # type: ignore[arg-type]


@pytest.fixture
def start_recorder(tmp_path: Path) -> Iterator[StartRecorder]:
    """Starts recorders (the same data directory by default, so a second start is a restart);
    stops whatever is still running after the test."""
    running: list[RunningRecorder] = []

    def starter(
        data_dir: Path | None = None, *, max_watch_events: int | None = None, **overrides: object
    ) -> RunningRecorder:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        directory = data_dir or tmp_path / "data"
        extra = {} if max_watch_events is None else {"max_watch_events": max_watch_events}
        app = start(
            recorder_config(directory, **overrides),
            tracer_provider=provider,
            max_workers=8,
            **extra,
        )  # type: ignore[arg-type]
        channel = grpc.insecure_channel(app.target)
        started = RunningRecorder(
            app, channel, usage_pb2_grpc.UsageRecorderStub(channel), exporter, directory
        )
        running.append(started)
        return started

    yield starter
    for started in running:
        if not started.app.handle.stopped:
            started.stop()


@pytest.fixture
def recorder(start_recorder: StartRecorder) -> RunningRecorder:
    """A fresh recorder with an empty journal."""
    return start_recorder()


@pytest.fixture
def stub(recorder: RunningRecorder) -> usage_pb2_grpc.UsageRecorderStub:
    """The client of ``recorder``."""
    return recorder.stub


def free_port() -> int:
    """A TCP port nobody listens on right now (for recorders run as subprocesses)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
