"""NVIDIA MIG-mode cards, held to HAMi's own MIG test cases (v2.10.0, commit 4707fb02).

Every case names the HAMi test it comes from (``pkg/device/nvidia/...``, ``pkg/scheduler/...``).
HAMi's ``Fit`` sees a card's counters and its reserved placements; here they are a
``DeviceState`` (``slots_used``, ``memory_used_mib``, ``core_percent_used``, ``mig_in_use``) fitted
through ``accounting.fit``, whose MIG path is ``accounting.vendor_fit`` / ``accounting.mig``.
Cases marked "derived" were traced by hand through HAMi's code (no HAMi test asserts them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from accounting import hami_codec, mig
from accounting.allocation import allocation_annotations
from accounting.errors import InvalidInputError
from accounting.fit import NodeState, fit_node
from accounting.kube import pod_json
from accounting.ledger import Ledger
from accounting.limits import MAX_MIG_SLICES
from accounting.model import (
    Device,
    DeviceRequest,
    DeviceState,
    MigInstance,
    MigPlacement,
    MigProfile,
    Pod,
    PodPhase,
)
from accounting.policy import DEFAULT_POLICY
from accounting.validate import validate_devices
from accounting.vendors import NVIDIA_RESOURCES, NVIDIA_SPEC
from tests.builders import PodBuilder

P = MigPlacement

A100_T = (
    MigProfile("1g.5gb", 5120, 14, 1, tuple(P(s, 1) for s in range(7))),
    MigProfile("2g.10gb", 10240, 28, 2, (P(0, 2), P(2, 2), P(4, 2))),
    MigProfile("3g.20gb", 20480, 42, 3, (P(0, 4), P(4, 4))),
)
"""pkg/device/nvidia/mig_capability_test.go:27 (a100MigProfiles)."""
TWO_G_EVERYWHERE = (P(0, 2), P(2, 2), P(4, 2))
"""mig_capability_test.go:53: every 2g.10gb placement in use."""

D1_REGISTER = (
    '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB",'
    '"numa":0,"health":true,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,'
    '"core":14,"sliceCount":1,"instanceCount":7,"multiprocessorCount":14,'
    '"placements":[{"start":6,"size":1}]}]}]'
)
"""pkg/device/nvidia/device_test.go:2472 (TestGetNodeDevices_MigProfilesFromNode)."""


def mig_card(
    uuid: str = "GPU-a",
    *,
    profiles: tuple[MigProfile, ...] = A100_T,
    count: int = 7,
    memory: int = 40960,
    cores: int = 100,
) -> Device:
    return Device(uuid, "NVIDIA-A100", 0, count, memory, cores, mode="mig", mig_profiles=profiles)


def state(device: Device, *, used: int = 0, mib: int = 0, cores: int = 0,
          in_use: tuple[MigPlacement, ...] = ()) -> DeviceState:
    return DeviceState(device, mib, cores, used, in_use)


def one_container(request: DeviceRequest, annotations: dict[str, str] | None = None) -> Pod:
    builder = PodBuilder("p").app("main", request)
    for key, value in (annotations or {}).items():
        builder = builder.annotate(key, value)
    return builder.build()


def nvidia(count: int = 1, *, mib: int = 0, percent: int = 0, cores: int = 0) -> DeviceRequest:
    return DeviceRequest("NVIDIA", count, mib, percent, cores)


# -- the instance chosen (HAMi's selectMigCandidate) -------------------------------------------


@dataclass(frozen=True)
class ChoiceCase:
    name: str
    source: str
    occupied: tuple[MigPlacement, ...]
    memory_mib: int
    want: tuple[str, MigPlacement, int, int] | None
    profiles: tuple[MigProfile, ...] = A100_T


CHOICE_CASES = [
    ChoiceCase("10000 MiB is a 2g.10gb at the lowest free start, charged 10240 / 28",
               "mig_capability_test.go:35 TestAddResourceUsageUsesReportedProfileAndPlacement",
               (), 10000, ("2g.10gb", P(0, 2), 10240, 28)),
    ChoiceCase("no 2g left and both 3g placements overlap: 10000 MiB fits nowhere",
               "mig_capability_test.go:53 TestCustomFilterUsesReportedPlacementCapacity",
               TWO_G_EVERYWHERE, 10000, None),
    ChoiceCase("5000 MiB still gets the 1g.5gb at start 6",
               "mig_capability_test.go:53 TestCustomFilterUsesReportedPlacementCapacity",
               TWO_G_EVERYWHERE, 5000, ("1g.5gb", P(6, 1), 5120, 14)),
    ChoiceCase("a full small profile spills to the next larger one (derived)",
               "device.go:621 selectMigCandidate",
               (P(6, 1),), 1000, ("2g.10gb", P(0, 2), 10240, 28),
               profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)), *A100_T[1:])),
    ChoiceCase("every slice taken: nothing fits (derived)",
               "device.go:621 selectMigCandidate",
               tuple(P(s, 1) for s in range(7)), 1000, None),
]


@pytest.mark.parametrize("case", CHOICE_CASES, ids=lambda c: c.name)
def test_the_instance_chosen_is_hamis(case: ChoiceCase) -> None:
    choice = mig.choose_instance(case.profiles, case.occupied, case.memory_mib)
    if case.want is None:
        assert choice is None
        return
    assert choice is not None
    profile, placement, memory, cores = case.want
    assert (choice.instance, choice.memory_mib, choice.core_percent) == (
        MigInstance(profile, placement), memory, cores
    )


def test_balanced_packing_orders_placements_as_hami_does() -> None:
    """mig_topology_test.go:46 TestSelectMigPlacementUsesBalancedPacking: 3g, 2g, 1g, 1g on an
    empty A100 start at 4, 0, 3, 2 (1g and 3g from the top, the others from the bottom)."""
    occupied: list[MigPlacement] = []
    starts = []
    for memory in (20480, 10240, 5120, 5120):
        choice = mig.choose_instance(A100_T, occupied, memory)
        assert choice is not None
        occupied.append(choice.instance.placement)
        starts.append(choice.instance.placement.start)
    assert starts == [4, 0, 3, 2]


# -- the fit on a MIG card (HAMi's Fit + CustomFilterRule + AddResourceUsage) --------------------


@dataclass(frozen=True)
class FitCase:
    name: str
    source: str
    devices: tuple[DeviceState, ...]
    request: DeviceRequest
    fits: bool
    reason: str = ""
    grants: tuple[tuple[str, int, int, MigPlacement | None], ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)


FIT_CASES = [
    FitCase(
        "a 25 % request is 10240 MiB of the whole card: no 2g or 3g instance is free",
        "device_test.go:91 TestFitUsesEffectivePercentageMemoryForMigPlacement",
        (state(mig_card(), used=3, mib=30720, in_use=TWO_G_EVERYWHERE),),
        nvidia(percent=25),
        False,
        "1/1 CardMigTopologyInfeasible",
    ),
    FitCase(
        "a MIG card that registers no profiles (only a legacy template) fits nothing",
        "device_test.go:2644 TestFit_MigPercentageRequestRejectsUndersizedTemplate",
        (state(mig_card("dev-0", profiles=(), count=1, memory=8192)),),
        nvidia(percent=50, cores=10),
        False,
        "1/1 CardMigTopologyInfeasible",
    ),
    FitCase(
        "two devices on a card with one placement: one instance, then the revisit fails",
        "score_test.go:3614 Test_fitInCertainDevice 'mode is mig'",
        (state(
            mig_card("test-0", profiles=(MigProfile("1g.test", 2048, 1, 1, (P(0, 1),)),),
                     count=4, memory=8192, cores=4),
            used=1, mib=2048, cores=1,
        ),),
        nvidia(2, mib=1024, cores=1),
        False,
        "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible",
    ),
    FitCase(
        "one card, two instances of it for one container: starts 6 then 5, each 5120 / 14",
        "mig_allocation_test.go:207 TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU",
        (state(mig_card(profiles=(A100_T[0],))),),
        nvidia(2, mib=4000),
        True,
        grants=(("GPU-a", 5120, 14, P(6, 1)), ("GPU-a", 5120, 14, P(5, 1))),
        annotations={"nvidia.com/vgpu-mode": "mig"},
    ),
    FitCase(
        "one placement only: the second instance of the container does not fit",
        "mig_allocation_test.go:236 TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU",
        (state(mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)),))),),
        nvidia(2, mib=4000),
        False,
        "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible",
        annotations={"nvidia.com/vgpu-mode": "mig"},
    ),
    FitCase(
        "without a MIG card the count is checked against the cards",
        "mig_allocation_test.go:256 TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU",
        (state(Device("GPU-a", "NVIDIA-A100", 0, 7, 40960, 100, mode="hami-core")),),
        nvidia(2, mib=4000),
        False,
        "NodeInsufficientDevice",
        annotations={"nvidia.com/vgpu-mode": "hami-core"},
    ),
    FitCase(
        "a pod asking hami-core only gets no waiver on a MIG card",
        "mig_allocation_test.go:162 TestIsMIGRequest (vgpu-mode hami-core on mig cards)",
        (state(mig_card()),),
        nvidia(2, mib=4000),
        False,
        "NodeInsufficientDevice",
        annotations={"nvidia.com/vgpu-mode": "hami-core"},
    ),
    FitCase(
        "a pod without a mode annotation gets the waiver on a MIG card",
        "mig_allocation_test.go:162 TestIsMIGRequest (mig cards, no annotation)",
        (state(mig_card()),),
        nvidia(2, mib=4000),
        True,
        grants=(("GPU-a", 5120, 14, P(6, 1)), ("GPU-a", 5120, 14, P(5, 1))),
    ),
    FitCase(
        "a hami-core card refuses a pod that asks mps only",
        "device_test.go:2438 TestCheckType_AllocateMode (mps)",
        (state(Device("GPU-a", "NVIDIA-A100", 0, 10, 8192, 100, mode="hami-core")),),
        nvidia(mib=1000),
        False,
        "1/1 CardTypeMismatch",
        annotations={"nvidia.com/vgpu-mode": "mps"},
    ),
    FitCase(
        "a hami-core card takes a pod that asks hami-core",
        "device_test.go:2438 TestCheckType_AllocateMode (hami-core)",
        (state(Device("GPU-a", "NVIDIA-A100", 0, 10, 8192, 100, mode="hami-core")),),
        nvidia(mib=1000),
        True,
        grants=(("GPU-a", 1000, 0, None),),
        annotations={"nvidia.com/vgpu-mode": "hami-core"},
    ),
    FitCase(
        "D2: the dynamic MIG example, 2 x 8000 MiB, is two 2g.10gb at starts 0 and 2 (derived)",
        "examples/nvidia/dynamic_mig_example.yaml",
        (state(mig_card()),),
        nvidia(2, mib=8000),
        True,
        grants=(("GPU-a", 10240, 28, P(0, 2)), ("GPU-a", 10240, 28, P(2, 2))),
        annotations={"nvidia.com/vgpu-mode": "mig"},
    ),
    FitCase(
        "D3: 25 % with 20 cores asked is a 2g.10gb charged its 28 cores (derived)",
        "device.go:645 AddResourceUsage",
        (state(mig_card()),),
        nvidia(percent=25, cores=20),
        True,
        grants=(("GPU-a", 10240, 28, P(0, 2)),),
    ),
    FitCase(
        "D4: a whole card (every core, 100 %) is larger than any instance (derived)",
        "device.go:621 selectMigCandidate",
        (state(mig_card()),),
        nvidia(percent=100, cores=100),
        False,
        "1/1 CardMigTopologyInfeasible",
    ),
    FitCase(
        "D4 on a mixed node: the whole card goes to the hami-core card (derived)",
        "mig.md §2 pooling",
        (state(mig_card()),
         state(Device("GPU-b", "NVIDIA-A100", 1, 10, 40960, 100, mode="hami-core"))),
        nvidia(percent=100, cores=100),
        True,
        grants=(("GPU-b", 40960, 100, None),),
    ),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=lambda c: c.name)
def test_a_mig_card_fits_and_charges_what_hami_does(case: FitCase) -> None:
    fit = fit_node(one_container(case.request, case.annotations), NodeState("n", case.devices))
    assert (fit.fits, fit.reason) == (case.fits, case.reason)
    if case.fits:
        [grants] = [g for g in fit.grants if g]
        assert tuple(
            (g.uuid, g.memory_mib, g.core_percent, g.mig.placement if g.mig else None)
            for g in grants
        ) == case.grants


def test_two_mig_cards_each_give_one_instance_of_a_container() -> None:
    """mig_capability_test.go:71 TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs: the
    instance queued on one card does not take the other card's placement."""
    only_1g_left = (state(mig_card("GPU-a"), used=3, mib=30720, in_use=TWO_G_EVERYWHERE),
                    state(Device("GPU-b", "NVIDIA-A100", 1, 7, 40960, 100, mode="mig",
                                 mig_profiles=A100_T), used=3, mib=30720, in_use=TWO_G_EVERYWHERE))
    fit = fit_node(one_container(nvidia(2, mib=5000)), NodeState("n", only_1g_left))
    assert fit.fits
    [grants] = [g for g in fit.grants if g]
    assert sorted((g.uuid, g.mig) for g in grants) == [
        ("GPU-a", MigInstance("1g.5gb", P(6, 1))),
        ("GPU-b", MigInstance("1g.5gb", P(6, 1))),
    ]


