"""The capacity rules of one card for one device's share of an ask: the one place they are
written, read by the generic fit (``accounting.fit.card_capacity_refusal``) and by the vendors'
own walks (``accounting.vendor_fit``).

Layer: accounting (pure). HAMi checks a card's time slices, memory and cores in that order, then
refuses an exclusive ask (every core of a 100-core card) on a card with a task on it, and a
share-only ask (no cores) on a card whose compute is all given away.
"""

from __future__ import annotations

from accounting.amount import Amount
from accounting.pod import EXCLUSIVE_CORE_PERCENT
from accounting.reasons import (
    CARD_CAPACITY_REASON,
    CARD_COMPUTE_UNITS_EXHAUSTED,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    card_shortfall,
)


def card_refusal(need: Amount, used: Amount, capacity: Amount) -> str | None:
    """The first capacity rule that refuses the card, as HAMi names it, or None.

    Args:
        need: what one device of the ask takes on this card (``DeviceDemand.on_card``: a share
            already sized on the card's memory, its cores, one slot).
        used: what is charged on the card now.
        capacity: what the card holds (``Device.capacity``, or a vendor's own reading of it).
    """
    short = card_shortfall(need, capacity - used)
    if short is not None:
        return CARD_CAPACITY_REASON[short]
    cores = need.core_percent
    if (
        cores == EXCLUSIVE_CORE_PERCENT
        and capacity.core_percent == EXCLUSIVE_CORE_PERCENT
        and used.slots
    ):
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if cores == 0 and capacity.core_percent != 0 and used.core_percent == capacity.core_percent:
        return CARD_COMPUTE_UNITS_EXHAUSTED
    return None
