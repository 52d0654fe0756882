"""The usage recorder's Kubernetes source against a fake API server over real HTTP.

The source runs with the official client against ``tests.support.fake_apiserver`` on 127.0.0.1
and feeds a recording sink; nothing of ours is mocked. Waits are bounded polls on the expected
state, never sleeps followed by timing assertions.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from accounting.model import Device, Pod
from accounting.policy import policy_for
from accounting.vendors import VENDORS
from services.common import kube_api
from services.usage.k8s import KubernetesSource, merge_quota_limits, quota_limits
from tests.support.fake_apiserver import FakeApiServer

MEM = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"
COUNT = "limits.nvidia.com/gpu"
WAIT_S = 15.0


# -- helpers -----------------------------------------------------------------------------------


class RecordingSink:
    """A UsageSink that keeps what it is told and the order of the calls."""

    def __init__(self, tracked: Sequence[str] = ()) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        self.pods: dict[str, Pod] = {}
        self.nodes: dict[str, tuple[Device, ...]] = {}
        self.quotas: dict[str, dict[str, int]] = {}
        self.synced = False
        self._tracked = set(tracked)

    def record_pod(self, pod: Pod) -> object:
        with self._lock:
            self.calls.append(("record_pod", pod.uid))
            self.pods[pod.uid] = pod
            self._tracked.add(pod.uid)
        return None

    def forget_pod(self, pod_uid: str) -> object:
        with self._lock:
            self.calls.append(("forget_pod", pod_uid))
            self.pods.pop(pod_uid, None)
            self._tracked.discard(pod_uid)
        return None

    def register_node(self, node_name: str, devices: Sequence[Device]) -> object:
        with self._lock:
            self.calls.append(("register_node", node_name))
            self.nodes[node_name] = tuple(devices)
        return None

    def forget_node(self, node_name: str) -> object:
        with self._lock:
            self.calls.append(("forget_node", node_name))
            self.nodes.pop(node_name, None)
        return None

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> object:
        with self._lock:
            self.calls.append(("set_quota", (namespace, dict(limits))))
            if limits:
                self.quotas[namespace] = dict(limits)
            else:
                self.quotas.pop(namespace, None)
        return None

    def tracked_pod_uids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._tracked)

    def registered_node_names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.nodes)

    def quota_namespaces(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.quotas)

    def set_synced(self, synced: bool) -> None:
        with self._lock:
            self.calls.append(("set_synced", synced))
            self.synced = synced

    def count(self, method: str, argument: Any) -> int:
        with self._lock:
            return sum(1 for call in self.calls if call == (method, argument))

    def mentions(self, value: str) -> list[tuple[str, Any]]:
        with self._lock:
            return [call for call in self.calls if value in json.dumps(call, default=str)]

    def index(self, call: tuple[str, Any]) -> int:
        with self._lock:
            return self.calls.index(call)


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def gpu_pod(
    uid: str,
    name: str | None = None,
    *,
    namespace: str = "team-a",
    node: str = "node-1",
    allocated: str = "GPU-0,NVIDIA,4000,30:;",
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod the scheduler placed: hami.io/vgpu-node and an allocation for its one container."""
    return {
        "metadata": {
            "uid": uid,
            "name": name or uid,
            "namespace": namespace,
            "annotations": {
                "hami.io/vgpu-node": node,
                "hami.io/vgpu-devices-allocated": allocated,
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "4000",
                            "nvidia.com/gpucores": "30",
                        }
                    },
                }
            ],
        },
        "status": {"phase": phase},
    }


def plain_pod(uid: str, *, namespace: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": namespace},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def register_annotation(*uuids: str) -> str:
    return json.dumps(
        [
            {
                "id": uuid,
                "index": i,
                "count": 10,
                "devmem": 24576,
                "devcore": 100,
                "type": "NVIDIA A10",
                "health": True,
            }
            for i, uuid in enumerate(uuids)
        ]
    )


def gpu_node(name: str, *uuids: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": {"hami.io/node-nvidia-register": register_annotation(*uuids)},
        }
    }