def test_a_mode_other_than_mig_is_placed_as_hami_core() -> None:
    # HAMi gives mig alone a path of its own: a card in any other mode (its tests register
    # "hami"; an operator may set the device plugin's) is fitted and charged as hami-core.
    other = Device("GPU-x", "NVIDIA-A100", 0, 10, 40960, 100, mode="vgpu-timeslice")
    fit = fit_node(one_container(nvidia(mib=1000)), NodeState("n", (DeviceState(other),)))
    assert fit.fits and [(g.uuid, g.memory_mib, g.mig) for g in fit.grants[0]] == [
        ("GPU-x", 1000, None)
    ]


# -- D1 and D5: the annotation, the record and the release ---------------------------------------


def _d1_node() -> tuple[Device, ...]:
    return hami_codec.decode_node_register(D1_REGISTER)


def test_d1_the_issue_case_is_charged_the_instance_and_written_for_the_device_plugin() -> None:
    """Issue 20's pod (3000 MiB asked) on HAMi's MIG node registration: a 1g.5gb, charged 5120 /
    14, and the reservation the device plugin needs (mig.md D1, derived)."""
    devices = _d1_node()
    pod = one_container(nvidia(mib=3000))
    fit = fit_node(pod, NodeState("node1", tuple(DeviceState(d) for d in devices)))
    assert fit.fits
    written = allocation_annotations(
        fit.grants, [NVIDIA_SPEC], {d.uuid: d for d in devices},
        node_name="node1", unix_s=0, annotations={},
    )
    assert written == {
        "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,5120,14:;",
        "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,5120,14:;",
        "hami.io/vgpu-mig-allocations": (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.5gb",'
            '"placement":{"start":6,"size":1}}]'
        ),
    }
    [usage] = fit.usage
    assert (usage.memory_mib, usage.core_percent, usage.slots) == (5120, 14, 1)

    # Recorded from those annotations, the card's only placement is taken: the same pod again
    # fits no instance; released, it fits again.
    ledger = Ledger()
    ledger.register_node("node1", devices)
    placed = _kube_pod("d1", {"hami.io/vgpu-node": "node1", **written}, apps=[("main", 3000)])
    ledger.record(placed)
    [card] = ledger.node_states("node1") or ()
    assert (card.memory_used_mib, card.core_percent_used, card.mig_in_use) == (5120, 14, (P(6, 1),))
    again = fit_node(pod, NodeState("node1", (card,)))
    assert (again.fits, again.reason) == (False, "1/1 CardMigTopologyInfeasible")
    ledger.forget(placed.uid)
    [card] = ledger.node_states("node1") or ()
    assert (card.memory_used_mib, card.mig_in_use) == (0, ())
    assert fit_node(pod, NodeState("node1", (card,))).fits


