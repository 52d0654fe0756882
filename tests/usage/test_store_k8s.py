"""The recorder with its Kubernetes source: the real store, journal and gRPC server fed by the
real source from ``tests.support.fake_apiserver`` over HTTP, reached through a kubeconfig.

Covers the health gate (NOT_SERVING until the first list is applied), the informer-driven pod
lifecycle, reconciliation of the journal against the cluster after a restart (a pod deleted and
a pod whose init finished while the recorder was down), and leader election between two
replicas (the standby refuses writes naming the leader, serves reads, and takes over).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from hami.accounting.v1 import usage_pb2
from services.common import metrics
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    kube_quota,
    running,
    terminated,
    to_json,
)
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder

WAIT_S = 20.0
GPU = "GPU-0"
NODE = "node1"
NS = "team-a"
MEMORY = "nvidia.com/gpumem"


def write_kubeconfig(path: Path, server_url: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {server_url}\n"
        "users:\n- name: tester\n  user: {}\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n"
        "current-context: fake\n"
    )
    return path


def health_status(recorder: RunningRecorder, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(recorder.channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
    return int(response.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    assert condition(), f"timed out waiting for {what}"


def stored_mib(recorder: RunningRecorder, uid: str) -> int | None:
    response = recorder.stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                         timeout=RPC_TIMEOUT_S)
    return sum(u.memory_mib for u in response.stored) if response.found else None


def namespace_mib(recorder: RunningRecorder, namespace: str = NS) -> tuple[int, int]:
    """(used, limit) of gpumem."""
    items = recorder.stub.GetNamespaceUsage(
        usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S).items
    by_resource = {i.resource: i for i in items}
    item = by_resource.get(MEMORY)
    return (item.used, item.limit) if item is not None else (0, 0)


def trainer(**overrides: object) -> dict[str, object]:
    options: dict[str, object] = {
        "uid": "uid-trainer", "namespace": NS,
        "init": [init_container("convert", gpumem=20480)],
        "apps": [app_container("server", gpumem=10240)],
    }
    options.update(overrides)
    return kube_pod("trainer", **options)  # type: ignore[arg-type]


def bound(**overrides: object) -> dict[str, object]:
    return trainer(allocation=allocation([(GPU, 20480, 0)], [(GPU, 10240, 0)]), node=NODE,
                   **overrides)


def _gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _scrape_time_text() -> str:
    """What this process's /metrics appends now: the scrape-time families of the recorder
    started last."""
    source = metrics.scrape_text()
    assert source is not None
    return source()


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.stop()


def test_informer_lifecycle_and_the_sync_gate(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    apiserver.add("resourcequotas", kube_quota("gpu", NS, {"limits.nvidia.com/gpumem": "24576",
                                                           "pods": "10"}))
    apiserver.add("pods", trainer())
    # The API server is not answering yet: the recorder is alive but not ready.
    recorder = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    assert health_status(recorder) == NOT_SERVING
    assert health_status(recorder, "hami.accounting.v1.UsageRecorder") == NOT_SERVING
    assert health_status(recorder, "liveness") == SERVING
    assert _gauge("hami_accounting_cache_synced", service="usage") == 0

    apiserver.start()
    wait_for(lambda: health_status(recorder) == SERVING, "the first sync")
    assert _gauge("hami_accounting_cache_synced", service="usage") == 1
    assert _gauge("hami_accounting_leader") == 1  # no election: the only replica writes
    assert namespace_mib(recorder) == (0, 24576)
    assert stored_mib(recorder, "uid-trainer") is None  # not scheduled: not tracked
    nodes = recorder.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    assert [(n.node_name, [d.memory_total_mib for d in n.devices]) for n in nodes.nodes] == [
        (NODE, [24576])]

    apiserver.update("pods", bound(init_statuses=[running("convert")]))
    wait_for(lambda: stored_mib(recorder, "uid-trainer") == 20480, "the bound pod at its peak")
    apiserver.update("pods", bound(phase="Running", init_statuses=[terminated("convert")],
                                   app_statuses=[running("server")]))
    wait_for(lambda: stored_mib(recorder, "uid-trainer") == 10240, "the shrink")
    assert namespace_mib(recorder) == (10240, 24576)
    apiserver.delete("pods", "trainer", NS)
    wait_for(lambda: stored_mib(recorder, "uid-trainer") is None, "the deletion")
    assert namespace_mib(recorder) == (0, 24576)
    apiserver.delete("resourcequotas", "gpu", NS)
    wait_for(lambda: namespace_mib(recorder) == (0, 0), "the quota removal")


def test_restart_reconciles_the_journal_with_the_cluster(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    apiserver.start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    apiserver.add("pods", bound(init_statuses=[running("convert")]))
    apiserver.add("pods", kube_pod("gone", uid="uid-gone", namespace=NS, node=NODE,
                                   apps=[app_container("a", gpumem=1024)],
                                   allocation=allocation([(GPU, 1024, 0)])))
    first = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(first) == SERVING, "the first sync")
    wait_for(lambda: (stored_mib(first, "uid-trainer"), stored_mib(first, "uid-gone")) == (
        20480, 1024), "both pods")
    first.stop()

    # While the recorder is down: one pod is deleted, the other's init container finishes.
    apiserver.delete("pods", "gone", NS)
    apiserver.update("pods", bound(phase="Running", init_statuses=[terminated("convert")]))

    second = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    # Until the re-list, the journal's figures are what the recorder holds.
    wait_for(lambda: health_status(second) == SERVING, "the sync after the restart")
    assert stored_mib(second, "uid-gone") is None
    assert stored_mib(second, "uid-trainer") == 10240
    assert namespace_mib(second) == (10240, 0)


def test_nodes_and_quotas_deleted_while_down_are_cleared_by_the_relist(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    apiserver.start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    apiserver.add("nodes", kube_node("node-gone", [gpu_device("GPU-gone")]))
    apiserver.add("resourcequotas", kube_quota("gpu", NS, {f"limits.{MEMORY}": "24576"}))
    apiserver.add("resourcequotas", kube_quota("gpu", "team-gone", {f"limits.{MEMORY}": "1000"}))
    first = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(first) == SERVING, "the first sync")
    assert registered(first, NODE, "node-gone") == {NODE, "node-gone"}
    assert namespace_mib(first, "team-gone") == (0, 1000)
    first.stop()

    # While the recorder is down the node and the namespace's quota are deleted.
    apiserver.delete("nodes", "node-gone")
    apiserver.delete("resourcequotas", "gpu", "team-gone")

    second = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(second) == SERVING, "the sync after the restart")
    assert registered(second, NODE, "node-gone") == {NODE}
    assert namespace_mib(second, "team-gone") == (0, 0)
    assert namespace_mib(second) == (0, 24576)


def registered(recorder: RunningRecorder, *names: str) -> set[str]:
    response = recorder.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=names),
                                          timeout=RPC_TIMEOUT_S)
    return {node.node_name for node in response.nodes}


def test_a_pod_that_vanished_from_the_list_stays_forgotten(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    apiserver.start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    gone = kube_pod("gone", uid="uid-gone", namespace=NS, node=NODE,
                    apps=[app_container("a", gpumem=1024)],
                    allocation=allocation([(GPU, 1024, 0)]))
    apiserver.add("pods", gone)
    first = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: stored_mib(first, "uid-gone") == 1024, "the pod recorded")
    first.stop()
    apiserver.delete("pods", "gone", NS)

    # The re-list after the restart forgets it; a late update of it then charges nothing.
    second = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(second) == SERVING, "the sync after the restart")
    assert stored_mib(second, "uid-gone") is None
    late = second.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(gone)),
                                 timeout=RPC_TIMEOUT_S)
    assert (late.decision, late.tracked) == ("Forgotten", False)
    assert namespace_mib(second) == (0, 0)
    second.stop()

    # The tombstone is journaled: a recorder without the cluster still refuses it.
    third = start_recorder()
    late = third.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(gone)),
                                timeout=RPC_TIMEOUT_S)
    assert late.decision == "Forgotten"
    assert stored_mib(third, "uid-gone") is None


def test_standby_refuses_writes_naming_the_leader_and_takes_over(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    apiserver.start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node(NODE, [gpu_device(GPU)]))
    election = {"kubernetes": "kubeconfig", "kubeconfig": kubeconfig, "leader_election": True,
                "lease_namespace": "default"}
    leader = start_recorder(tmp_path / "a", identity="replica-a", **election)
    wait_for(lambda: health_status(leader) == SERVING, "replica-a to lead and sync")
    standby = start_recorder(tmp_path / "b", identity="replica-b", **election)
    # The standby is alive, not ready, and serves reads but refuses writes.
    assert health_status(standby, "liveness") == SERVING
    assert health_status(standby) == NOT_SERVING
    # The gauges of this process follow the recorder started last: the standby.
    assert _gauge("hami_accounting_leader") == 0
    assert _gauge("hami_accounting_cache_synced", service="usage") == 0
    assert _scrape_time_text() == ""  # a standby's copy is stale: none of those families
    request = usage_pb2.SetQuotaRequest(namespace=NS, limits={"limits.nvidia.com/gpumem": 1})
    with pytest.raises(grpc.RpcError) as caught:
        standby.stub.SetQuota(request, timeout=RPC_TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not the leader; the leader is replica-a" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        standby.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(bound())),
                               timeout=RPC_TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert standby.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(),
                                     timeout=RPC_TIMEOUT_S) is not None
    leader.stub.SetQuota(request, timeout=RPC_TIMEOUT_S)

    # The leader stops and releases the Lease: the standby takes over, lists, and serves.
    leader.stop()
    wait_for(lambda: health_status(standby) == SERVING, "replica-b to take over")
    assert _gauge("hami_accounting_leader") == 1
    assert _gauge("hami_accounting_cache_synced", service="usage") == 1
    assert f'hami_gpu_memory_limit_bytes{{device_index="0",device_type="NVIDIA A10",' \
           f'device_uuid="{GPU}",node="{NODE}",zone="vGPU"}} ' in _scrape_time_text()
    standby.stub.SetQuota(request, timeout=RPC_TIMEOUT_S)
    nodes = standby.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    assert [n.node_name for n in nodes.nodes] == [NODE]
