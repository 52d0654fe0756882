"""The usage recorder through gRPC: the design cases and HAMi's lifecycle vectors L1–L14
(docs/design.md §9) as pod lifecycles, bad input, Reserve refusals, and WatchUsage.

Every test runs a real recorder (server, store, SQLite journal) on 127.0.0.1:0 and talks to it
through the generated stub. Pods are written as Kubernetes JSON (tests.support.pods) and sent
either as ``kubernetes_pod_json`` or, converted once by the shared parser, as the typed ``Pod``;
every lifecycle runs in both encodings. After each step the test reads back what is stored for
the pod, the node's device usage and the namespace's quota usage.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from accounting.kube import pod_json as kube_pod_parser
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from services.common import convert
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    running,
    sidecar_container,
    terminated,
    to_json,
    waiting,
)
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder

Json = dict[str, Any]
Stub = usage_pb2_grpc.UsageRecorderStub

GPU = "GPU-0"
NODE = "node1"
NS = "team-a"
CARD_MIB = 24576
MEMORY = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
ENCODINGS = ("kubernetes_pod_json", "typed")


# -- helpers -----------------------------------------------------------------------------------


def register_node(stub: Stub, name: str = NODE, gpus: Sequence[Json] | None = None) -> None:
    devices = gpus if gpus is not None else [gpu_device(GPU, memory_mib=CARD_MIB)]
    stub.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(kube_node(name, devices))),
        timeout=RPC_TIMEOUT_S,
    )


def set_quota(stub: Stub, namespace: str = NS, memory_mib: int = CARD_MIB) -> None:
    stub.SetQuota(
        usage_pb2.SetQuotaRequest(
            namespace=namespace, limits={"limits.nvidia.com/gpumem": memory_mib}
        ),
        timeout=RPC_TIMEOUT_S,
    )


def one_gpu_cluster(stub: Stub) -> None:
    """The design cases' cluster (docs/design.md §9): node1 with one 24Gi GPU, team-a quota
    gpumem 24Gi."""
    register_node(stub)
    set_quota(stub)


def typed_pod(pod: Json) -> types_pb2.Pod:
    return convert.pod_to_pb(kube_pod_parser.parse_pod(pod, (NVIDIA_RESOURCES,)))


def record(stub: Stub, pod: Json, encoding: str) -> usage_pb2.RecordPodResponse:
    if encoding == "typed":
        request = usage_pb2.RecordPodRequest(pod=typed_pod(pod))
    else:
        request = usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod))
    response: usage_pb2.RecordPodResponse = stub.RecordPod(request, timeout=RPC_TIMEOUT_S)
    return response


def reserve(
    stub: Stub, pod: Json, grants: Sequence[Sequence[tuple[str, int, int]]], encoding: str,
    node: str = NODE,
) -> usage_pb2.ReserveResponse:
    container_grants = [
        types_pb2.ContainerGrants(
            grants=[
                types_pb2.DeviceGrant(uuid=uuid, device_type="NVIDIA", memory_mib=mib,
                                      core_percent=cores)
                for uuid, mib, cores in per_container
            ]
        )
        for per_container in grants
    ]
    if encoding == "typed":
        request = usage_pb2.ReserveRequest(pod=typed_pod(pod), node_name=node,
                                           container_grants=container_grants)
    else:
        request = usage_pb2.ReserveRequest(kubernetes_pod_json=to_json(pod), node_name=node,
                                           container_grants=container_grants)
    response: usage_pb2.ReserveResponse = stub.Reserve(request, timeout=RPC_TIMEOUT_S)
    return response


@dataclass(frozen=True)
class Figures:
    """What the recorder reports about one pod, its node and its namespace."""

    stored_mib: int | None
    """Memory stored for the pod; None when it is not tracked."""
    node_mib: int
    namespace_mib: int
    init_released: bool = False
    stored_cores: int | None = None
    node_cores: int = 0
    namespace_cores: int = 0


def figures(stub: Stub, uid: str, node: str = NODE, namespace: str = NS) -> Figures:
    pod = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S)
    nodes = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=[node]),
                              timeout=RPC_TIMEOUT_S)
    items = stub.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(namespace=namespace),
                                   timeout=RPC_TIMEOUT_S).items
    used = {item.resource: item.used for item in items}
    devices = [d for n in nodes.nodes for d in n.devices]
    return Figures(
        stored_mib=sum(u.memory_mib for u in pod.stored) if pod.found else None,
        node_mib=sum(d.memory_used_mib for d in devices),
        namespace_mib=used.get(MEMORY, 0),
        init_released=pod.init_released,
        stored_cores=sum(u.core_percent for u in pod.stored) if pod.found else None,
        node_cores=sum(d.cores_used for d in devices),
        namespace_cores=used.get(CORES, 0),
    )


def state_of(stub: Stub) -> tuple[bytes, ...]:
    """Every node and the test namespace, serialized, to prove a refusal changed nothing."""
    nodes = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    namespace = stub.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(namespace=NS),
                                       timeout=RPC_TIMEOUT_S)
    return (nodes.SerializeToString(deterministic=True),
            namespace.SerializeToString(deterministic=True))


# -- lifecycle steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """RecordPod with the pod's current state, then the expected figures."""

    pod: Json
    want_decision: str
    want: Figures


@dataclass(frozen=True)
class Forget:
    """ForgetPod, then the expected released memory and figures."""

    uid: str
    want_found: bool
    want_released_mib: int
    want: Figures


@dataclass(frozen=True)
class Reserve:
    """Reserve another pod's grants; ``want`` are the figures of the *first* pod's uid."""

    pod: Json
    grants: tuple[tuple[tuple[str, int, int], ...], ...]
    want_reserved: bool
    want_reason: str
    want_node_mib: int
    want_namespace_mib: int


Step = Record | Forget | Reserve


@dataclass(frozen=True)
class Lifecycle:
    name: str
    uid: str
    steps: tuple[Step, ...]
    namespace: str = NS
    setup: tuple[str, ...] = field(default=("one_gpu_cluster",))


def run_lifecycle(stub: Stub, lifecycle: Lifecycle, encoding: str) -> list[str]:
    """Runs the steps, asserting each; returns one line of figures per step (for reports)."""
    one_gpu_cluster(stub)
    lines = []
    for index, step in enumerate(lifecycle.steps):
        where = f"step {index} of {lifecycle.name!r}"
        if isinstance(step, Record):
            response = record(stub, step.pod, encoding)
            assert response.decision == step.want_decision, (where, response.message)
            want_stored = step.want.stored_mib
            assert response.tracked == (want_stored is not None), where
            assert sum(u.memory_mib for u in response.stored) == (want_stored or 0), where
            got = figures(stub, lifecycle.uid, namespace=lifecycle.namespace)
            assert got == step.want, where
            lines.append(f"{response.decision}: {got}")
        elif isinstance(step, Forget):
            forgotten = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=step.uid),
                                       timeout=RPC_TIMEOUT_S)
            assert forgotten.found == step.want_found, where
            assert sum(u.memory_mib for u in forgotten.released) == step.want_released_mib, where
            got = figures(stub, lifecycle.uid, namespace=lifecycle.namespace)
            assert got == step.want, where
            lines.append(f"ForgetPod found={forgotten.found}: {got}")
        else:
            before = state_of(stub)
            reserved = reserve(stub, step.pod, step.grants, encoding)
            assert (reserved.reserved, reserved.reason) == (step.want_reserved,
                                                            step.want_reason), where
            assert reserved.message, where
            if not step.want_reserved:
                assert state_of(stub) == before, f"{where}: a refusal changed something"
            got = figures(stub, lifecycle.uid, namespace=lifecycle.namespace)
            assert (got.node_mib, got.namespace_mib) == (step.want_node_mib,
                                                         step.want_namespace_mib), where
            lines.append(f"Reserve {reserved.reason}: node {got.node_mib} ns {got.namespace_mib}")
    return lines