def test_d5_an_init_and_an_app_container_may_hold_the_same_instance_in_turn() -> None:
    """mig.md D5 (derived): with one placement, the init container and the app container are
    each given (6,1): they never run at once. Stored 5120 / 14 / one slot, and the instance stays
    held after the init container finished (HAMi keeps every reservation while the pod lives)."""
    devices = _d1_node()
    pod = (PodBuilder("p").init("init", nvidia(mib=3000)).app("main", nvidia(mib=3000)).build())
    fit = fit_node(pod, NodeState("node1", tuple(DeviceState(d) for d in devices)))
    assert fit.fits
    assert [g.mig for g in fit.grants[0]] == [g.mig for g in fit.grants[1]] == [
        MigInstance("1g.5gb", P(6, 1))
    ]
    written = allocation_annotations(
        fit.grants, [NVIDIA_SPEC], {d.uuid: d for d in devices},
        node_name="node1", unix_s=0, annotations={},
    )
    allocated = written["hami.io/vgpu-devices-allocated"]
    assert allocated == "GPU-0,NVIDIA,5120,14:;GPU-0,NVIDIA,5120,14:;"
    reservations = json.loads(written["hami.io/vgpu-mig-allocations"])
    assert [r["containerIndex"] for r in reservations] == [0, 1]

    ledger = Ledger()
    ledger.register_node("node1", devices)
    annotations = {"hami.io/vgpu-node": "node1", **written}
    running = _kube_pod("d5", annotations, inits=[("init", 3000)], apps=[("main", 3000)],
                        init_state="running")
    ledger.record(running)
    [card] = ledger.node_states("node1") or ()
    assert (card.memory_used_mib, card.core_percent_used, card.slots_used) == (5120, 14, 1)
    assert card.mig_in_use == (P(6, 1),)
    finished = _kube_pod("d5", annotations, inits=[("init", 3000)], apps=[("main", 3000)],
                         init_state="terminated")
    ledger.record(finished)
    [card] = ledger.node_states("node1") or ()
    assert (card.memory_used_mib, card.mig_in_use) == (5120, (P(6, 1),))


