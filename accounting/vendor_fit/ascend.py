"""Ascend: when HAMi collects every NPU that passes, and how it chooses among them (910C
modules, NetworkID groups).

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``).
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting.container_ask import ContainerAsk
from accounting.vendor_data import (
    ASCEND_TOPOLOGY_PREFIX,
    NETWORK_ID_INFO,
    NPUS_PER_MODULE,
)
from accounting.vendor_fit.cards import Card, Pick, RuleContext


def collects_all(context: RuleContext, ask: ContainerAsk, cards: Sequence[Card]) -> bool:
    """Ascend: with NetworkIDs on every device, or a 910C request for more than one NPU,
    HAMi collects every device that passes and then chooses among them."""
    spec = context.spec
    if spec.rule != "ascend":
        return False
    if spec.count_multiple > 1 and ask.demand.count > 1:
        return True
    return spec.vendor.startswith(ASCEND_TOPOLOGY_PREFIX) and all(
        card.state.device.info(NETWORK_ID_INFO) is not None for card in cards
    )


def choose_ascend(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[Card], picks: Sequence[Pick]
) -> tuple[Pick, ...] | None:
    """HAMi's choice among every Ascend NPU that passed: 910C takes whole modules; with
    NetworkIDs, one NPU is the first that passed and more come from the fullest network group
    first. None when too few passed."""
    count = ask.demand.count
    if context.spec.count_multiple > 1 and count > 1:
        modules = full_modules(ordered, picks, count)
        return modules if len(modules) == count else None
    if len(picks) < count:
        return None
    if count == 1:
        return (picks[0],)
    cards = {card.position: card for card in ordered}
    groups: dict[str, list[Pick]] = {}
    for pick in picks:
        network = cards[pick[0]].state.device.info(NETWORK_ID_INFO) or ""
        groups.setdefault(network, []).append(pick)
    # The fullest group first; equal groups in the order their first NPU passed.
    ranked = sorted(groups.values(), key=len, reverse=True)
    return tuple(pick for group in ranked for pick in group)[:count]


def full_modules(
    ordered: Sequence[Card], picks: Sequence[Pick], count: int
) -> tuple[Pick, ...]:
    """Ascend 910C: the picks of modules (device index // 2) whose two NPUs both passed, in
    the order their first NPU passed, until ``count`` NPUs."""
    cards = {card.position: card for card in ordered}
    modules: dict[int, list[Pick]] = {}
    for pick in picks:
        module = cards[pick[0]].state.device.index // NPUS_PER_MODULE
        modules.setdefault(module, []).append(pick)
    chosen: list[Pick] = []
    for members in modules.values():
        if len(chosen) >= count:
            break
        if len(members) == NPUS_PER_MODULE:
            chosen.extend(sorted(members, key=lambda p: cards[p[0]].state.device.index))
    return tuple(chosen)


NETWORK_TERM_WEIGHT = 10
"""HAMi's ``Ascend910NetworkWeight``."""


def network_term(network_ids: Sequence[Sequence[str | None]]) -> float:
    """HAMi's Ascend 910 term of the node score (``ScoreNode``): for each container, the
    share of its NPUs in its fullest network group, summed over the containers and weighed
    10, so a node where each container's NPUs share a network scores higher.

    ``network_ids`` has, per container, each granted NPU's NetworkID (None: the NPU has none).
    As in HAMi, an NPU without a NetworkID makes the whole term 0, and a NetworkID that does
    not read as a number is left out of the count; a number is its whole part, as Go's
    conversion of a float to an int. (HAMi counts JSON numbers only; the inventory keeps the
    string "1" and the number 1 alike, so such a string counts here: docs/design.md §7.)
    """
    score = 0.0
    for container in network_ids:
        counts: dict[int, int] = {}
        for value in container:
            if value is None:
                return 0.0
            group = _group(value)
            if group is not None:
                counts[group] = counts.get(group, 0) + 1
        total = sum(counts.values())
        if total:
            score += max(counts.values()) / total
    return score * NETWORK_TERM_WEIGHT


def _group(value: str) -> int | None:
    try:
        number = float(value)
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return int(number)