# -- the init-container cases 2-4 (docs/design.md §9) -------------------------------------------

SEED_UID = "uid-trainer"
SEED_ALLOCATION = allocation([(GPU, 20480, 0)], [(GPU, 10240, 0)])


def seed_pod(**overrides: Any) -> Json:
    options: dict[str, Any] = {
        "uid": SEED_UID,
        "namespace": NS,
        "init": [init_container("convert-weights", gpumem=20480)],
        "apps": [app_container("server", gpumem=10240)],
    }
    options.update(overrides)
    return kube_pod("trainer", **options)


def bound_seed_pod(**overrides: Any) -> Json:
    return seed_pod(allocation=SEED_ALLOCATION, node=NODE, **overrides)


WARMUP_POD = kube_pod("model-warmup", uid="uid-warmup", namespace=NS,
                      apps=[app_container("warmup", gpumem=12288)])
WARMUP_GRANTS = (((GPU, 12288, 0),),)

SEED_LIFECYCLE = Lifecycle(
    "seed cases 2-4: init 20Gi + app 10Gi on one 24Gi GPU",
    SEED_UID,
    (
        Record(seed_pod(), "NotTracked", Figures(None, 0, 0)),
        Record(
            bound_seed_pod(init_statuses=[waiting("convert-weights")]),
            "Recorded",
            Figures(20480, 20480, 20480, stored_cores=0),
        ),
        Reserve(WARMUP_POD, WARMUP_GRANTS, False, "CardInsufficientMemory", 20480, 20480),
        Record(
            bound_seed_pod(init_statuses=[running("convert-weights")],
                           app_statuses=[waiting("server")]),
            "Unchanged",
            Figures(20480, 20480, 20480, stored_cores=0),
        ),
        Record(
            bound_seed_pod(phase="Running", init_statuses=[terminated("convert-weights")],
                           app_statuses=[running("server")]),
            "Shrunk",
            Figures(10240, 10240, 10240, init_released=True, stored_cores=0),
        ),
        Reserve(WARMUP_POD, WARMUP_GRANTS, True, "Reserved", 22528, 22528),
        Forget(SEED_UID, True, 10240, Figures(None, 12288, 12288)),
    ),
)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_seed_lifecycle_init_share_is_released_and_a_12gi_pod_fits(
    stub: Stub, encoding: str
) -> None:
    run_lifecycle(stub, SEED_LIFECYCLE, encoding)


def test_seed_lifecycle_reserve_then_bind_keeps_the_reservation(stub: Stub) -> None:
    """Seed case 2 as the scheduler does it: Reserve the grants, then the informer sees the
    bound pod; the reservation and the recorded value are the same 20480, charged once."""
    one_gpu_cluster(stub)
    reserved = reserve(stub, seed_pod(), ((( GPU, 20480, 0),), ((GPU, 10240, 0),)), "typed")
    assert (reserved.reserved, sum(u.memory_mib for u in reserved.stored)) == (True, 20480)
    response = record(stub, bound_seed_pod(init_statuses=[running("convert-weights")]),
                      "kubernetes_pod_json")
    assert response.decision == "Unchanged"
    assert figures(stub, SEED_UID) == Figures(20480, 20480, 20480, stored_cores=0)


def test_seed_case_1_init_larger_than_the_card_is_refused_by_reserve(stub: Stub) -> None:
    """Case 1 reaches the recorder only if admission let it through: Reserve refuses it too."""
    one_gpu_cluster(stub)
    register_node(stub, "node2", [gpu_device("GPU-BIG", memory_mib=49152)])
    pod = kube_pod("convert", uid="uid-convert", namespace=NS,
                   init=[init_container("convert-weights", gpumem=30720)],
                   apps=[app_container("server", gpumem=4096)])
    grants = (((GPU, 30720, 0),), ((GPU, 4096, 0),))
    on_card = reserve(stub, pod, grants, "typed")
    assert (on_card.reserved, on_card.reason) == (False, "CardInsufficientMemory")
    big_grants = ((("GPU-BIG", 30720, 0),), (("GPU-BIG", 4096, 0),))
    over_quota = reserve(stub, pod, big_grants, "typed", node="node2")
    assert (over_quota.reserved, over_quota.reason) == (False, "MemoryQuotaExceeded")
    assert "30720" in over_quota.message
    assert figures(stub, "uid-convert", node="node2") == Figures(None, 0, 0)


# -- a forgotten uid is never charged again (tombstones) -----------------------------------------

SEED_GRANTS = (((GPU, 20480, 0),), ((GPU, 10240, 0),))
NOTHING = Figures(None, 0, 0)

TOMBSTONE_LIFECYCLES = [
    Lifecycle("a late or retried update after the delete charges nothing", SEED_UID, (
        Record(bound_seed_pod(init_statuses=[running("convert-weights")]), "Recorded",
               Figures(20480, 20480, 20480, stored_cores=0)),
        Forget(SEED_UID, True, 20480, NOTHING),
        Record(bound_seed_pod(init_statuses=[running("convert-weights")]), "Forgotten",
               NOTHING),
        Record(bound_seed_pod(phase="Running", init_statuses=[terminated("convert-weights")]),
               "Forgotten", NOTHING),
        Forget(SEED_UID, False, 0, NOTHING),
    )),
    Lifecycle("a delete seen before the add refuses the add and a reservation", SEED_UID, (
        Forget(SEED_UID, False, 0, NOTHING),
        Record(bound_seed_pod(init_statuses=[running("convert-weights")]), "Forgotten",
               NOTHING),
        Reserve(seed_pod(), SEED_GRANTS, False, "PodForgotten", 0, 0),
    )),
    Lifecycle("a reservation deleted while being filtered again stays refused", SEED_UID, (
        Reserve(seed_pod(), SEED_GRANTS, True, "Reserved", 20480, 20480),
        # The delete of the stored pod: a forget always means the pod is gone.
        Forget(SEED_UID, True, 20480, NOTHING),
        Record(bound_seed_pod(init_statuses=[running("convert-weights")]), "Forgotten",
               NOTHING),
        # A Filter still running for it (a re-filter that read its reservation): refused.
        Reserve(seed_pod(), SEED_GRANTS, False, "PodForgotten", 0, 0),
        Forget(SEED_UID, False, 0, NOTHING),
        Reserve(seed_pod(), SEED_GRANTS, False, "PodForgotten", 0, 0),
    )),
]


@pytest.mark.parametrize("lifecycle", TOMBSTONE_LIFECYCLES, ids=lambda c: c.name)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_forgotten_uid_is_never_charged_again(
    stub: Stub, lifecycle: Lifecycle, encoding: str
) -> None:
    run_lifecycle(stub, lifecycle, encoding)


