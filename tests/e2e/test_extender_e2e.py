"""Beside HAMi as released, end to end (docs/extender.md): the AdmissionReview webhook admits a
pod, the scheduler daemon's kube-scheduler extender places it and annotates it, a stand-in for
HAMi's Bind binds it, the recorder's Kubernetes source picks it up, its init container finishes
and the usage shrinks, and it is all one trace.

The three daemons run as processes (tests/e2e/stack.py) against the fake API server of our
tests, in this process: the recorder lists and watches it, the extender patches pods on it. The
test plays the API server's admission step (it POSTs the AdmissionReview the API server would,
then creates the pod), kube-scheduler (it POSTs the ExtenderArgs kube-scheduler would), HAMi's
Bind (``hami.io/bind-phase: allocating``, ``hami.io/bind-time``, the Binding), HAMi's device
plugin (``bind-phase: success``) and the kubelet (the pod's status).
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube
from opentelemetry import trace

from hami.accounting.v1 import usage_pb2
from services.common.telemetry import pod_uid_trace
from tests.admission.admission_support import make_serving_certificate, review
from tests.e2e.stack import OtlpSink, ReceivedSpan, Stack, Stubs, clean_env, free_port, span_tree
from tests.scheduler.extender_support import extender_args, write_kubeconfig
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    running,
    terminated,
    waiting,
)

pytestmark = pytest.mark.timeout(120)

NODE = "e2e-node-1"
NAMESPACE = "e2e"
TIMEOUT_S = 20.0
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
POD_SPANS = {
    "admission.check_quota": "hami-accounting-admission",
    "extender.filter": "hami-accounting-scheduler",
    "scheduler.filter": "hami-accounting-scheduler",
    "usage.reserve": "hami-accounting-usage",
    "usage.shrink": "hami-accounting-usage",
}


def _wait(what: str, check: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _post(url: str, body: Mapping[str, Any], cafile: Path | None = None) -> dict[str, Any]:
    scheme, _, rest = url.partition("://")
    host_port, _, path = rest.partition("/")
    host, _, port = host_port.rpartition(":")
    connection = (
        http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT_S,
                                    context=ssl.create_default_context(cafile=str(cafile)))
        if scheme == "https"
        else http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    )
    try:
        connection.request("POST", "/" + path, body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
        assert response.status == 200, answer
        return answer
    finally:
        connection.close()


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add("Node", kube_node(NODE, [gpu_device("GPU-e2e-0", memory_mib=24576)]))
        yield server


def _stored_mib(stubs: Stubs, uid: str) -> int:
    stored = stubs.usage.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                     timeout=TIMEOUT_S)
    return sum(d.memory_mib for d in stored.stored) if stored.found else -1


def test_beside_hami_as_released(apiserver: FakeApiServer, tmp_path: Path) -> None:
    cert, key = make_serving_certificate(tmp_path)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    webhook_port, extender_port = free_port(), free_port()
    sink = OtlpSink()
    stack = Stack(
        tmp_path / "stack",
        clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
            OTEL_TRACES_SAMPLER="always_on",
            OTEL_BSP_SCHEDULE_DELAY="100",
            # Read by the daemon each belongs to: the recorder's Kubernetes source and the
            # extender's pod patches share the API server; the webhook is the admission's.
            HAMI_ACCOUNTING_KUBERNETES="kubeconfig",
            HAMI_ACCOUNTING_KUBECONFIG=str(kubeconfig),
            HAMI_ACCOUNTING_WEBHOOK_ADDR=f"127.0.0.1:{webhook_port}",
            HAMI_ACCOUNTING_WEBHOOK_CERT_FILE=str(cert),
            HAMI_ACCOUNTING_WEBHOOK_KEY_FILE=str(key),
            HAMI_ACCOUNTING_EXTENDER_ADDR=f"127.0.0.1:{extender_port}",
        ),
    )
    stack.start()
    try:
        stubs = Stubs.dial(stack)
        _wait("the recorder to read the node", lambda: bool(
            stubs.usage.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=[NODE]),
                                     timeout=TIMEOUT_S).nodes))
        uid = str(uuid.uuid4())
        pod = kube_pod(
            "trainer", uid=uid, namespace=NAMESPACE,
            init=[init_container("convert-weights", gpumem=20480)],
            apps=[app_container("server", gpumem=10240)],
        )

        # The API server: the validating webhook sees the pod with its uid, then stores it.
        admitted = _post(f"https://127.0.0.1:{webhook_port}/validate", review(pod), cert)
        assert admitted["response"]["allowed"] is True, admitted
        apiserver.add("Pod", pod)

        # kube-scheduler: the extender places the pod and annotates it before answering.
        placed = _post(f"http://127.0.0.1:{extender_port}/filter",
                       extender_args(pod, node_names=[NODE]))
        assert (placed["NodeNames"], placed["Error"]) == ([NODE], ""), placed
        annotations = apiserver.get("Pod", "trainer", NAMESPACE)["metadata"]["annotations"]
        assert annotations["hami.io/vgpu-node"] == NODE
        assert annotations["hami.io/vgpu-devices-to-allocate"] == (
            "GPU-e2e-0,NVIDIA,20480,0:;GPU-e2e-0,NVIDIA,10240,0:;"
        )
        assert _stored_mib(stubs, uid) == 20480  # the init peak, reserved

        # HAMi's Bind: the bind phase and time, then the Binding; its device plugin: success.
        apiserver.patch("Pod", "trainer", {"metadata": {"annotations": {
            BIND_PHASE: "allocating", BIND_TIME: str(int(time.time()))}}}, NAMESPACE)
        core = kube.CoreV1Api(apiserver.kube_client())
        core.create_namespaced_pod_binding(
            "trainer", NAMESPACE,
            kube.V1Binding(metadata=kube.V1ObjectMeta(name="trainer"),
                           target=kube.V1ObjectReference(kind="Node", name=NODE)),
            _preload_content=False,
        )
        assert apiserver.get("Pod", "trainer", NAMESPACE)["spec"]["nodeName"] == NODE
        apiserver.patch("Pod", "trainer", {
            "metadata": {"annotations": {BIND_PHASE: "success"}},
            "status": {"phase": "Pending",
                       "initContainerStatuses": [running("convert-weights")],
                       "containerStatuses": [waiting("server")]},
        }, NAMESPACE)
        _wait("the recorder to keep the init peak while the init container runs",
              lambda: _stored_mib(stubs, uid) == 20480)

        # The kubelet: the init container exited 0, the app runs; the recorder shrinks.
        apiserver.patch("Pod", "trainer", {"status": {
            "phase": "Running",
            "initContainerStatuses": [terminated("convert-weights")],
            "containerStatuses": [running("server")],
        }}, NAMESPACE)
        _wait("the usage to shrink to the app container's",
              lambda: _stored_mib(stubs, uid) == 10240)
    finally:
        if "stubs" in locals():
            stubs.close()
        codes = stack.stop()
    assert codes == {"scheduler": 0, "admission": 0, "usage": 0}, stack.logs()

    # The webhook could not annotate the pod: its check and the extender found the same trace
    # from the pod's uid, and the extender's patch carried it on to the recorder.
    trace_id = f"{trace.get_current_span(pod_uid_trace(uid)).get_span_context().trace_id:032x}"

    def pod_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if s.name in POD_SPANS
                and s.attributes.get("hami.accounting.pod.uid") == uid]

    _wait("every span of the pod", lambda: {s.name for s in pod_spans(sink.spans())}
          >= set(POD_SPANS), timeout_s=TIMEOUT_S)
    spans = pod_spans(sink.spans())
    sink.stop()
    tree = span_tree(spans, trace_id)
    assert {s.trace_id for s in spans} == {trace_id}, tree
    for span in spans:
        assert span.service == POD_SPANS[span.name], (span.name, span.service)
