"""Telemetry: the provider from OTEL_* variables, and spans that follow a pod's trace."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from common_runtime_support import SpanFixture
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from accounting.model import TRACEPARENT_ANNOTATION, ContainerClass, Pod
from services.common import telemetry

# SDK 1.45 writes trace-flags 03 (sampled + random); the parser must not insist on 01.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT_03 = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-03"


def _pod(annotations: dict[str, str] | None = None) -> Pod:
    return Pod(uid="uid-1", namespace="team-a", name="trainer", containers=(),
               annotations=annotations or {})


@pytest.mark.parametrize(
    ("env", "want_none"),
    [
        ({"OTEL_SDK_DISABLED": "true"}, True),
        ({"OTEL_SDK_DISABLED": "TRUE"}, True),
        ({"OTEL_SDK_DISABLED": "false"}, False),
        ({}, False),
    ],
    ids=["disabled", "disabled in capitals", "explicitly enabled", "enabled by default"],
)
def test_sdk_disabled_gives_no_provider(env: dict[str, str], want_none: bool) -> None:
    provider = telemetry.tracer_provider_from_env("usage", env)
    assert (provider is None) == want_none
    telemetry.shutdown(provider)


@pytest.mark.parametrize(
    ("env", "want_name"),
    [
        ({}, "hami-accounting-usage"),
        ({"OTEL_SERVICE_NAME": "recorder-eu-1"}, "recorder-eu-1"),
    ],
    ids=["default name from the daemon", "OTEL_SERVICE_NAME wins"],
)
def test_service_name(env: dict[str, str], want_name: str) -> None:
    provider = telemetry.tracer_provider_from_env("usage", env)
    assert provider is not None
    assert provider.resource.attributes["service.name"] == want_name
    telemetry.shutdown(provider)


class _OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An in-process OTLP/gRPC receiver: keeps (service.name, span name) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = next(a.value.string_value for a in resource_spans.resource.attributes
                           if a.key == "service.name")
            for scope_spans in resource_spans.scope_spans:
                self.spans += [(service, span.name) for span in scope_spans.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.mark.parametrize(
    "variable",
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"],
    ids=["generic endpoint", "traces endpoint"],
)
def test_spans_are_exported_to_the_configured_otlp_endpoint(variable: str) -> None:
    sink = _OtlpSink()
    receiver = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    try:
        provider = telemetry.tracer_provider_from_env(
            "admission", {variable: f"http://127.0.0.1:{port}"})
        assert provider is not None
        with provider.get_tracer("test").start_as_current_span("admission.check_quota"):
            pass
        telemetry.shutdown(provider)  # flushes the batch synchronously
    finally:
        receiver.stop(0)
    assert sink.spans == [("hami-accounting-admission", "admission.check_quota")]


def test_pod_span_parents_on_the_traceparent_annotation(spans: SpanFixture) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    pod = _pod({TRACEPARENT_ANNOTATION: TRACEPARENT_03})
    with tracer.start_as_current_span("rpc"), \
            telemetry.pod_span(tracer, "usage.record", pod, attributes={"decision": "charge"}):
        pass
    span = next(s for s in exporter.get_finished_spans() if s.name == "usage.record")
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_SPAN_ID
    assert span.attributes == {
        "hami.accounting.pod.uid": "uid-1",
        "hami.accounting.pod.namespace": "team-a",
        "hami.accounting.pod.name": "trainer",
        "hami.accounting.decision": "charge",
    }
    # The RPC's own span is kept as a link, so the two traces lead to each other.
    rpc = next(s for s in exporter.get_finished_spans() if s.name == "rpc")
    assert [link.context.span_id for link in span.links] == [rpc.context.span_id]


def test_explicit_traceparent_wins_over_the_annotation(spans: SpanFixture) -> None:
    provider, exporter = spans
    other_trace = "0af7651916cd43dd8448eb211c80319c"
    pod = _pod({TRACEPARENT_ANNOTATION: TRACEPARENT_03})
    with telemetry.pod_span(provider.get_tracer("test"), "scheduler.filter", pod,
                            traceparent=f"00-{other_trace}-b7ad6b7169203331-01"):
        pass
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == other_trace


@pytest.mark.parametrize(
    "annotations",
    [{}, {TRACEPARENT_ANNOTATION: "not-a-traceparent"}, {TRACEPARENT_ANNOTATION: ""}],
    ids=["no annotation", "malformed annotation", "empty annotation"],
)
def test_pod_span_without_a_usable_annotation_nests_under_the_current_span(
    spans: SpanFixture, annotations: dict[str, str]
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("rpc") as rpc, \
            telemetry.pod_span(tracer, "usage.record", _pod(annotations)):
        pass
    span = next(s for s in exporter.get_finished_spans() if s.name == "usage.record")
    assert span.context.trace_id == rpc.get_span_context().trace_id
    assert span.parent is not None and span.parent.span_id == rpc.get_span_context().span_id
    assert span.links == ()


def test_attribute_values_are_made_exportable(spans: SpanFixture) -> None:
    provider, exporter = spans
    with telemetry.pod_span(provider.get_tracer("test"), "x", attributes={
        "container.class": ContainerClass.SIDECAR,
        "effective.memory_mib": 4096,
        "hami.accounting.reason": "fits",
        "nodes": ("n1", "n2"),
        "odd": {"a": 1},
    }):
        pass
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "hami.accounting.container.class": "sidecar",
        "hami.accounting.effective.memory_mib": 4096,
        "hami.accounting.reason": "fits",
        "hami.accounting.nodes": ("n1", "n2"),
        "hami.accounting.odd": "{'a': 1}",
    }


def test_current_traceparent_round_trips_into_pod_span(spans: SpanFixture) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    assert telemetry.current_traceparent() == ""
    with tracer.start_as_current_span("admission.check_quota") as admission:
        traceparent = telemetry.current_traceparent()
    assert traceparent.startswith(f"00-{admission.get_span_context().trace_id:032x}-")
    with telemetry.pod_span(tracer, "usage.release", _pod({TRACEPARENT_ANNOTATION: traceparent})):
        pass
    span = next(s for s in exporter.get_finished_spans() if s.name == "usage.release")
    assert span.parent is not None
    assert span.parent.span_id == admission.get_span_context().span_id


def test_no_op_tracer_when_tracing_is_disabled() -> None:
    tracer = telemetry.tracer_for(None, "test")
    with telemetry.pod_span(tracer, "x", _pod()) as span:
        assert not span.get_span_context().is_valid


def test_shutdown_flushes_batched_spans() -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    # A long delay: only the flush in shutdown() can deliver the span.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    with provider.get_tracer("test").start_as_current_span("last words"):
        pass
    telemetry.shutdown(provider)
    assert [s.name for s in exporter.get_finished_spans()] == ["last words"]