def test_forgotten_answers_name_the_pod_and_count_as_decisions(
    recorder: RunningRecorder,
) -> None:
    stub = recorder.stub
    one_gpu_cluster(stub)
    stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=SEED_UID), timeout=RPC_TIMEOUT_S)

    recorded = record(stub, bound_seed_pod(), "kubernetes_pod_json")
    reserved = reserve(stub, seed_pod(), SEED_GRANTS, "typed")

    assert (recorded.decision, recorded.tracked, list(recorded.stored)) == (
        "Forgotten", False, [])
    assert SEED_UID in recorded.message and "forgotten" in recorded.message
    assert (reserved.reserved, reserved.reason, list(reserved.stored)) == (
        False, "PodForgotten", [])
    assert SEED_UID in reserved.message and "deleted" in reserved.message
    spans = {span.name: span for span in recorder.spans.get_finished_spans()}
    assert spans["usage.record"].attributes["hami.accounting.decision"] == "Forgotten"
    assert spans["usage.reserve"].attributes["hami.accounting.reason"] == "PodForgotten"


# -- the sidecar cases (docs/design.md §9) ------------------------------------------------------

SIDECAR_APP_ALLOCATION = allocation([(GPU, 10240, 0)], [(GPU, 10240, 0)])


def sidecar_app_pod(**overrides: Any) -> Json:
    return kube_pod("sidecar-app", uid="uid-sidecar-app", namespace=NS,
                    init=[sidecar_container("proxy", gpumem=10240)],
                    apps=[app_container("server", gpumem=10240)],
                    allocation=SIDECAR_APP_ALLOCATION, node=NODE, **overrides)


def three_class_pod(sidecar_first: bool, **overrides: Any) -> Json:
    sidecar = sidecar_container("proxy", gpumem=2048)
    init = init_container("convert-weights", gpumem=20480)
    grants = {"proxy": [(GPU, 2048, 0)], "convert-weights": [(GPU, 20480, 0)]}
    order = ["proxy", "convert-weights"] if sidecar_first else ["convert-weights", "proxy"]
    return kube_pod(
        "three-class", uid="uid-three", namespace=NS,
        init=[sidecar, init] if sidecar_first else [init, sidecar],
        apps=[app_container("server", gpumem=10240)],
        allocation=allocation(*(grants[name] for name in order), [(GPU, 10240, 0)]),
        node=NODE, **overrides,
    )


TWELVE_GI_POD = kube_pod("twelve", uid="uid-twelve", namespace=NS,
                         apps=[app_container("twelve", gpumem=12288)])
TWELVE_GI_GRANTS = (((GPU, 12288, 0),),)

SIDECAR_LIFECYCLES = (
    Lifecycle(
        "sidecar 10Gi + app 10Gi is charged 20Gi, so a 12Gi pod is refused",
        "uid-sidecar-app",
        (
            Record(sidecar_app_pod(phase="Running", init_statuses=[running("proxy")],
                                   app_statuses=[running("server")]),
                   # Only sidecars in the init list: the gate is open at once (delta 0).
                   "RecordedSteadyState",
                   Figures(20480, 20480, 20480, init_released=True, stored_cores=0)),
            Reserve(TWELVE_GI_POD, TWELVE_GI_GRANTS, False, "CardInsufficientMemory",
                    20480, 20480),
            Record(sidecar_app_pod(phase="Running",
                                   init_statuses=[terminated("proxy", restarts=1)],
                                   app_statuses=[running("server")]),
                   "Unchanged",
                   Figures(20480, 20480, 20480, init_released=True, stored_cores=0)),
            Record(sidecar_app_pod(phase="Succeeded",
                                   init_statuses=[terminated("proxy")],
                                   app_statuses=[terminated("server")]),
                   "Released",
                   Figures(0, 0, 0, init_released=True, stored_cores=0)),
            Forget("uid-sidecar-app", True, 0, Figures(None, 0, 0)),
        ),
    ),
    Lifecycle(
        "sidecar declared before init: 2+20 = 22Gi, then 12Gi through a sidecar exit-0 gap",
        "uid-three",
        (
            Record(three_class_pod(True, init_statuses=[running("proxy"),
                                                        waiting("convert-weights")]),
                   "Recorded", Figures(22528, 22528, 22528, stored_cores=0)),
            # The sidecar crash-loops through exit 0 while the init container runs: the gate
            # ignores sidecars, so nothing is released.
            Record(three_class_pod(True, init_statuses=[terminated("proxy", restarts=1),
                                                        running("convert-weights")]),
                   "Unchanged", Figures(22528, 22528, 22528, stored_cores=0)),
            Record(three_class_pod(True, phase="Running",
                                   init_statuses=[running("proxy", restarts=1),
                                                  terminated("convert-weights")],
                                   app_statuses=[running("server")]),
                   "Shrunk", Figures(12288, 12288, 12288, init_released=True, stored_cores=0)),
            # Another exit-0 gap after the shrink: the sidecar's share stays counted.
            Record(three_class_pod(True, phase="Running",
                                   init_statuses=[terminated("proxy", restarts=2),
                                                  terminated("convert-weights")],
                                   app_statuses=[running("server")]),
                   "Unchanged", Figures(12288, 12288, 12288, init_released=True,
                                        stored_cores=0)),
            Record(three_class_pod(True, phase="Failed",
                                   init_statuses=[terminated("proxy", 137),
                                                  terminated("convert-weights")],
                                   app_statuses=[terminated("server", 1)]),
                   "Released", Figures(0, 0, 0, init_released=True, stored_cores=0)),
            Forget("uid-three", True, 0, Figures(None, 0, 0)),
        ),
    ),
    Lifecycle(
        "init declared before sidecar: max(20, 2+10) = 20Gi, then 12Gi",
        "uid-three",
        (
            Record(three_class_pod(False, init_statuses=[running("convert-weights"),
                                                         waiting("proxy")]),
                   "Recorded", Figures(20480, 20480, 20480, stored_cores=0)),
            Record(three_class_pod(False, phase="Running",
                                   init_statuses=[terminated("convert-weights"),
                                                  running("proxy")],
                                   app_statuses=[running("server")]),
                   "Shrunk", Figures(12288, 12288, 12288, init_released=True, stored_cores=0)),
            # Deletion subtracts exactly what is stored (the shrunk value).
            Forget("uid-three", True, 12288, Figures(None, 0, 0)),
        ),
    ),
)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("lifecycle", SIDECAR_LIFECYCLES, ids=lambda c: c.name)
def test_sidecar_design_cases(stub: Stub, lifecycle: Lifecycle, encoding: str) -> None:
    run_lifecycle(stub, lifecycle, encoding)


# -- HAMi's lifecycle vectors L1-L14 (docs/design.md §9) --------------------------

L_UID = "uid-l"
L_ALLOCATION = allocation([(GPU, 20000, 10)], [(GPU, 10000, 5)])


def l_pod(**overrides: Any) -> Json:
    options: dict[str, Any] = {
        "uid": L_UID, "namespace": NS, "allocation": L_ALLOCATION, "node": NODE,
        "init": [init_container("init", gpumem=20000, gpucores=10)],
        "apps": [app_container("app", gpumem=10000, gpucores=5)],
    }
    options.update(overrides)
    return kube_pod("l-pod", **options)


