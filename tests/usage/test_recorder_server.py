"""The recorder's grpc.aio server keeps the daemon shape of every other daemon's server
(services/common/server/event_loop.py): health, reflection, the decode guard, the latency metric and
status codes of each call, whether the call runs on the event loop or on the pool."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from hami.accounting.v1 import usage_pb2
from services.usage.servicer import INLINE_METHODS
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder

SERVICE = "hami.accounting.v1.UsageRecorder"


def test_reflection_lists_the_recorder_health_and_reflection(recorder: RunningRecorder) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(recorder.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=RPC_TIMEOUT_S))
    names = {service.name for service in answer.list_services_response.service}
    assert names == {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


@pytest.mark.parametrize("service", ["", SERVICE, "liveness"])
def test_health_is_serving(recorder: RunningRecorder, service: str) -> None:
    reply = health_pb2_grpc.HealthStub(recorder.channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("hami_accounting_rpc_duration_seconds_count", {
        "service": "usage", "method": method, "code": code}) or 0.0


def _counted(method: str, code: str, want: float) -> float:
    """The count once it reaches ``want`` (a call on the pool records it just after its status
    went out), or what it is after two seconds."""
    deadline = time.monotonic() + 2.0
    while _count(method, code) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    return _count(method, code)


@pytest.mark.parametrize(
    ("method", "where"),
    [
        pytest.param("RecordPod", "loop", id="a-call-on-the-event-loop"),
        pytest.param("GetNodeUsage", "pool", id="a-call-on-the-pool"),
    ],
)
def test_undecodable_bytes_are_invalid_argument_and_counted(
    recorder: RunningRecorder, method: str, where: str
) -> None:
    full = f"/{SERVICE}/{method}"
    assert (full in INLINE_METHODS) is (where == "loop")
    before = _count(full, "INVALID_ARGUMENT")
    call = recorder.channel.unary_unary(full, request_serializer=None,
                                        response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\xff\xff\xff", timeout=RPC_TIMEOUT_S)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "do not decode as its request message" in (caught.value.details() or "")
    assert _counted(full, "INVALID_ARGUMENT", before + 1) == before + 1


def test_a_bad_request_on_the_event_loop_is_invalid_argument_naming_the_field(
    recorder: RunningRecorder,
) -> None:
    before = _count(f"/{SERVICE}/ForgetPod", "INVALID_ARGUMENT")
    with pytest.raises(grpc.RpcError) as caught:
        recorder.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=""), timeout=RPC_TIMEOUT_S)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "pod_uid" in (caught.value.details() or "")
    assert _counted(f"/{SERVICE}/ForgetPod", "INVALID_ARGUMENT", before + 1) == before + 1
    # The server goes on answering.
    assert not recorder.stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="x"),
                                         timeout=RPC_TIMEOUT_S).found