def quota(namespace: str, name: str, hard: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": dict(hard)}}


@dataclass
class Harness:
    server: FakeApiServer
    start: Callable[..., tuple[KubernetesSource, RecordingSink]]


@pytest.fixture
def harness() -> Iterator[Harness]:
    sources: list[KubernetesSource] = []
    with FakeApiServer() as server:

        def start(
            sink: RecordingSink | None = None, **options: Any
        ) -> tuple[KubernetesSource, RecordingSink]:
            sink = sink if sink is not None else RecordingSink()
            options.setdefault("watch_timeout_s", 30)
            source = KubernetesSource(server.kube_client(), sink, **options)
            source.start()
            sources.append(source)
            return source, sink

        try:
            yield Harness(server, start)
        finally:
            for source in sources:
                source.stop()


def started_and_synced(harness: Harness, **options: Any) -> tuple[KubernetesSource, RecordingSink]:
    source, sink = harness.start(**options)
    assert source.wait_synced(WAIT_S), "the source never finished its first sync"
    return source, sink


# -- pods ------------------------------------------------------------------------------------


def test_pods_are_recorded_from_the_list_and_then_from_watch_events(harness: Harness) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-listed"))
    _, sink = started_and_synced(harness)
    assert sink.count("record_pod", "uid-listed") == 1

    server.add("pods", gpu_pod("uid-added"))
    wait_until(lambda: sink.count("record_pod", "uid-added") == 1, "the added pod")

    server.update("pods", gpu_pod("uid-added", phase="Succeeded"))
    wait_until(lambda: sink.count("record_pod", "uid-added") == 2, "the updated pod")
    assert sink.pods["uid-added"].phase.value == "Succeeded"

    server.delete("pods", "uid-listed", "team-a")
    wait_until(lambda: sink.count("forget_pod", "uid-listed") == 1, "the deleted pod forgotten")
    assert set(sink.pods) == {"uid-added"}


def test_pods_without_vgpu_node_are_ignored(harness: Harness) -> None:
    server = harness.server
    server.add("pods", plain_pod("uid-plain-listed"))
    _, sink = started_and_synced(harness)

    server.add("pods", plain_pod("uid-plain-added"))
    server.update("pods", plain_pod("uid-plain-added"))
    server.delete("pods", "uid-plain-listed", "team-a")
    # A tracked pod added last: once it is seen, every earlier event has been handled.
    server.add("pods", gpu_pod("uid-marker"))
    wait_until(lambda: sink.count("record_pod", "uid-marker") == 1, "the marker pod")

    assert sink.mentions("uid-plain") == []


def test_a_malformed_allocation_is_skipped_without_stopping_the_watch(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-bad-listed", "bad-listed", allocated="not-an-allocation"))
    caplog.set_level(logging.WARNING, logger="services.usage.k8s")
    _, sink = started_and_synced(harness)

    server.add("pods", gpu_pod("uid-bad-added", "bad-added", allocated="GPU-0,NVIDIA,x,30:;"))
    server.add("pods", gpu_pod("uid-good"))
    wait_until(lambda: sink.count("record_pod", "uid-good") == 1, "the pod after the bad one")
    server.add("pods", gpu_pod("uid-good-2"))
    wait_until(lambda: sink.count("record_pod", "uid-good-2") == 1, "a later pod")

    assert sink.mentions("uid-bad") == []
    skipped = [r for r in caplog.records if "skipping pod" in r.getMessage()]
    assert {r.__dict__["pod_uid"] for r in skipped} == {"uid-bad-listed", "uid-bad-added"}
    assert {r.__dict__["pod_name"] for r in skipped} == {"bad-listed", "bad-added"}
    for record in skipped:
        # Who and what is wrong, never the pod spec.
        assert "vgpu-devices-allocated" in record.getMessage()
        assert "containers" not in record.getMessage()
        assert "nvidia.com/gpumem" not in record.getMessage()


def test_a_timed_out_watch_resumes_from_the_last_resource_version_without_listing(
    harness: Harness,
) -> None:
    server = harness.server
    _, sink = started_and_synced(harness, watch_timeout_s=1)

    added = server.add("pods", gpu_pod("uid-1"))
    wait_until(lambda: sink.count("record_pod", "uid-1") == 1, "the added pod")
    last_rv = added["metadata"]["resourceVersion"]
    wait_until(
        lambda: any(r.resource_version == last_rv for r in server.watch_requests("pods")),
        "a pods watch resumed from the pod's resourceVersion",
    )

    assert len(server.list_requests("pods")) == 1
    assert sink.count("record_pod", "uid-1") == 1


def test_a_bookmark_advances_the_resource_version_the_watch_resumes_from(
    harness: Harness,
) -> None:
    server = harness.server
    _, sink = started_and_synced(harness, watch_timeout_s=1)
    # A write to another kind moves the store's version past every pod event.
    server.add("nodes", {"metadata": {"name": "node-without-hami"}})
    bookmark_rv = str(server.resource_version)

    def resumed_from_bookmark() -> bool:
        server.send_bookmarks()
        return any(r.resource_version == bookmark_rv for r in server.watch_requests("pods"))

    wait_until(resumed_from_bookmark, "a pods watch resumed from the bookmark's version")
    assert len(server.list_requests("pods")) == 1
    assert sink.mentions("node-without-hami") == []


def test_410_expired_relists_and_reconciles_what_changed_while_disconnected(
    harness: Harness,
) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-kept"))
    server.add("pods", gpu_pod("uid-deleted-while-away"))
    _, sink = started_and_synced(harness)
    wait_until(lambda: server.open_watch_count() == 3, "three open watches")

    with server.watches_suspended():
        server.delete("pods", "uid-deleted-while-away", "team-a")
        server.add("pods", gpu_pod("uid-added-while-away"))
        server.compact()

    wait_until(
        lambda: sink.count("forget_pod", "uid-deleted-while-away") == 1,
        "the pod deleted while disconnected forgotten",
    )
    wait_until(
        lambda: sink.count("record_pod", "uid-added-while-away") == 1,
        "the pod added while disconnected recorded",
    )
    assert len(server.list_requests("pods")) == 2
    assert sink.count("forget_pod", "uid-kept") == 0
    assert set(sink.pods) == {"uid-kept", "uid-added-while-away"}
    # Still watching after the re-list.
    server.add("pods", gpu_pod("uid-after"))
    wait_until(lambda: sink.count("record_pod", "uid-after") == 1, "a pod after the re-list")


def test_the_first_list_forgets_journal_pods_the_cluster_no_longer_has(harness: Harness) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-live"))
    # Journaled earlier; still in the cluster but not (yet) annotated, e.g. just reserved.
    server.add("pods", plain_pod("uid-reserved"))
    journal = RecordingSink(tracked=["uid-gone", "uid-live", "uid-reserved"])

    _, sink = started_and_synced(harness, sink=journal)

    assert sink.count("forget_pod", "uid-gone") == 1
    assert sink.count("forget_pod", "uid-live") == 0
    assert sink.count("forget_pod", "uid-reserved") == 0
    assert sink.index(("forget_pod", "uid-gone")) < sink.index(("set_synced", True))
    assert sink.tracked_pod_uids() == {"uid-live", "uid-reserved"}


def test_a_deleted_pod_the_store_tracks_is_forgotten_even_without_the_annotation(
    harness: Harness,
) -> None:
    server = harness.server
    server.add("pods", plain_pod("uid-reserved"))
    _, sink = started_and_synced(harness, sink=RecordingSink(tracked=["uid-reserved"]))

    server.delete("pods", "uid-reserved", "team-a")
    wait_until(lambda: sink.count("forget_pod", "uid-reserved") == 1, "the reserved pod forgotten")


# -- nodes -----------------------------------------------------------------------------------


def test_nodes_are_registered_updated_and_forgotten(harness: Harness) -> None:
    server = harness.server
    server.add("nodes", gpu_node("node-1", "GPU-a"))
    server.add("nodes", {"metadata": {"name": "cpu-node"}})
    _, sink = started_and_synced(harness)
    assert [d.uuid for d in sink.nodes["node-1"]] == ["GPU-a"]

    server.add("nodes", gpu_node("node-2", "GPU-b"))
    wait_until(lambda: "node-2" in sink.nodes, "node-2 registered")
    # A status-only change (same annotation) is not news; a new inventory is.
    server.update("nodes", gpu_node("node-2", "GPU-b", labels={"heartbeat": "1"}))
    server.update("nodes", gpu_node("node-2", "GPU-b", "GPU-c"))
    wait_until(lambda: len(sink.nodes.get("node-2", ())) == 2, "node-2's new inventory")
    assert sink.count("register_node", "node-2") == 2

    # The device plugin's annotation disappears: the node offers no HAMi devices any more.
    server.update("nodes", {"metadata": {"name": "node-1"}})
    wait_until(lambda: "node-1" not in sink.nodes, "node-1 forgotten")
    server.delete("nodes", "node-2")
    wait_until(lambda: "node-2" not in sink.nodes, "node-2 forgotten")
    assert sink.mentions("cpu-node") == []


def test_a_malformed_node_registration_is_skipped(harness: Harness) -> None:
    server = harness.server
    broken = {
        "metadata": {"name": "node-bad", "annotations": {"hami.io/node-nvidia-register": "{"}}
    }
    server.add("nodes", broken)
    _, sink = started_and_synced(harness)
    server.add("nodes", gpu_node("node-ok", "GPU-a"))
    wait_until(lambda: "node-ok" in sink.nodes, "the node after the bad one")
    assert sink.mentions("node-bad") == []


def test_every_vendors_devices_pods_and_quotas_are_read_from_the_cluster(harness: Harness) -> None:
    """The source works from the vendor table: a node with Cambricon capacity, one with a
    Hygon register in HAMi's ':' form, a DCU pod with HAMi's allocation annotation and a
    quota on a DCU key are all read; a capacity change is news, a heartbeat is not."""
    server = harness.server
    mlu = {"metadata": {"name": "mlu-node"}, "status": {"capacity": {
        "cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "400"}}}
    dcu = {"metadata": {"name": "dcu-node", "annotations": {
        "hami.io/node-dcu-register": "DCU-0,4,16384,100,DCU,0,true,0,hami-core:"}}}
    server.add("nodes", mlu)
    server.add("nodes", dcu)
    server.add("pods", {
        "metadata": {"name": "dcu-pod", "namespace": "team-a", "uid": "uid-dcu", "annotations": {
            "hami.io/vgpu-node": "dcu-node",
            "hami.io/dcu-devices-allocated": "DCU-0,DCU,2000,60:;"}},
        "spec": {"nodeName": "dcu-node", "containers": [{"name": "main", "resources": {
            "limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000",
                       "hygon.com/dcucores": "60"}}}]},
        "status": {"phase": "Running"},
    })
    server.add("resourcequotas", quota("team-a", "dcu", {"limits.hygon.com/dcumem": "8000"}))
    _, sink = started_and_synced(harness, policy=policy_for([v.vendor for v in VENDORS]))
    assert [(d.uuid, d.vendor, d.memory_total_mib) for d in sink.nodes["mlu-node"]] == [
        ("mlu-node-cambricon-mlu-0", "MLU", 51200), ("mlu-node-cambricon-mlu-1", "MLU", 51200)]
    assert [(d.uuid, d.vendor, d.slots_total) for d in sink.nodes["dcu-node"]] == [
        ("DCU-0", "DCU", 4)]
    [grant] = sink.pods["uid-dcu"].containers[0].grants
    assert (grant.uuid, grant.vendor, grant.memory_mib, grant.core_percent) == (
        "DCU-0", "DCU", 2000, 60)
    assert sink.quotas["team-a"] == {"limits.hygon.com/dcumem": 8000}

    server.update("nodes", {**mlu, "metadata": {"name": "mlu-node", "labels": {"beat": "1"}}})
    server.update("nodes", {"metadata": {"name": "mlu-node"}, "status": {"capacity": {
        "cambricon.com/mlu.smlu.vcore": "300", "cambricon.com/mlu.smlu.vmemory": "600"}}})
    wait_until(lambda: len(sink.nodes.get("mlu-node", ())) == 3, "mlu-node's third MLU")
    assert sink.count("register_node", "mlu-node") == 2


# -- quotas ----------------------------------------------------------------------------------


def test_quotas_of_one_namespace_merge_to_the_minimum_per_key(harness: Harness) -> None:
    server = harness.server
    server.add("resourcequotas", quota("team-a", "gpu", {MEM: "8000", CORES: "100", "cpu": "4"}))
    _, sink = started_and_synced(harness)
    assert sink.quotas["team-a"] == {MEM: 8000, CORES: 100}

    server.add("resourcequotas", quota("team-a", "tighter", {MEM: "4000", COUNT: "2"}))
    wait_until(
        lambda: sink.quotas.get("team-a") == {MEM: 4000, CORES: 100, COUNT: 2}, "the merged quota"
    )
    server.delete("resourcequotas", "tighter", "team-a")
    wait_until(lambda: sink.quotas.get("team-a") == {MEM: 8000, CORES: 100}, "the recomputed quota")
    server.delete("resourcequotas", "gpu", "team-a")
    wait_until(lambda: sink.count("set_quota", ("team-a", {})) == 1, "the quota cleared")
    assert "team-a" not in sink.quotas


def test_a_quota_without_gpu_keys_sets_nothing_until_it_gains_one(harness: Harness) -> None:
    server = harness.server
    _, sink = started_and_synced(harness)
    server.add(
        "resourcequotas", quota("team-b", "cpu-only", {"cpu": "4", "requests.nvidia.com/gpu": "1"})
    )
    server.update("resourcequotas", quota("team-b", "cpu-only", {"cpu": "4", CORES: "50"}))
    wait_until(lambda: sink.quotas.get("team-b") == {CORES: 50}, "the quota with a GPU key")
    assert sink.mentions("team-b") == [("set_quota", ("team-b", {CORES: 50}))]


@pytest.mark.parametrize(
    ("hard", "want"),
    [
        ({MEM: "24576", CORES: "100", COUNT: "2"}, {MEM: 24576, CORES: 100, COUNT: 2}),
        ({MEM: "24Ki"}, {MEM: 24576}),
        ({MEM: "2k"}, {MEM: 2000}),
        ({MEM: "2000m"}, {MEM: 2}),
        ({MEM: "1.5"}, {}),
        ({MEM: "500m"}, {}),
        ({MEM: "lots"}, {}),
        ({MEM: "-5"}, {}),
        ({MEM: "99999999999999999999"}, {}),
        ({MEM: "1e12", CORES: "1000000000001"}, {MEM: 10**12}),
        ({"requests.nvidia.com/gpumem": "1", "nvidia.com/gpucores": "1", "cpu": "2"}, {}),
    ],
    ids=[
        "plain integers for all three keys",
        "a binary suffix is taken at its integer value like AsInt64",
        "a decimal suffix is taken at its integer value",
        "milli units that make a whole number are accepted",
        "a fraction is skipped",
        "milli units below one are skipped",
        "garbage is skipped",
        "a negative limit is skipped",
        "a value beyond int64 is skipped",
        "the largest limit is read, one above it is skipped",
        "requests and unprefixed keys are not HAMi quota keys",
    ],
)
def test_quota_limits_reads_only_whole_limits_keys(
    hard: dict[str, str], want: dict[str, int]
) -> None:
    assert quota_limits(quota("ns", "q", hard)) == want


def test_merge_quota_limits_takes_the_minimum_per_key() -> None:
    merged = merge_quota_limits([{MEM: 8000, CORES: 100}, {MEM: 4000, COUNT: 2}, {}])
    assert merged == {MEM: 4000, CORES: 100, COUNT: 2}
    assert merge_quota_limits([]) == {}


# -- sync, stop, configuration ---------------------------------------------------------------


def test_synced_is_set_once_after_the_first_list_of_all_three_kinds(harness: Harness) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-1"))
    server.add("nodes", gpu_node("node-1", "GPU-a"))
    server.add("resourcequotas", quota("team-a", "gpu", {MEM: "8000"}))
    source, sink = started_and_synced(harness)

    synced_at = sink.index(("set_synced", True))
    assert sink.index(("record_pod", "uid-1")) < synced_at
    assert sink.index(("register_node", "node-1")) < synced_at
    assert sink.index(("set_quota", ("team-a", {MEM: 8000}))) < synced_at
    assert source.synced

    # A later re-list (after 410) does not signal again.
    with server.watches_suspended():
        server.add("nodes", {"metadata": {"name": "cpu-node"}})
        server.compact()
    wait_until(lambda: len(server.list_requests("pods")) == 2, "the re-list")
    server.add("pods", gpu_pod("uid-2"))
    wait_until(lambda: sink.count("record_pod", "uid-2") == 1, "a pod after the re-list")
    assert sink.count("set_synced", True) == 1


def test_an_unreachable_api_server_leaves_the_source_unsynced() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    sink = RecordingSink()
    source = KubernetesSource(client.ApiClient(configuration), sink, max_backoff_s=0.2)
    source.start()
    try:
        assert not source.wait_synced(1.0)
        assert not source.synced
        assert sink.calls == [("set_synced", False)]
    finally:
        source.stop()


def test_stop_ends_the_threads_while_watches_are_open(harness: Harness) -> None:
    server = harness.server
    source, _ = started_and_synced(harness, watch_timeout_s=300)
    wait_until(lambda: server.open_watch_count() == 3, "three open watches")

    source.stop(timeout_s=10)

    alive = [t.name for t in threading.enumerate() if t.name.startswith("k8s-source-")]
    assert alive == []


def test_a_restarted_source_lists_reconciles_and_syncs_again(harness: Harness) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-1"))
    source, sink = started_and_synced(harness)
    source.stop()

    server.delete("pods", "uid-1", "team-a")
    server.add("pods", gpu_pod("uid-2"))
    source.start()

    assert source.wait_synced(WAIT_S)
    assert sink.count("forget_pod", "uid-1") == 1
    assert sink.count("record_pod", "uid-2") == 1
    synced_calls = [call for call in sink.calls if call[0] == "set_synced"]
    assert synced_calls == [("set_synced", s) for s in (False, True, False, True)]


def test_api_client_from_mode(tmp_path: Any) -> None:
    assert kube_api.api_client_from_mode("off", None) is None
    with pytest.raises(ValueError, match="unknown Kubernetes mode"):
        kube_api.api_client_from_mode("sideways", None)
    with pytest.raises(kube_api.KubernetesConfigError):
        kube_api.api_client_from_mode("kubeconfig", str(tmp_path / "missing"))

    with FakeApiServer() as server:
        server.add("pods", gpu_pod("uid-1"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                    "users": [{"name": "me", "user": {"token": "t"}}],
                    "contexts": [{"name": "ctx", "context": {"cluster": "fake", "user": "me"}}],
                    "current-context": "ctx",
                }
            )
        )
        api_client = kube_api.api_client_from_mode("kubeconfig", str(kubeconfig))
        assert api_client is not None
        sink = RecordingSink()
        source = KubernetesSource(api_client, sink)
        source.start()
        try:
            assert source.wait_synced(WAIT_S)
        finally:
            source.stop()
        assert sink.count("record_pod", "uid-1") == 1
