"""What the metrics need of each stored pod beyond what the ledger stores: the init share it
holds, and the runtime identity of its MIG instances.

Layer: services/usage (recorder state). The ledger stores a pod's current usage, neither the
steady state it will shrink to (that needs the pod's containers) nor the MIG UUID and instance
ids HAMi's device plugin writes into the pod's ``hami.io/vgpu-mig-allocations`` once it has
created the instances; only an update carries those. So the store hands every recorded or
reserved pod to ``PodFactsBook.note`` (under its lock), which keeps them beside the stored value
they belong to. A scrape counts an entry only while the ledger still stores that very value
(the stored pods are immutable, so identity says "unchanged"): a pod forgotten, released, or
changed by a path that carried no pod simply stops counting (its entry goes when the pod is
next recorded or forgotten).

Not journaled: after a restart a pod's facts show again once the pod is next recorded (the
Kubernetes source re-lists every pod when it starts, so with it they are whole once synced).

The released amounts are counters (``services.usage.metrics``), counted per namespace when a
shrink or a partial release gives memory and compute back.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting.errors import InvalidInputError
from accounting.lifecycle import Decision, StoredPod, init_share_held
from accounting.mig import MIG_ALLOCATIONS_ANNOTATION, MigAllocation, decode_allocations
from accounting.model import DeviceUsage, Pod
from accounting.pod import usage_totals
from services.usage import metrics as usage_metrics

RELEASING_DECISIONS = frozenset({Decision.SHRUNK, Decision.PARTIALLY_RELEASED})
"""The lifecycle decisions that give an init share back."""


@dataclass(frozen=True, slots=True)
class PodFacts:
    """One pod's facts, and the stored value they belong to."""

    stored: StoredPod
    init_share: tuple[DeviceUsage, ...]
    """What its regular init containers hold on top of the steady state, per device."""
    mig_instances: tuple[MigAllocation, ...]
    """Its MIG instances the device plugin has created (each with its ``runtime``)."""
    mig_annotation: str
    """The allocation annotation ``mig_instances`` were read from."""


class PodFactsBook:
    """uid -> the facts of its stored value (only pods with some). Not thread-safe: the store
    calls it with its lock held."""

    def __init__(self) -> None:
        self._facts: dict[str, PodFacts] = {}

    def note(
        self,
        pod: Pod,
        stored: StoredPod | None,
        *,
        decision: Decision | None = None,
        before: StoredPod | None = None,
    ) -> None:
        """Keeps the facts of ``stored`` (what the ledger now stores for ``pod``), and counts
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
            self._facts.pop(pod.uid, None)
            return
        annotation = pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, "")
        known = self._facts.get(pod.uid)
        same_value = known is not None and known.stored is stored
        if known is not None and same_value and known.mig_annotation == annotation:
            return  # the same stored value and instances: the same facts
        init_share = (
            known.init_share if known is not None and same_value
            else init_share_held(pod, stored)
        )
        instances = (
            known.mig_instances if known is not None and known.mig_annotation == annotation
            else _created_instances(annotation)
        )
        if (init_share or instances) and stored.usage:
            self._facts[pod.uid] = PodFacts(stored, init_share, instances, annotation)
        else:
            self._facts.pop(pod.uid, None)

    def forget(self, uid: str) -> None:
        """Drops a forgotten pod's facts."""
        self._facts.pop(uid, None)

    def copy(self) -> dict[str, PodFacts]:
        """uid -> facts, as kept now (they count only while ``facts.stored`` is still what the
        ledger stores for the uid: the reader checks)."""
        return dict(self._facts)


def _created_instances(annotation: str) -> tuple[MigAllocation, ...]:
    if not annotation:
        return ()
    try:
        allocations = decode_allocations(annotation, path=MIG_ALLOCATIONS_ANNOTATION)
    except InvalidInputError:
        return ()  # the ledger refused such a pod already; nothing to show
    return tuple(a for a in allocations if a.runtime is not None)
