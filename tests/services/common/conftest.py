"""Fixtures for the shared runtime tests: TinyRecorder served by the real build_server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from common_runtime_support import USAGE_SERVICE, ServeFn, SpanFixture, TinyRecorder
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami.accounting.v1 import usage_pb2_grpc
from services.common import server as common_server


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """Starts TinyRecorder servers through the real build_server; stops them after the test."""
    handles: list[common_server.ServerHandle] = []

    def start(**overrides: object) -> common_server.ServerHandle:
        servicer = TinyRecorder()
        options: dict[str, object] = {
            "service_names": [USAGE_SERVICE],
            "register": lambda s: usage_pb2_grpc.add_UsageRecorderServicer_to_server(servicer, s),
            "listen_addr": "127.0.0.1:0",
            "max_workers": 4,
        }
        options.update(overrides)
        handle = common_server.build_server(**options)  # type: ignore[arg-type]
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop(grace_s=0)


@pytest.fixture
def spans() -> SpanFixture:
    """A tracer provider that keeps finished spans in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter
