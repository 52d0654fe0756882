"""The AdmissionReview endpoint over HTTPS, with a throwaway certificate made by openssl, against
a real usage recorder: real review JSON in admission.k8s.io/v1 and v1beta1.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from admission_support import (
    Recorder,
    StartAdmission,
    container,
    free_port,
    kube_pod,
    make_serving_certificate,
    no_gpu,
    post,
    review,
    wait_until,
)

from services.admission.__main__ import AdmissionDaemon
from services.admission.webhook import MAX_BODY_BYTES, WebhookStartError

VERSIONS = ["v1", "v1beta1"]


def seed_case_1(namespace: str, **options: Any) -> dict[str, Any]:
    return kube_pod("llm", namespace, init=[container("convert-weights", 30720)],
                    apps=[container("server", 4096)], **options)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_within_quota_is_allowed_and_the_uid_and_version_are_echoed(
    version: str, send: Any, recorder: Recorder
) -> None:
    recorder.set_quota(f"wh-fits-{version}", mib=24576)
    pod = kube_pod("small", f"wh-fits-{version}", apps=[container("a", 4096)])

    answer = send(review(pod, version=version, uid="705ab4f5-6393-11e8-b7cc-42010a800002"))

    assert answer.status == 200
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.body["apiVersion"] == f"admission.k8s.io/{version}"
    assert answer.body["kind"] == "AdmissionReview"
    response = answer.body["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert "status" not in response and "patch" not in response
    assert response["auditAnnotations"]["reason"] == "QuotaFits"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_over_quota_is_denied_403_with_the_sentence(
    version: str, send: Any, recorder: Recorder
) -> None:
    namespace = f"wh-seed-{version}"
    recorder.set_quota(namespace, mib=24576)

    answer = send(review(seed_case_1(namespace), version=version, uid=f"uid-{version}"))

    assert answer.status == 200
    assert answer.body["apiVersion"] == f"admission.k8s.io/{version}"
    assert answer.body["kind"] == "AdmissionReview"
    response = answer.body["response"]
    assert response["uid"] == f"uid-{version}"
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 403
    assert status["reason"] == "MemoryQuotaExceeded"
    assert "30720" in status["message"] and "24576" in status["message"]
    assert namespace in status["message"]


def test_already_used_usage_counts(
    send: Any, recorder: Recorder, webhook: AdmissionDaemon
) -> None:
    recorder.set_quota("wh-used", mib=30000)
    recorder.use("wh-used", 20000)
    pod = kube_pod("p", "wh-used", init=[container("i", 20000)], apps=[container("a", 10000)])
    # An AdmissionReview carries no usage revision: wait until this daemon's usage copy has the
    # charge, as a later review would find it (under load the review raced the copy's event).
    wait_until(lambda: webhook.usage.namespace_items("wh-used")["nvidia.com/gpumem"].used
               == 20000, "the admission daemon's usage copy to hold the charge")

    response = send(review(pod)).body["response"]

    assert response["allowed"] is False
    assert "already used 20000" in response["status"]["message"]


def test_the_sidecar_ordering_decides_at_the_webhook_too(send: Any, recorder: Recorder) -> None:
    recorder.set_quota("wh-order", mib=21000)
    sidecar_first = kube_pod("p1", "wh-order", init=[container("proxy", 2048, sidecar=True),
                                                     container("warmup", 20480)],
                             apps=[container("main", 10240)])
    init_first = kube_pod("p2", "wh-order", init=[container("warmup", 20480),
                                                  container("proxy", 2048, sidecar=True)],
                          apps=[container("main", 10240)])

    assert send(review(sidecar_first)).body["response"]["allowed"] is False
    assert send(review(init_first)).body["response"]["allowed"] is True


def test_a_pod_naming_another_scheduler_is_still_checked(send: Any, recorder: Recorder) -> None:
    recorder.set_quota("wh-other-scheduler", mib=24576)
    pod = seed_case_1("wh-other-scheduler", scheduler_name="my-scheduler")

    assert send(review(pod)).body["response"]["allowed"] is False


def test_a_pod_as_the_mutating_stage_sees_it_uses_the_request_namespace(
    send: Any, recorder: Recorder
) -> None:
    recorder.set_quota("wh-no-uid", mib=24576)
    pod = seed_case_1("ignored", uid="")
    del pod["metadata"]["namespace"]

    response = send(review(pod, namespace="wh-no-uid")).body["response"]

    assert response["allowed"] is False
    assert "wh-no-uid" in response["status"]["message"]


@pytest.mark.parametrize(
    "options",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE"},
        {"kind": "Deployment"},
        {"sub_resource": "ephemeralcontainers"},
    ],
    ids=["update", "delete", "not-a-pod", "subresource"],
)
def test_other_requests_are_allowed_unchanged(
    options: dict[str, str], send: Any, recorder: Recorder
) -> None:
    recorder.set_quota("wh-other", mib=0)

    answer = send(review(seed_case_1("wh-other"), uid="other", **options))

    assert answer.status == 200
    assert answer.body["response"] == {"uid": "other", "allowed": True}


def test_a_pod_without_gpus_is_allowed(send: Any, recorder: Recorder) -> None:
    recorder.set_quota("wh-plain", mib=0)
    pod = kube_pod("plain", "wh-plain", apps=[no_gpu("web")])

    response = send(review(pod)).body["response"]

    assert response["allowed"] is True
    assert response["auditAnnotations"]["reason"] == "NoGpuRequest"


def test_a_malformed_pod_is_denied_400_naming_the_field(send: Any) -> None:
    pod = kube_pod("bad", "wh-bad", apps=[container("", 100), container("b", "lots")])  # type: ignore[arg-type]

    answer = send(review(pod, uid="bad-pod"))

    assert answer.status == 200
    response = answer.body["response"]
    assert response["uid"] == "bad-pod" and response["allowed"] is False
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    assert "request.object.spec.containers[0].name" in message
    assert 'request.object.spec.containers[1].resources.limits["nvidia.com/gpumem"]' in message


def test_a_quantity_that_cannot_be_charged_is_denied_with_its_reading(send: Any) -> None:
    # Issue 15: "2Gi" of gpumem once made the request vanish and the pod was allowed.
    spec = container("server", 1000)
    spec["resources"]["limits"]["nvidia.com/gpumem"] = "2Gi"
    pod = kube_pod("big", "wh-quantity", apps=[spec])

    answer = send(review(pod, uid="big-pod"))

    response = answer.body["response"]
    assert (response["allowed"], response["status"]["code"]) == (False, 400)
    assert response["status"]["message"] == (
        'invalid pod: request.object.spec.containers[0].resources.limits["nvidia.com/gpumem"]: '
        'container "server": nvidia.com/gpumem is in MiB: 2Gi reads as 2147483648 MiB, more '
        "than any device (at most 2147483647)"
    )


def test_a_review_without_a_pod_object_is_denied_400(send: Any) -> None:
    answer = send(review(None, uid="no-object"))

    response = answer.body["response"]
    assert (response["uid"], response["allowed"], response["status"]["code"]) == (
        "no-object", False, 400,
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (json.dumps({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview",
                     "request": {"uid": "x"}}).encode(), "apiVersion"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Review",
                     "request": {"uid": "x"}}).encode(), "kind"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
         "request"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "request": {"operation": "CREATE"}}).encode(), "request.uid"),
        # The six characters \ud800: text no UTF-8 can carry, named where it was found.
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "request": {"uid": "x", "object": {"metadata": {"name": "p\ud800"}}}}
                    ).encode(), "body.request.object.metadata.name: must be text UTF-8"),
    ],
    ids=["not-json", "not-object", "wrong-version", "wrong-kind", "no-request", "no-uid",
         "lone-surrogate"],
)
def test_a_malformed_review_is_http_400_with_a_json_error(
    body: bytes, fragment: str, send: Any
) -> None:
    answer = send(body)

    assert answer.status == 400
    assert fragment in answer.body["error"]


def test_a_body_over_one_mib_is_refused(send: Any) -> None:
    pod = kube_pod("huge", "wh-huge", apps=[container("a", 1)])
    pod["metadata"]["annotations"] = {"filler": "x" * MAX_BODY_BYTES}

    answer = send(review(pod))

    assert answer.status == 413
    assert "exceeds" in answer.body["error"]


def test_other_paths_and_methods(send: Any) -> None:
    assert send(b"{}", path="/mutate").status == 404
    assert send(b"", method="GET").status == 405
    assert send(b"", method="GET", path="/healthz").status == 200


def test_an_unreachable_recorder_denies_503(
    start_admission_daemon: StartAdmission, serving_certificate: tuple[Path, Path]
) -> None:
    cert, key = serving_certificate
    dead = f"127.0.0.1:{free_port()}"
    daemon = start_admission_daemon(
        usage_addr=dead, webhook_addr="127.0.0.1:0",
        webhook_cert_file=str(cert), webhook_key_file=str(key),
    )
    assert daemon.webhook is not None

    answer = post(daemon.webhook.url, cert, review(seed_case_1("wh-down"), uid="down"))

    response = answer.body["response"]
    assert (response["uid"], response["allowed"]) == ("down", False)
    assert response["status"]["code"] == 503
    assert dead in response["status"]["message"]


def test_several_reviews_share_one_connection(
    webhook: AdmissionDaemon, serving_certificate: tuple[Path, Path], recorder: Recorder
) -> None:
    assert webhook.webhook is not None
    recorder.set_quota("wh-keepalive", mib=24576)
    context = ssl.create_default_context(cafile=str(serving_certificate[0]))
    connection = http.client.HTTPSConnection("127.0.0.1", webhook.webhook.port, context=context,
                                             timeout=10)
    try:
        for index in range(3):
            body = json.dumps(review(seed_case_1("wh-keepalive"), uid=f"k{index}")).encode()
            connection.request("POST", "/validate", body=body,
                               headers={"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())
            assert answer["response"]["uid"] == f"k{index}"
    finally:
        connection.close()


def test_a_rotated_certificate_is_picked_up_without_a_restart(
    start_admission_daemon: StartAdmission, serving_certificate: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(serving_certificate[0], cert)
    shutil.copy(serving_certificate[1], key)
    daemon = start_admission_daemon(webhook_addr="127.0.0.1:0", webhook_cert_file=str(cert),
                                    webhook_key_file=str(key))
    assert daemon.webhook is not None
    url = daemon.webhook.url
    assert post(url, serving_certificate[0], b"", method="GET", path="/healthz").status == 200

    (tmp_path / "new").mkdir()
    new_cert, new_key = make_serving_certificate(tmp_path / "new")
    time.sleep(0.01)  # a distinct mtime even on coarse clocks
    shutil.copy(new_key, key)
    shutil.copy(new_cert, cert)

    def new_certificate_served() -> bool:
        try:
            return post(url, new_cert, b"", method="GET", path="/healthz").status == 200
        except ssl.SSLError:
            return False

    wait_until(new_certificate_served, "the rotated certificate to be served")


def test_the_webhook_is_disabled_without_a_certificate(admission: AdmissionDaemon) -> None:
    assert admission.webhook is None


def test_a_webhook_key_of_another_certificate_says_so(
    start_admission_daemon: StartAdmission, serving_certificate: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    cert, _ = serving_certificate
    _, other_key = make_serving_certificate(tmp_path)
    with pytest.raises(WebhookStartError) as raised:
        start_admission_daemon(webhook_addr="127.0.0.1:0", webhook_cert_file=str(cert),
                               webhook_key_file=str(other_key))
    assert str(raised.value) == (
        f"webhook certificate: the private key {other_key} does not belong to the certificate "
        f"{cert}"
    )
