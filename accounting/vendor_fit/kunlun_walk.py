"""Kunlunxin: the cards of the 8-card topology for one container, whole or vXPU.

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``; the topology itself is
``accounting.kunlun``).
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting import kunlun
from accounting.container_ask import ContainerAsk
from accounting.reasons import (
    CARD_UUID_MISMATCH,
    NUMA_NOT_FIT,
    format_reasons,
)
from accounting.vendor_fit.cards import Card, Pick, RuleContext, vendor_grant


def kunlun_picks(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[Card], devices_total: int
) -> tuple[Pick, ...] | str:
    """Kunlunxin: the cards of the 8-card topology (``accounting.kunlun``), over the devices
    in HAMi's sorted order (the reverse of the order the walk tries them). A whole card is
    usable when nothing runs on it; a vXPU card when the partition fits and every partition
    on it has the request's size. Nothing found is the id filter's mismatches, else
    ``NumaNotFit`` once."""
    spec = context.spec
    demand = ask.demand
    memory_mib = demand.memory_mib if demand.memory_mib is not None else 0
    mismatched: set[str] = set()

    def usable(card: Card) -> bool:
        device = card.state.device
        device_filter = context.device_filter
        if device_filter is not None and device_filter.uuid_refused(device.uuid):
            mismatched.add(device.uuid)
            return False
        if not device.healthy:
            return False
        if spec.rule == "kunlun":
            return card.slots_used == 0
        if memory_mib + card.memory_used > device.memory_total_mib:
            return False
        # Only partitions of one size share a card (HAMi's FitVXPU).
        return card.slots_used == 0 or card.memory_used // card.slots_used == memory_mib

    hami_order = list(reversed(ordered))
    chosen = kunlun.select([(card.state.device.index, usable(card)) for card in hami_order],
                           demand.count)
    if not chosen:
        if mismatched:
            return format_reasons({CARD_UUID_MISMATCH: len(mismatched)}, devices_total)
        return format_reasons({NUMA_NOT_FIT: 1}, devices_total)
    by_index: dict[int, Card] = {}
    for card in hami_order:
        by_index.setdefault(card.state.device.index, card)
    picks = []
    for index in chosen:
        card = by_index[index]
        picks.append((card.position, vendor_grant(spec, card, memory_mib, demand.core_percent)))
    return tuple(picks)
