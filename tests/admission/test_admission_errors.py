"""CheckQuota's failures: a recorder that cannot be reached is UNAVAILABLE naming its address
(never a silent allow); malformed pods are INVALID_ARGUMENT naming every bad field; a pod that
has no uid yet (as a mutating webhook sees it) is checked normally.
"""

from __future__ import annotations

import grpc
import pytest
from admission_support import (
    Recorder,
    StartAdmission,
    StartRecorder,
    checker,
    container,
    free_port,
    json_request,
    kube_pod,
    typed_request,
)
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from hami.accounting.v1 import admission_pb2, types_pb2
from services.admission.__main__ import AdmissionDaemon
from services.common.server import client_channel
from tests.builders import PodBuilder, req


def _call(target: str, request: admission_pb2.CheckQuotaRequest) -> grpc.RpcError:
    with client_channel(target) as channel, pytest.raises(grpc.RpcError) as caught:
        checker(channel)(request)
    return caught.value


def _violations(error: grpc.RpcError) -> dict[str, str]:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    return {v.field: v.description for v in bad.field_violations}
    return {}


def test_an_unreachable_recorder_is_unavailable_naming_its_address(
    start_admission_daemon: StartAdmission,
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    daemon = start_admission_daemon(usage_addr=dead)
    pod = PodBuilder("p", namespace="team-a").app("a", req(1, mib=100)).build()

    error = _call(daemon.target, typed_request(pod))

    assert error.code() is grpc.StatusCode.UNAVAILABLE
    details = error.details()
    assert "usage recorder" in details and dead in details, details


def test_a_recorder_that_stops_makes_checks_unavailable_not_allowed(
    start_recorder: StartRecorder, start_admission_daemon: StartAdmission
) -> None:
    recorder = start_recorder()
    daemon = start_admission_daemon(usage_addr=recorder.target)
    pod = PodBuilder("p", namespace="team-b").app("a", req(1, mib=100)).build()
    with client_channel(daemon.target) as channel:
        assert checker(channel)(typed_request(pod)).allowed
        recorder.stop(grace_s=0)

        with pytest.raises(grpc.RpcError) as caught:
            checker(channel)(typed_request(pod))

    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert recorder.target in caught.value.details()


def test_a_pod_without_a_gpu_request_needs_no_recorder(
    start_admission_daemon: StartAdmission,
) -> None:
    daemon = start_admission_daemon(usage_addr=f"127.0.0.1:{free_port()}")
    pod = PodBuilder("p", namespace="team-a").app("a").build()

    with client_channel(daemon.target) as channel:
        response = checker(channel)(typed_request(pod))

    assert response.allowed and response.reason == "NoGpuRequest"


def test_a_malformed_typed_pod_names_every_bad_field(admission: AdmissionDaemon) -> None:
    pod = types_pb2.Pod(
        uid="u1", namespace="",
        containers=[types_pb2.Container(name="a")],  # no class
    )

    error = _call(admission.target, admission_pb2.CheckQuotaRequest(pod=pod))

    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = error.details()
    assert "pod.containers[0].container_class" in details
    assert "pod.namespace" in details
    assert set(_violations(error)) >= {"pod.containers[0].container_class", "pod.namespace"}


def test_a_malformed_kubernetes_pod_names_the_field(admission: AdmissionDaemon) -> None:
    bad = kube_pod("p", "team-a", apps=[container("", "lots")])

    error = _call(admission.target, json_request(bad))

    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations = _violations(error)
    assert "kubernetes_pod_json.spec.containers[0].name" in violations
    assert 'kubernetes_pod_json.spec.containers[0].resources.limits["nvidia.com/gpumem"]' in (
        violations
    )


# Issue 15: each of these once read as 0 cores (passing the core quota) or as no GPU at all
# (NoGpuRequest, admitted). Now INVALID_ARGUMENT naming the field, the container and the reading.
_QUOTA_BYPASS_TEXTS = [
    ("nvidia.com/gpucores", "1e400", None),
    ("nvidia.com/gpucores", "1500m", "1500m reads as 1.5 percent, not a whole number"),
    ("nvidia.com/gpucores", "1.5", "1.5 reads as 1.5 percent, not a whole number"),
    ("nvidia.com/gpumem", "2Gi", "2Gi reads as 2147483648 MiB, more than any device"),
    ("nvidia.com/gpumem", "1e10", "1e10 reads as 10000000000 MiB, more than any device"),
    ("nvidia.com/gpumem", "9999999999999Gi",
     "9999999999999Gi reads as 9223372036854775807 MiB, more than any device"),
]


@pytest.mark.parametrize(("resource", "text", "reading"), _QUOTA_BYPASS_TEXTS)
def test_a_quantity_is_charged_as_asked_or_refused_with_its_reading(
    admission: AdmissionDaemon, recorder: Recorder, resource: str, text: str, reading: str | None
) -> None:
    recorder.set_quota("team-q", mib=1_000_000, cores=50)
    spec = container("server", 1000, cores=10)
    spec["resources"]["limits"][resource] = text
    pod = kube_pod("p", "team-q", apps=[spec])

    if reading is None:
        # Cores however large read as 100, as HAMi does: charged, so over a 50 % core quota.
        with client_channel(admission.target) as channel:
            response = checker(channel)(json_request(pod))
        assert (response.allowed, response.reason) == (False, "CoreQuotaExceeded")
        return
    error = _call(admission.target, json_request(pod))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    field = f'kubernetes_pod_json.spec.containers[0].resources.limits["{resource}"]'
    message = _violations(error)[field]
    assert message.startswith(f'container "server": {resource} ')
    assert reading in message


@pytest.mark.parametrize(
    ("request_message", "path"),
    [
        (admission_pb2.CheckQuotaRequest(), "pod_source"),
        (admission_pb2.CheckQuotaRequest(kubernetes_pod_json=b"{not json"), "kubernetes_pod_json"),
        (admission_pb2.CheckQuotaRequest(kubernetes_pod_json=b"[]"), "kubernetes_pod_json"),
    ],
    ids=["no-pod", "not-json", "not-an-object"],
)
def test_a_missing_or_undecodable_pod_is_invalid(
    admission: AdmissionDaemon, request_message: admission_pb2.CheckQuotaRequest, path: str
) -> None:
    error = _call(admission.target, request_message)

    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert path in _violations(error)


def test_a_pod_without_a_uid_yet_is_checked(admission: AdmissionDaemon) -> None:
    # A mutating webhook (HAMi's) sees the pod before the API server assigns its uid.
    pod = kube_pod("p", "team-a", uid="", apps=[container("a", 100)])
    typed = typed_request(PodBuilder("p", namespace="team-a", uid="x").app(
        "a", req(1, mib=100)).build())
    typed.pod.uid = ""

    with client_channel(admission.target) as channel:
        for request in (json_request(pod), typed):
            response = checker(channel)(request)
            assert response.allowed and response.reason == "QuotaFits"
