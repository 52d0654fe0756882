"""One pod, two Filters at the same moment on two scheduler replicas: every answer is what the
recorder stores, and a pod deleted while it is being placed is never reserved.

The first tests are real servers and many pairs: a recorder, two scheduler servers reading
from it (with their WatchUsage node caches, and without), and for each pair one pod sent to
both replicas behind a barrier. A Scheduled answer must name the node and exactly the cards the
recorder stores for the pod; the other answer is the same placement (the two Filters did not
overlap: the second filtered the pod again) or ReservationConflict, which reserves nothing and
names where the first one placed it. Before Reserve stated the reservation it replaces, the
second Reserve silently replaced the first, and both answered Scheduled on different cards.

The others make each race deterministic with a recorder client that lets the rival act
between the Filter's read and its Reserve.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import scheduler_pb2, scheduler_pb2_grpc, usage_pb2
from services.scheduler.node_cache import Candidates, NodeCache
from services.scheduler.placer import PodPlacer
from services.scheduler.recorder_client import RecorderClient
from tests.scheduler.conftest import NS, RPC_TIMEOUT_S, Recorder, StartScheduler
from tests.support.pods import app_container, gpu_device, init_container, kube_pod, to_json

Json = dict[str, Any]
PAIRS = 40
SPREAD = {"hami.io/gpu-scheduler-policy": "spread", "hami.io/node-scheduler-policy": "spread"}


def cluster(recorder: Recorder) -> list[str]:
    """Three nodes of four 24 GiB cards: room for every pod of the test."""
    names = [f"node{n}" for n in range(3)]
    for name in names:
        recorder.register_node(
            name, [gpu_device(f"{name}-GPU-{i}", memory_mib=24576, index=i) for i in range(4)]
        )
    return names


def pair_pod(index: int) -> Json:
    """Spread over nodes and cards: a Filter that sees its rival's reservation places the pod
    elsewhere, so two stored placements would differ."""
    init = [init_container("fetch", gpumem=1000 + index % 3 * 100)] if index % 2 else []
    return kube_pod(
        f"pair-{index}", namespace=NS, annotations=SPREAD, init=init,
        apps=[app_container("main", gpumem=900 + index % 5 * 10)],
    )


def both_at_once(schedulers: Sequence[Any], pod: Json,
                 names: Sequence[str]) -> list[scheduler_pb2.FilterResponse]:
    responses: list[scheduler_pb2.FilterResponse | None] = [None, None]
    barrier = threading.Barrier(2)

    def run(index: int) -> None:
        barrier.wait()
        responses[index] = schedulers[index].filter(pod, names)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(r is not None for r in responses)
    return [r for r in responses if r is not None]


def granted(response: scheduler_pb2.FilterResponse) -> dict[str, int]:
    """Memory per card of a Scheduled answer, per card as the recorder folds it (the pods
    here have at most one init container and one app, so a card holds their max)."""
    per_card: dict[str, int] = {}
    for entry in response.container_grants:
        for grant in entry.grants:
            per_card[grant.uuid] = max(per_card.get(grant.uuid, 0), grant.memory_mib)
    return per_card


def assert_answers_are_what_is_stored(recorder: Recorder, pod: Json,
                                      responses: Sequence[scheduler_pb2.FilterResponse]) -> None:
    stored = recorder.stored(pod["metadata"]["uid"])
    scheduled = [r for r in responses if r.reason == "Scheduled"]
    others = [r for r in responses if r.reason != "Scheduled"]
    assert stored.found, [r.message for r in responses]
    assert scheduled, [r.message for r in responses]
    for answer in scheduled:
        assert answer.node_name == stored.node_name, (answer.message, stored)
        assert granted(answer) == {u.uuid: u.memory_mib for u in stored.stored}, answer.message
        assert {u.uuid: u.memory_mib for u in answer.reserved} == granted(answer)
    for answer in others:
        assert answer.reason == "ReservationConflict", answer.message
        assert answer.node_name == "" and not answer.annotations and not answer.reserved
        assert "another Filter" in answer.message and stored.node_name in answer.message


@pytest.mark.parametrize("node_cache", ["watch", "off"])
def test_two_replicas_filtering_one_pod_at_once_answer_what_is_stored(
    recorder: Recorder, start_scheduler: StartScheduler, node_cache: str
) -> None:
    names = cluster(recorder)
    schedulers = [start_scheduler(node_cache=node_cache), start_scheduler(node_cache=node_cache)]
    outcomes: list[tuple[str, ...]] = []

    for index in range(PAIRS):
        pod = pair_pod(index)
        responses = both_at_once(schedulers, pod, names)
        assert_answers_are_what_is_stored(recorder, pod, responses)
        outcomes.append(tuple(sorted(r.reason for r in responses)))

        # The same pod filtered again by both at once: a re-filter race, the same invariant.
        again = both_at_once(schedulers, pod, names)
        assert_answers_are_what_is_stored(recorder, pod, again)
        outcomes.append(tuple(sorted(r.reason for r in again)))

    # Charged once per pod, whatever the answers were.
    total = sum(recorder.node_memory(name) for name in names)
    expected = 0
    for index in range(PAIRS):
        stored = recorder.stored(pair_pod(index)["metadata"]["uid"])
        expected += sum(u.memory_mib for u in stored.stored)
    assert total == expected
    assert len(outcomes) == 2 * PAIRS


# -- deterministic races ------------------------------------------------------------------------


class RivalFirst(RecorderClient):
    """A recorder client that lets ``rival`` act right after the Filter's first read (its
    snapshot), before the Filter reserves."""

    def __init__(self, target: str, rival: Callable[[], None]) -> None:
        super().__init__(grpc.insecure_channel(target), target)
        self._rival: Callable[[], None] | None = rival

    def snapshot(self, node_names: Sequence[str], namespace: str, timeout_s: float) -> Any:
        taken = super().snapshot(node_names, namespace, timeout_s)
        rival, self._rival = self._rival, None
        if rival is not None:
            rival()
        return taken


class RivalAfterCacheRead(NodeCache):
    """A node cache that lets ``rival`` act right after the Filter's first read of the copy
    (the optimistic path: no read of what is stored; Reserve states "nothing")."""

    rival: Callable[[], None] | None = None

    def candidates(self, *args: Any, **kwargs: Any) -> Candidates:
        taken = super().candidates(*args, **kwargs)
        rival, self.rival = self.rival, None
        if rival is not None:
            rival()
        return taken


PlacerWith = Callable[[Recorder, Callable[[], None], str], PodPlacer]


@pytest.fixture
def placer_with() -> Iterator[PlacerWith]:
    """Placers whose first read is followed by ``rival``: read directly ("direct"), or from a
    node cache fed by the recorder ("cache"); closed after the test."""
    made: list[tuple[RecorderClient, NodeCache | None]] = []

    def make(recorder: Recorder, rival: Callable[[], None], reads: str) -> PodPlacer:
        if reads == "direct":
            direct = RivalFirst(recorder.target, rival)
            made.append((direct, None))
            return PodPlacer(direct)
        client = RecorderClient(grpc.insecure_channel(recorder.target), recorder.target)
        cache = RivalAfterCacheRead(client, grpc.insecure_channel(recorder.target)).start()
        made.append((client, cache))
        assert cache.wait_for_revision(recorder.app.store.revision, RPC_TIMEOUT_S)
        cache.rival = rival
        return PodPlacer(client, node_cache=cache)

    yield make
    for client, cache in made:
        if cache is not None:
            cache.close()
        client.close()


def filter_through(stub: scheduler_pb2_grpc.SchedulerStub, pod: Json,
                   names: Sequence[str]) -> scheduler_pb2.FilterResponse:
    response: scheduler_pb2.FilterResponse = stub.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=list(names)),
        timeout=RPC_TIMEOUT_S,
    )
    return response


@pytest.mark.parametrize("reads", ["direct", "cache"])
@pytest.mark.parametrize("refilter", [False, True], ids=["first Filter", "re-filter"])
def test_the_filter_that_loses_to_a_rival_for_the_same_pod_reserves_nothing(
    recorder: Recorder,
    start_scheduler: StartScheduler,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
    placer_with: PlacerWith,
    refilter: bool,
    reads: str,
) -> None:
    names = cluster(recorder)
    rival_scheduler = start_scheduler()
    pod = pair_pod(7)
    if refilter:
        assert rival_scheduler.filter(pod, names).reason == "Scheduled"
    rival_answers: list[scheduler_pb2.FilterResponse] = []
    stub = serve_placer(placer_with(
        recorder, lambda: rival_answers.append(rival_scheduler.filter(pod, names)), reads
    ))

    response = filter_through(stub, pod, names)

    (rival,) = rival_answers
    assert rival.reason == "Scheduled", rival.message
    assert response.reason == "ReservationConflict", response.message
    assert f"placed it on {rival.node_name}" in response.message
    assert response.node_name == "" and not response.reserved
    assert_answers_are_what_is_stored(recorder, pod, [rival, response])


@pytest.mark.parametrize("reads", ["direct", "cache"])
@pytest.mark.parametrize("refilter", [False, True], ids=["first Filter", "re-filter"])
def test_a_pod_deleted_while_it_is_being_placed_is_not_reserved(
    recorder: Recorder,
    start_scheduler: StartScheduler,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
    placer_with: PlacerWith,
    refilter: bool,
    reads: str,
) -> None:
    names = cluster(recorder)
    pod = pair_pod(3)
    uid = pod["metadata"]["uid"]
    if refilter:
        assert start_scheduler().filter(pod, names).reason == "Scheduled"

    def informer_deletes() -> None:
        recorder.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S)

    stub = serve_placer(placer_with(recorder, informer_deletes, reads))

    response = filter_through(stub, pod, names)

    assert response.reason == "PodForgotten", response.message
    assert "deleted" in response.message and "PodForgotten" in response.message
    assert response.node_name == "" and not response.annotations and not response.reserved
    assert not recorder.stored(uid).found
    assert sum(recorder.node_memory(name) for name in names) == 0


@pytest.mark.parametrize("reads", ["direct", "cache"])
def test_a_refilter_that_finds_no_node_releases_only_the_reservation_it_read(
    recorder: Recorder,
    start_scheduler: StartScheduler,
    serve_placer: Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub],
    placer_with: PlacerWith,
    reads: str,
) -> None:
    names = cluster(recorder)
    rival_scheduler = start_scheduler()
    pod = pair_pod(4)
    uid = pod["metadata"]["uid"]
    assert rival_scheduler.filter(pod, names).reason == "Scheduled"
    recorder.register_node("tiny", [gpu_device("tiny-GPU", memory_mib=10)])
    rival_answers: list[scheduler_pb2.FilterResponse] = []
    stub = serve_placer(placer_with(
        recorder, lambda: rival_answers.append(rival_scheduler.filter(pod, names)), reads
    ))

    # This Filter only may use a node that cannot hold the pod: no node fits; it would release
    # the reservation it read, but the rival re-placed the pod meanwhile: that one stands.
    response = filter_through(stub, pod, ["tiny"])

    (rival,) = rival_answers
    assert rival.reason == "Scheduled"
    assert response.reason == "ReservationConflict", response.message
    stored = recorder.stored(uid)
    assert stored.found and stored.node_name == rival.node_name
    assert granted(rival) == {u.uuid: u.memory_mib for u in stored.stored}
