"""Placements this scheduler replica made that its node cache may not show yet.

Layer: services/scheduler (adapter state). A Filter's placement is held from the moment it is
chosen (before its Reserve) until the node cache has applied the reservation's revision, or
until the Reserve is refused. Every Filter of the replica fits the cached nodes with the held
placements of the other pods added, so two Filters of one replica running at once do not both
choose the same free capacity, and a Filter that runs right after another sees that one's
placement before its WatchUsage event arrives. Without holds, Filters choose capacity their
predecessor has just taken, are refused and read the node again, and more answers are
ReservationConflict (docs/scheduler-measurements.md has the figures; bench/scheduler_scale.py
counts the refusals).

Holds only shape the fit's view of the cache; the recorder's Reserve still decides what is
stored, and every answer is what it stored. A node read directly from the recorder is fitted as
read, without holds (it is newer than any of them), so "no node fits" is always confirmed
without them; a Filter that read nothing from the cache (its stream down) holds nothing. A hold
adds to a card's memory, cores and slots only (a MIG card's instances are left as they are: the
Reserve tells). A hold the cache should show by now but does not (a recorder restarted without
its journal counts revisions from 0 again) lapses after ``max_age_s``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from accounting.model import DeviceUsage

DEFAULT_MAX_AGE_S = 10.0
"""How long a hold lasts at most: far longer than the cache's lag (milliseconds), short enough
that a hold whose revision never shows stops shaping fits soon."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    pod_uid: str
    node_name: str
    usage: tuple[DeviceUsage, ...]
    """What the placement adds per device (accounting.fit.placement_usage of its grants)."""
    since_s: float
    """When it was taken (the holds' clock)."""
    revision: int | None = None
    """The revision its reservation is visible at; None while its Reserve is in flight."""


class Holds:
    """The replica's held placements, one per Filter placing a pod (thread-safe)."""

    def __init__(
        self,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, Hold] = {}
        self._keys = itertools.count(1)
        self._max_age_s = max_age_s
        self._clock = clock

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, pod_uid: str, node_name: str, usage: Sequence[DeviceUsage]) -> int:
        """A Filter of ``pod_uid`` chose ``node_name`` and is about to reserve it; returns the
        hold's key (two Filters of one pod each have their own)."""
        with self._lock:
            key = next(self._keys)
            self._held[key] = Hold(
                pod_uid=pod_uid, node_name=node_name, usage=tuple(usage), since_s=self._clock()
            )
            return key

    def reserved(self, key: int, revision: int) -> None:
        """Its Reserve succeeded: held until the cache has applied ``revision``."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held[key] = Hold(
                    pod_uid=held.pod_uid,
                    node_name=held.node_name,
                    usage=held.usage,
                    since_s=held.since_s,
                    revision=revision,
                )

    def drop(self, key: int) -> None:
        """Its Reserve was refused or failed: nothing was stored."""
        with self._lock:
            self._held.pop(key, None)

    def unseen(self, pod_uid: str, applied_revision: int) -> dict[str, list[DeviceUsage]]:
        """Node -> usage of the holds a cache at ``applied_revision`` does not show yet, other
        than ``pod_uid``'s own (a pod's own reservation never counts against it); the holds
        it shows, and those past their age, are let go."""
        by_node: dict[str, list[DeviceUsage]] = {}
        oldest = self._clock() - self._max_age_s
        with self._lock:
            for key, held in list(self._held.items()):
                seen = held.revision is not None and held.revision <= applied_revision
                if seen or held.since_s < oldest:
                    del self._held[key]
                elif held.pod_uid != pod_uid:
                    by_node.setdefault(held.node_name, []).extend(held.usage)
        return by_node
