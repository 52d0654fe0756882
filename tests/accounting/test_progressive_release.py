"""Progressive release and init containers that run again (issue "Beyond the design")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accounting.ledger import Ledger
from accounting.lifecycle import Decision
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    Pod,
    PodPhase,
)

INIT, SIDECAR, APP = ContainerClass.INIT, ContainerClass.SIDECAR, ContainerClass.APP
CARD_MIB = 24576


def grant(memory_mib: int) -> tuple[DeviceGrant, ...]:
    return (DeviceGrant("GPU-0", "NVIDIA", memory_mib, 0),)


# [init a 8000, sidecar s1 1000, init b 12000, sidecar s2 2000, init c 6000], app 4000
CONTAINERS = (
    Container("a", INIT, (), grant(8000)),
    Container("s1", SIDECAR, (), grant(1000)),
    Container("b", INIT, (), grant(12000)),
    Container("s2", SIDECAR, (), grant(2000)),
    Container("c", INIT, (), grant(6000)),
    Container("app", APP, (), grant(4000)),
)


def done(name: str, restarts: int = 0) -> ContainerStatus:
    return ContainerStatus(name, ContainerState.TERMINATED, 0, restarts)


def running(name: str, restarts: int = 0) -> ContainerStatus:
    return ContainerStatus(name, ContainerState.RUNNING, 0, restarts)


def pod(*statuses: ContainerStatus, phase: PodPhase = PodPhase.PENDING) -> Pod:
    return Pod("uid-1", "team-a", "p", CONTAINERS, phase, tuple(statuses), node_name="node-1")


@pytest.fixture
def ledger() -> Ledger:
    book = Ledger()
    book.register_node("node-1", (Device("GPU-0", "NVIDIA A10", 0, 10, CARD_MIB, 100),))
    return book


def stored_mib(book: Ledger) -> int:
    stored = book.pod("uid-1")
    assert stored is not None
    return sum(u.memory_mib for u in stored.usage)


# Points: a = 8000; b = 1000 + 12000 = 13000; c = 1000 + 2000 + 6000 = 9000; steady = 7000.
STEPS = [
    pytest.param(
        (running("a"),), 13000, Decision.RECORDED, id="first sight holds the peak (init b)"
    ),
    pytest.param(
        (done("a"), running("s1"), running("b")),
        13000,
        Decision.UNCHANGED,
        id="init a done: b (13000) still to come, nothing to release",
    ),
    pytest.param(
        (done("a"), running("s1"), done("b"), running("s2"), running("c")),
        9000,
        Decision.PARTIALLY_RELEASED,
        id="init b done: only c (9000) still to come",
    ),
    pytest.param(
        (done("a"), running("s1"), done("b"), running("s2"), done("c")),
        7000,
        Decision.SHRUNK,
        id="all init done: steady state (sidecars + app)",
    ),
]


def test_progressive_release_walks_down_as_each_init_container_finishes(ledger: Ledger) -> None:
    for param in STEPS:
        statuses, want_mib, want_decision = param.values
        outcome = ledger.record(pod(*statuses))  # type: ignore[arg-type]
        assert (outcome.decision, stored_mib(ledger)) == (want_decision, want_mib), param.id
        assert ledger.namespace_items("team-a")["nvidia.com/gpumem"].used == want_mib
    assert ledger.record(pod(phase=PodPhase.SUCCEEDED)).decision is Decision.RELEASED
    assert ledger.namespace_items("team-a") == {}
    assert ledger.forget("uid-1").before is not None
    assert ledger.node_usage("node-1") == {}


def test_an_older_status_replayed_never_undoes_a_release(ledger: Ledger) -> None:
    ledger.record(pod(done("a"), done("b"), running("c")))
    assert stored_mib(ledger) == 9000
    outcome = ledger.record(pod(running("a")))  # stale: fewer finished, no restart
    assert outcome.decision is Decision.UNCHANGED
    assert stored_mib(ledger) == 9000


def test_init_containers_running_again_restore_the_init_inclusive_usage(ledger: Ledger) -> None:
    ledger.record(pod(running("a")))
    ledger.record(pod(done("a"), done("b"), done("c")))
    assert stored_mib(ledger) == 7000
    # A re-created sandbox runs every init container again; their restart counts grow.
    outcome = ledger.record(pod(running("a", restarts=1), running("s1", restarts=1)))
    assert outcome.decision is Decision.RERUN_RESTORED
    assert stored_mib(ledger) == 13000
    stored = ledger.pod("uid-1")
    assert stored is not None and not stored.init_released
    assert outcome.overcommitted == ()


def test_a_rerun_whose_capacity_was_handed_out_is_recorded_and_reported(ledger: Ledger) -> None:
    ledger.record(pod(done("a"), done("b"), done("c")))
    other = replace(pod(), uid="uid-2", containers=(Container("big", APP, (), grant(15000)),))
    ledger.record(other)  # 7000 + 15000 = 22000 of 24576
    outcome = ledger.record(pod(running("a", restarts=1)))
    assert outcome.decision is Decision.RERUN_RESTORED
    assert outcome.overcommitted == ("GPU-0",)
    assert ledger.node_usage("node-1")["GPU-0"][0] == 13000 + 15000
