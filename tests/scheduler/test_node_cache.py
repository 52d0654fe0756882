"""HAMI_ACCOUNTING_NODE_CACHE=watch: the scheduler's node states fed by WatchUsage.

The cache follows registrations, recorded and forgotten pods without reading node usage per
Filter; it reads directly what it cannot answer for (a stream that cannot connect, a candidate
the recorder does not know — once); a stale copy costs a refused reservation and a direct read
of that node, never a double allocation; a dead stream makes Filter read directly (and fail
closed when the recorder is gone), and the cache comes back with the recorder.

Each test builds its placer by hand around a ``CountingRecorder``, so it can tell which node
names were read with GetNodeUsage. Nothing here waits for a fixed time: waits poll for a
condition with a generous limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from accounting.model import Device
from hami.accounting.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.common.config import CommonConfig
from services.common.convert import device_to_pb
from services.scheduler.config import SchedulerConfig
from services.scheduler.node_cache import NodeCache
from services.scheduler.placer import PodPlacer
from services.scheduler.recorder_client import RecorderClient, Snapshot
from services.usage.__main__ import UsageRecorder
from services.usage.__main__ import start as start_usage_recorder
from services.usage.config import UsageConfig
from tests.scheduler.conftest import (
    NS,
    RPC_TIMEOUT_S,
    GatedCache,
    Recorder,
    StartScheduler,
    bound_pod,
    free_port,
    local_common,
)
from tests.support.pods import allocation, app_container, gpu_device, kube_pod, to_json

Json = dict[str, Any]
CARD_MIB = 24576
HALF_MIB = 12288
WAIT_S = 10.0
ServePlacer = Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub]


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def pod_of(name: str, mib: int) -> Json:
    return kube_pod(name, namespace=NS, apps=[app_container("main", gpumem=mib)])


def filter_pod(stub: scheduler_pb2_grpc.SchedulerStub, pod: Json,
               nodes: Sequence[str]) -> scheduler_pb2.FilterResponse:
    response: scheduler_pb2.FilterResponse = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=list(nodes)),
        timeout=RPC_TIMEOUT_S,
    )
    return response


def used_mib(cache: NodeCache, node: str) -> int:
    state = cache.cached()[node]
    assert state is not None
    return sum(device.memory_used_mib for device in state.devices)


class CountingRecorder(RecorderClient):
    """A recorder client that remembers which node names each direct snapshot read."""

    def __init__(self, target: str) -> None:
        super().__init__(grpc.insecure_channel(target), target)
        self.node_reads: list[tuple[str, ...]] = []

    def snapshot(self, node_names: Sequence[str], namespace: str, timeout_s: float, *,
                 quota: bool = True) -> Snapshot:
        self.node_reads.append(tuple(node_names))
        return super().snapshot(node_names, namespace, timeout_s, quota=quota)


CacheFactory = Callable[..., tuple[NodeCache, CountingRecorder, scheduler_pb2_grpc.SchedulerStub]]


@pytest.fixture
def cached_placer(serve_placer: ServePlacer) -> Iterator[CacheFactory]:
    """Builds (cache, counting recorder client, Filter stub) for a recorder address."""
    made: list[tuple[NodeCache, CountingRecorder]] = []

    def make(target: str, *, watch_target: str | None = None, cache_class: type[NodeCache] =
             NodeCache, reserve_attempts: int = 3) -> tuple[
                 NodeCache, CountingRecorder, scheduler_pb2_grpc.SchedulerStub]:
        client = CountingRecorder(target)
        cache = cache_class(client, grpc.insecure_channel(watch_target or target)).start()
        made.append((cache, client))
        placer = PodPlacer(client, reserve_attempts=reserve_attempts, node_cache=cache)
        return cache, client, serve_placer(placer)

    yield make
    for cache, client in made:
        if isinstance(cache, GatedCache):
            cache.gate.set()
        cache.close()
        client.close()


def synced(cache: NodeCache, recorder: Recorder) -> None:
    """Waits until the cache has applied everything the recorder acknowledged so far."""
    revision = recorder.app.store.revision
    assert cache.wait_for_revision(revision, WAIT_S), f"cache never reached revision {revision}"


# -- following the recorder --------------------------------------------------------------------


def test_the_cache_follows_registrations_recorded_and_forgotten_pods(
    recorder: Recorder, cached_placer: CacheFactory
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    cache, client, stub = cached_placer(recorder.target)
    synced(cache, recorder)

    first = filter_pod(stub, pod_of("first", HALF_MIB), ["node1"])
    assert first.reason == "Scheduled", first.message
    # Node usage and the namespace quota came from the cache: nothing was read directly.
    assert client.node_reads == []

    # The informer records a pod that takes the rest of the card.
    recorder.record(bound_pod("resident", "node1", allocation([("GPU-1", HALF_MIB, 0)]),
                              apps=[app_container("main", gpumem=HALF_MIB)]))
    synced(cache, recorder)
    assert used_mib(cache, "node1") == CARD_MIB
    full = filter_pod(stub, pod_of("second", HALF_MIB), ["node1"])
    assert full.reason == "NoNodeFits", full.message
    assert dict(full.failed_nodes) == {"node1": "1/1 CardInsufficientMemory"}

    recorder.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-team-a-resident"),
                            timeout=RPC_TIMEOUT_S)
    synced(cache, recorder)
    assert used_mib(cache, "node1") == HALF_MIB
    assert filter_pod(stub, pod_of("second", HALF_MIB), ["node1"]).reason == "Scheduled"

    # A new node and a new inventory for node1 (a bigger card) arrive as NODE_REGISTERED.
    recorder.register_node("node2", [gpu_device("GPU-2", memory_mib=CARD_MIB)])
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=2 * CARD_MIB)])
    synced(cache, recorder)
    node1 = cache.cached()["node1"]
    assert node1 is not None and node1.devices[0].device.memory_total_mib == 2 * CARD_MIB
    # Binpack: node1 holds 24576 of 49152, node2 nothing; the pod joins node1.
    third = filter_pod(stub, pod_of("third", HALF_MIB), ["node2", "node1"])
    assert (third.reason, third.node_name) == ("Scheduled", "node1"), third.message
    assert recorder.node_memory("node1") == CARD_MIB + HALF_MIB
    # The only node read confirmed the cache's "no node fits" for the second pod.
    assert [names for names in client.node_reads if names] == [("node1",)], client.node_reads


def test_an_unregistered_candidate_is_read_once_until_it_registers(
    recorder: Recorder, cached_placer: CacheFactory
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=HALF_MIB)])
    cache, client, stub = cached_placer(recorder.target)
    synced(cache, recorder)

    first = filter_pod(stub, pod_of("a", HALF_MIB), ["ghost", "node1"])
    assert dict(first.failed_nodes) == {"ghost": "node unregistered"}
    synced(cache, recorder)  # the copy shows the first pod on node1
    second = filter_pod(stub, pod_of("b", HALF_MIB), ["ghost", "node1"])
    # node1 is full now and ghost is still unknown, both answered from the cache.
    assert dict(second.failed_nodes) == {
        "ghost": "node unregistered", "node1": "1/1 CardInsufficientMemory"}
    # The last read confirmed the cache's "no node fits" directly.
    assert client.node_reads == [("ghost",), ("ghost", "node1")]

    # Registering the node replaces the "not registered" answer through its event.
    recorder.register_node("ghost", [gpu_device("GPU-g", memory_mib=CARD_MIB)])
    synced(cache, recorder)
    third = filter_pod(stub, pod_of("b", HALF_MIB), ["ghost", "node1"])
    assert (third.reason, third.node_name) == ("Scheduled", "ghost"), third.message
    assert client.node_reads[2:] == []


# -- staleness ---------------------------------------------------------------------------------


def test_a_stale_cache_costs_a_refused_reservation_and_a_direct_read_never_a_double_charge(
    recorder: Recorder, cached_placer: CacheFactory, start_scheduler: StartScheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    recorder.record(bound_pod("resident", "node1", allocation([("GPU-1", HALF_MIB, 0)]),
                              apps=[app_container("main", gpumem=HALF_MIB)]))
    cache, client, stub = cached_placer(recorder.target, cache_class=GatedCache)
    assert isinstance(cache, GatedCache)
    synced(cache, recorder)
    rival = start_scheduler()

    cache.gate.clear()  # this scheduler stops seeing changes
    assert rival.filter(pod_of("rival", HALF_MIB), ["node1"]).reason == "Scheduled"
    assert used_mib(cache, "node1") == HALF_MIB  # stale: the rival's half is not there

    response = filter_pod(stub, pod_of("loser", HALF_MIB), ["node1"])

    # The stale copy said it fits; Reserve refused; node1 was read directly; no room.
    assert response.reason == "NoNodeFits", response.message
    assert dict(response.failed_nodes) == {"node1": "1/1 CardInsufficientMemory"}
    assert client.node_reads == [("node1",)]
    assert recorder.node_memory("node1") == CARD_MIB
    assert not recorder.stored("uid-team-a-loser").found
    cache.gate.set()
    synced(cache, recorder)
    assert used_mib(cache, "node1") == CARD_MIB


def test_a_refilter_reads_the_node_it_is_stored_on_directly(
    recorder: Recorder, cached_placer: CacheFactory
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    cache, client, stub = cached_placer(recorder.target, cache_class=GatedCache)
    assert isinstance(cache, GatedCache)
    synced(cache, recorder)
    pod = pod_of("whole-card", CARD_MIB)
    assert filter_pod(stub, pod, ["node1"]).reason == "Scheduled"
    synced(cache, recorder)
    assert used_mib(cache, "node1") == CARD_MIB

    cache.gate.clear()  # the re-filter's reservation will not reach the copy
    again = filter_pod(stub, pod, ["node1"])

    # The first Filter reads nothing directly. The second finds node1 full (its own charge),
    # confirms it with a direct read, then learns the pod holds the card since before it
    # began (its own earlier reservation): it reads node1 again and fits the pod there
    # without its own charge.
    assert again.reason == "Scheduled", again.message
    assert client.node_reads == [("node1",), ("node1",)]
    assert recorder.node_memory("node1") == CARD_MIB


# -- the stream down ---------------------------------------------------------------------------


def test_a_stream_that_cannot_connect_leaves_filter_on_direct_reads(
    recorder: Recorder, cached_placer: CacheFactory
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    # Unary calls reach the recorder; the watch stream dials a port nobody listens on.
    cache, client, stub = cached_placer(
        recorder.target, watch_target=f"127.0.0.1:{free_port()}")

    first = filter_pod(stub, pod_of("a", HALF_MIB), ["node1", "ghost"])
    second = filter_pod(stub, pod_of("b", CARD_MIB), ["node1", "ghost"])

    assert not cache.live and cache.cached() == {}
    assert first.reason == "Scheduled", first.message
    assert second.reason == "NoNodeFits"
    assert dict(second.failed_nodes) == {
        "ghost": "node unregistered", "node1": "1/1 CardInsufficientMemory"}
    assert client.node_reads == [("node1", "ghost"), ("node1", "ghost")]


def one_card_inventory(uuid: str) -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(
        devices=[device_to_pb(Device(uuid, "NVIDIA A10", 0, 10, CARD_MIB, 100))])


def start_recorder_at(listen: str, data_dir: Path) -> UsageRecorder:
    common = CommonConfig(listen_addr=listen, metrics_addr=None, tls=None, log_level="INFO")
    return start_usage_recorder(
        UsageConfig(common=common, data_dir=data_dir, identity="test"), max_workers=8)


def test_filter_reads_directly_while_the_stream_is_down_and_the_cache_comes_back(
    tmp_path: Path, cached_placer: CacheFactory
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    first = start_recorder_at(listen, tmp_path / "usage")
    second: UsageRecorder | None = None
    try:
        with grpc.insecure_channel(listen) as channel:
            usage_pb2_grpc.UsageRecorderStub(channel).RegisterNode(
                usage_pb2.RegisterNodeRequest(
                    node_name="node1", inventory=one_card_inventory("GPU-1")),
                timeout=RPC_TIMEOUT_S)
        cache, client, stub = cached_placer(listen)
        wait_until(lambda: "node1" in cache.cached(), "the initial state")
        wait_until(lambda: cache.complete, "the initial state to be complete")

        first.stop(grace_s=0)
        wait_until(lambda: not cache.live, "the stream to be noticed down")
        assert not cache.complete
        # The copy is dropped, not served stale: Filter reads directly and fails closed.
        with pytest.raises(grpc.RpcError) as caught:
            filter_pod(stub, pod_of("a", HALF_MIB), ["node1"])
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert cache.cached() == {}

        # The same recorder comes back (same journal): the stream reconnects with its state.
        second = start_recorder_at(listen, tmp_path / "usage")
        wait_until(lambda: cache.live and "node1" in cache.cached(), "the stream to come back")
        wait_until(lambda: cache.complete, "the new initial state to be complete")
        reads_before = len(client.node_reads)
        response = filter_pod(stub, pod_of("a", HALF_MIB), ["node1"])
        assert response.reason == "Scheduled", response.message
        assert client.node_reads[reads_before:] == []
    finally:
        for started in (first, second):
            if started is not None and not started.handle.stopped:
                started.stop(grace_s=0)


# -- configuration -----------------------------------------------------------------------------


def test_node_cache_off_reads_every_candidate_directly(
    recorder: Recorder, start_scheduler: StartScheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    scheduler = start_scheduler(node_cache="off")

    assert scheduler.app.node_cache is None
    assert scheduler.filter(pod_of("a", HALF_MIB), ["node1"]).reason == "Scheduled"
    assert scheduler.filter(pod_of("b", CARD_MIB), ["node1"]).reason == "NoNodeFits"


def test_the_daemon_starts_its_cache_by_default(
    recorder: Recorder, start_scheduler: StartScheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-1", memory_mib=CARD_MIB)])
    scheduler = start_scheduler()
    cache = scheduler.app.node_cache

    assert SchedulerConfig(common=local_common()).node_cache == "watch"
    assert cache is not None
    wait_until(lambda: "node1" in cache.cached(), "the daemon's cache to fill")
    scheduler.stop()
    assert not cache.live
