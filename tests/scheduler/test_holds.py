"""A replica's Filters see each other's placements before the WatchUsage events arrive.

``services.scheduler.holds.Holds`` on its own (what it shows, to whom, until when), then
through real servers: a Filter right after another, and a Filter running while another's
Reserve is in flight, on one scheduler whose node cache is held stale on purpose. Each takes
other capacity at its first Reserve — no refusal, no direct read — and what is stored is
exactly what was answered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import pytest

from accounting.fit import NodeState
from accounting.model import Device, DeviceState, DeviceUsage, Pod
from hami.accounting.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.scheduler.convert import PodDevices, Reservation
from services.scheduler.holds import Holds
from services.scheduler.placer import PodPlacer
from services.scheduler.recorder_client import RecorderClient, Snapshot
from tests.scheduler.conftest import NS, RPC_TIMEOUT_S, GatedCache, Recorder, free_port
from tests.support.pods import app_container, gpu_device, kube_pod, to_json

CARD_MIB = 24576
WAIT_S = 10.0
ServePlacer = Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub]


def usage(uuid: str, memory_mib: int, cores: int = 0, slots: int = 1) -> DeviceUsage:
    return DeviceUsage(uuid, "NVIDIA", memory_mib, cores, slots)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- Holds on its own ----------------------------------------------------------------------------


def test_a_hold_in_flight_is_shown_to_other_pods_and_not_to_its_own() -> None:
    holds = Holds()
    holds.hold("pod-a", "node1", [usage("GPU-1", 1000)])
    assert holds.unseen("pod-b", applied_revision=10**9) == {"node1": [usage("GPU-1", 1000)]}
    # Its own placement never counts against a pod (a re-filter of it).
    assert holds.unseen("pod-a", applied_revision=10**9) == {}
    # In flight, no revision the cache reaches lets it go.
    assert len(holds) == 1


def test_a_reserved_hold_lasts_until_the_cache_has_applied_its_revision() -> None:
    holds = Holds()
    key = holds.hold("pod-a", "node1", [usage("GPU-1", 1000)])
    holds.reserved(key, revision=7)
    assert holds.unseen("pod-b", applied_revision=6) == {"node1": [usage("GPU-1", 1000)]}
    assert holds.unseen("pod-b", applied_revision=7) == {}
    assert len(holds) == 0
    # Once the cache shows it, it is gone for good (a later, older revision does not bring it
    # back: that would count the placement twice).
    assert holds.unseen("pod-b", applied_revision=6) == {}


def test_a_refused_reserve_drops_its_hold_and_only_its_own() -> None:
    holds = Holds()
    first = holds.hold("pod-a", "node1", [usage("GPU-1", 1000)])
    # A second Filter of the same pod (two requests at once) has its own hold.
    second = holds.hold("pod-a", "node2", [usage("GPU-2", 500)])
    holds.drop(first)
    assert holds.unseen("pod-b", applied_revision=0) == {"node2": [usage("GPU-2", 500)]}
    holds.drop(second)
    assert holds.unseen("pod-b", applied_revision=0) == {}


def test_holds_on_one_node_add_up() -> None:
    holds = Holds()
    holds.hold("pod-a", "node1", [usage("GPU-1", 1000)])
    holds.hold("pod-b", "node1", [usage("GPU-1", 500), usage("GPU-2", 200)])
    holds.hold("pod-c", "node2", [usage("GPU-9", 300)])
    unseen = holds.unseen("pod-z", applied_revision=0)
    assert sorted(unseen["node1"], key=repr) == sorted(
        [usage("GPU-1", 1000), usage("GPU-1", 500), usage("GPU-2", 200)], key=repr
    )
    assert unseen["node2"] == [usage("GPU-9", 300)]


def test_a_hold_the_cache_never_shows_lapses_after_its_age() -> None:
    clock = Clock()
    holds = Holds(max_age_s=10.0, clock=clock)
    key = holds.hold("pod-a", "node1", [usage("GPU-1", 1000)])
    holds.reserved(key, revision=50)  # e.g. a recorder restarted without its journal
    clock.now += 9.0
    assert holds.unseen("pod-b", applied_revision=3) == {"node1": [usage("GPU-1", 1000)]}
    clock.now += 2.0
    assert holds.unseen("pod-b", applied_revision=3) == {}
    assert len(holds) == 0


def test_with_added_charges_each_entry_and_without_takes_it_back() -> None:
    devices = tuple(
        DeviceState(Device(f"GPU-{i}", "A100", i, 10, CARD_MIB, 100), 1000 * i, 10 * i, i)
        for i in range(3)
    )
    node = NodeState("node1", devices)
    added = [usage("GPU-1", 4000, 30, 1), usage("GPU-1", 1000, 0, 1), usage("GPU-9", 5, 5, 1)]
    held = node.with_added(added)
    assert [(d.memory_used_mib, d.core_percent_used, d.slots_used) for d in held.devices] == [
        (0, 0, 0), (6000, 40, 3), (2000, 20, 2)
    ]
    assert held.without([usage("GPU-1", 5000, 30, 2)]) == node
    assert node.with_added([usage("GPU-9", 5)]) is node


# -- one replica, real servers -------------------------------------------------------------------


def whole_card_pod(name: str) -> dict[str, Any]:
    return kube_pod(name, namespace=NS, apps=[app_container("main", gpumem=CARD_MIB)])


class WatchedRecorder(RecorderClient):
    """Counts direct node reads and Reserves; the first Reserve can be held at a barrier."""

    def __init__(self, target: str) -> None:
        super().__init__(grpc.insecure_channel(target), target)
        self.node_reads: list[tuple[str, ...]] = []
        self.reserves: list[tuple[str, str, bool]] = []
        self.first_reserve_entered = threading.Event()
        self.release_first_reserve = threading.Event()
        self.release_first_reserve.set()
        self._lock = threading.Lock()

    def snapshot(self, node_names: Sequence[str], namespace: str, timeout_s: float, *,
                 quota: bool = True) -> Snapshot:
        self.node_reads.append(tuple(node_names))
        return super().snapshot(node_names, namespace, timeout_s, quota=quota)

    def reserve(self, pod: Pod, node_name: str, grants: PodDevices, policy_id: str,
                timeout_s: float, *, replaces_revision: int | None = None) -> Reservation:
        with self._lock:
            first = not self.first_reserve_entered.is_set()
            self.first_reserve_entered.set()
        if first:
            assert self.release_first_reserve.wait(WAIT_S)
        reservation = super().reserve(
            pod, node_name, grants, policy_id, timeout_s, replaces_revision=replaces_revision
        )
        with self._lock:
            self.reserves.append((pod.uid, node_name, reservation.reserved))
        return reservation


Replica = tuple[GatedCache, WatchedRecorder, scheduler_pb2_grpc.SchedulerStub, PodPlacer]


@pytest.fixture
def replica(recorder: Recorder, serve_placer: ServePlacer, request: pytest.FixtureRequest
            ) -> Iterator[Replica]:
    """One scheduler replica (a cache that can be held stale) over two one-card nodes; a test
    parametrized with ``watch_target`` points the cache's stream there."""
    watch_target: str | None = getattr(request, "param", None)
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    recorder.register_node("node2", [gpu_device("GPU-2", memory_mib=CARD_MIB)])
    client = WatchedRecorder(recorder.target)
    cache = GatedCache(client, grpc.insecure_channel(watch_target or recorder.target)).start()
    placer = PodPlacer(client, node_cache=cache)
    stub = serve_placer(placer)
    if watch_target is None:
        assert cache.wait_for_revision(recorder.app.store.revision, WAIT_S)
    yield cache, client, stub, placer
    cache.gate.set()
    client.release_first_reserve.set()
    cache.close()
    client.close()


