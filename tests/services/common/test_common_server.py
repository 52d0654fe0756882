"""build_server: health, reflection, binding, call telemetry, message limits, client channels."""

from __future__ import annotations

import grpc
import pytest
from common_runtime_support import USAGE_SERVICE, ServeFn, SpanFixture
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common import metrics
from services.common.server import ServerStartError, client_channel
from services.common.server.call_telemetry import CallTelemetry
from services.common.server.registration import WrappedGeneric

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.mark.parametrize("service", ["", USAGE_SERVICE], ids=["whole server", "usage service"])
def test_health_follows_set_serving(serve: ServeFn, service: str) -> None:
    handle = serve()
    assert handle.port > 0
    assert _health(handle.target, service) == SERVING
    handle.set_serving(False)
    assert _health(handle.target, service) == NOT_SERVING
    handle.set_serving(True)
    assert _health(handle.target, service) == SERVING


def test_server_started_not_serving_reports_it_until_ready(serve: ServeFn) -> None:
    handle = serve(serving=False)
    assert _health(handle.target, USAGE_SERVICE) == NOT_SERVING


def test_health_of_unknown_service_is_not_found(serve: ServeFn) -> None:
    handle = serve()
    with pytest.raises(grpc.RpcError) as caught:
        _health(handle.target, "hami.accounting.v1.Nope")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service_health_and_reflection(serve: ServeFn) -> None:
    handle = serve()
    with grpc.insecure_channel(handle.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in responses[0].list_services_response.service}
    assert names == {
        USAGE_SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


def test_binding_a_port_in_use_fails_with_a_clear_error(serve: ServeFn) -> None:
    first = serve()
    with pytest.raises(ServerStartError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        serve(listen_addr=f"127.0.0.1:{first.port}")


def test_malformed_listen_address_is_refused(serve: ServeFn) -> None:
    with pytest.raises(ServerStartError, match="host:port"):
        serve(listen_addr="no-port-here")


def test_stop_is_idempotent_and_reports_not_serving_first(serve: ServeFn) -> None:
    handle = serve()
    handle.stop(grace_s=0)
    handle.stop(grace_s=0)
    assert handle.stopped
    # After enter_graceful_shutdown the health servicer refuses to go back to SERVING.
    handle.set_serving(True)
    with grpc.insecure_channel(handle.target) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_message_limit_rejects_larger_requests(serve: ServeFn) -> None:
    handle = serve(max_message_bytes=1024)
    with client_channel(handle.target) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        assert stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5).found
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="x" * 4096), timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def _histogram_count(service: str, method: str, code: str) -> float:
    value = metrics.RPC_DURATION.labels(service=service, method=method, code=code)
    return sum(sample.value for sample in value.collect()[0].samples
               if sample.name.endswith("_count"))


def test_call_telemetry_counts_calls_by_method_and_code(serve: ServeFn) -> None:
    handle = serve(metrics_service="latency-test")
    method = f"/{USAGE_SERVICE}/GetPodUsage"
    before_ok = _histogram_count("latency-test", method, "OK")
    before_bad = _histogram_count("latency-test", method, "INVALID_ARGUMENT")
    with client_channel(handle.target) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5)
        stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5)
        with pytest.raises(grpc.RpcError):
            stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="invalid"), timeout=5)
    assert _histogram_count("latency-test", method, "OK") == before_ok + 2
    assert _histogram_count("latency-test", method, "INVALID_ARGUMENT") == before_bad + 1


class _CallDetails:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class _Context:
    """What the call telemetry reads of a servicer context, for a call that returned
    normally."""

    def code(self) -> None:
        return None

    def details(self) -> None:
        return None


class _Generic:
    """A generic handler that answers with whatever handler it holds now."""

    def __init__(self) -> None:
        self.handler: object = None

    def service(self, _details: object) -> object:
        return self.handler


