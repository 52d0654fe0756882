"""The ledger: totals by deltas, reservations, and bad input that changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from accounting.errors import InvalidInputError
from accounting.ledger import Ledger, ReserveReason
from accounting.lifecycle import Decision, StoredPod
from accounting.model import Pod, PodPhase
from accounting.quota import QuotaReason
from tests.builders import PodBuilder, device, gpu, usage

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
COUNT = "nvidia.com/gpu"
NS = "team-a"


def _ledger(*, slots: int = 10) -> Ledger:
    ledger = Ledger()
    ledger.register_node(
        "node1",
        [device("g0", mib=24576, slots=slots), device("g1", mib=24576, slots=slots, index=1)],
    )
    return ledger


def _snapshot(ledger: Ledger) -> tuple[object, ...]:
    """Everything a change could touch."""
    return (
        {pod.uid: pod for pod in ledger.pods()},
        {node: ledger.node_states(node) for node in ledger.node_names()},
        {node: ledger.node_usage(node) for node in ("node1", "node2")},
        {ns: ledger.namespace_items(ns) for ns in ledger.namespaces()},
        {ns: ledger.limits(ns) for ns in ledger.namespaces()},
        ledger.revision,
    )


def _pod(name: str, *grants_per_app: int, node: str = "node1") -> Pod:
    builder = PodBuilder(name, namespace=NS, node=node)
    for index, mib in enumerate(grants_per_app):
        builder.app(f"a{index}", gpu("g0", mib=mib, cores=10))
    return builder.build()


# -- totals ----------------------------------------------------------------------------------


def test_record_charges_node_and_namespace_with_the_effective_usage() -> None:
    ledger = _ledger()
    pod = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=20480, cores=10))
        .app("a", gpu("g0", mib=10240, cores=5), gpu("g1", mib=1000, cores=1))
        .build()
    )

    ledger.record(pod)

    states = {s.device.uuid: s for s in ledger.node_states("node1") or ()}
    assert (states["g0"].memory_used_mib, states["g0"].cores_used, states["g0"].slots_used) == (
        20480,
        10,
        1,
    )
    assert states["g0"].memory_free_mib == 4096
    assert (states["g1"].memory_used_mib, states["g1"].slots_used) == (1000, 1)
    items = ledger.namespace_items(NS)
    assert (items[MEM].used, items[CORES].used, items[COUNT].used) == (21480, 11, 2)


def test_recording_the_same_update_twice_changes_nothing() -> None:
    ledger = _ledger()
    pod = _pod("p", 1000)
    ledger.record(pod)
    before = _snapshot(ledger)

    outcome = ledger.record(pod)

    assert outcome.decision is Decision.UNCHANGED
    assert outcome.change.changed is False
    assert _snapshot(ledger) == before


def test_forget_returns_every_total_to_zero_and_drops_empty_entries() -> None:
    ledger = _ledger()
    pods = [_pod("p1", 1000), _pod("p2", 2000, 3000)]
    for pod in pods:
        ledger.record(pod)

    for pod in pods:
        ledger.forget(pod.uid)

    assert len(ledger) == 0
    assert ledger.node_usage("node1") == {}
    assert ledger.namespace_items(NS) == {}


def test_forget_of_an_unknown_pod_changes_nothing() -> None:
    ledger = _ledger()
    ledger.record(_pod("p", 1000))
    before = _snapshot(ledger)

    change = ledger.forget("uid-never-seen")

    assert change.changed is False
    assert _snapshot(ledger) == before


def test_restore_puts_back_an_acknowledged_value_exactly() -> None:
    ledger = _ledger()
    stored = StoredPod(
        "uid-x", NS, "x", "node1", (usage("g0", 10240, 5, slots=1),), init_released=True
    )

    ledger.restore(stored)
    ledger.restore(stored)

    assert ledger.pod("uid-x") == stored
    assert ledger.namespace_items(NS)[MEM].used == 10240
    assert ledger.node_usage("node1") == {"g0": (10240, 5, 1)}


def test_set_quota_keeps_used_and_an_empty_mapping_removes_the_limits() -> None:
    ledger = _ledger()
    ledger.record(_pod("p", 1000))

    ledger.set_quota(NS, {MEM: 24576})
    assert ledger.namespace_items(NS)[MEM].used == 1000
    assert ledger.namespace_items(NS)[MEM].limit == 24576
    assert ledger.namespace_items(NS)[MEM].limit_set is True

    ledger.set_quota(NS, {})
    assert ledger.namespace_items(NS)[MEM].limit_set is False
    assert ledger.namespace_items(NS)[MEM].used == 1000


# -- bad input -------------------------------------------------------------------------------


def test_set_quota_refuses_a_negative_limit_naming_the_key_and_keeps_the_old_limits() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 10000})
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.set_quota(NS, {MEM: 20000, CORES: -1})

    assert [v.path for v in error.value.violations] == [f"limits[{CORES!r}]"]
    assert CORES in str(error.value)
    assert _snapshot(ledger) == before


def test_record_refuses_a_grant_for_a_device_the_node_lacks_and_changes_nothing() -> None:
    ledger = _ledger()
    ledger.record(_pod("other", 1000))
    bad = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=100))
        .app("a", gpu("g1", mib=100), gpu("GPU-missing", mib=100))
        .build()
    )
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.record(bad)

    assert [v.path for v in error.value.violations] == ["pod.containers[1].grants[1].uuid"]
    assert "GPU-missing" in str(error.value)
    assert _snapshot(ledger) == before


def test_reserve_on_an_unregistered_node_is_bad_input_and_changes_nothing() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.reserve(_pod("p", 1000), "node-unknown")

    assert [v.path for v in error.value.violations] == ["node_name"]
    assert _snapshot(ledger) == before


def test_reserve_refuses_a_grant_for_a_device_the_node_lacks_naming_the_field() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)
    pod = PodBuilder("p", namespace=NS).app("a", gpu("GPU-missing", mib=100)).build()

    with pytest.raises(InvalidInputError) as error:
        ledger.reserve(pod, "node1")

    assert [v.path for v in error.value.violations] == ["container_grants[0].grants[0].uuid"]
    assert _snapshot(ledger) == before


# -- reserve ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    name: str
    slots_per_device: int
    quota: dict[str, int]
    already: tuple[Pod, ...]
    pod: Pod
    want_reason: str


def _cores_pod(name: str, cores: int) -> Pod:
    return PodBuilder(name, namespace=NS).app("a", gpu("g0", mib=100, cores=cores)).build()


REFUSALS = [
    Refusal(
        "memory: 20480 held, 12288 more does not fit a 24576 card",
        10,
        {},
        (_pod("held", 20480),),
        _pod("p", 12288),
        ReserveReason.INSUFFICIENT_MEMORY,
    ),
    Refusal(
        "cores: 60 percent held, 50 more exceed 100",
        10,
        {},
        (_cores_pod("held", 60),),
        _cores_pod("p", 50),
        ReserveReason.INSUFFICIENT_CORE,
    ),
    Refusal(
        "slots: a one-slot card already shared is exhausted",
        1,
        {},
        (_pod("held", 100),),
        _pod("p", 100),
        ReserveReason.SLOTS_EXHAUSTED,
    ),
    Refusal(
        "quota: 8000 used + 4000 over a 10000 limit",
        10,
        {MEM: 10000},
        (_pod("held", 8000),),
        _pod("p", 4000),
        QuotaReason.MEMORY_EXCEEDED.value,
    ),
    Refusal(
        "quota: an explicit limit of 0 refuses the first reservation",
        10,
        {MEM: 0},
        (),
        _pod("p", 1),
        QuotaReason.MEMORY_EXCEEDED.value,
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.name)
def test_reserve_refusal_changes_nothing(case: Refusal) -> None:
    ledger = _ledger(slots=case.slots_per_device)
    ledger.set_quota(NS, case.quota)
    for pod in case.already:
        assert ledger.reserve(pod, "node1").reserved
    before = _snapshot(ledger)

    outcome = ledger.reserve(case.pod, "node1")

    assert (outcome.reserved, outcome.reason) == (False, case.want_reason)
    assert outcome.change is None
    assert ledger.pod(case.pod.uid) is None
    assert _snapshot(ledger) == before


def test_reserve_without_grants_is_refused_and_changes_nothing() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)

    outcome = ledger.reserve(PodBuilder("p", namespace=NS).app("a").build(), "node1")

    assert (outcome.reserved, outcome.reason) == (False, ReserveReason.NO_GRANTS)
    assert _snapshot(ledger) == before


def test_reserve_stores_the_effective_usage_and_the_boundary_is_inclusive() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 24576})
    pod = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=24576, cores=10))
        .app("a", gpu("g0", mib=10240, cores=5))
        .build()
    )

    outcome = ledger.reserve(pod, "node1")

    assert (outcome.reserved, outcome.reason) == (True, ReserveReason.RESERVED)
    stored = ledger.pod(pod.uid)
    assert stored is not None
    assert (stored.node_name, stored.usage) == ("node1", (usage("g0", 24576, 10, slots=1),))
    assert ledger.namespace_items(NS)[MEM].used == 24576


def test_reserving_again_for_the_same_pod_replaces_the_old_reservation() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 20000})
    first = _pod("p", 15000)
    again = _pod("p", 16000)
    assert ledger.reserve(first, "node1").reserved

    outcome = ledger.reserve(again, "node1")

    assert outcome.reserved, outcome.message
    assert ledger.node_usage("node1") == {"g0": (16000, 10, 1)}
    assert ledger.namespace_items(NS)[MEM].used == 16000


def test_a_terminal_pod_stays_released_when_seen_again() -> None:
    ledger = _ledger()
    builder = PodBuilder("p", namespace=NS).app("a", gpu("g0", mib=1000))
    ledger.record(builder.build())
    ledger.record(builder.phase(PodPhase.SUCCEEDED).build())

    outcome = ledger.record(builder.phase(PodPhase.RUNNING).build())

    assert outcome.decision is Decision.UNCHANGED
    assert ledger.namespace_items(NS) == {}
    assert ledger.node_usage("node1") == {}