L_ADDED = l_pod(init_statuses=[running("init")], app_statuses=[waiting("app")])
L_INIT_DONE = l_pod(phase="Running", init_statuses=[terminated("init")],
                    app_statuses=[running("app")])
AT_PEAK = Figures(20000, 20000, 20000, stored_cores=10, node_cores=10, namespace_cores=10)
SHRUNK = Figures(10000, 10000, 10000, init_released=True, stored_cores=5, node_cores=5,
                 namespace_cores=5)
RELEASED = Figures(0, 0, 0, init_released=True, stored_cores=0)
RELEASED_UNSHRUNK = Figures(0, 0, 0, stored_cores=0)
GONE = Figures(None, 0, 0)

L_VECTORS = (
    Lifecycle("L1 add, then init exit 0: 20000/10 -> 10000/5", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(L_INIT_DONE, "Shrunk", SHRUNK),
    )),
    Lifecycle("L2 the same update again changes nothing", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(L_INIT_DONE, "Shrunk", SHRUNK),
        Record(L_INIT_DONE, "Unchanged", SHRUNK),
    )),
    Lifecycle("L3 a re-add with the full annotation keeps the shrunk value", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(L_INIT_DONE, "Shrunk", SHRUNK),
        Record(L_ADDED, "Unchanged", SHRUNK),
    )),
    Lifecycle("L4 init exit 1 holds the peak", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(l_pod(phase="Running", init_statuses=[terminated("init", 1)]), "Held", AT_PEAK),
    )),
    Lifecycle("L5 phase Failed releases everything", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(l_pod(phase="Failed", init_statuses=[terminated("init", 1)]), "Released",
               RELEASED_UNSHRUNK),
    )),
    Lifecycle("L6 shrunk, then Succeeded releases the rest", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(L_INIT_DONE, "Shrunk", SHRUNK),
        Record(l_pod(phase="Succeeded", init_statuses=[terminated("init")],
                     app_statuses=[terminated("app")]), "Released", RELEASED),
    )),
    Lifecycle("L7 add, then delete without a shrink", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Forget(L_UID, True, 20000, GONE),
    )),
    Lifecycle("L8 add, shrink, delete: +20000, -10000, -10000", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(L_INIT_DONE, "Shrunk", SHRUNK),
        Forget(L_UID, True, 10000, GONE),
    )),
    Lifecycle("L9 terminating keeps the usage", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Record(l_pod(phase="Running", deleting=True, init_statuses=[running("init")]),
               "Unchanged", AT_PEAK),
    )),
    Lifecycle("L10 a pod without init containers never shrinks", "uid-apps", (
        Record(kube_pod("apps", uid="uid-apps", namespace=NS, node=NODE,
                        apps=[app_container("a", gpumem=10000, gpucores=5)],
                        allocation=allocation([(GPU, 10000, 5)])),
               "Recorded", Figures(10000, 10000, 10000, stored_cores=5, node_cores=5,
                                   namespace_cores=5)),
        Record(kube_pod("apps", uid="uid-apps", namespace=NS, node=NODE, phase="Running",
                        apps=[app_container("a", gpumem=10000, gpucores=5)],
                        allocation=allocation([(GPU, 10000, 5)]),
                        app_statuses=[terminated("a", restarts=1)]),
               "Unchanged", Figures(10000, 10000, 10000, stored_cores=5, node_cores=5,
                                    namespace_cores=5)),
    )),
    Lifecycle("L11 init exit 0 with a sidecar running opens the gate", "uid-l11", (
        Record(kube_pod("l11", uid="uid-l11", namespace=NS, node=NODE,
                        init=[init_container("init", gpumem=8000),
                              sidecar_container("side", gpumem=2000)],
                        apps=[app_container("app", gpumem=4000)],
                        allocation=allocation([(GPU, 8000, 0)], [(GPU, 2000, 0)],
                                              [(GPU, 4000, 0)]),
                        init_statuses=[running("init")]),
               "Recorded", Figures(8000, 8000, 8000, stored_cores=0)),
        Record(kube_pod("l11", uid="uid-l11", namespace=NS, node=NODE, phase="Running",
                        init=[init_container("init", gpumem=8000),
                              sidecar_container("side", gpumem=2000)],
                        apps=[app_container("app", gpumem=4000)],
                        allocation=allocation([(GPU, 8000, 0)], [(GPU, 2000, 0)],
                                              [(GPU, 4000, 0)]),
                        init_statuses=[terminated("init"), running("side")],
                        app_statuses=[running("app")]),
               "Shrunk", Figures(6000, 6000, 6000, init_released=True, stored_cores=0)),
    )),
    Lifecycle("L13 removing more than is used never goes negative", L_UID, (
        Record(L_ADDED, "Recorded", AT_PEAK),
        Forget(L_UID, True, 20000, GONE),
        Forget(L_UID, False, 0, GONE),
    )),
)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("lifecycle", L_VECTORS, ids=lambda c: c.name)
def test_hami_lifecycle_vectors(stub: Stub, lifecycle: Lifecycle, encoding: str) -> None:
    run_lifecycle(stub, lifecycle, encoding)


@dataclass(frozen=True)
class GateCase:
    name: str
    init: tuple[Json, ...]
    statuses: tuple[Json, ...]
    want_released: bool


def _gate_pod(case: GateCase, statuses: Sequence[Json]) -> Json:
    apps = [app_container("app", gpumem=1000)]
    per_container = [[(GPU, 1000, 0)] for _ in (*case.init, *apps)]
    return kube_pod("gate", uid="uid-gate", namespace=NS, node=NODE, init=case.init, apps=apps,
                    allocation=allocation(*per_container), phase="Running",
                    init_statuses=statuses)


INIT = init_container("init", gpumem=1000)
SIDE = sidecar_container("side", gpumem=1000)
GATE_CASES = (
    GateCase("no init containers: closed", (), (), False),
    GateCase("init running, sidecar running: closed", (INIT, SIDE),
             (running("init"), running("side")), False),
    GateCase("init exit 0, sidecar running: open", (INIT, SIDE),
             (terminated("init"), running("side")), True),
    GateCase("init exit 0, sidecar in an exit-0 gap: open", (INIT, SIDE),
             (terminated("init"), terminated("side", restarts=3)), True),
    GateCase("init running, sidecar in an exit-0 gap: closed", (INIT, SIDE),
             (running("init"), terminated("side", restarts=3)), False),
    GateCase("init exit 1: closed", (INIT,), (terminated("init", 1),), False),
    GateCase("only sidecars: open", (SIDE,), (running("side"),), True),
    GateCase("status missing for a regular init: closed", (SIDE, INIT), (running("side"),),
             False),
)


@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: c.name)
def test_l12_shrink_gate_through_grpc(stub: Stub, case: GateCase) -> None:
    """L12: the pod is recorded with no statuses, then updated with the case's statuses."""
    one_gpu_cluster(stub)
    record(stub, _gate_pod(case, ()), "kubernetes_pod_json")
    response = record(stub, _gate_pod(case, case.statuses), "kubernetes_pod_json")
    assert response.init_released == case.want_released, response.message


