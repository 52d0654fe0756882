"""The init share a stored pod holds (accounting.lifecycle.init_share_held): what its regular
init containers hold on top of the steady state, per device, until they have finished.

The table walks the design's seed pods (docs/design.md §9) through their lives on the Ledger,
so each expectation is about what the recorder really stores; the property checks the identity
the metric rests on: held + steady state = stored, on every device, at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.ledger import Ledger
from accounting.lifecycle import init_share_held
from accounting.model import DeviceUsage, Pod, PodPhase
from accounting.pod import steady_state_usage
from tests.accounting.strategies import pods, status_updates
from tests.builders import PodBuilder, gpu, usage


def _seed_builder() -> PodBuilder:
    """Init 20 GiB / 10 %, app 10 GiB / 5 % on one card (the issue's example)."""
    return (
        PodBuilder("seed")
        .init("init", gpu("g0", mib=20480, cores=10))
        .app("app", gpu("g0", mib=10240, cores=5))
    )


def _sidecar_builder() -> PodBuilder:
    """Sidecar 2000/2 declared before init 20000/10, app 10000/5: effective 22000/12 s2."""
    return (
        PodBuilder("sidecar")
        .sidecar("proxy", gpu("g0", mib=2000, cores=2))
        .init("init", gpu("g0", mib=20000, cores=10))
        .app("app", gpu("g0", mib=10000, cores=5))
    )


def _two_inits_builder() -> PodBuilder:
    """init-a 30000 on g0, init-b 16000 on g1, app 8000 on g0 and 4000 on g1."""
    return (
        PodBuilder("two")
        .init("init-a", gpu("g0", mib=30000, cores=40))
        .init("init-b", gpu("g1", mib=16000, cores=20))
        .app("app", gpu("g0", mib=8000, cores=10), gpu("g1", mib=4000, cores=5))
    )


@dataclass(frozen=True)
class Case:
    name: str
    updates: tuple[Pod, ...]
    """The pod's states recorded in order; the expectation is about the last one."""
    want: tuple[DeviceUsage, ...]


CASES = [
    Case(
        "init running: the init's 20 GiB peak minus the app's 10 GiB is held on the card",
        (_seed_builder().running("init").build(),),
        (usage("g0", 10240, 5, slots=0),),
    ),
    Case(
        "init exited 0: shrunk to the app, nothing held",
        (
            _seed_builder().running("init").build(),
            _seed_builder().terminated("init").running("app").phase(PodPhase.RUNNING).build(),
        ),
        (),
    ),
    Case(
        "init exited 1: the peak is held, and so is the share",
        (
            _seed_builder().running("init").build(),
            _seed_builder().terminated("init", 1).phase(PodPhase.RUNNING).build(),
        ),
        (usage("g0", 10240, 5, slots=0),),
    ),
    Case(
        "first seen after the init finished: recorded at steady state, nothing held",
        (_seed_builder().terminated("init").running("app").phase(PodPhase.RUNNING).build(),),
        (),
    ),
    Case(
        "a sidecar before the init counts in both the peak and the steady state",
        (_sidecar_builder().running("proxy").running("init").build(),),
        (usage("g0", 10000, 5, slots=0),),
    ),
    Case(
        "two inits on two cards: both cards hold a share while the first runs",
        (_two_inits_builder().running("init-a").build(),),
        (usage("g0", 22000, 30, slots=0), usage("g1", 12000, 15, slots=0)),
    ),
    Case(
        "first init done: its card's share is released, the second card still holds one",
        (
            _two_inits_builder().running("init-a").build(),
            _two_inits_builder().terminated("init-a").running("init-b").build(),
        ),
        (usage("g1", 12000, 15, slots=0),),
    ),
    Case(
        "terminal: nothing is stored, nothing held",
        (
            _seed_builder().running("init").build(),
            _seed_builder().terminated("init", 1).phase(PodPhase.FAILED).build(),
        ),
        (),
    ),
    Case(
        "no regular init container (sidecar and app only): nothing to hold",
        (
            PodBuilder("apps")
            .sidecar("proxy", gpu("g0", mib=2000, cores=2))
            .app("app", gpu("g0", mib=10000, cores=5))
            .running("proxy")
            .build(),
        ),
        (),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_init_share_held(case: Case) -> None:
    ledger = Ledger()
    for update in case.updates:
        ledger.record(update)
    last = case.updates[-1]
    assert init_share_held(last, ledger.pod(last.uid)) == case.want


def test_nothing_is_held_for_a_pod_not_stored() -> None:
    assert init_share_held(_seed_builder().running("init").build(), None) == ()


def _by_uuid(entries: tuple[DeviceUsage, ...]) -> dict[str, tuple[int, int, int]]:
    return {e.uuid: (e.memory_mib, e.core_percent, e.slots) for e in entries}


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_held_plus_steady_state_is_what_is_stored(data: st.DataObject) -> None:
    template = data.draw(pods())
    ledger = Ledger()
    for _ in range(data.draw(st.integers(1, 4))):
        update = data.draw(status_updates(template))
        ledger.record(update)
        stored = ledger.pod(update.uid)
        held = _by_uuid(init_share_held(update, stored))
        if stored is None or stored.init_released or stored.terminal:
            assert held == {}
            continue
        steady = _by_uuid(steady_state_usage(update))
        for entry in stored.usage:
            base = steady.get(entry.uuid, (0, 0, 0))
            share = held.get(entry.uuid, (0, 0, 0))
            assert (entry.memory_mib, entry.core_percent, entry.slots) == tuple(
                b + s for b, s in zip(base, share, strict=True)
            ), (entry, base, share)
