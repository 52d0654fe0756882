"""The recorder's recovery: the state it starts from, loaded from its journal, and what is done
when the journal is damaged or incomplete (refuse to start, keep what is readable, or start
empty for the Kubernetes re-list to rebuild).

Layer: services/usage (recorder state). ``UsageStore.recover`` (services/usage/store.py) calls
``start_state`` with the cyclic collector paused (``collector_paused``) and restores the result
into its ledger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from services.usage.journal import (
    ON_DAMAGE_MODES,
    ON_DAMAGE_REBUILD,
    ON_DAMAGE_REFUSE,
    Journal,
    JournalDamage,
    JournalDamagedError,
    JournalState,
)

_LOG = logging.getLogger(__name__)

FREEZE_MIN_PODS = 10_000
"""Recovered pods from which the recovered state is frozen out of garbage collection."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoverySummary:
    """What ``UsageStore.recover`` loaded."""

    pods: int
    nodes: int
    namespaces: int
    revision: int
    seconds: float
    damage: JournalDamage | None = None
    """What was wrong with the journal, when the recorder went on anyway."""


@dataclass(slots=True)
class CollectorPause:
    """Whether the state loaded under ``collector_paused`` is to be frozen when it ends."""

    freeze: bool = False

    def freeze_if_large(self, pods: int) -> None:
        """Freezes the recovered state when it holds ``FREEZE_MIN_PODS`` pods or more."""
        self.freeze = pods >= FREEZE_MIN_PODS


@contextlib.contextmanager
def collector_paused() -> Iterator[CollectorPause]:
    """Runs a recovery with the cyclic garbage collector off, and freezes what it loaded when
    asked to.

    Recovery allocates up to millions of long-lived objects and no garbage cycles: the cyclic
    collector would walk the growing heap again and again (a third of the time of 100,000
    pods), and once more when it is switched back on. A large recovered state is frozen: left
    out of every later collection (no pause walking it while serving), while objects released
    later are still freed by reference counting (the ledger holds no cycles). Not collecting
    first keeps the cyclic garbage the process made before for good (about 300 objects from
    the daemon's imports, once); collecting would cost more.
    """
    collecting = gc.isenabled()
    gc.disable()
    pause = CollectorPause()
    try:
        yield pause
        if pause.freeze:
            gc.freeze()
    finally:
        if collecting:
            gc.enable()


@dataclass(frozen=True, slots=True, kw_only=True)
class StartingPoint:
    """What the recorder starts from."""

    state: JournalState
    """The state to restore (whole: its ``damage`` is None)."""
    damage: JournalDamage | None = None
    """What was wrong with the journal, when the recorder goes on anyway."""


def start_state(journal: Journal | None, on_damage: str) -> StartingPoint:
    """The state the recorder starts from: what the journal holds (nothing without one), or,
    when it is damaged, what ``on_damage`` makes of it.

    Args:
        journal: the recorder's journal; None: nothing is durable, start empty.
        on_damage: one of ``ON_DAMAGE_MODES``.

    Raises:
        JournalDamagedError: the journal is damaged and ``on_damage`` is refuse.
        JournalError: the journal cannot be read or repaired.
    """
    if journal is None:
        return StartingPoint(state=JournalState())
    state = journal.load()
    damage = state.damage
    if damage is None:
        return StartingPoint(state=state)
    return StartingPoint(
        state=_state_after_damage(damage, state, journal, on_damage), damage=damage
    )


def _state_after_damage(
    damage: JournalDamage, state: JournalState, journal: Journal, on_damage: str
) -> JournalState:
    """The state to start from on a damaged journal, as ``on_damage`` says, with what was lost
    logged; raises JournalDamagedError to refuse."""
    if on_damage not in ON_DAMAGE_MODES:
        raise ValueError(f"on_damage must be one of {ON_DAMAGE_MODES}, got {on_damage!r}")
    if on_damage == ON_DAMAGE_REFUSE:
        raise JournalDamagedError(damage)
    lost: dict[str, object] = {"problems": list(damage.problems)}
    if damage.acknowledged_revision > damage.readable_revision:
        lost["lost_revisions"] = f"{damage.readable_revision + 1}..{damage.acknowledged_revision}"
    if damage.damaged_rows:
        lost["dropped_rows"] = list(damage.damaged_rows[:100])
        lost["dropped_rows_total"] = len(damage.damaged_rows)
    if on_damage == ON_DAMAGE_REBUILD:
        revision = max(damage.readable_revision, damage.acknowledged_revision)
        moved = journal.reset(revision)
        _LOG.error(
            "journal damaged: set aside, starting empty; the Kubernetes re-list rebuilds pods, "
            "nodes and quotas (forgotten uids are not rebuilt): %s", damage.summary(),
            extra={**lost, "set_aside": [str(p) for p in moved],
                   "readable_pods_set_aside": len(state.pods), "on_damage": on_damage},
        )
        return JournalState(revision=revision)
    revision = journal.accept_loss(damage)
    if damage.unreadable:
        state = JournalState()
    _LOG.error(
        "journal damaged: going on with what is readable (%d pods, %d nodes, %d quotas, %d "
        "forgotten uids); what was lost is listed here: %s", len(state.pods), len(state.nodes),
        len(state.quotas), len(state.tombstones), damage.summary(),
        extra={**lost, "on_damage": on_damage, "revision": revision},
    )
    return dataclasses.replace(state, revision=revision, damage=None)