# -- the usage rebuilt from a pod's annotations (HAMi's getNodesUsage) ---------------------------


def _kube_pod(
    uid: str,
    annotations: dict[str, str],
    *,
    inits: list[tuple[str, int]] = (),  # type: ignore[assignment]
    apps: list[tuple[str, int]],
    init_state: str = "running",
) -> Pod:
    def container(name: str, mib: int) -> dict[str, object]:
        return {"name": name, "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}}}

    statuses = [
        {"name": name, "state": {init_state: {"exitCode": 0} if init_state == "terminated"
                                 else {}}}
        for name, _ in inits
    ]
    return pod_json.parse_pod({
        "metadata": {"uid": uid, "name": uid, "namespace": "default", "annotations": annotations},
        "spec": {
            "initContainers": [container(n, m) for n, m in inits],
            "containers": [container(n, m) for n, m in apps],
        },
        "status": {"phase": PodPhase.RUNNING.value, "initContainerStatuses": statuses},
    }, (NVIDIA_RESOURCES,))


M13_ALLOCATIONS = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
    '"placement":{"start":6,"size":1},"migUUID":"MIG-a","gpuInstanceID":7,"computeInstanceID":0}]'
)
"""mig_allocation_test.go:33 TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement."""


def _rebuild(devices: tuple[Device, ...], annotations: dict[str, str]) -> DeviceState:
    ledger = Ledger()
    ledger.register_node("node1", devices)
    ledger.record(_kube_pod("pod", {"hami.io/vgpu-node": "node1", **annotations},
                            apps=[("main", 4000)]))
    [card, *_] = ledger.node_states("node1") or ()
    return card


