"""The ledger's tombstones: the uids it remembers as forgotten, oldest first, within a bound.

Layer: accounting (pure; a part of ``accounting.ledger.ledger.Ledger``, which alone changes it).

Kubernetes never reuses a pod uid, so a forgotten uid is remembered: a RecordPod that arrives
after the ForgetPod (a late or retried informer update, or a delete seen before its add)
changes nothing and answers ``Forgotten``. The ledger keeps the most recent
``DEFAULT_MAX_TOMBSTONES`` forgotten uids and drops the oldest beyond that. The bound is safe
because a late update is late by seconds or minutes (an informer retry or resync, a reordered
delivery), while a uid drops out only after 100,000 later deletions. Should an update older than
that still arrive, the pod is charged again as before tombstones existed, until a ForgetPod (or,
with the Kubernetes source, the next re-list) releases it.

A tombstone has one of two kinds. Reservable (True): it refuses RecordPod only; such tombstones
are only restored from journals written before every forget meant a delete. Not reservable
(False): it refuses Reserve too. A tombstone only ever hardens (reservable -> not), in place:
its age is the first forget.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_MAX_TOMBSTONES = 100_000
"""Forgotten uids remembered (the most recent ones); see the module docstring for the bound."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TombstoneChange:
    """A tombstone written by a forget: the uid, its new kind, and what it replaced."""

    uid: str
    reservable: bool
    """True: refuses RecordPod only (only restored from journals written before every forget
    meant a delete); False: refuses Reserve too."""
    previous: bool | None
    """The kind it had before (None: the uid was not remembered)."""
    evicted: tuple[tuple[str, bool], ...] = ()
    """The oldest tombstones dropped to keep the bound, oldest first, with their kinds."""


class Tombstones:
    """The remembered forgotten uids with their kinds, and the order they were first forgotten."""

    __slots__ = ("kinds", "max_tombstones", "order")

    def __init__(self, max_tombstones: int = DEFAULT_MAX_TOMBSTONES) -> None:
        if max_tombstones < 1:
            raise ValueError(f"max_tombstones must be >= 1, got {max_tombstones}")
        self.max_tombstones = max_tombstones
        self.kinds: dict[str, bool] = {}
        """uid -> reservable (see TombstoneChange); read directly by the ledger's checks."""
        # The uids oldest first. A deque for the order because popping a dict's first key again
        # and again is not O(1): the deleted slots at its front are scanned until the next resize.
        self.order: collections.deque[str] = collections.deque()

    def listed(self) -> tuple[tuple[str, bool], ...]:
        """(uid, reservable) of every remembered uid, oldest first."""
        kinds = self.kinds
        return tuple((uid, kinds[uid]) for uid in self.order)

    def bury(self, uid: str, reservable: bool) -> TombstoneChange | None:
        """Writes a tombstone, evicting the oldest beyond the bound; None when nothing changed
        (the uid already has one at least as hard)."""
        kinds = self.kinds
        previous = kinds.get(uid)
        if previous is not None:
            if not previous or reservable:
                return None
            kinds[uid] = False
            return TombstoneChange(uid=uid, reservable=False, previous=previous)
        kinds[uid] = reservable
        self.order.append(uid)
        evicted: list[tuple[str, bool]] = []
        while len(kinds) > self.max_tombstones:
            oldest = self.order.popleft()
            evicted.append((oldest, kinds.pop(oldest)))
        return TombstoneChange(
            uid=uid, reservable=reservable, previous=None, evicted=tuple(evicted)
        )

    def undo(self, change: TombstoneChange) -> None:
        """Puts the tombstones back as they were before ``change`` (a journal write failed)."""
        if change.previous is not None:
            self.kinds[change.uid] = change.previous
            return
        del self.kinds[change.uid]
        self.order.pop()  # the newest: the uid ``change`` added
        for uid, reservable in reversed(change.evicted):
            self.kinds[uid] = reservable
            self.order.appendleft(uid)

    def restore(self, tombstones: Iterable[tuple[str, bool]]) -> None:
        """Loads remembered uids (uid, reservable), oldest first (journal recovery), where
        there are none yet; beyond the bound only the most recent are kept."""
        kinds = self.kinds
        if kinds:
            raise ValueError("restore_tombstones needs a ledger without tombstones")
        for uid, reservable in tombstones:
            if uid not in kinds:
                self.order.append(uid)
            kinds[uid] = reservable
        while len(kinds) > self.max_tombstones:
            del kinds[self.order.popleft()]
