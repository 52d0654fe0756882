"""Two schedulers racing for the same capacity: only the recorder's Reserve decides.

The first test fires two real scheduler servers (one recorder) at the last 12 GiB of a card
from two threads, several rounds, with and without their WatchUsage node caches. The others
make the race deterministic: a recorder client whose snapshot is taken before a rival's
reservation lands, so the scheduler's Reserve is refused and it must read again (then
NoNodeFits), or keeps being refused (then, after the configured attempts,
ReservationConflict). Either way exactly one pod is charged. (test_node_cache makes the same
race deterministic through a stale node cache.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import scheduler_pb2, scheduler_pb2_grpc, usage_pb2
from services.scheduler.convert import Reservation
from services.scheduler.placer import PodPlacer
from services.scheduler.recorder_client import RecorderClient, Snapshot
from tests.scheduler.conftest import NS, RPC_TIMEOUT_S, Recorder, StartScheduler, bound_pod
from tests.support.pods import allocation, app_container, gpu_device, kube_pod, to_json

Json = dict[str, Any]
CARD_MIB = 24576
HALF_MIB = 12288
ROUNDS = 5


def half_card_pod(name: str) -> Json:
    return kube_pod(name, namespace=NS, apps=[app_container("main", gpumem=HALF_MIB)])


def half_full_card(recorder: Recorder) -> None:
    """node1 with one 24576-MiB card, 12288 MiB of it already charged."""
    recorder.register_node("node1", [gpu_device("GPU-0", memory_mib=CARD_MIB)])
    recorder.record(bound_pod("resident", "node1", allocation([("GPU-0", HALF_MIB, 0)]),
                              apps=[app_container("main", gpumem=HALF_MIB)]))


@pytest.mark.parametrize("node_cache", ["watch", "off"])
def test_two_schedulers_racing_for_the_last_12gi_reserve_it_once(
    recorder: Recorder, start_scheduler: StartScheduler, node_cache: str
) -> None:
    half_full_card(recorder)
    schedulers = [start_scheduler(node_cache=node_cache), start_scheduler(node_cache=node_cache)]

    for round_number in range(ROUNDS):
        pods = [half_card_pod(f"p{round_number}-{i}") for i in range(2)]
        responses: list[scheduler_pb2.FilterResponse | None] = [None, None]
        barrier = threading.Barrier(2)

        def run(index: int, pods: Sequence[Json] = pods,
                responses: list[scheduler_pb2.FilterResponse | None] = responses,
                barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            responses[index] = schedulers[index].filter(pods[index], ["node1"])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

        assert all(r is not None for r in responses)
        reasons = sorted(r.reason for r in responses if r is not None)
        assert reasons.count("Scheduled") == 1, reasons
        assert set(reasons) - {"Scheduled"} <= {"NoNodeFits", "ReservationConflict"}, reasons
        # The card holds exactly the resident plus one of the two pods.
        assert recorder.node_memory("node1") == CARD_MIB
        stored = [recorder.stored(p["metadata"]["uid"]).found for p in pods]
        assert stored.count(True) == 1
        winner = pods[stored.index(True)]
        won = next(r for r in responses if r is not None and r.reason == "Scheduled")
        assert won.annotations["hami.io/vgpu-devices-allocated"] == "GPU-0,NVIDIA,12288,0:;"
        # Free the card for the next round.
        recorder.stub.ForgetPod(
            usage_pb2.ForgetPodRequest(pod_uid=winner["metadata"]["uid"]), timeout=RPC_TIMEOUT_S
        )


# -- a deterministic lost race -----------------------------------------------------------------


class StaleRecorder(RecorderClient):
    """Takes its first snapshot, then lets the rival reserve, then answers with that (stale)
    snapshot; with ``always_stale`` every later snapshot is the same stale one."""

    def __init__(self, target: str, rival: Callable[[], None], *, always_stale: bool) -> None:
        super().__init__(grpc.insecure_channel(target), target)
        self._rival = rival
        self._always_stale = always_stale
        self._stale: Snapshot | None = None
        self.snapshots = 0

    def snapshot(
        self, node_names: Sequence[str], namespace: str, timeout_s: float
    ) -> Snapshot:
        self.snapshots += 1
        if self._stale is None:
            self._stale = super().snapshot(node_names, namespace, timeout_s)
            self._rival()
            return self._stale
        if self._always_stale:
            return self._stale
        return super().snapshot(node_names, namespace, timeout_s)


@pytest.mark.parametrize(
    "always_stale, want_reason, want_snapshots",
    [(False, "NoNodeFits", 2), (True, "ReservationConflict", 3)],
    ids=["fresh read after the refusal finds no room", "every attempt refused"],
)
def test_lost_reservation_is_retried_on_fresh_usage(
    recorder: Recorder,
    start_scheduler: StartScheduler,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
    always_stale: bool,
    want_reason: str,
    want_snapshots: int,
) -> None:
    half_full_card(recorder)
    rival_scheduler = start_scheduler()
    rival = half_card_pod("rival")

    def rival_reserves() -> None:
        assert rival_scheduler.filter(rival, ["node1"]).reason == "Scheduled"

    client = StaleRecorder(recorder.target, rival_reserves, always_stale=always_stale)
    stub = serve_placer(PodPlacer(client, reserve_attempts=3))
    pod = half_card_pod("loser")

    response = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=["node1"]),
        timeout=RPC_TIMEOUT_S,
    )
    client.close()

    assert response.reason == want_reason, response.message
    assert client.snapshots == want_snapshots
    assert response.node_name == "" and not response.annotations and not response.reserved
    if want_reason == "NoNodeFits":
        assert dict(response.failed_nodes) == {"node1": "1/1 CardInsufficientMemory"}
    else:
        assert "CardInsufficientMemory" in response.message
        assert "3 time(s)" in response.message
    assert recorder.node_memory("node1") == CARD_MIB
    assert recorder.stored(rival["metadata"]["uid"]).found
    assert not recorder.stored(pod["metadata"]["uid"]).found


def test_a_node_whose_inventory_changed_before_reserve_is_read_again(
    recorder: Recorder,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-0", memory_mib=CARD_MIB)])

    def device_plugin_re_registers() -> None:
        # The card the first snapshot showed is gone: the fit's GPU-0 grant names no device.
        recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])

    client = StaleRecorder(recorder.target, device_plugin_re_registers, always_stale=False)
    stub = serve_placer(PodPlacer(client, reserve_attempts=3))
    pod = half_card_pod("moved")

    response = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=["node1"]),
        timeout=RPC_TIMEOUT_S,
    )
    client.close()

    # Refused as a lost race (not INVALID_ARGUMENT to the caller), read again, placed.
    assert response.reason == "Scheduled", response.message
    assert client.snapshots == 2
    assert response.annotations["hami.io/vgpu-devices-allocated"] == "GPU-1,NVIDIA,12288,0:;"
    assert recorder.node_memory("node1") == HALF_MIB


class RefusingRecorder(RecorderClient):
    """Refuses every Reserve on the nodes of ``refuse`` as NodeChanged (what the scheduler
    makes of an INVALID_ARGUMENT for grants fitted on the recorder's own state), without
    asking the recorder; counts the Reserves each node was sent."""

    def __init__(self, target: str, refuse: frozenset[str]) -> None:
        super().__init__(grpc.insecure_channel(target), target)
        self._refuse = refuse
        self.reserves: dict[str, int] = {}

    def reserve(self, pod: Any, node_name: str, *args: Any, **kwargs: Any) -> Reservation:
        self.reserves[node_name] = self.reserves.get(node_name, 0) + 1
        if node_name in self._refuse:
            return Reservation(
                reserved=False,
                reason="NodeChanged",
                message="the recorder refused the grants: invalid",
            )
        return super().reserve(pod, node_name, *args, **kwargs)


@pytest.mark.parametrize(
    ("refused", "want_reason", "want_node", "want_failed"),
    [
        ({"busy"}, "Scheduled", "idle", {}),
        ({"busy", "idle"}, "NoNodeFits", "", {"busy": "NodeChanged", "idle": "NodeChanged"}),
    ],
    ids=["the preferred node keeps refusing: placed on the other",
         "every node keeps refusing: no node fits, no rival blamed"],
)
def test_a_node_refused_as_changed_but_unchanged_is_left_out_of_the_next_attempt(
    recorder: Recorder,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
    refused: set[str],
    want_reason: str,
    want_node: str,
    want_failed: dict[str, str],
) -> None:
    """Binpack prefers "busy" (a quarter of its card used). Its Reserve is refused as
    NodeChanged; read again, it has not changed, so the same fit would be refused again: it
    is left out, and the next attempt places the pod on "idle" (once tried on "busy", where
    it once tried every attempt and answered ReservationConflict blaming another scheduler)."""
    recorder.register_node("busy", [gpu_device("GPU-busy", memory_mib=CARD_MIB)])
    recorder.register_node("idle", [gpu_device("GPU-idle", memory_mib=CARD_MIB)])
    recorder.record(bound_pod("resident", "busy", allocation([("GPU-busy", 6144, 0)]),
                              apps=[app_container("main", gpumem=6144)]))
    client = RefusingRecorder(recorder.target, frozenset(refused))
    stub = serve_placer(PodPlacer(client, reserve_attempts=3))
    pod = half_card_pod("placed")

    response = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=["busy", "idle"]),
        timeout=RPC_TIMEOUT_S,
    )
    client.close()

    assert (response.reason, response.node_name) == (want_reason, want_node), response.message
    assert client.reserves.get("busy") == 1
    assert dict(response.failed_nodes) == want_failed
    assert "another scheduler" not in response.message
    assert recorder.stored(pod["metadata"]["uid"]).found == (want_reason == "Scheduled")