def test_l14_restart_after_the_shrink_keeps_the_steady_state(
    start_recorder: StartRecorder,
) -> None:
    """L14: HAMi re-charges the peak after a restart; we come back shrunk (journal) and, with
    no journal, record a pod whose init already finished at steady state."""
    first = start_recorder()
    run_lifecycle(first.stub, L_VECTORS[0], "kubernetes_pod_json")
    first.stop()

    restarted = start_recorder()
    assert figures(restarted.stub, L_UID) == SHRUNK
    assert record(restarted.stub, L_ADDED, "kubernetes_pod_json").decision == "Unchanged"
    assert figures(restarted.stub, L_UID) == SHRUNK

    empty = start_recorder(restarted.data_dir.parent / "empty")
    one_gpu_cluster(empty.stub)
    response = record(empty.stub, L_INIT_DONE, "typed")
    assert response.decision == "RecordedSteadyState"
    assert figures(empty.stub, L_UID) == SHRUNK


# -- traces ------------------------------------------------------------------------------------


def test_spans_follow_the_pod_trace_and_name_the_decision(
    start_recorder: StartRecorder,
) -> None:
    recorder = start_recorder()
    stub = recorder.stub
    one_gpu_cluster(stub)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = {"hami.io/traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    reserve(stub, seed_pod(annotations=traceparent), (((GPU, 20480, 0),), ((GPU, 10240, 0),)),
            "typed")
    record(stub, bound_seed_pod(annotations=traceparent,
                                init_statuses=[running("convert-weights")]), "typed")
    record(stub, bound_seed_pod(annotations=traceparent, phase="Running",
                                init_statuses=[terminated("convert-weights")]), "typed")
    record(stub, bound_seed_pod(annotations=traceparent, phase="Succeeded",
                                init_statuses=[terminated("convert-weights")]), "typed")
    # The pod's trace survives a restart with the journal.
    first_spans = recorder.spans.get_finished_spans()
    recorder.stop()
    recorder = start_recorder()
    stub = recorder.stub
    stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=SEED_UID), timeout=RPC_TIMEOUT_S)

    spans = [s for s in (*first_spans, *recorder.spans.get_finished_spans())
             if s.name.startswith("usage.")]
    assert [s.name for s in spans] == [
        "usage.reserve", "usage.record", "usage.shrink", "usage.release", "usage.release",
    ]
    # ForgetPod carries only the uid: its release joins the trace kept from the pod's record.
    for span in spans:
        assert format(span.context.trace_id, "032x") == trace_id, span.name
        assert span.attributes is not None
        assert span.attributes["hami.accounting.pod.uid"] == SEED_UID
    shrink = spans[2].attributes
    assert shrink is not None
    assert (shrink["hami.accounting.decision"], shrink["hami.accounting.stored.memory_mib"]) == (
        "Shrunk", 10240)
    assert spans[0].attributes is not None
    assert spans[0].attributes["hami.accounting.reason"] == "Reserved"
    assert all("containers" not in key for s in spans for key in (s.attributes or {}))


# -- bad input ---------------------------------------------------------------------------------


def _with_typed_grant(memory_mib: int = 1000, uuid: str = GPU,
                      container_class: int = types_pb2.CONTAINER_CLASS_APP) -> types_pb2.Pod:
    return types_pb2.Pod(
        uid="uid-bad", namespace=NS, name="bad", node_name=NODE,
        containers=[types_pb2.Container(
            name="app", container_class=container_class,  # type: ignore[arg-type]
            grants=[types_pb2.DeviceGrant(uuid=uuid, device_type="NVIDIA",
                                          memory_mib=memory_mib)],
        )],
    )


def _bad_annotation_pod(value: str) -> bytes:
    pod = kube_pod("bad", uid="uid-bad", namespace=NS, node=NODE,
                   apps=[app_container("app", gpumem=1000)], allocation=value)
    return to_json(pod)


ANNOTATION_FIELD = 'kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"]'

BAD_RECORDS = (
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=_bad_annotation_pod(
        "uuid,type,100:;")), ANNOTATION_FIELD, id="annotation entry with three fields"),
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=_bad_annotation_pod(
        f"{GPU},NVIDIA,2147483648,0:;")), ANNOTATION_FIELD, id="annotation memory beyond int32"),
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=_bad_annotation_pod(
        f"{GPU},NVIDIA,-5,0:;")), ANNOTATION_FIELD, id="negative annotation memory"),
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=b"{not json"),
                 "kubernetes_pod_json", id="pod JSON that is not JSON"),
    pytest.param(usage_pb2.RecordPodRequest(pod=_with_typed_grant(memory_mib=-5)),
                 "pod.containers[0].grants[0].memory_mib", id="negative typed grant memory"),
    pytest.param(usage_pb2.RecordPodRequest(pod=_with_typed_grant(
        container_class=types_pb2.CONTAINER_CLASS_UNSPECIFIED)),
        "pod.containers[0].container_class", id="container class not set"),
    pytest.param(usage_pb2.RecordPodRequest(pod=_with_typed_grant(container_class=99)),
                 "pod.containers[0].container_class", id="container class unknown to this build"),
    pytest.param(usage_pb2.RecordPodRequest(pod=_with_typed_grant(uuid="GPU-NOT-THERE")),
                 "pod.containers[0].grants[0].uuid", id="grant for a UUID the node lacks"),
    # Named where the request wrote the grant: the annotation's entry, not our pod's field.
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=_bad_annotation_pod(
        "GPU-NOT-THERE,NVIDIA,1000,0:;")), f"{ANNOTATION_FIELD}[0][0].uuid: node ",
        id="annotation grant for a UUID the node lacks"),
    pytest.param(usage_pb2.RecordPodRequest(kubernetes_pod_json=_bad_annotation_pod(
        f"::{GPU},NVIDIA,1,0::GPU-NOT-THERE,NVIDIA,1000,0:;")),
        f"{ANNOTATION_FIELD}[0][4].uuid: node ",
        id="the second grant of an entry, after empty pieces"),
    pytest.param(usage_pb2.RecordPodRequest(), "pod_source", id="no pod at all"),
)


