"""Scheduler.Filter through gRPC against a real usage recorder: the design cases and HAMi's
scheduling vectors S1–S10 (docs/design.md §9), the padding and #3052 regressions, re-filters,
and the answers that are not placements (no GPU, no node, unknown nodes).

Every test runs a real recorder (server, store, SQLite journal) and a real scheduler server on
127.0.0.1:0. Cluster state is built the way it arrives in production: nodes through
RegisterNode (the device plugin's register annotation), pods HAMi already placed through
RecordPod (the informer). After each Filter the test reads back what the recorder stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from accounting.kube import pod_json as kube_pod_parser
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import scheduler_pb2, types_pb2
from services.scheduler import metrics as scheduler_metrics
from tests.scheduler.conftest import (
    FIXED_UNIX_S,
    NS,
    Recorder,
    Scheduler,
    StartScheduler,
    bound_pod,
)
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_pod,
    sidecar_container,
)

Json = dict[str, Any]

CARD_MIB = 24576
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"
ENCODINGS = ("kubernetes_pod_json", "typed")


def seed_pod(name: str = "trainer", *, annotations: Mapping[str, str] | None = None) -> Json:
    """The second init-container case (docs/design.md §9): init convert-weights 20480 MiB,
    app server 10240 MiB."""
    return kube_pod(
        name,
        namespace=NS,
        init=[init_container("convert-weights", gpumem=20480)],
        apps=[app_container("server", gpumem=10240)],
        annotations=annotations,
    )


def one_card_node(recorder: Recorder, node: str = "node1", uuid: str = "GPU-0",
                  memory_mib: int = CARD_MIB) -> None:
    recorder.register_node(node, [gpu_device(uuid, memory_mib=memory_mib)])


Positions = list[tuple[str, int, list[tuple[str, int, int]]]]
"""(container name, class, [(uuid, memory MiB, cores)]) per container position."""


def grants_of(response: scheduler_pb2.FilterResponse) -> Positions:
    return [
        (
            entry.container_name,
            entry.container_class,
            [(g.uuid, g.memory_mib, g.core_percent) for g in entry.grants],
        )
        for entry in response.container_grants
    ]


def percentage_container(name: str, percent: int, cores: int) -> Json:
    """A container asking one GPU and a share of its memory (nvidia.com/gpumem-percentage)."""
    return {
        "name": name,
        "image": "busybox",
        "resources": {
            "limits": {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": str(percent),
                "nvidia.com/gpucores": str(cores),
            }
        },
    }


# -- the seed case -----------------------------------------------------------------------------


def test_seed_request_reads_as_20480_and_10240_mib_without_cores() -> None:
    # gpumem is set, so HAMi's webhook exclusive default (cores 100) does not apply: 0 cores.
    pod = kube_pod_parser.parse_pod(seed_pod(), (NVIDIA_RESOURCES,))
    requests = [(c.requests[0].memory_mib, c.requests[0].core_percent) for c in pod.containers]
    assert requests == [(20480, 0), (10240, 0)]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_seed_case_2_fits_one_24gi_card_and_records_the_peak(
    recorder: Recorder, scheduler: Scheduler, encoding: str
) -> None:
    one_card_node(recorder)

    response = scheduler.filter(seed_pod(), ["node1"], encoding=encoding)

    assert response.reason == "Scheduled", response.message
    assert response.node_name == "node1"
    assert dict(response.annotations) == {
        ALLOCATED: "GPU-0,NVIDIA,20480,0:;GPU-0,NVIDIA,10240,0:;",
        TO_ALLOCATE: "GPU-0,NVIDIA,20480,0:;GPU-0,NVIDIA,10240,0:;",
        VGPU_NODE: "node1",
        VGPU_TIME: str(FIXED_UNIX_S),
    }
    assert grants_of(response) == [
        ("convert-weights", types_pb2.CONTAINER_CLASS_INIT, [("GPU-0", 20480, 0)]),
        ("server", types_pb2.CONTAINER_CLASS_APP, [("GPU-0", 10240, 0)]),
    ]
    assert [(u.uuid, u.memory_mib, u.slots) for u in response.reserved] == [("GPU-0", 20480, 1)]
    assert dict(response.failed_nodes) == {}
    assert [(s.node_name, s.score) for s in response.scores] == [("node1", 0.0)]
    # What the recorder now charges: the peak, not 20480 + 10240.
    assert recorder.devices("node1")["GPU-0"].memory_used_mib == 20480
    assert recorder.namespace_used(NS) == 20480
    stored = recorder.stored("uid-team-a-trainer")
    assert stored.found and stored.node_name == "node1"


def test_two_nodes_binpack_takes_the_busier_node(recorder: Recorder, scheduler: Scheduler) -> None:
    one_card_node(recorder, "node-a", "GPU-a")
    one_card_node(recorder, "node-b", "GPU-b")
    recorder.record(bound_pod("other", "node-b", allocation([("GPU-b", 2048, 0)]),
                              apps=[app_container("main", gpumem=2048)]))

    response = scheduler.filter(seed_pod(), ["node-a", "node-b"])

    assert (response.reason, response.node_name) == ("Scheduled", "node-b")
    assert response.annotations[ALLOCATED] == "GPU-b,NVIDIA,20480,0:;GPU-b,NVIDIA,10240,0:;"
    assert response.annotations[TO_ALLOCATE] == response.annotations[ALLOCATED]
    assert response.annotations[VGPU_NODE] == "node-b"
    scores = {s.node_name: s.score for s in response.scores}
    assert scores["node-a"] == 0.0 and scores["node-b"] > 0.0
    assert grants_of(response) == [
        ("convert-weights", types_pb2.CONTAINER_CLASS_INIT, [("GPU-b", 20480, 0)]),
        ("server", types_pb2.CONTAINER_CLASS_APP, [("GPU-b", 10240, 0)]),
    ]
    assert recorder.node_memory("node-b") == 2048 + 20480
    assert recorder.node_memory("node-a") == 0


@pytest.mark.parametrize("how", ["pod annotation", "daemon config"])
def test_spread_takes_the_idler_node(
    recorder: Recorder, start_scheduler: StartScheduler, how: str
) -> None:
    one_card_node(recorder, "node-a", "GPU-a")
    one_card_node(recorder, "node-b", "GPU-b")
    recorder.record(bound_pod("other", "node-b", allocation([("GPU-b", 2048, 0)]),
                              apps=[app_container("main", gpumem=2048)]))
    if how == "pod annotation":
        scheduler = start_scheduler()
        pod = seed_pod(annotations={NODE_POLICY: "spread"})
    else:
        scheduler = start_scheduler(node_policy="spread")
        pod = seed_pod()

    response = scheduler.filter(pod, ["node-a", "node-b"])

    assert (response.reason, response.node_name) == ("Scheduled", "node-a")
    assert recorder.node_memory("node-a") == 20480


# -- HAMi's scheduling vectors and the sidecar document ----------------------------------------


@dataclass(frozen=True)
class Case:
    """One scheduling vector: cluster, already placed pods, the pod, and what must follow."""

    id: str
    nodes: Mapping[str, Sequence[Json]]
    pod: Json
    want_reason: str
    want_node: str = ""
    want_allocated: str = ""
    want_failed: Mapping[str, str] = field(default_factory=dict)
    want_device: Mapping[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)
    """(node, uuid) -> (memory MiB, cores, slots) the recorder reports after the Filter."""
    placed: Sequence[Json] = ()
    want_scores: Mapping[str, float] | None = None


def two_cards(node: str = "node1", memory_mib: int = 8000, *names: str) -> list[Json]:
    uuids = names or ("uuid1", "uuid2")
    return [gpu_device(uuid, memory_mib=memory_mib, index=i) for i, uuid in enumerate(uuids)]


BINPACK_GPU = {GPU_POLICY: "binpack"}

CASES = [
    Case(
        "S1 init 20480 and app 10240 fit one 24576 card with 20480 merged",
        {"node1": [gpu_device("GPU-0", memory_mib=24576)]},
        seed_pod(),
        "Scheduled",
        "node1",
        "GPU-0,NVIDIA,20480,0:;GPU-0,NVIDIA,10240,0:;",
        want_device={("node1", "GPU-0"): (20480, 0, 1)},
    ),
    Case(
        "S2 init and app share the same card under binpack",
        {"node1": two_cards()},
        kube_pod("s2", namespace=NS, annotations=BINPACK_GPU,
                 init=[init_container("init", gpumem=1000, gpucores=30)],
                 apps=[app_container("app", gpumem=1000, gpucores=30)]),
        "Scheduled",
        "node1",
        "uuid2,NVIDIA,1000,30:;uuid2,NVIDIA,1000,30:;",
        want_device={("node1", "uuid2"): (1000, 30, 1), ("node1", "uuid1"): (0, 0, 0)},
    ),
    Case(
        "S3 an init container asking two cards takes both, the app one of them",
        {"node1": two_cards()},
        kube_pod("s3", namespace=NS, annotations=BINPACK_GPU,
                 init=[init_container("init", gpus=2, gpumem=1000, gpucores=30)],
                 apps=[app_container("app", gpumem=1000, gpucores=30)]),
        "Scheduled",
        "node1",
        "uuid2,NVIDIA,1000,30:uuid1,NVIDIA,1000,30:;uuid2,NVIDIA,1000,30:;",
        want_device={("node1", "uuid2"): (1000, 30, 1), ("node1", "uuid1"): (1000, 30, 1)},
    ),
    Case(
        "S4 init needs more memory than any card has left",
        {"node1": two_cards()},
        kube_pod("s4", namespace=NS,
                 init=[init_container("init", gpumem=4000)],
                 apps=[app_container("app", gpumem=100)]),
        "NoNodeFits",
        want_failed={"node1": "2/2 CardInsufficientMemory"},
        placed=[
            bound_pod("fill-1", "node1", allocation([("uuid1", 7500, 0)]),
                      apps=[app_container("main", gpumem=7500)]),
            bound_pod("fill-2", "node1", allocation([("uuid2", 7500, 0)]),
                      apps=[app_container("main", gpumem=7500)]),
        ],
        want_device={("node1", "uuid1"): (7500, 0, 1), ("node1", "uuid2"): (7500, 0, 1)},
    ),
    Case(
        "S5 init needs more cores than any card has left",
        {"node1": two_cards()},
        kube_pod("s5", namespace=NS,
                 init=[init_container("init", gpumem=100, gpucores=30)],
                 apps=[app_container("app", gpumem=100, gpucores=10)]),
        "NoNodeFits",
        want_failed={"node1": "2/2 CardInsufficientCore"},
        placed=[
            bound_pod("fill-1", "node1", allocation([("uuid1", 100, 80)]),
                      apps=[app_container("main", gpumem=100, gpucores=80)]),
            bound_pod("fill-2", "node1", allocation([("uuid2", 100, 80)]),
                      apps=[app_container("main", gpumem=100, gpucores=80)]),
        ],
    ),
    Case(
        "S6 init 5000 declared before sidecar 8000 fits a 10000 card, stored 8000",
        {"node1": [gpu_device("GPU-0", memory_mib=10000)]},
        kube_pod("s6", namespace=NS,
                 init=[init_container("prep", gpumem=5000),
                       sidecar_container("proxy", gpumem=8000)],
                 apps=[app_container("main")]),
        "Scheduled",
        "node1",
        "GPU-0,NVIDIA,5000,0:;GPU-0,NVIDIA,8000,0:;;",
        want_device={("node1", "GPU-0"): (8000, 0, 1)},
    ),
    Case(
        "S7 sidecar 8000 declared before init 5000 needs 13000 of a 10000 card",
        {"node1": [gpu_device("GPU-0", memory_mib=10000)]},
        kube_pod("s7", namespace=NS,
                 init=[sidecar_container("proxy", gpumem=8000),
                       init_container("prep", gpumem=5000)],
                 apps=[app_container("main")]),
        "NoNodeFits",
        want_failed={"node1": "1/1 CardInsufficientMemory"},
        want_device={("node1", "GPU-0"): (0, 0, 0)},
    ),
    Case(
        "S8 init 5000, sidecar 3000, init 4000, app 1000 peak at 7000 of 7500",
        {"node1": [gpu_device("GPU-0", memory_mib=7500)]},
        kube_pod("s8", namespace=NS,
                 init=[init_container("a", gpumem=5000), sidecar_container("b", gpumem=3000),
                       init_container("c", gpumem=4000)],
                 apps=[app_container("app", gpumem=1000)]),
        "Scheduled",
        "node1",
        "GPU-0,NVIDIA,5000,0:;GPU-0,NVIDIA,3000,0:;GPU-0,NVIDIA,4000,0:;GPU-0,NVIDIA,1000,0:;",
        want_device={("node1", "GPU-0"): (7000, 0, 2)},
    ),
    Case(
        "S9 sidecar 4000 runs beside app 4000: 8000 does not fit 7500",
        {"node1": [gpu_device("GPU-0", memory_mib=7500)]},
        kube_pod("s9", namespace=NS,
                 init=[sidecar_container("proxy", gpumem=4000)],
                 apps=[app_container("app", gpumem=4000)]),
        "NoNodeFits",
        want_failed={"node1": "1/1 CardInsufficientMemory"},
    ),
    Case(
        "S10 binpack takes the node scoring 8.0 over 3.0 and the init lands on its free card",
        {
            "node1": two_cards("node1", 8000, "device1", "device2"),
            "node2": two_cards("node2", 8000, "device3", "device4"),
        },
        kube_pod("s10", namespace=NS, annotations=BINPACK_GPU,
                 init=[init_container("init", gpumem=5000, gpucores=20)],
                 apps=[app_container("app", gpumem=4000, gpucores=20)]),
        "Scheduled",
        "node2",
        "device3,NVIDIA,5000,20:;device3,NVIDIA,4000,20:;",
        placed=[
            bound_pod("used-1", "node1", allocation([("device1", 2000, 25)]),
                      apps=[app_container("main", gpumem=2000, gpucores=25)]),
            bound_pod("used-2", "node2", allocation([("device4", 6000, 75)]),
                      apps=[app_container("main", gpumem=6000, gpucores=75)]),
        ],
        want_device={("node2", "device3"): (5000, 20, 1), ("node2", "device4"): (6000, 75, 1),
                     ("node1", "device1"): (2000, 25, 1), ("node1", "device2"): (0, 0, 0)},
        want_scores={"node1": 3.0, "node2": 8.0},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_scheduling_vectors(recorder: Recorder, scheduler: Scheduler, case: Case) -> None:
    for node, gpus in case.nodes.items():
        recorder.register_node(node, gpus)
    for pod in case.placed:
        recorder.record(pod)

    response = scheduler.filter(case.pod, list(case.nodes))

    assert response.reason == case.want_reason, response.message
    assert response.node_name == case.want_node
    assert response.annotations.get(ALLOCATED, "") == case.want_allocated
    assert response.annotations.get(TO_ALLOCATE, "") == case.want_allocated
    assert dict(response.failed_nodes) == dict(case.want_failed)
    for (node, uuid), (memory_mib, cores, slots) in case.want_device.items():
        device = recorder.devices(node)[uuid]
        assert (device.memory_used_mib, device.cores_used, device.slots_used) == (
            memory_mib, cores, slots
        ), f"{node}/{uuid}"
    if case.want_scores is not None:
        assert {s.node_name: round(s.score, 6) for s in response.scores} == case.want_scores
    uid = case.pod["metadata"]["uid"]
    assert recorder.stored(uid).found == (case.want_reason == "Scheduled")
    if case.want_reason != "Scheduled":
        assert not response.annotations and not response.reserved
        assert case.want_failed[next(iter(case.want_failed))] in response.message


# -- regressions -------------------------------------------------------------------------------


def test_gpu_less_init_container_keeps_its_position(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    # HAMi v2.10.0 dropped the empty entry on model-typed nodes (#2899): the device plugin then
    # gave the app's GPU to the init container's name and the shrink dropped the app's usage.
    one_card_node(recorder)
    pod = kube_pod(
        "padded",
        namespace=NS,
        init=[init_container("fetch")],
        apps=[app_container("a", gpumem=2500, gpucores=25),
              app_container("b", gpumem=2500, gpucores=25)],
    )

    response = scheduler.filter(pod, ["node1"])

    assert response.reason == "Scheduled", response.message
    assert response.annotations[ALLOCATED] == ";GPU-0,NVIDIA,2500,25:;GPU-0,NVIDIA,2500,25:;"
    assert grants_of(response) == [
        ("fetch", types_pb2.CONTAINER_CLASS_INIT, []),
        ("a", types_pb2.CONTAINER_CLASS_APP, [("GPU-0", 2500, 25)]),
        ("b", types_pb2.CONTAINER_CLASS_APP, [("GPU-0", 2500, 25)]),
    ]
    # Both apps run at once: 5000 MiB, 50 cores, 2 slots (not an init peak of 2500).
    device = recorder.devices("node1")["GPU-0"]
    assert (device.memory_used_mib, device.cores_used, device.slots_used) == (5000, 50, 2)


@pytest.mark.parametrize("with_init", [False, True], ids=["two apps", "GPU-less init + two apps"])
def test_percentage_memory_is_checked_against_the_quota_with_real_classes(
    recorder: Recorder, scheduler: Scheduler, with_init: bool
) -> None:
    # A15 / #3052: Q 24000, one 40000-MiB GPU, two apps at 40% (16000 each) = 32000 > 24000.
    # HAMi counted the first app as init once a GPU-less init container was added, and let the
    # pod through at max(16000, 16000).
    one_card_node(recorder, memory_mib=40000)
    recorder.set_quota(NS, {"limits.nvidia.com/gpumem": 24000})
    pod = kube_pod(
        "percent",
        namespace=NS,
        init=[init_container("setup")] if with_init else [],
        apps=[percentage_container("a", 40, 10), percentage_container("b", 40, 10)],
    )

    response = scheduler.filter(pod, ["node1"])

    assert response.reason == "NoNodeFits", response.message
    assert dict(response.failed_nodes) == {"node1": "1/1 ResourceQuotaNotFit"}
    assert response.node_name == "" and not response.annotations
    assert recorder.node_memory("node1") == 0
    assert recorder.namespace_used(NS) == 0
    assert not recorder.stored("uid-team-a-percent").found


def test_percentage_memory_fits_a_quota_that_holds_the_real_card_share(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    one_card_node(recorder, memory_mib=40000)
    recorder.set_quota(NS, {"limits.nvidia.com/gpumem": 32000})
    pod = kube_pod(
        "percent",
        namespace=NS,
        init=[init_container("setup")],
        apps=[percentage_container("a", 40, 10), percentage_container("b", 40, 10)],
    )

    response = scheduler.filter(pod, ["node1"])

    assert response.reason == "Scheduled", response.message
    assert response.annotations[ALLOCATED] == ";GPU-0,NVIDIA,16000,10:;GPU-0,NVIDIA,16000,10:;"
    assert recorder.namespace_used(NS) == 32000


# -- re-filters --------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_refilter_of_the_same_pod_does_not_double_charge(
    recorder: Recorder, scheduler: Scheduler, encoding: str
) -> None:
    one_card_node(recorder)
    first = scheduler.filter(seed_pod(), ["node1"], encoding=encoding)
    # The pod's own 20480 must not count against it: 20480 + 20480 would not fit the card.
    second = scheduler.filter(seed_pod(), ["node1"], encoding=encoding)

    assert (first.reason, second.reason) == ("Scheduled", "Scheduled"), second.message
    assert second.annotations[ALLOCATED] == first.annotations[ALLOCATED]
    assert recorder.node_memory("node1") == 20480
    assert recorder.namespace_used(NS) == 20480


def test_refilter_that_no_longer_fits_releases_the_earlier_reservation(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    one_card_node(recorder)
    assert scheduler.filter(seed_pod(), ["node1"]).reason == "Scheduled"
    assert recorder.node_memory("node1") == 20480
    recorder.set_quota(NS, {"limits.nvidia.com/gpumem": 10000})

    response = scheduler.filter(seed_pod(), ["node1"])

    assert response.reason == "NoNodeFits", response.message
    assert dict(response.failed_nodes) == {"node1": "1/1 ResourceQuotaNotFit"}
    assert not recorder.stored("uid-team-a-trainer").found
    assert recorder.node_memory("node1") == 0
    assert recorder.namespace_used(NS) == 0


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_refilter_onto_other_nodes_moves_the_reservation(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    one_card_node(recorder, "node1", "GPU-1")
    one_card_node(recorder, "node2", "GPU-2")
    one_card_node(recorder, "small", "GPU-s", memory_mib=16384)
    assert scheduler.filter(seed_pod(), ["node1"]).node_name == "node1"

    moved = scheduler.filter(seed_pod(), ["node2"])
    assert moved.node_name == "node2"
    assert (recorder.node_memory("node1"), recorder.node_memory("node2")) == (0, 20480)

    refusals = _sample("hami_accounting_filter_node_refusals_total",
                       reason="CardInsufficientMemory")
    no_fits = _sample("hami_accounting_filter_duration_seconds_count", decision="no-fit")
    refused = scheduler.filter(seed_pod(), ["small"])
    assert refused.reason == "NoNodeFits"
    assert dict(refused.failed_nodes) == {"small": "1/1 CardInsufficientMemory"}
    # Counted by the reason's code, and timed under the Filter's decision.
    assert _sample("hami_accounting_filter_node_refusals_total",
                   reason="CardInsufficientMemory") == refusals + 1
    assert _sample("hami_accounting_filter_duration_seconds_count",
                   decision="no-fit") == no_fits + 1
    assert recorder.node_memory("node2") == 0
    assert not recorder.stored("uid-team-a-trainer").found


# -- answers that are not placements -----------------------------------------------------------


def test_pod_without_gpu_passes_through(recorder: Recorder, scheduler: Scheduler) -> None:
    one_card_node(recorder)
    pod = kube_pod("web", namespace=NS, init=[init_container("migrate")],
                   apps=[app_container("nginx")])

    response = scheduler.filter(pod, ["node1", "node2"])

    assert response.reason == "NoGpuRequest"
    assert response.node_name == ""  # the extender keeps every candidate node
    assert not response.annotations and not response.failed_nodes and not response.reserved
    assert grants_of(response) == [
        ("migrate", types_pb2.CONTAINER_CLASS_INIT, []),
        ("nginx", types_pb2.CONTAINER_CLASS_APP, []),
    ]
    assert not recorder.stored("uid-team-a-web").found


def test_unknown_nodes_are_failed_nodes(recorder: Recorder, scheduler: Scheduler) -> None:
    one_card_node(recorder)

    response = scheduler.filter(seed_pod(), ["ghost", "node1", "node1"])

    assert (response.reason, response.node_name) == ("Scheduled", "node1")
    assert dict(response.failed_nodes) == {"ghost": "node unregistered"}
    assert [s.node_name for s in response.scores] == ["node1"]


def test_only_unknown_nodes_is_no_node_fits(recorder: Recorder, scheduler: Scheduler) -> None:
    response = scheduler.filter(seed_pod(), ["ghost-b", "ghost-a"])

    assert response.reason == "NoNodeFits"
    assert dict(response.failed_nodes) == {
        "ghost-a": "node unregistered",
        "ghost-b": "node unregistered",
    }
    assert response.message == (
        "0/2 nodes fit: ghost-a: node unregistered; ghost-b: node unregistered"
    )


def test_no_node_fits_names_every_node(recorder: Recorder, scheduler: Scheduler) -> None:
    one_card_node(recorder, "node1", memory_mib=16384)
    one_card_node(recorder, "node2", "GPU-2", memory_mib=16384)

    response = scheduler.filter(seed_pod(), ["node1", "node2", "ghost"])

    assert response.reason == "NoNodeFits"
    assert dict(response.failed_nodes) == {
        "ghost": "node unregistered",
        "node1": "1/1 CardInsufficientMemory",
        "node2": "1/1 CardInsufficientMemory",
    }
    assert response.message.startswith("0/3 nodes fit: ghost: node unregistered; node1: ")
    assert [g.grants for g in response.container_grants] == [[], []]


# -- bad input ---------------------------------------------------------------------------------


def typed_seed() -> types_pb2.Pod:
    from services.common import convert

    return convert.pod_to_pb(kube_pod_parser.parse_pod(seed_pod(), (NVIDIA_RESOURCES,)))


def unclassified_pod() -> types_pb2.Pod:
    pod = typed_seed()
    pod.containers[0].container_class = types_pb2.CONTAINER_CLASS_UNSPECIFIED
    return pod


BAD_REQUESTS = [
    pytest.param(
        scheduler_pb2.FilterRequest(pod=typed_seed()),
        ["node_names: at least one candidate node is required"],
        id="no candidate node",
    ),
    pytest.param(
        scheduler_pb2.FilterRequest(node_names=["node1"]),
        ["pod_source: one of pod or kubernetes_pod_json is required"],
        id="no pod",
    ),
    pytest.param(
        scheduler_pb2.FilterRequest(pod=typed_seed(),
                                    node_names=[f"n{i}" for i in range(10_001)]),
        ["node_names: at most 10000 candidate nodes, got 10001"],
        id="more than 10000 candidates",
    ),
    pytest.param(
        scheduler_pb2.FilterRequest(pod=typed_seed(), node_names=["node1", "", "x" * 254]),
        ["node_names[1]: must not be empty", "node_names[2]: at most 253 characters"],
        id="empty and overlong node names",
    ),
    pytest.param(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=b"{not json", node_names=["node1"]),
        ["kubernetes_pod_json: not valid JSON"],
        id="pod JSON that is not JSON",
    ),
    pytest.param(
        scheduler_pb2.FilterRequest(pod=unclassified_pod()),
        ["pod.containers[0].container_class: must be set",
         "node_names: at least one candidate node is required"],
        id="every bad field at once",
    ),
]


@pytest.mark.parametrize("request_pb, want_parts", BAD_REQUESTS)
def test_bad_input_is_invalid_argument_naming_the_field(
    recorder: Recorder, scheduler: Scheduler, request_pb: scheduler_pb2.FilterRequest,
    want_parts: list[str],
) -> None:
    one_card_node(recorder)
    with pytest.raises(grpc.RpcError) as raised:
        scheduler.stub.Filter(request_pb, timeout=10)
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    for part in want_parts:
        assert part in error.details()
    assert recorder.node_memory("node1") == 0


# -- the recorder unreachable ------------------------------------------------------------------


def test_recorder_down_is_unavailable(start_scheduler: StartScheduler) -> None:
    from tests.scheduler.conftest import free_port

    address = f"127.0.0.1:{free_port()}"
    scheduler = start_scheduler(usage_addr=address)

    with pytest.raises(grpc.RpcError) as raised:
        scheduler.filter(seed_pod(), ["node1"])
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"usage recorder unavailable at {address}" in error.details()
    # A pod without a GPU needs nothing from the recorder.
    pass_through = scheduler.filter(kube_pod("web", apps=[app_container("nginx")]), ["node1"])
    assert pass_through.reason == "NoGpuRequest"


def test_recorder_that_never_answers_hits_the_deadline(start_scheduler: StartScheduler) -> None:
    import socket
    import time

    # A listener that never speaks HTTP/2: every call waits for its deadline.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        scheduler = start_scheduler(usage_addr=address, usage_timeout_ms=300)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            scheduler.filter(seed_pod(), ["node1"])
        elapsed_s = time.monotonic() - started
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "DEADLINE_EXCEEDED" in error.details()
    assert elapsed_s < 5.0


def test_large_candidate_lists_are_read_in_batches(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    # 1201 candidates: three GetNodeUsage batches; the one registered node is still found.
    one_card_node(recorder)
    ghosts = [f"ghost-{i:04d}" for i in range(1200)]

    response = scheduler.filter(seed_pod(), [*ghosts[:700], "node1", *ghosts[700:]])

    assert (response.reason, response.node_name) == ("Scheduled", "node1")
    assert len(response.failed_nodes) == 1200
    assert set(response.failed_nodes.values()) == {"node unregistered"}
    assert recorder.node_memory("node1") == 20480


def test_ten_thousand_unknown_candidates_give_a_short_message(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    names = [f"ghost-{i:05d}" for i in range(10_000)]

    response = scheduler.filter(seed_pod(), names)

    assert response.reason == "NoNodeFits"
    assert len(response.failed_nodes) == 10_000
    assert response.message.startswith("0/10000 nodes fit: ghost-00000: node unregistered; ")
    assert response.message.endswith("; and 9980 more")


@pytest.mark.parametrize(
    ("sentence", "codes"),
    [
        ("1/1 CardInsufficientMemory", ("CardInsufficientMemory",)),
        ("3/8 CardInsufficientMemory, 5/8 CardTimeSlicingExhausted",
         ("CardInsufficientMemory", "CardTimeSlicingExhausted")),
        ("NodeInsufficientDevice", ("NodeInsufficientDevice",)),
        ("node unregistered", ("node unregistered",)),
        ("2/2 ResourceQuotaNotFit", ("ResourceQuotaNotFit",)),
    ],
    ids=["one code with its count", "two codes, each once", "a bare code",
         "the unregistered phrase", "the quota refusal"],
)
def test_a_failed_nodes_sentence_is_counted_under_its_codes(
    sentence: str, codes: tuple[str, ...]
) -> None:
    assert scheduler_metrics.reason_codes(sentence) == codes
