"""A drain of the leader's node: the eviction is allowed, the Lease is handed over, and the
recorder's Service follows the new leader, with the PodDisruptionBudget, the Service and the
StatefulSet of deploy/base as they ship.

Two recorders run in this process against the fake API server (its Lease, its pods, its
eviction subresource and the budget's arithmetic), each as the pod of the StatefulSet it
would be. The test plays the kubelet and the StatefulSet controller: it writes each pod's
``Ready`` condition from the health service its readiness probe asks, stops a recorder whose
pod is being deleted, deletes the pod, and creates it again with its journal. The Service's
endpoints are the ready pods its selector matches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client

from hami.accounting.v1 import usage_pb2
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import allocation, app_container, gpu_device, kube_node, kube_pod
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder
from tests.usage.test_store_k8s import write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
NAMESPACE = "hami-system"
NODE, GPU = "gpu-node-1", "GPU-drain-0"


def _manifest(kind: str) -> dict[str, Any]:
    for document in yaml.safe_load_all((REPO / "deploy/base/usage.yaml").read_text()):
        if document and document["kind"] == kind:
            return dict(document)
    raise AssertionError(f"no {kind} in deploy/base/usage.yaml")


STATEFULSET = _manifest("StatefulSet")
SERVICE = _manifest("Service")
BUDGET = _manifest("PodDisruptionBudget")
PROBE = STATEFULSET["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]
POD_NAMES = [f"{STATEFULSET['metadata']['name']}-{i}"
             for i in range(STATEFULSET["spec"]["replicas"])]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    assert condition(), f"timed out waiting for {what}"


def health(recorder: RunningRecorder, service: str) -> bool:
    stub = health_pb2_grpc.HealthStub(recorder.channel)
    try:
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    except grpc.RpcError:
        return False
    return answer.status == health_pb2.HealthCheckResponse.SERVING


class Cluster:
    """The kubelet and the StatefulSet controller of the recorder's pods."""

    def __init__(self, api: FakeApiServer, start: Callable[[str], RunningRecorder]) -> None:
        self.api = api
        self._start = start
        self.recorders: dict[str, RunningRecorder] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._kubelet, daemon=True)

    def create_pod(self, name: str) -> None:
        template = STATEFULSET["spec"]["template"]
        self.api.add("pods", {
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": dict(template["metadata"]["labels"])},
            "spec": {"containers": [{"name": "usage"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        })
        recorder = self._start(name)
        with self._lock:
            self.recorders[name] = recorder

    def start(self) -> None:
        for name in POD_NAMES:
            self.create_pod(name)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)

    def _kubelet(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                recorders = dict(self.recorders)
            for name, recorder in recorders.items():
                pod = self.api.get("pods", name, NAMESPACE)
                if pod is None:
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    recorder.stop()  # SIGTERM: the recorder stops gracefully
                    with self._lock:
                        del self.recorders[name]
                    self.api.delete("pods", name, NAMESPACE)
                    continue
                ready = health(recorder, PROBE.get("service", ""))
                self.api.patch("pods", name, {"status": {"conditions": [
                    {"type": "Ready", "status": str(ready)}]}}, NAMESPACE)
            self._stopping.wait(0.1)

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.api.get("pods", name, NAMESPACE)

    def ready(self, name: str) -> bool:
        pod = self.pod(name)
        return pod is not None and not pod["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )

    def endpoints(self) -> set[str]:
        """The pods the recorder's Service sends calls to: ready, and matched by its
        selector."""
        selector = SERVICE["spec"]["selector"]
        found = set()
        for name in POD_NAMES:
            pod = self.pod(name)
            labels = (pod or {}).get("metadata", {}).get("labels") or {}
            if pod and self.ready(name) and selector.items() <= labels.items():
                found.add(name)
        return found

    def leader(self) -> str:
        lease = self.api.get("leases", "hami-accounting-usage", NAMESPACE)
        return str((lease or {}).get("spec", {}).get("holderIdentity") or "")


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.start()
    yield server
    server.stop()


def test_a_drain_evicts_the_leader_and_the_service_follows_the_new_one(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    pod = kube_pod("trainer", uid="uid-trainer", namespace="team-a",
                   apps=[app_container("server", gpumem=10240)],
                   allocation=allocation([(GPU, 10240, 0)]), node=NODE)
    apiserver.add("pods", pod)
    apiserver.add("poddisruptionbudgets", {
        **BUDGET, "status": {"expectedPods": STATEFULSET["spec"]["replicas"]},
    })
    lease_name = next(e["value"] for e in STATEFULSET["spec"]["template"]["spec"][
        "containers"][0]["env"] if e["name"] == "HAMI_ACCOUNTING_LEASE_NAME")

    def start(name: str) -> RunningRecorder:
        return start_recorder(
            tmp_path / name, identity=name, kubernetes="kubeconfig", kubeconfig=kubeconfig,
            leader_election=True, lease_namespace=NAMESPACE, lease_name=lease_name,
        )

    cluster = Cluster(apiserver, start)
    cluster.start()
    core: Any = client.CoreV1Api(apiserver.kube_client())

    def evict(name: str) -> int:
        try:
            core.create_namespaced_pod_eviction(
                name, NAMESPACE, client.V1Eviction(metadata=client.V1ObjectMeta(name=name)))
        except client.ApiException as error:
            return int(error.status)
        return 201

    try:
        # Both replicas ready (the standby in contact with the Lease), the Service on the
        # leader alone.
        wait_for(lambda: all(cluster.ready(n) for n in POD_NAMES), "both replicas ready")
        wait_for(lambda: cluster.endpoints() == {cluster.leader()} and cluster.leader() != "",
                 "the Service to select the leader")
        first = cluster.leader()
        (standby,) = set(POD_NAMES) - {first}
        assert not health(cluster.recorders[standby], "")  # the standby takes no calls
        assert "accounting.hami.io/leader" not in (cluster.pod(standby) or {})["metadata"].get(
            "labels", {})

        # kubectl drain evicts the leader: allowed, and a second eviction while it goes is not.
        assert evict(first) == 201
        assert evict(standby) == 429
        wait_for(lambda: cluster.leader() == standby, "the standby to take the Lease")
        wait_for(lambda: cluster.endpoints() == {standby}, "the Service to follow the leader")
        new_leader = cluster.recorders[standby]
        usage = new_leader.stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-trainer"),
                                            timeout=RPC_TIMEOUT_S)
        assert usage.found and sum(u.memory_mib for u in usage.stored) == 10240

        # Until the StatefulSet's replacement is ready, the new leader cannot be evicted.
        wait_for(lambda: cluster.pod(first) is None, "the evicted pod to be gone")
        assert evict(standby) == 429
        cluster.create_pod(first)
        wait_for(lambda: cluster.ready(first), "the replacement to be ready as a standby")
        assert cluster.endpoints() == {standby}
        assert cluster.leader() == standby
        labels = (cluster.pod(first) or {})["metadata"].get("labels", {})
        assert "accounting.hami.io/leader" not in labels
    finally:
        cluster.stop()
