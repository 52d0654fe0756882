"""Reserve's checks: what refuses a reservation before anything is changed.

Layer: accounting (pure functions over what the ledger holds, which they read and never
change). In the order ``accounting.ledger.ledger.Ledger.reserve`` asks them: what is stored for
the pod is no longer what the caller read (also asked by a release), a device lacks the memory,
cores or slots, a MIG instance overlaps one another pod holds, a namespace's quota would be
exceeded. Each sees a re-filter's own reservation (``previous``) as its own: it does not count
against the placement that replaces it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accounting import reasons
from accounting.amount import ZERO, Amount
from accounting.ledger.wording import describe_usage, shortfall_message
from accounting.lifecycle import StoredPod
from accounting.model import Device, DeviceUsage, MigPlacement, QuotaItem
from accounting.quota import check_usage, held_quantities
from accounting.vendors import VendorResources


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a reservation is refused: the reason code and the sentence that says it."""

    reason: str
    message: str


def changed_since(uid: str, stored: StoredPod | None, replaces_revision: int) -> str | None:
    """Why what is stored for the pod (``stored``) is no longer what the caller read (the
    revision ``replaces_revision``, 0 for nothing), or None."""
    current = 0 if stored is None else stored.revision
    if current == replaces_revision:
        return None
    read = "nothing" if not replaces_revision else f"revision {replaces_revision}"
    now = (
        "nothing"
        if stored is None
        else f"revision {current} ({describe_usage(stored.usage)} on {stored.node_name})"
    )
    return (
        f"pod {uid} was read with {read} stored and now has {now}: another Filter for the "
        "same pod (or an update) changed it meanwhile, and that stands; nothing changed"
    )


def capacity_refusal(
    node_name: str,
    devices: tuple[Device, ...],
    usage: tuple[DeviceUsage, ...],
    previous: StoredPod | None,
    *,
    used: Mapping[str, Amount],
    core_masks: frozenset[str],
) -> Refusal | None:
    """A device of the grants without the memory, cores or slots the pod asks beyond what
    the other pods hold (``used``: the node's totals); for vendors in ``core_masks``, also a
    core another pod holds."""
    by_uuid = {d.uuid: d for d in devices}
    mine = (
        {u.uuid: u.amount for u in previous.usage}
        if previous and previous.node_name == node_name
        else {}
    )
    for entry in usage:
        capacity = by_uuid[entry.uuid].capacity
        # A re-filter replaces the pod's own reservation: it does not count against itself.
        others = used.get(entry.uuid, ZERO) - mine.get(entry.uuid, ZERO)
        short = reasons.card_shortfall(entry.amount, capacity - others)
        if short is not None:
            return Refusal(
                reason=reasons.CARD_CAPACITY_REASON[short],
                message=shortfall_message(entry, node_name, short, others, capacity),
            )
        if entry.vendor in core_masks and others.core_percent & entry.core_percent:
            # Cores counted as a bit mask (AWS Neuron): the same core twice is a conflict
            # even when the sum fits (the masks of other pods are disjoint, so their sum is
            # their union).
            return Refusal(
                reason=reasons.CARD_INSUFFICIENT_CORE,
                message=(
                    f"device {entry.uuid} on {node_name}: cores {entry.core_percent:b} "
                    f"requested, cores {others.core_percent:b} held by other pods"
                ),
            )
    return None


def mig_refusal(
    node_name: str,
    usage: tuple[DeviceUsage, ...],
    previous: StoredPod | None,
    *,
    held: Mapping[str, Mapping[MigPlacement, int]] | None,
) -> Refusal | None:
    """A MIG instance of the grants that overlaps one another pod holds on its card (``held``:
    the node's MIG placements, None for none)."""
    if not held:
        return None
    mine: dict[str, set[MigPlacement]] = {}
    if previous is not None and previous.node_name == node_name:
        for entry in previous.usage:
            mine[entry.uuid] = {m.placement for m in entry.mig}
    for entry in usage:
        taken = held.get(entry.uuid)
        if not taken or not entry.mig:
            continue
        others = [p for p in taken if p not in mine.get(entry.uuid, ())]
        for instance in entry.mig:
            clash = next((p for p in others if p.overlaps(instance.placement)), None)
            if clash is not None:
                return Refusal(
                    reason=reasons.MIG_PLACEMENT_TAKEN,
                    message=(
                        f"device {entry.uuid} on {node_name}: MIG instance {instance.profile} "
                        f"at slices {instance.placement.start}-{instance.placement.end - 1} "
                        f"overlaps slices {clash.start}-{clash.end - 1} another pod holds"
                    ),
                )
    return None


def quota_refusal(
    namespace: str,
    usage: tuple[DeviceUsage, ...],
    previous: StoredPod | None,
    *,
    items: dict[str, QuotaItem],
    vendors: Iterable[VendorResources],
    enforce_gpu_count: bool,
) -> Refusal | None:
    """A quota of the namespace (``items``: its usage and limits, taken over and changed
    here) that the usage would exceed, for the first of ``vendors`` that refuses."""
    vendors = tuple(vendors)
    if previous is not None and previous.namespace == namespace:
        for vendor in vendors:
            for resource, quantity in held_quantities(previous.usage, vendor):
                if resource in items:
                    item = items[resource]
                    items[resource] = QuotaItem(
                        resource,
                        used=item.used - quantity,
                        limit=item.limit,
                        limit_set=item.limit_set,
                    )
    for vendor in vendors:
        decision = check_usage(
            namespace, usage, items, vendor, enforce_gpu_count=enforce_gpu_count
        )
        if not decision.allowed:
            return Refusal(reason=decision.reason, message=decision.message)
    return None
