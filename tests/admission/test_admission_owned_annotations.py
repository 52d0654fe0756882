"""Forged allocation annotations at the door: the AdmissionReview endpoint refuses a pod CREATE
carrying a scheduler-owned annotation, and an UPDATE changing one from a caller that is not a
HAMi component; CheckQuota answers the same CREATE with a "no". HAMi's cases as data
(tests/support/owned_annotation_cases.py), through the real daemons."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from admission_support import (
    Recorder,
    StartAdmission,
    checker,
    container,
    json_request,
    kube_pod,
    post,
    review,
    typed_request,
)

from accounting.kube import pod_json as kube_pod_parser
from accounting.vendors import ALL_VENDORS
from services.admission.config import AdmissionConfig
from services.common.config import ConfigError
from tests.support.owned_annotation_cases import (
    CREATE_CASES,
    SCHEDULER,
    TENANT,
    UPDATE_CASES,
    CreateCase,
    UpdateCase,
)


def _pod(namespace: str, annotations: dict[str, str], scheduler: str | None = None) -> Any:
    return kube_pod("p", namespace, apps=[container("main", 20000)], annotations=annotations,
                    scheduler_name=scheduler)


def _update(old: dict[str, Any], new: dict[str, Any], username: str) -> dict[str, Any]:
    body = review(new, operation="UPDATE", uid="update-1")
    body["request"]["oldObject"] = old
    body["request"]["userInfo"] = {"username": username, "groups": ["system:authenticated"]}
    return body


@pytest.mark.parametrize("case", CREATE_CASES, ids=lambda case: case.id)
def test_the_webhook_refuses_a_create_carrying_one(
    case: CreateCase, send: Any, recorder: Recorder
) -> None:
    namespace = "own-create"
    recorder.set_quota(namespace, mib=24576)

    response = send(review(_pod(namespace, case.annotations, case.scheduler_name))).body[
        "response"
    ]

    if case.refused_for is None:
        assert response["allowed"] is True
        assert response["auditAnnotations"]["reason"] == "QuotaFits"
        return
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "reason": "SchedulerOwnedAnnotation",
        "message": f"annotation {case.refused_for} is written by the scheduler and cannot be "
        "set when creating a pod",
    }


def test_the_webhook_refuses_it_also_for_a_pod_asking_no_gpu(send: Any) -> None:
    pod = kube_pod("plain", "own-plain", annotations={"hami.io/vgpu-devices-allocated": "x"})

    response = send(review(pod)).body["response"]

    assert response["allowed"] is False
    assert response["status"]["reason"] == "SchedulerOwnedAnnotation"


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda case: case.id)
def test_the_webhook_refuses_an_update_changing_one_unless_a_writer_sends_it(
    case: UpdateCase,
    start_admission_daemon: StartAdmission,
    serving_certificate: tuple[Path, Path],
    recorder: Recorder,
) -> None:
    cert, key = serving_certificate
    options = {"annotation_writers": ",".join(case.writers)} if case.writers else {}
    daemon = start_admission_daemon(
        webhook_addr="127.0.0.1:0", webhook_cert_file=str(cert), webhook_key_file=str(key),
        **options,
    )
    assert daemon.webhook is not None
    # Over quota on purpose: an UPDATE is never quota-checked, only guarded.
    recorder.set_quota("own-update", mib=0)
    old = _pod("own-update", case.old)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = dict(case.new)

    answer = post(daemon.webhook.url, cert, _update(old, new, case.username))

    response = answer.body["response"]
    if case.refused_for is None:
        assert response == {"uid": "update-1", "allowed": True}
        return
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "SchedulerOwnedAnnotation"
    assert case.refused_for in response["status"]["message"]
    assert "cannot be set by" in response["status"]["message"]


def test_an_update_without_the_old_object_is_judged_against_none(send: Any) -> None:
    pod = _pod("own-no-old", {"hami.io/vgpu-node": "node-a"})
    body = review(pod, operation="UPDATE")
    body["request"]["userInfo"] = {"username": TENANT}

    response = send(body).body["response"]

    assert response["allowed"] is False
    assert "hami.io/vgpu-node" in response["status"]["message"]


READABLE_CREATE_CASES = [case for case in CREATE_CASES if case.id != "a-value-that-does-not-parse"]
"""CheckQuota reads the pod before it answers: an unreadable forged value is INVALID_ARGUMENT
naming it (test_a_forged_value_check_quota_cannot_read_is_invalid_argument)."""


@pytest.mark.parametrize("encoding", ["kubernetes_pod_json", "typed"])
@pytest.mark.parametrize("case", READABLE_CREATE_CASES, ids=lambda case: case.id)
def test_check_quota_answers_the_same_create_with_a_no(
    case: CreateCase, encoding: str, admission_channel: grpc.Channel, recorder: Recorder
) -> None:
    namespace = "own-grpc"
    recorder.set_quota(namespace, mib=24576)
    pod = _pod(namespace, case.annotations, case.scheduler_name)
    if encoding == "typed":
        request = typed_request(kube_pod_parser.parse_pod(pod, ALL_VENDORS))
    else:
        request = json_request(pod)

    response = checker(admission_channel)(request)

    if case.refused_for is None:
        assert response.allowed and response.reason == "QuotaFits"
        return
    assert not response.allowed
    assert response.reason == "SchedulerOwnedAnnotation"
    assert response.message == (
        f"annotation {case.refused_for} is written by the scheduler and cannot be set when "
        "creating a pod"
    )


def test_a_forged_value_check_quota_cannot_read_is_invalid_argument(
    admission_channel: grpc.Channel,
) -> None:
    pod = _pod("own-bad", {"hami.io/vgpu-devices-allocated": "}{"})

    with pytest.raises(grpc.RpcError) as raised:
        checker(admission_channel)(json_request(pod))

    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "hami.io/vgpu-devices-allocated" in (raised.value.details() or "")


def test_the_writers_are_configured_with_one_variable() -> None:
    base = {"HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0"}
    assert SCHEDULER in AdmissionConfig.from_env(base).annotation_writers
    configured = AdmissionConfig.from_env(
        {**base, "HAMI_ACCOUNTING_ANNOTATION_WRITERS": " a:b , c,a:b ,"}
    )
    assert configured.annotation_writers == ("a:b", "c")
    with pytest.raises(ConfigError, match="HAMI_ACCOUNTING_ANNOTATION_WRITERS"):
        AdmissionConfig.from_env({**base, "HAMI_ACCOUNTING_ANNOTATION_WRITERS": "a b"})


def test_the_review_answer_is_json_with_the_version_received(send: Any) -> None:
    body = review(_pod("own-version", {"hami.io/bind-phase": "success"}), version="v1beta1")

    answer = send(body)

    assert answer.body["apiVersion"] == "admission.k8s.io/v1beta1"
    assert json.loads(json.dumps(answer.body))["response"]["uid"] == "review-1"