def test_a_methods_observed_handler_is_built_once_and_again_for_another() -> None:
    telemetry = CallTelemetry("memo-test")
    inner = _Generic()
    generic = WrappedGeneric(inner, telemetry.observe)
    method = "/memo.Test/Call"
    first = grpc.unary_unary_rpc_method_handler(lambda request, context: ("first", request))
    second = grpc.unary_unary_rpc_method_handler(lambda request, context: ("second", request))
    before = _histogram_count("memo-test", method, "OK")

    inner.handler = first
    observed = generic.service(_CallDetails(method))  # type: ignore[arg-type]
    assert observed is not None and observed is not first
    # grpc asks for every call: the same handler gets the same wrapper back.
    assert generic.service(_CallDetails(method)) is observed  # type: ignore[arg-type]
    # Another handler for the method (a generic handler may make one per call) is wrapped anew.
    inner.handler = second
    replaced = generic.service(_CallDetails(method))  # type: ignore[arg-type]
    assert replaced is not None and replaced is not observed
    inner.handler = None
    assert generic.service(_CallDetails(method)) is None  # type: ignore[arg-type]

    assert observed.unary_unary(1, _Context()) == ("first", 1)
    assert observed.unary_unary(2, _Context()) == ("first", 2)
    assert replaced.unary_unary(3, _Context()) == ("second", 3)
    assert _histogram_count("memo-test", method, "OK") == before + 3


def test_metrics_service_label_defaults_to_the_daemon_name(serve: ServeFn) -> None:
    handle = serve()
    method = f"/{USAGE_SERVICE}/GetPodUsage"
    before = _histogram_count("usage", method, "OK")
    with client_channel(handle.target) as channel:
        usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5)
    assert _histogram_count("usage", method, "OK") == before + 1


def test_traced_client_and_server_share_one_trace(serve: ServeFn, spans: SpanFixture) -> None:
    provider, exporter = spans
    handle = serve(tracer_provider=provider)
    with client_channel(handle.target, tracer_provider=provider) as channel:
        usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5)
    finished = exporter.get_finished_spans()
    by_kind = {span.kind.name: span for span in finished}
    server_span, client_span = by_kind["SERVER"], by_kind["CLIENT"]
    assert server_span.name == f"/{USAGE_SERVICE}/GetPodUsage"
    assert server_span.context.trace_id == client_span.context.trace_id
    assert server_span.parent is not None
    assert server_span.parent.span_id == client_span.context.span_id


def test_server_without_tracer_provider_creates_no_spans(
    serve: ServeFn, spans: SpanFixture
) -> None:
    _provider, exporter = spans
    handle = serve(tracer_provider=None)
    with client_channel(handle.target) as channel:
        usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5)
    assert exporter.get_finished_spans() == ()


REMOTE_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
REMOTE_SPAN_ID = 0x00F067AA0BA902B7


@pytest.mark.parametrize(
    ("uid", "code"),
    [
        pytest.param("ok", grpc.StatusCode.OK, id="ok-is-unset-status"),
        pytest.param("invalid", grpc.StatusCode.INVALID_ARGUMENT, id="mapped-error"),
        pytest.param("own-abort", grpc.StatusCode.PERMISSION_DENIED, id="servicer-abort"),
    ],
)
def test_the_server_span_continues_the_callers_trace_and_carries_the_code(
    serve: ServeFn, spans: SpanFixture, uid: str, code: grpc.StatusCode
) -> None:
    provider, exporter = spans
    handle = serve(tracer_provider=provider)
    traceparent = f"00-{REMOTE_TRACE_ID:032x}-{REMOTE_SPAN_ID:016x}-01"
    with client_channel(handle.target) as channel:
        call = usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage
        request = usage_pb2.GetPodUsageRequest(pod_uid=uid)
        if code is grpc.StatusCode.OK:
            call(request, timeout=5, metadata=(("traceparent", traceparent),))
        else:
            with pytest.raises(grpc.RpcError):
                call(request, timeout=5, metadata=(("traceparent", traceparent),))

    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind.name) == (f"/{USAGE_SERVICE}/GetPodUsage", "SERVER")
    assert span.context.trace_id == REMOTE_TRACE_ID
    assert span.parent is not None and span.parent.span_id == REMOTE_SPAN_ID
    assert dict(span.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": USAGE_SERVICE,
        "rpc.method": "GetPodUsage",
        "rpc.grpc.status_code": code.value[0],
    }
    assert span.status.is_ok is (code is grpc.StatusCode.OK)
    assert not span.events  # an abort is an answer, not an exception


def test_a_fault_in_the_servicer_marks_the_server_span_as_an_error(
    serve: ServeFn, spans: SpanFixture
) -> None:
    provider, exporter = spans
    handle = serve(tracer_provider=provider)
    with client_channel(handle.target) as channel, pytest.raises(grpc.RpcError):
        usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid="bug"), timeout=5)

    (span,) = exporter.get_finished_spans()
    assert span.parent is None  # no context sent: the call starts its own trace
    assert not span.status.is_ok
    assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] != 0
