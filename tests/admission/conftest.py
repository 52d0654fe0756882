"""Fixtures for the admission tests: a real usage recorder and admission daemons on 127.0.0.1:0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from admission_support import (
    Recorder,
    StartAdmission,
    StartRecorder,
    make_serving_certificate,
    post,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami.accounting.v1 import usage_pb2_grpc
from services.admission.__main__ import AdmissionDaemon
from services.admission.__main__ import start as start_admission
from services.admission.config import AdmissionConfig
from services.common.server import client_channel
from services.usage.__main__ import UsageRecorder
from services.usage.__main__ import start as start_usage
from services.usage.config import UsageConfig


@pytest.fixture(scope="session")
def start_recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartRecorder]:
    """Starts real usage recorders (journal in a temp dir, no metrics); stops them at the end."""
    started: list[UsageRecorder] = []

    def start(
        listen: str = "127.0.0.1:0", data_dir: Path | None = None, **policy: str
    ) -> UsageRecorder:
        """``policy``: the recorder's accounting policy settings, e.g. ``memory_factor="4"``."""
        directory = data_dir or tmp_path_factory.mktemp("usage")
        recorder = start_usage(UsageConfig.from_env({
            "HAMI_ACCOUNTING_LISTEN_ADDR": listen,
            "HAMI_ACCOUNTING_DATA_DIR": str(directory),
            "HAMI_ACCOUNTING_METRICS_ADDR": "off",
            **{f"HAMI_ACCOUNTING_{key.upper()}": value for key, value in policy.items()},
        }), max_workers=8)
        started.append(recorder)
        return recorder

    yield start
    for recorder in started:
        if not recorder.handle.stopped:
            recorder.stop(grace_s=0)


@pytest.fixture(scope="session")
def usage_recorder(start_recorder: StartRecorder) -> UsageRecorder:
    """One recorder shared by the session; every test uses namespaces of its own."""
    return start_recorder()


@pytest.fixture(scope="session")
def recorder(usage_recorder: UsageRecorder) -> Iterator[Recorder]:
    with client_channel(usage_recorder.target) as channel:
        yield Recorder(usage_recorder.target, usage_pb2_grpc.UsageRecorderStub(channel))


@pytest.fixture
def recorder_with_policy(start_recorder: StartRecorder) -> Iterator[Callable[..., Recorder]]:
    """Clients of fresh recorders, each under its own accounting policy (``memory_factor="4"``):
    the policy is the recorder's configuration, and every daemon reading it answers under it."""
    channels: list[grpc.Channel] = []

    def make(**policy: str) -> Recorder:
        usage = start_recorder(**policy)
        channel = client_channel(usage.target)
        channels.append(channel)
        return Recorder(usage.target, usage_pb2_grpc.UsageRecorderStub(channel))

    yield make
    for channel in channels:
        channel.close()


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def start_admission_daemon(
    usage_recorder: UsageRecorder,
) -> Iterator[StartAdmission]:
    """Starts admission daemons reading from the shared recorder unless told otherwise."""
    started: list[AdmissionDaemon] = []

    def start(*, tracer_provider: TracerProvider | None = None, **env: str) -> AdmissionDaemon:
        variables = {
            "HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0",
            "HAMI_ACCOUNTING_METRICS_ADDR": "off",
            "HAMI_ACCOUNTING_USAGE_ADDR": usage_recorder.target,
        }
        variables.update({f"HAMI_ACCOUNTING_{key.upper()}": value for key, value in env.items()})
        daemon = start_admission(AdmissionConfig.from_env(variables),
                                 tracer_provider=tracer_provider or TracerProvider(),
                                 max_workers=4)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop(grace_s=0)


@pytest.fixture
def admission(start_admission_daemon: StartAdmission) -> AdmissionDaemon:
    """An admission daemon with the defaults (the WatchUsage cache), reading the shared recorder
    (the default policy: memory factor 1)."""
    return start_admission_daemon()


@pytest.fixture
def admission_channel(admission: AdmissionDaemon) -> Iterator[grpc.Channel]:
    with client_channel(admission.target) as channel:
        yield channel


@pytest.fixture(scope="session")
def serving_certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_serving_certificate(tmp_path_factory.mktemp("webhook-tls"))


@pytest.fixture
def webhook(
    start_admission_daemon: StartAdmission, serving_certificate: tuple[Path, Path]
) -> AdmissionDaemon:
    cert, key = serving_certificate
    return start_admission_daemon(
        webhook_addr="127.0.0.1:0", webhook_cert_file=str(cert), webhook_key_file=str(key)
    )


@pytest.fixture
def send(webhook: AdmissionDaemon, serving_certificate: tuple[Path, Path]) -> Any:
    """POSTs a review (dict or bytes) to ``webhook``, verifying it against its certificate."""
    assert webhook.webhook is not None
    url = webhook.webhook.url

    def send_review(body: bytes | dict[str, Any], **options: Any) -> Any:
        return post(url, serving_certificate[0], body, **options)

    return send_review