@pytest.mark.parametrize(("request_message", "want_field"), BAD_RECORDS)
def test_bad_record_is_invalid_argument_naming_the_field_and_stores_nothing(
    stub: Stub, request_message: usage_pb2.RecordPodRequest, want_field: str
) -> None:
    one_gpu_cluster(stub)
    before = state_of(stub)
    with pytest.raises(grpc.RpcError) as caught:
        stub.RecordPod(request_message, timeout=RPC_TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert want_field in caught.value.details()
    assert state_of(stub) == before
    pod = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-bad"), timeout=RPC_TIMEOUT_S)
    assert not pod.found


BAD_WRITES = (
    pytest.param("SetQuota", usage_pb2.SetQuotaRequest(
        namespace=NS, limits={"requests.cpu": 4, "limits.nvidia.com/gpumem": 1}),
        "limits['requests.cpu']", id="quota key HAMi does not manage"),
    pytest.param("SetQuota", usage_pb2.SetQuotaRequest(
        namespace=NS, limits={"limits.nvidia.com/gpumem": -1}),
        "limits['limits.nvidia.com/gpumem']", id="negative quota"),
    pytest.param("SetQuota", usage_pb2.SetQuotaRequest(limits={"limits.nvidia.com/gpumem": 1}),
                 "namespace", id="quota without a namespace"),
    pytest.param("RegisterNode", usage_pb2.RegisterNodeRequest(
        inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
            uuid="GPU-X", memory_total_mib=1, slots_total=1, cores_total=100)])),
        "node_name", id="typed inventory without a node name"),
    pytest.param("RegisterNode", usage_pb2.RegisterNodeRequest(
        node_name=NODE, inventory=types_pb2.NodeInventory(devices=[
            types_pb2.Device(uuid="GPU-X", memory_total_mib=1, slots_total=1),
            types_pb2.Device(uuid="GPU-X", memory_total_mib=1, slots_total=1)])),
        "inventory.devices[1].uuid", id="duplicate device UUID"),
    pytest.param("RegisterNode", usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json({"metadata": {"name": NODE, "annotations": {
            "hami.io/node-nvidia-register": "GPU-0,10,24576,100,NVIDIA,0,true:"}}})),
        "hami.io/node-nvidia-register", id="legacy register annotation"),
    pytest.param("ForgetPod", usage_pb2.ForgetPodRequest(), "pod_uid", id="forget without uid"),
    pytest.param("Reserve", usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(WARMUP_POD), node_name="node-unknown",
        container_grants=[types_pb2.ContainerGrants(grants=[types_pb2.DeviceGrant(
            uuid=GPU, device_type="NVIDIA", memory_mib=1)])]),
        "node_name", id="reserve on an unregistered node"),
    pytest.param("Reserve", usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(WARMUP_POD), node_name=NODE,
        container_grants=[types_pb2.ContainerGrants(), types_pb2.ContainerGrants()]),
        "container_grants", id="reserve with more positions than containers"),
    pytest.param("Reserve", usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(WARMUP_POD), node_name=NODE,
        container_grants=[types_pb2.ContainerGrants(grants=[types_pb2.DeviceGrant(
            uuid="GPU-NOT-THERE", device_type="NVIDIA", memory_mib=1)])]),
        "container_grants[0].grants[0].uuid", id="reserve of a UUID the node lacks"),
    pytest.param("Reserve", usage_pb2.ReserveRequest(
        kubernetes_pod_json=_bad_annotation_pod("GPU-NOT-THERE,NVIDIA,1000,0:;"), node_name=NODE),
        f"{ANNOTATION_FIELD}[0][0].uuid: node ",
        id="reserve of an annotation's UUID the node lacks"),
    pytest.param("Reserve", usage_pb2.ReserveRequest(
        pod=_with_typed_grant(uuid="GPU-NOT-THERE"), node_name=NODE),
        "pod.containers[0].grants[0].uuid: node ",
        id="reserve of a typed pod's own UUID the node lacks"),
)


@pytest.mark.parametrize(("method", "request_message", "want_field"), BAD_WRITES)
def test_bad_write_is_invalid_argument_naming_the_field_and_changes_nothing(
    stub: Stub, method: str, request_message: Any, want_field: str
) -> None:
    one_gpu_cluster(stub)
    before = state_of(stub)
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, method)(request_message, timeout=RPC_TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert want_field in caught.value.details()
    assert state_of(stub) == before


def test_oversized_message_is_resource_exhausted_and_stores_nothing(stub: Stub) -> None:
    one_gpu_cluster(stub)
    before = state_of(stub)
    pod = kube_pod("huge", uid="uid-huge", namespace=NS, node=NODE,
                   apps=[app_container("app", gpumem=1000)],
                   allocation=allocation([(GPU, 1000, 0)]),
                   annotations={"padding": "x" * (5 * 1024 * 1024)})
    with pytest.raises(grpc.RpcError) as caught:
        record(stub, pod, "kubernetes_pod_json")
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert state_of(stub) == before


def test_reserve_that_no_longer_fits_is_refused_with_a_reason_and_changes_nothing(
    stub: Stub,
) -> None:
    one_gpu_cluster(stub)
    first = reserve(stub, WARMUP_POD, (((GPU, 12288, 0),),), "typed")
    assert first.reserved
    before = state_of(stub)
    second_pod = kube_pod("second", uid="uid-second", namespace=NS,
                          apps=[app_container("second", gpumem=12289)])
    refused = reserve(stub, second_pod, (((GPU, 12289, 0),),), "kubernetes_pod_json")
    assert (refused.reserved, refused.reason) == (False, "CardInsufficientMemory")
    assert "12289" in refused.message and not refused.stored
    assert state_of(stub) == before
    quota_pod = kube_pod("third", uid="uid-third", namespace=NS,
                         apps=[app_container("third", gpumem=12288)])
    # The card still has room for exactly 12288, and so has the quota: an exact fit passes.
    assert reserve(stub, quota_pod, (((GPU, 12288, 0),),), "typed").reserved


def test_get_node_usage_lists_every_node_and_names_unknown_ones(stub: Stub) -> None:
    register_node(stub, "node-b", [gpu_device("GPU-B")])
    register_node(stub, "node-a", [gpu_device("GPU-A"), gpu_device("GPU-A2", index=1)])
    every = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    assert [n.node_name for n in every.nodes] == ["node-b", "node-a"]
    assert [d.uuid for d in every.nodes[1].devices] == ["GPU-A", "GPU-A2"]
    asked = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=["node-a", "nope"]),
                              timeout=RPC_TIMEOUT_S)
    assert [n.node_name for n in asked.nodes] == ["node-a"]
    assert list(asked.unknown_node_names) == ["nope"]


def test_register_node_typed_inventory_and_forget_of_unknown_pod(stub: Stub) -> None:
    response = stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name="typed-node",
        inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
            uuid="GPU-T", device_type="NVIDIA A100", memory_total_mib=81920, slots_total=4,
            cores_total=100, healthy=True)])), timeout=RPC_TIMEOUT_S)
    assert response.node.node_name == "typed-node"
    assert (response.node.devices[0].memory_total_mib, response.node.devices[0].vendor) == (
        81920, "NVIDIA")
    forgotten = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="never-seen"),
                               timeout=RPC_TIMEOUT_S)
    assert (forgotten.found, list(forgotten.released)) == (False, [])


def test_set_quota_replaces_limits_and_an_empty_map_unsets_them(stub: Stub) -> None:
    items = stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=NS, limits={
        "limits.nvidia.com/gpumem": 4096, "limits.nvidia.com/gpucores": 50}),
        timeout=RPC_TIMEOUT_S).items
    assert {(i.resource, i.limit, i.limit_set) for i in items} == {
        (MEMORY, 4096, True), (CORES, 50, True)}
    items = stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=NS, limits={
        "limits.nvidia.com/gpumem": 0}), timeout=RPC_TIMEOUT_S).items
    assert [(i.resource, i.limit, i.limit_set) for i in items] == [(MEMORY, 0, True)]
    assert not stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=NS), timeout=RPC_TIMEOUT_S).items


# -- WatchUsage --------------------------------------------------------------------------------