def test_a_recorded_reservation_takes_its_placement() -> None:
    """M13: the device plugin's runtime fields (migUUID, GI, CI) come along and change nothing."""
    card = _rebuild(
        (mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)),)),),
        {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,5120,14:;",
         "hami.io/vgpu-mig-allocations": M13_ALLOCATIONS},
    )
    assert card.mig_in_use == (P(6, 1),)


def test_a_mig_grant_without_its_reservation_closes_the_card() -> None:
    """M14 (mig_allocation_test.go:59 TestGetNodesUsageFailsClosedWithoutMigAllocation): HAMi
    marks the card unhealthy; here the grant holds every slice, so nothing more is placed
    there until the pod goes."""
    card = _rebuild((mig_card(),), {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,5120,14:;"})
    assert card.mig_in_use == (P(0, 8),)
    fit = fit_node(one_container(nvidia(mib=1000)), NodeState("n", (card,)))
    assert (fit.fits, fit.reason) == (False, "1/1 CardMigTopologyInfeasible")


def test_every_reservation_of_a_pod_on_one_card_is_held() -> None:
    """M15 (mig_allocation_test.go:82 TestGetNodesUsageRestoresUnconsumedMigReservations): two
    instances of one container on one card, both placements held."""
    card = _rebuild(
        (mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(5, 1), P(6, 1))),)),),
        {
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,5120,14:GPU-a,NVIDIA,5120,14:;",
            "hami.io/vgpu-mig-allocations": json.dumps([
                {"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-a", "profile": "1g.5gb",
                 "placement": {"start": 6, "size": 1}},
                {"containerIndex": 0, "deviceIndex": 1, "gpuUUID": "GPU-a", "profile": "1g.5gb",
                 "placement": {"start": 5, "size": 1}},
            ]),
        },
    )
    assert card.mig_in_use == (P(5, 1), P(6, 1))