def filter_pod(stub: scheduler_pb2_grpc.SchedulerStub, pod: dict[str, Any]
               ) -> scheduler_pb2.FilterResponse:
    response: scheduler_pb2.FilterResponse = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod),
                                    node_names=["node1", "node2"]),
        timeout=RPC_TIMEOUT_S,
    )
    return response


def assert_stored_as_answered(recorder: Recorder, answers: dict[str, str]) -> None:
    """Each pod is stored once, on the node its Scheduled answer named; each card holds one."""
    for uid, node in answers.items():
        stored = recorder.stored(uid)
        assert stored.found and stored.node_name == node, (uid, stored)
    assert recorder.node_memory("node1") == CARD_MIB
    assert recorder.node_memory("node2") == CARD_MIB


def test_a_filter_right_after_another_sees_its_placement_before_the_event(
    recorder: Recorder, replica: Replica
) -> None:
    cache, client, stub, placer = replica
    cache.gate.clear()  # the copy will not show the first placement
    first = filter_pod(stub, whole_card_pod("first"))
    second = filter_pod(stub, whole_card_pod("second"))

    assert (first.reason, second.reason) == ("Scheduled", "Scheduled"), second.message
    assert {first.node_name, second.node_name} == {"node1", "node2"}
    # The second Filter fitted the first one's hold: its first Reserve was accepted, and it
    # read no node directly (a refused Reserve would have read the refused node).
    assert [reserved for _, _, reserved in client.reserves] == [True, True]
    assert client.node_reads == []
    assert_stored_as_answered(recorder, {
        "uid-team-a-first": first.node_name, "uid-team-a-second": second.node_name})
    assert placer.held_placements == 2
    # Once the copy shows both placements, the holds are let go and nothing counts twice.
    cache.gate.set()
    assert cache.wait_for_revision(recorder.app.store.revision, WAIT_S)
    third = filter_pod(stub, whole_card_pod("third"))
    assert third.reason == "NoNodeFits"
    assert placer.held_placements == 0
    # "No node fits" is confirmed with direct reads (no hold applies to them).
    assert [sorted(read) for read in client.node_reads] == [["node1", "node2"]]


def test_two_filters_at_once_on_one_replica_do_not_choose_the_same_card(
    recorder: Recorder, replica: Replica
) -> None:
    _cache, client, stub, _placer = replica
    client.release_first_reserve.clear()
    with futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(filter_pod, stub, whole_card_pod("first"))
        # The second Filter fits while the first one's Reserve is in flight.
        assert client.first_reserve_entered.wait(WAIT_S)
        second = filter_pod(stub, whole_card_pod("second"))
        client.release_first_reserve.set()
        first_answer = first.result(timeout=WAIT_S)

    assert (first_answer.reason, second.reason) == ("Scheduled", "Scheduled")
    assert {first_answer.node_name, second.node_name} == {"node1", "node2"}
    assert [reserved for _, _, reserved in client.reserves] == [True, True]
    assert client.node_reads == []
    assert_stored_as_answered(recorder, {
        "uid-team-a-first": first_answer.node_name, "uid-team-a-second": second.node_name})


@pytest.mark.parametrize(
    "replica", [f"127.0.0.1:{free_port()}"], indirect=True, ids=["stream-unreachable"]
)
def test_a_filter_that_read_directly_holds_nothing(recorder: Recorder, replica: Replica) -> None:
    cache, client, stub, placer = replica
    # The watch stream dials a port nobody listens on: every Filter reads directly, and a
    # hold would wait for a cache that lets nothing go.
    answer = filter_pod(stub, whole_card_pod("first"))
    assert not cache.live
    assert answer.reason == "Scheduled", answer.message
    assert client.node_reads and placer.held_placements == 0