class Watcher:
    """Reads a WatchUsage stream on a thread into a list."""

    def __init__(self, stub: Stub, send_initial_state: bool,
                 content: usage_pb2.WatchContent.ValueType = usage_pb2.WATCH_CONTENT_UNSPECIFIED
                 ) -> None:
        self.call = stub.WatchUsage(
            usage_pb2.WatchUsageRequest(send_initial_state=send_initial_state, content=content),
            timeout=60,
        )
        self.events: list[usage_pb2.UsageEvent] = []
        self.error: grpc.RpcError | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        except grpc.RpcError as error:
            with self._changed:
                self.error = error
                self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[usage_pb2.UsageEvent]:
        with self._changed:
            self._changed.wait_for(lambda: len(self.events) >= count or self.error is not None,
                                   timeout_s)
            return list(self.events)

    def wait_for_error(self, timeout_s: float = 10.0) -> grpc.RpcError | None:
        with self._changed:
            self._changed.wait_for(lambda: self.error is not None, timeout_s)
            return self.error


K = usage_pb2


def _shape(event: usage_pb2.UsageEvent) -> tuple[int, str, bool, bool]:
    """(kind, namespace, carries namespace items, carries a node)."""
    return (event.kind, event.namespace, bool(event.namespace_items), event.HasField("node"))


def test_a_watcher_gets_only_the_part_of_the_state_it_asked_for(stub: Stub) -> None:
    one_gpu_cluster(stub)
    everything = Watcher(stub, send_initial_state=True)
    namespaces = Watcher(stub, send_initial_state=True, content=K.WATCH_CONTENT_NAMESPACES)
    nodes = Watcher(stub, send_initial_state=True, content=K.WATCH_CONTENT_NODES)
    complete = (K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE, "", False, False)
    assert [_shape(e) for e in namespaces.wait_for(2)] == [
        (K.USAGE_EVENT_KIND_SNAPSHOT, NS, True, False), complete]
    assert [_shape(e) for e in nodes.wait_for(2)] == [
        (K.USAGE_EVENT_KIND_SNAPSHOT, "", False, True), complete]
    assert [_shape(e) for e in everything.wait_for(3)][-1] == complete

    record(stub, bound_seed_pod(init_statuses=[running("convert-weights")]), "typed")
    set_quota(stub, memory_mib=8192)
    register_node(stub, "node2", [gpu_device("GPU-2")])

    live = {name: watcher.wait_for(count)[-3:] for name, watcher, count in (
        ("everything", everything, 6), ("namespaces", namespaces, 5), ("nodes", nodes, 5))}
    assert [_shape(e) for e in live["everything"]] == [
        (K.USAGE_EVENT_KIND_POD_CHANGED, NS, True, True),
        (K.USAGE_EVENT_KIND_QUOTA_SET, NS, True, False),
        (K.USAGE_EVENT_KIND_NODE_REGISTERED, "", False, True),
    ]
    assert [_shape(e) for e in live["namespaces"]] == [
        (K.USAGE_EVENT_KIND_POD_CHANGED, NS, True, False),
        (K.USAGE_EVENT_KIND_QUOTA_SET, NS, True, False),
        # Nothing of the node, but the change still arrives: the watcher's revision follows.
        (K.USAGE_EVENT_KIND_NODE_REGISTERED, "", False, False),
    ]
    assert [_shape(e) for e in live["nodes"]] == [
        (K.USAGE_EVENT_KIND_POD_CHANGED, NS, False, True),
        (K.USAGE_EVENT_KIND_QUOTA_SET, NS, False, False),
        (K.USAGE_EVENT_KIND_NODE_REGISTERED, "", False, True),
    ]
    revisions = [[e.revision for e in events] for events in live.values()]
    assert revisions[0] == revisions[1] == revisions[2]
    # What each part carries is the same as in the full event.
    assert live["namespaces"][0].namespace_items == live["everything"][0].namespace_items
    assert live["nodes"][0].node == live["everything"][0].node
    for watcher in (everything, namespaces, nodes):
        watcher.call.cancel()


def test_an_unknown_watch_content_is_invalid_and_named(stub: Stub) -> None:
    watcher = Watcher(stub, send_initial_state=True,
                      content=99)  # type: ignore[arg-type]  # a newer client's value
    error = watcher.wait_for_error()
    assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "content" in (error.details() or "")


def test_each_write_returns_the_revision_of_the_event_that_shows_it(stub: Stub) -> None:
    set_quota(stub, memory_mib=1)
    watcher = Watcher(stub, send_initial_state=True)
    watcher.wait_for(2)  # the quota's snapshot and the end of the initial state: subscribed
    node = stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(kube_node(NODE, [gpu_device(GPU, memory_mib=CARD_MIB)]))),
        timeout=RPC_TIMEOUT_S)
    recorded = record(stub, bound_seed_pod(init_statuses=[running("convert-weights")]), "typed")
    replayed = record(stub, bound_seed_pod(init_statuses=[running("convert-weights")]), "typed")
    forgotten = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=SEED_UID),
                               timeout=RPC_TIMEOUT_S)
    # Unknown uid: only a tombstone is written, which no watcher sees.
    tombstone = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-never-seen"),
                               timeout=RPC_TIMEOUT_S)
    quota = stub.SetQuota(usage_pb2.SetQuotaRequest(
        namespace=NS, limits={"limits.nvidia.com/gpumem": CARD_MIB}), timeout=RPC_TIMEOUT_S)

    events = watcher.wait_for(6)[2:]
    assert [e.kind for e in events] == [
        K.USAGE_EVENT_KIND_NODE_REGISTERED,
        K.USAGE_EVENT_KIND_POD_CHANGED,
        K.USAGE_EVENT_KIND_POD_FORGOTTEN,
        K.USAGE_EVENT_KIND_QUOTA_SET,
    ]
    assert [node.revision, recorded.revision, forgotten.revision, quota.revision] == [
        e.revision for e in events]
    # A write that changes nothing a reader sees hands back the last visible revision, so a
    # reader waiting for it is not left waiting for an event that never comes.
    assert replayed.decision == "Unchanged" and replayed.revision == recorded.revision
    assert tombstone.revision == forgotten.revision
    watcher.call.cancel()