def test_reserve_refuses_an_instance_another_pod_holds() -> None:
    devices = _d1_node()
    ledger = Ledger()
    ledger.register_node("node1", devices)
    pod = one_container(nvidia(mib=3000))
    fit = fit_node(pod, NodeState("node1", tuple(DeviceState(d) for d in devices)))
    first = _with_grants(pod, "first", fit.grants)
    second = _with_grants(pod, "second", fit.grants)
    assert ledger.reserve(first, "node1").reserved
    refused = ledger.reserve(second, "node1")
    assert (refused.reserved, refused.reason) == (False, "MigPlacementTaken")
    assert "slices 6-6" in refused.message
    # A re-filter of the same pod replaces its own reservation.
    assert ledger.reserve(first, "node1").reserved


def _with_grants(pod: Pod, uid: str, grants: tuple[tuple[object, ...], ...]) -> Pod:
    from dataclasses import replace

    return replace(
        pod,
        uid=uid,
        containers=tuple(
            replace(c, grants=g)  # type: ignore[arg-type]
            for c, g in zip(pod.containers, grants, strict=True)
        ),
    )


# -- hami.io/vgpu-mig-allocations ----------------------------------------------------------------


def test_the_annotation_encodes_as_hami_writes_it() -> None:
    """mig_profiles_test.go:36 TestEncodeDecodeMigAllocations."""
    allocation = mig.MigAllocation(0, 0, "GPU-a", MigInstance("1g.5gb", P(6, 1)))
    text = mig.encode_allocations([allocation])
    assert text == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    assert mig.decode_allocations(text, path="a") == (allocation,)
    assert mig.encode_allocations([]) == ""


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
            '"placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":0,'
            '"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]',
            "duplicate MIG allocation for container 0 device 0",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
            '"placement":{"start":0,"size":2},"migUUID":"MIG-a"}]',
            "partial runtime identity",
        ),
        ('[{"profile":"1g.5gb"}]', "the MIG allocation is incomplete"),
    ],
    ids=[
        "mig_profiles_test.go:61 duplicate container and device",
        "mig_profiles_test.go:82 partial runtime identity",
        "pod_test.go:395 an incomplete reservation",
    ],
)
def test_a_bad_annotation_is_refused_naming_the_entry(value: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        mig.decode_allocations(value, path="mig")
    assert problem in str(caught.value)
    assert caught.value.violations[0].path.startswith("mig[")


def test_a_complete_runtime_identity_is_accepted() -> None:
    """mig_profiles_test.go:68: GI 4 and CI 0 with the MIG UUID."""
    [allocation] = mig.decode_allocations(
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2},"migUUID":"MIG-a","gpuInstanceID":4,'
        '"computeInstanceID":0}]',
        path="mig",
    )
    assert allocation.instance == MigInstance("2g.10gb", P(0, 2))
    # Kept for HAMi's hami_node_gpu_mig_instance_info, and no part of the allocation's value.
    assert allocation.runtime == mig.MigRuntime("MIG-a", 4, 0)
    assert allocation == mig.MigAllocation(0, 0, "GPU-a", MigInstance("2g.10gb", P(0, 2)))


@pytest.mark.parametrize(
    "runtime",
    ['', ',"migUUID":"MIG-a","gpuInstanceID":"4","computeInstanceID":0',
     ',"migUUID":"MIG-a","gpuInstanceID":4,"computeInstanceID":true'],
    ids=["not created yet", "an id as a string", "an id as a boolean"],
)
def test_no_runtime_identity_until_the_device_plugin_wrote_a_whole_one(runtime: str) -> None:
    [allocation] = mig.decode_allocations(
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        f'"placement":{{"start":0,"size":2}}{runtime}}}]',
        path="mig",
    )
    assert allocation.runtime is None


