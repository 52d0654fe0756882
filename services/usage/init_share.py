"""The init share each stored pod holds, kept for the metrics: what its regular init containers
hold on top of the steady state, per device, and how much has been released.

Layer: services/usage (recorder state). The ledger stores a pod's current usage, not the
steady state it will shrink to: that needs the pod's containers, which only an update carries.
So the store hands every recorded or reserved pod to ``InitShareBook.note`` (under its lock),
which keeps ``accounting.lifecycle.init_share_held`` for it beside the stored value it was
computed for. A scrape counts an entry only while the ledger still stores that very value (the
stored pods are immutable, so identity says "unchanged"): a pod forgotten, released, or
changed by a path that carried no pod simply stops counting (its entry goes when the pod is
next recorded or forgotten).

Not journaled: after a restart a pod's share shows again once the pod is next recorded (the
Kubernetes source re-lists every pod when it starts, so with it the figure is whole once
synced).

The released amounts are counters (``services.usage.metrics``), counted per namespace when a
shrink or a partial release gives memory and compute back.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting.lifecycle import Decision, StoredPod, init_share_held
from accounting.model import DeviceUsage, Pod
from accounting.pod import usage_totals
from services.usage import metrics as usage_metrics

RELEASING_DECISIONS = frozenset({Decision.SHRUNK, Decision.PARTIALLY_RELEASED})
"""The lifecycle decisions that give an init share back."""


@dataclass(frozen=True, slots=True)
class HeldShare:
    """One pod's init share, and the stored value it was computed for."""

    stored: StoredPod
    held: tuple[DeviceUsage, ...]


class InitShareBook:
    """uid -> the init share its stored value holds (only pods holding one). Not thread-safe:
    the store calls it with its lock held."""

    def __init__(self) -> None:
        self._held: dict[str, HeldShare] = {}

    def note(
        self,
        pod: Pod,
        stored: StoredPod | None,
        *,
        decision: Decision | None = None,
        before: StoredPod | None = None,
    ) -> None:
        """Keeps the share ``stored`` (what the ledger now stores for ``pod``) holds, and counts
        what a releasing ``decision`` gave back since ``before``."""
        if decision in RELEASING_DECISIONS and before is not None and stored is not None:
            memory_before, cores_before, _ = usage_totals(before.usage)
            memory_after, cores_after, _ = usage_totals(stored.usage)
            usage_metrics.count_init_share_released(
                stored.namespace,
                max(memory_before - memory_after, 0),
                max(cores_before - cores_after, 0),
            )
        if stored is None:
            self._held.pop(pod.uid, None)
            return
        known = self._held.get(pod.uid)
        if known is not None and known.stored is stored:
            return  # the same stored value: the same share (its containers never change)
        held = init_share_held(pod, stored)
        if held:
            self._held[pod.uid] = HeldShare(stored, held)
        else:
            self._held.pop(pod.uid, None)

    def forget(self, uid: str) -> None:
        """Drops a forgotten pod's share."""
        self._held.pop(uid, None)

    def copy(self) -> dict[str, HeldShare]:
        """uid -> share, as kept now (a share counts only while ``share.stored`` is still what
        the ledger stores for the uid: the reader checks)."""
        return dict(self._held)
