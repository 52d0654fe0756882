"""Why a device or a container is refused: the capacity rules of one card for one ask
(``card_capacity_refusal``), and HAMi's per-device count of why a container fits nowhere on a node
(``_walk_reasons``).

Layer: accounting (pure). Only called on failure; the placing's hot loop keeps its own inlined
copy of the capacity rules (``accounting.fit.place._place_vendor`` says why).
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting.amount import Amount
from accounting.card_capacity import card_refusal
from accounting.container_ask import ContainerAsk
from accounting.fit.node_state import _NodeColumns
from accounting.fit.quota_walk import _QuotaWalk
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_TIME_SLICING_EXHAUSTED,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    NUMA_NOT_FIT,
    RESOURCE_QUOTA_NOT_FIT,
    format_reasons,
)


def card_capacity_refusal(ask: ContainerAsk, used: Amount, capacity: Amount) -> str | None:
    """The first capacity rule that refuses one card for one container's ask, or None: the
    card's rules (``accounting.card_capacity.card_refusal``) for one of the ask's devices sized
    on this card.

    Args:
        ask: the container's ask for the card's vendor (``accounting.container_ask``).
        used: what is charged on the card now.
        capacity: the card's capacity (``Device.capacity``).
    """
    return card_refusal(ask.demand.on_card(capacity.memory_mib), used, capacity)


def _walk_reasons(
    ask: ContainerAsk,
    blocks: Sequence[str | None],
    order: Sequence[int],
    columns: _NodeColumns,
    free: tuple[Sequence[int], Sequence[int], Sequence[int]],
    quota: _QuotaWalk | None,
    vendor_name: str,
    vendor_devices: int,
    mutex: bool = False,
    numa_groups: bool = False,
) -> str:
    """Why one container fits nowhere on the node, as HAMi words it: every device of the
    vendor counted under the first reason that stopped it, and the cards that passed (picked
    before the walk ran out) as AllocatedCardsInsufficientRequest. Other vendors' devices are
    not the vendor's to count (HAMi hands a vendor only its own).

    Only called on failure, when HAMi's walk has visited every device. A device refused for
    its health, type or UUID is refused whatever came before it; the others are walked again
    in the order the fit tried them (``_card_verdicts``).
    """
    verdicts = _card_verdicts(ask, blocks, order, columns, free, quota, mutex, numa_groups)
    walked = {p for p, _ in verdicts}
    counts: dict[str, int] = {}
    devices = columns.devices
    for p, block in enumerate(blocks):
        if block is not None and p not in walked and devices[p].device.vendor == vendor_name:
            counts[block] = counts.get(block, 0) + 1
    picked = 0
    for _, reason in verdicts:
        if reason is None:
            picked += 1
        else:
            counts[reason] = counts.get(reason, 0) + 1
    if picked:
        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = picked
    return format_reasons(counts, vendor_devices)


def _card_verdicts(
    ask: ContainerAsk,
    blocks: Sequence[str | None],
    order: Sequence[int],
    columns: _NodeColumns,
    free: tuple[Sequence[int], Sequence[int], Sequence[int]],
    quota: _QuotaWalk | None,
    mutex: bool = False,
    numa_groups: bool = False,
    count: int | None = None,
) -> list[tuple[int, str | None]]:
    """One container's walk over ``order`` card by card, as HAMi's walk sees it: each card
    visited with the first reason that refuses it, or None when the walk takes it; the walk
    stops once it has ``count`` cards (None: it visits every card, as on failure).

    Whether the quota refuses a card depends on the cards taken before it, so they are taken
    in order. With ``numa_groups`` (nvidia.com/numa-bind) the walk starts again at each NUMA
    node it enters: the cards it had taken there become NumaNotFit, and ``order`` also holds
    the devices refused by UUID (HAMi enters their NUMA node before it checks the UUID).
    """
    devices = columns.devices
    slots_free, memory_free, cores_free = free
    capacities = [state.device.capacity for state in devices]
    verdicts: list[tuple[int, str | None]] = []
    taken = [0, 0, 0]
    picked: list[int] = []  # places in ``verdicts`` of the cards taken in this NUMA node
    numa_now: int | None = None
    for p in order:
        if numa_groups:
            numa = devices[p].device.numa
            if numa != numa_now:
                numa_now = numa
                for place in picked:
                    verdicts[place] = (verdicts[place][0], NUMA_NOT_FIT)
                picked = []
                taken = [0, 0, 0]
            if blocks[p] is not None:
                verdicts.append((p, blocks[p]))
                continue
        capacity = capacities[p]
        used = capacity - Amount(memory_free[p], cores_free[p], slots_free[p])
        reason: str | None = None
        if slots_free[p] <= 0:
            reason = CARD_TIME_SLICING_EXHAUSTED
        elif mutex and slots_free[p] < capacity.slots:
            reason = EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        elif quota is not None:
            added = quota.added(p, ask.memory_on_card(capacity.memory_mib), ask.core_percent)
            if not quota.fits(taken, added):
                reason = RESOURCE_QUOTA_NOT_FIT
        if reason is None:
            reason = card_capacity_refusal(ask, used, capacity)
        verdicts.append((p, reason))
        if reason is not None:
            continue
        picked.append(len(verdicts) - 1)
        if quota is not None:
            taken = [t + a for t, a in zip(taken, added, strict=True)]
        if count is not None and len(picked) == count:
            break
    return verdicts