def test_the_node_registration_keeps_the_profiles() -> None:
    """device_test.go:2472 TestGetNodeDevices_MigProfilesFromNode; devices_test.go:384: a
    profile is written back in HAMi's compact form (instanceCount is not on the wire)."""
    [device] = _d1_node()
    assert device.mode == "mig"
    assert device.mig_profiles == (MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)),)
    assert mig.encode_profiles(device.mig_profiles) == [
        {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
         "placements": [{"start": 6, "size": 1}]}
    ]
    assert DEFAULT_POLICY.vendor("NVIDIA") is not None


# -- profiles checked against their card at registration ----------------------------------------


def _register(profiles: list[dict[str, object]], devmem: int = 40960, devcore: int = 100) -> str:
    return json.dumps([{"id": "GPU-0", "count": 7, "devmem": devmem, "devcore": devcore,
                        "type": "NVIDIA-A100-SXM4-40GB", "health": True, "mode": "mig",
                        "migProfiles": profiles}])


def _profile(**overrides: object) -> dict[str, object]:
    profile: dict[str, object] = {"name": "1g.5gb", "memoryMB": 5120, "core": 14,
                                  "sliceCount": 1, "placements": [{"start": 6, "size": 1}]}
    profile.update(overrides)
    return profile


PROFILE_CASES = [
    ("more memory than the card", _profile(memoryMB=50000), "[0].memoryMB",
     "the card's memory (devmem 40960), got 50000"),
    ("more compute than the card", _profile(core=140), "[0].core",
     "the card's compute (devcore 100), got 140"),
    ("a placement beyond the card's slices", _profile(placements=[{"start": 60, "size": 4}]),
     "[0].placements[0]", "got start 60 size 4"),
    ("a placement ending past slice 7", _profile(placements=[{"start": 6, "size": 4}]),
     "[0].placements[0]", "got start 6 size 4"),
    ("a placement of no slice", _profile(placements=[{"start": 3, "size": 0}]),
     "[0].placements[0]", "got start 3 size 0"),
]


@pytest.mark.parametrize(("what", "profile", "field", "words"), PROFILE_CASES,
                         ids=[c[0] for c in PROFILE_CASES])
def test_a_profile_its_card_cannot_hold_is_refused_naming_it(
    what: str, profile: dict[str, object], field: str, words: str
) -> None:
    path = 'annotations["hami.io/node-nvidia-register"]'
    with pytest.raises(InvalidInputError) as refused:
        hami_codec.decode_node_register(_register([_profile(name="7g.40gb", memoryMB=40960,
                                                            core=100, sliceCount=7,
                                                            placements=[{"start": 0, "size": 8}]),
                                                   profile]), path=path)
    [violation] = refused.value.violations
    assert violation.path == f"{path}[0].migProfiles{field.replace('[0]', '[1]', 1)}"
    assert words in violation.message


def test_hamis_own_registrations_are_held_by_their_cards() -> None:
    """The A100 table of mig_capability_test.go and device_test.go's registration, as the
    device plugin writes them: every profile fits its card (the whole card included)."""
    devices = hami_codec.decode_node_register(D1_REGISTER)
    assert devices[0].mig_profiles[0].placements == (P(6, 1),)
    card = mig_card(profiles=(*A100_T, MigProfile("7g.40gb", 40960, 100, 7, (P(0, 8),))))
    validate_devices((card,))
    assert max(p.end for profile in card.mig_profiles for p in profile.placements) == (
        MAX_MIG_SLICES)


def test_a_typed_inventory_is_checked_the_same_way() -> None:
    card = mig_card(profiles=(MigProfile("1g.5gb", 50000, 140, 1, (P(7, 2),)),))
    with pytest.raises(InvalidInputError) as refused:
        validate_devices((card,))
    assert [v.path for v in refused.value.violations] == [
        "devices[0].mig_profiles[0].memory_mib", "devices[0].mig_profiles[0].core_percent",
        "devices[0].mig_profiles[0].placements[0]"]