def test_watch_usage_reports_snapshot_then_every_change(stub: Stub) -> None:
    one_gpu_cluster(stub)
    watcher = Watcher(stub, send_initial_state=True)
    snapshot = watcher.wait_for(3)
    assert [(e.kind, e.node.node_name, e.namespace) for e in snapshot] == [
        (K.USAGE_EVENT_KIND_SNAPSHOT, NODE, ""),
        (K.USAGE_EVENT_KIND_SNAPSHOT, "", NS),
        (K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE, "", ""),
    ]
    # Every event of the initial state carries the revision it was read at.
    assert len({e.revision for e in snapshot}) == 1
    record(stub, bound_seed_pod(init_statuses=[running("convert-weights")]), "typed")
    record(stub, bound_seed_pod(phase="Running", init_statuses=[terminated("convert-weights")]),
           "typed")
    stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=SEED_UID), timeout=RPC_TIMEOUT_S)
    set_quota(stub, memory_mib=8192)
    register_node(stub, "node2", [gpu_device("GPU-2")])

    events = watcher.wait_for(8)[3:]
    assert [e.kind for e in events] == [
        K.USAGE_EVENT_KIND_POD_CHANGED,
        K.USAGE_EVENT_KIND_POD_CHANGED,
        K.USAGE_EVENT_KIND_POD_FORGOTTEN,
        K.USAGE_EVENT_KIND_QUOTA_SET,
        K.USAGE_EVENT_KIND_NODE_REGISTERED,
    ]
    recorded, shrunk, forgotten, quota, node = events
    assert [sum(u.memory_mib for u in e.stored) for e in (recorded, shrunk, forgotten)] == [
        20480, 10240, 0]
    assert [e.node.devices[0].memory_used_mib for e in (recorded, shrunk, forgotten)] == [
        20480, 10240, 0]
    assert [{i.resource: i.used for i in e.namespace_items}[MEMORY]
            for e in (recorded, shrunk)] == [20480, 10240]
    assert MEMORY not in {i.resource for i in forgotten.namespace_items if i.used}
    assert {i.resource: i.limit for i in quota.namespace_items}[MEMORY] == 8192
    assert node.node.node_name == "node2" and node.node.devices[0].uuid == "GPU-2"
    revisions = [e.revision for e in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    assert all(e.pod_uid == SEED_UID for e in (recorded, shrunk, forgotten))
    watcher.call.cancel()


def test_watch_usage_client_cancel_releases_the_subscription(recorder: RunningRecorder) -> None:
    watcher = Watcher(recorder.stub, send_initial_state=False)
    # Changes before the server has subscribed are not part of the stream: wait for it.
    _wait_until(lambda: recorder.app.store.watcher_count == 1)
    register_node(recorder.stub)
    assert len(watcher.wait_for(1)) == 1
    assert recorder.app.store.watcher_count == 1
    watcher.call.cancel()
    _wait_until(lambda: recorder.app.store.watcher_count == 0)


def test_watch_usage_slow_watcher_is_dropped_with_resource_exhausted(
    start_recorder: StartRecorder,
) -> None:
    running_recorder = start_recorder(max_watch_events=3)
    stub = running_recorder.stub
    # A stream that nobody reads, on a channel with a small flow-control window and no window
    # growth: the server soon cannot send, so its queue for this watcher fills up.
    slow_channel = grpc.insecure_channel(
        running_recorder.app.target,
        options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)],
    )
    call = usage_pb2_grpc.UsageRecorderStub(slow_channel).WatchUsage(
        usage_pb2.WatchUsageRequest(), timeout=60
    )
    _wait_until(lambda: running_recorder.app.store.watcher_count == 1)
    # Big events (a node with 256 devices each time) get past any buffering quickly. The
    # writers are never blocked by the stuck watcher: every RegisterNode below returns.
    for round_index in range(400):
        register_node(stub, "big", [gpu_device(f"GPU-{i}", index=i, memory_mib=1000 + round_index)
                                    for i in range(256)])
        if running_recorder.app.store.watcher_count == 0:
            break
    _wait_until(lambda: running_recorder.app.store.watcher_count == 0)
    with pytest.raises(grpc.RpcError) as caught:
        for _event in call:
            pass
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "send_initial_state" in caught.value.details()
    slow_channel.close()


def _wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    done = threading.Event()
    deadline_thread = threading.Timer(timeout_s, done.set)
    deadline_thread.start()
    try:
        while not done.is_set():
            if condition():
                return
            done.wait(0.02)
        assert condition(), "condition not reached in time"
    finally:
        deadline_thread.cancel()


# -- a Reserve states the reservation it replaces --------------------------------------------------


def _read_revision(stub: Stub, uid: str) -> int:
    pod = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S)
    return pod.stored_revision if pod.found else 0


def _reserve_replacing(stub: Stub, pod: Json, grants: Sequence[Sequence[tuple[str, int, int]]],
                       replaces: int) -> usage_pb2.ReserveResponse:
    request = usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(pod), node_name=NODE, replaces_revision=replaces,
        container_grants=[
            types_pb2.ContainerGrants(grants=[
                types_pb2.DeviceGrant(uuid=uuid, device_type="NVIDIA", memory_mib=mib,
                                      core_percent=cores)
                for uuid, mib, cores in per_container
            ])
            for per_container in grants
        ],
    )
    response: usage_pb2.ReserveResponse = stub.Reserve(request, timeout=RPC_TIMEOUT_S)
    return response


def test_reserve_replaces_only_the_reservation_it_states(stub: Stub) -> None:
    register_node(stub)
    assert _read_revision(stub, SEED_UID) == 0
    first = _reserve_replacing(stub, seed_pod(), SEED_GRANTS, 0)
    assert (first.reserved, first.stored_node_name) == (True, NODE)
    read = _read_revision(stub, SEED_UID)
    assert read == first.stored_revision > 0

    # A rival that read "nothing stored" is refused and changes nothing.
    rival = _reserve_replacing(stub, seed_pod(), (((GPU, 1000, 0),), ((GPU, 1000, 0),)), 0)
    assert (rival.reserved, rival.reason) == (False, "ReservationChanged")
    assert (rival.stored_revision, rival.stored_node_name) == (read, NODE)
    assert sum(u.memory_mib for u in rival.stored) == 20480
    assert figures(stub, SEED_UID).stored_mib == 20480

    # The re-filter that read it replaces it, under a new revision.
    again = _reserve_replacing(stub, seed_pod(), (((GPU, 1000, 0),), ((GPU, 1000, 0),)), read)
    assert again.reserved and again.stored_revision > read
    assert figures(stub, SEED_UID) == Figures(1000, 1000, 1000, stored_cores=0)


def test_release_reservation_states_what_it_releases_and_leaves_the_pod_reservable(
    stub: Stub,
) -> None:
    register_node(stub)
    reserved = _reserve_replacing(stub, seed_pod(), SEED_GRANTS, 0)

    stale = stub.ReleaseReservation(
        usage_pb2.ReleaseReservationRequest(pod_uid=SEED_UID,
                                            replaces_revision=reserved.stored_revision - 1),
        timeout=RPC_TIMEOUT_S)
    assert (stale.released, stale.reason) == (False, "ReservationChanged")
    assert figures(stub, SEED_UID).stored_mib == 20480

    released = stub.ReleaseReservation(
        usage_pb2.ReleaseReservationRequest(pod_uid=SEED_UID,
                                            replaces_revision=reserved.stored_revision),
        timeout=RPC_TIMEOUT_S)
    assert (released.released, released.reason) == (True, "Released")
    assert sum(u.memory_mib for u in released.released_usage) == 20480
    assert released.revision >= reserved.revision + 1
    assert figures(stub, SEED_UID) == NOTHING
    # No tombstone: the pod can be reserved again (it was not deleted).
    assert _reserve_replacing(stub, seed_pod(), SEED_GRANTS, 0).reserved


def test_stored_revisions_survive_a_restart(start_recorder: Any) -> None:
    first = start_recorder()
    register_node(first.stub)
    reserved = _reserve_replacing(first.stub, seed_pod(), SEED_GRANTS, 0)
    first.stop()

    again = start_recorder()

    assert _read_revision(again.stub, SEED_UID) == reserved.stored_revision
    refilter = _reserve_replacing(again.stub, seed_pod(), SEED_GRANTS, reserved.stored_revision)
    assert refilter.reserved and refilter.stored_revision > reserved.stored_revision
