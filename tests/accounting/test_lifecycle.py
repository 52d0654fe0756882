"""Lifecycle vectors L1–L14 (docs/design.md §9) on the Ledger, with the #2723 gate.

Each case is a sequence of steps (record the pod's current state, or forget it as on deletion).
After every step the test checks the stored usage, the init-released flag, and the namespace's
used memory and cores. The gate cases of L12 also run on ``regular_init_gate_open`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from accounting.ledger import Ledger
from accounting.lifecycle import Decision, regular_init_gate_open
from accounting.model import DeviceUsage, Pod, PodPhase
from tests.builders import PodBuilder, device, gpu, usage

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
NS = "team-a"


@dataclass(frozen=True)
class Step:
    action: str
    """"record" the pod, or "forget" it (the pod was deleted)."""
    pod: Pod
    want_decision: Decision | None
    want_usage: tuple[DeviceUsage, ...] | None
    """What the ledger stores for the pod afterwards; None = nothing stored."""
    want_released: bool | None
    want_used_mib: int
    want_used_cores: int


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]


def record(
    pod: Pod,
    decision: Decision,
    stored: tuple[DeviceUsage, ...] | None,
    *,
    released: bool | None,
    mib: int,
    cores: int,
) -> Step:
    return Step("record", pod, decision, stored, released, mib, cores)


def forget(pod: Pod, *, mib: int, cores: int) -> Step:
    return Step("forget", pod, None, None, None, mib, cores)


def _l1_builder() -> PodBuilder:
    """The pod of L1: init 20000/10, app 10000/5 on g0."""
    return (
        PodBuilder("l1", namespace=NS)
        .init("init", gpu("g0", mib=20000, cores=10))
        .app("app", gpu("g0", mib=10000, cores=5))
    )


PEAK = (usage("g0", 20000, 10, slots=1),)
APPS = (usage("g0", 10000, 5, slots=1),)

L1_ADDED = _l1_builder().running("init").build()
L1_SHRUNK = _l1_builder().terminated("init", 0).running("app").phase(PodPhase.RUNNING).build()


def _l1_steps() -> tuple[Step, ...]:
    return (
        record(L1_ADDED, Decision.RECORDED, PEAK, released=False, mib=20000, cores=10),
        record(L1_SHRUNK, Decision.SHRUNK, APPS, released=True, mib=10000, cores=5),
    )


def _sidecar_builder() -> PodBuilder:
    """S(2000) I(20000) A(10000) on g0: effective 22000/12 s2, steady 12000/7 s2."""
    return (
        PodBuilder("l11", namespace=NS)
        .sidecar("proxy", gpu("g0", mib=2000, cores=2))
        .init("init", gpu("g0", mib=20000, cores=10))
        .app("app", gpu("g0", mib=10000, cores=5))
    )


CASES = [
    Case("L1 init exit 0 shrinks 20000/10 to the app's 10000/5 and sets the flag", _l1_steps()),
    Case(
        "L2 replaying the shrink update changes nothing (idempotent)",
        (
            *_l1_steps(),
            record(L1_SHRUNK, Decision.UNCHANGED, APPS, released=True, mib=10000, cores=5),
        ),
    ),
    Case(
        "L3 re-adding the same UID with the full grants keeps the shrunk value, no second charge",
        (
            *_l1_steps(),
            record(
                _l1_builder().terminated("init", 0).running("app").phase(PodPhase.RUNNING).build(),
                Decision.UNCHANGED,
                APPS,
                released=True,
                mib=10000,
                cores=5,
            ),
        ),
    ),
    Case(
        "L4 init exit 1 with phase Running holds the init-inclusive 20000/10",
        (
            record(L1_ADDED, Decision.RECORDED, PEAK, released=False, mib=20000, cores=10),
            record(
                _l1_builder().terminated("init", 1).phase(PodPhase.RUNNING).build(),
                Decision.HELD,
                PEAK,
                released=False,
                mib=20000,
                cores=10,
            ),
        ),
    ),
    Case(
        "L5 phase Failed after a failed init (restartPolicy Never) releases 20000 to 0",
        (
            record(L1_ADDED, Decision.RECORDED, PEAK, released=False, mib=20000, cores=10),
            record(
                _l1_builder().terminated("init", 1).phase(PodPhase.FAILED).build(),
                Decision.RELEASED,
                (),
                released=False,
                mib=0,
                cores=0,
            ),
            forget(L1_ADDED, mib=0, cores=0),
        ),
    ),
    Case(
        "L6 phase Succeeded after the shrink releases 10000 to 0",
        (
            *_l1_steps(),
            record(
                _l1_builder()
                .terminated("init", 0)
                .terminated("app")
                .phase(PodPhase.SUCCEEDED)
                .build(),
                Decision.RELEASED,
                (),
                released=True,
                mib=0,
                cores=0,
            ),
        ),
    ),
    Case(
        "L7 delete without a shrink subtracts the 20000 that was added",
        (
            record(L1_ADDED, Decision.RECORDED, PEAK, released=False, mib=20000, cores=10),
            forget(L1_ADDED, mib=0, cores=0),
        ),
    ),
    Case(
        "L8 delete after the shrink subtracts the stored 10000 (add and remove symmetric)",
        (*_l1_steps(), forget(L1_SHRUNK, mib=0, cores=0)),
    ),
    Case(
        "L9 a terminating pod (deletionTimestamp, phase Running) keeps its usage",
        (
            record(L1_ADDED, Decision.RECORDED, PEAK, released=False, mib=20000, cores=10),
            record(
                _l1_builder().running("init").phase(PodPhase.RUNNING).terminating().build(),
                Decision.UNCHANGED,
                PEAK,
                released=False,
                mib=20000,
                cores=10,
            ),
        ),
    ),
    Case(
        "L10 a pod without init containers never shrinks whatever its status",
        (
            record(
                PodBuilder("l10", namespace=NS).app("app", gpu("g0", mib=10000, cores=5)).build(),
                Decision.RECORDED,
                APPS,
                released=False,
                mib=10000,
                cores=5,
            ),
            record(
                PodBuilder("l10", namespace=NS)
                .app("app", gpu("g0", mib=10000, cores=5))
                .terminated("app", 0)
                .phase(PodPhase.RUNNING)
                .build(),
                Decision.UNCHANGED,
                APPS,
                released=False,
                mib=10000,
                cores=5,
            ),
        ),
    ),
    Case(
        "L11 #2723 init exit 0 with the sidecar running opens the gate: steady state kept",
        (
            record(
                _sidecar_builder().running("proxy").running("init").build(),
                Decision.RECORDED,
                (usage("g0", 22000, 12, slots=2),),
                released=False,
                mib=22000,
                cores=12,
            ),
            record(
                _sidecar_builder()
                .running("proxy")
                .terminated("init", 0)
                .running("app")
                .phase(PodPhase.RUNNING)
                .build(),
                Decision.SHRUNK,
                (usage("g0", 12000, 7, slots=2),),
                released=True,
                mib=12000,
                cores=7,
            ),
        ),
    ),
    Case(
        "L13 forgetting never drives totals negative (HAMi clamps RmUsage at 0)",
        (
            *_l1_steps(),
            forget(L1_SHRUNK, mib=0, cores=0),
            forget(L1_SHRUNK, mib=0, cores=0),
            forget(
                PodBuilder("never-seen", namespace=NS, uid="uid-unknown").build(), mib=0, cores=0
            ),
        ),
    ),
    Case(
        "L14 first recorded after its init finished (scheduler restart): stored at steady state, "
        "fixing HAMi's re-charge of the peak",
        (
            record(
                L1_SHRUNK, Decision.RECORDED_STEADY_STATE, APPS, released=True, mib=10000, cores=5
            ),
            record(L1_SHRUNK, Decision.UNCHANGED, APPS, released=True, mib=10000, cores=5),
        ),
    ),
]


def _two_inits() -> PodBuilder:
    """init1 20000/10, init2 15000/8, app 10000/5 on g0."""
    return (
        PodBuilder("two-inits", namespace=NS)
        .init("init1", gpu("g0", mib=20000, cores=10))
        .init("init2", gpu("g0", mib=15000, cores=8))
        .app("app", gpu("g0", mib=10000, cores=5))
    )


SECOND_INIT = (usage("g0", 15000, 8, slots=1),)

# Beyond HAMi (docs/design.md §7): release each init container as it finishes and its known
# gap (a re-created sandbox runs the init containers again under the same UID).
BEYOND_HAMI = [
    Case(
        "progressive release: the first of two inits exiting 0 releases its share, "
        "a replayed older status undoes nothing",
        (
            record(
                _two_inits().running("init1").build(),
                Decision.RECORDED,
                PEAK,
                released=False,
                mib=20000,
                cores=10,
            ),
            record(
                _two_inits().terminated("init1", 0).running("init2").build(),
                Decision.PARTIALLY_RELEASED,
                SECOND_INIT,
                released=False,
                mib=15000,
                cores=8,
            ),
            record(
                _two_inits().running("init1").build(),
                Decision.UNCHANGED,
                SECOND_INIT,
                released=False,
                mib=15000,
                cores=8,
            ),
            record(
                _two_inits().terminated("init1", 0).terminated("init2", 0).build(),
                Decision.SHRUNK,
                APPS,
                released=True,
                mib=10000,
                cores=5,
            ),
        ),
    ),
    Case(
        "sandbox re-run: init running again with a higher restartCount restores the peak, "
        "then shrinks again",
        (
            *_l1_steps(),
            record(
                _l1_builder().running("init", restarts=1).forget_status("app").build(),
                Decision.RERUN_RESTORED,
                PEAK,
                released=False,
                mib=20000,
                cores=10,
            ),
            record(
                _l1_builder().terminated("init", 0, restarts=1).phase(PodPhase.RUNNING).build(),
                Decision.SHRUNK,
                APPS,
                released=True,
                mib=10000,
                cores=5,
            ),
        ),
    ),
    Case(
        "an older status replayed after the shrink (same restartCount) keeps the shrunk value",
        (
            *_l1_steps(),
            record(L1_ADDED, Decision.UNCHANGED, APPS, released=True, mib=10000, cores=5),
        ),
    ),
]


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.register_node("node1", [device("g0", mib=40960), device("g1", mib=40960, index=1)])
    return ledger


def _used(ledger: Ledger, resource: str) -> int:
    item = ledger.namespace_items(NS).get(resource)
    return item.used if item else 0


@pytest.mark.parametrize("case", CASES + BEYOND_HAMI, ids=lambda c: c.name)
def test_lifecycle_on_the_ledger(case: Case) -> None:
    ledger = _ledger()
    for number, step in enumerate(case.steps, start=1):
        where = f"step {number} ({step.action})"
        if step.action == "record":
            outcome = ledger.record(step.pod)
            assert outcome.decision is step.want_decision, where
        else:
            ledger.forget(step.pod.uid)

        stored = ledger.pod(step.pod.uid)
        if step.want_usage is None:
            assert stored is None, where
        else:
            assert stored is not None, where
            assert stored.usage == step.want_usage, where
            assert stored.init_released is step.want_released, where
        assert _used(ledger, MEM) == step.want_used_mib, where
        assert _used(ledger, CORES) == step.want_used_cores, where
        assert all(item.used >= 0 for item in ledger.namespace_items(NS).values()), where
        assert all(
            value >= 0 for values in ledger.node_usage("node1").values() for value in values
        ), where


# -- L12: the #2723 gate, by name, sidecars ignored ------------------------------------------


def _gate_pod(*steps: Callable[[PodBuilder], PodBuilder]) -> PodBuilder:
    builder = (
        PodBuilder("gate", namespace=NS)
        .init("init", gpu("g0", mib=20000, cores=10))
        .sidecar("proxy", gpu("g0", mib=2000, cores=2))
        .app("app", gpu("g0", mib=10000, cores=5))
    )
    for step in steps:
        builder = step(builder)
    return builder


@dataclass(frozen=True)
class GateCase:
    name: str
    pod: Pod
    want_open: bool
    want_usage: tuple[DeviceUsage, ...]
    """Stored after a status-less first sight followed by this update."""


# _gate_pod: init 20000/10, then sidecar 2000/2, then app 10000/5, all on g0.
GATE_PEAK = (usage("g0", 20000, 10, slots=2),)
GATE_STEADY = (usage("g0", 12000, 7, slots=2),)

GATE_CASES = [
    GateCase(
        "L12 no init containers: gate closed",
        PodBuilder("gate", namespace=NS).app("app", gpu("g0", mib=100)).running("app").build(),
        want_open=False,
        want_usage=(usage("g0", 100, slots=1),),
    ),
    GateCase(
        "L12 init running, sidecar running: gate closed",
        _gate_pod().running("init").running("proxy").build(),
        want_open=False,
        want_usage=GATE_PEAK,
    ),
    GateCase(
        "L12 init exit 0, sidecar running: gate open",
        _gate_pod().terminated("init", 0).running("proxy").build(),
        want_open=True,
        want_usage=GATE_STEADY,
    ),
    GateCase(
        "L12 init exit 0, sidecar in its exit-0 gap: gate open",
        _gate_pod().terminated("init", 0).terminated("proxy", 0, restarts=1).build(),
        want_open=True,
        want_usage=GATE_STEADY,
    ),
    GateCase(
        "L12 init running, sidecar in its exit-0 gap: gate closed",
        _gate_pod().running("init").terminated("proxy", 0, restarts=1).build(),
        want_open=False,
        want_usage=GATE_PEAK,
    ),
    GateCase(
        "L12 init exit 1: gate closed",
        _gate_pod().terminated("init", 1).running("proxy").build(),
        want_open=False,
        want_usage=GATE_PEAK,
    ),
    GateCase(
        "L12 only sidecars in the init list: gate open at once",
        PodBuilder("gate", namespace=NS)
        .sidecar("proxy", gpu("g0", mib=2000, cores=2))
        .app("app", gpu("g0", mib=10000, cores=5))
        .build(),
        want_open=True,
        want_usage=GATE_STEADY,
    ),
    GateCase(
        "L12 status missing for a regular init: gate closed, its 15000 still held",
        PodBuilder("gate", namespace=NS)
        .init("first", gpu("g0", mib=20000))
        .init("second", gpu("g0", mib=15000))
        .app("app", gpu("g0", mib=10000))
        .terminated("first", 0)
        .build(),
        want_open=False,
        want_usage=(usage("g0", 15000, slots=1),),
    ),
]


@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: c.name)
def test_regular_init_gate(case: GateCase) -> None:
    assert regular_init_gate_open(case.pod) is case.want_open


@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: c.name)
def test_gate_decides_what_the_ledger_stores_after_an_update(case: GateCase) -> None:
    ledger = _ledger()
    ledger.record(replace(case.pod, init_container_statuses=(), container_statuses=()))

    ledger.record(case.pod)

    stored = ledger.pod(case.pod.uid)
    assert stored is not None
    assert (stored.usage, stored.init_released) == (case.want_usage, case.want_open)
