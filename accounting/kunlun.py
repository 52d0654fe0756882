"""Kunlunxin's 8-card topology: which cards a request for 1, 2, 4 or 8 of them takes.

Layer: accounting (pure). HAMi's ``graghSelect`` (``pkg/device/kunlun/topo.go``), re-written:
a Kunlunxin node has 8 cards in two wings of four (positions 0-3 and 4-7 of the device list as
the scheduler ordered it), wired pairwise across the wings (``0-4, 1-5, 2-6, 3-7``) and in fixed
quads (``0-1-4-5, 2-3-6-7, 0-2-4-6, 1-3-5-7, 0-3-4-7, 1-2-5-6``; cards named by index).

* 8 cards: all eight must be free;
* 1, 2 or 4: when a wing has enough free cards, the wing whose free count leaves the least
  fragmentation (for 2 and 4: a wing with exactly 2, 3, then 4 free; for 1: exactly 1, 3, 2,
  then 4 free) gives its first free cards in list order; otherwise an interconnected pair (2) or
  quad (4) of free cards;
* anything else, or nothing found: no cards.

``select`` takes the cards in the scheduler's order as (index, usable) and returns the indexes
chosen, in HAMi's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WING = 4
"""Cards per wing."""
CROSS_PAIRS = ((0, 4), (1, 5), (2, 6), (3, 7))
"""HAMi's ``InterGroupConnection``."""
WING_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6),
              (5, 7), (6, 7))
"""HAMi's ``GroupConnection``."""
QUADS = ((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6))
"""HAMi's ``InterGroupConnection2``."""
_ODD_ORDER = (1, 3, 2, 4)
"""For one card: the wing sizes tried, in order."""

Card = tuple[int, bool]
"""A card's index and whether it can take the request."""


def select(cards: Sequence[Card], count: int) -> tuple[int, ...]:
    """The indexes of the cards HAMi's ``graghSelect`` picks, or () when none fit."""
    left = sum(1 for position, (_, usable) in enumerate(cards) if usable and position < WING)
    right = sum(1 for position, (_, usable) in enumerate(cards) if usable and position >= WING)
    if count == 2 * WING:
        return tuple(range(2 * WING)) if left + right == count else ()
    if count not in (1, 2, 4):
        return ()
    if left >= count or right >= count:
        for slots in range(count, WING + 1):
            wanted = _ODD_ORDER[slots - 1] if count % 2 else slots
            if left == wanted:
                return _pick(cards, 0, count)
            if right == wanted:
                return _pick(cards, WING, count)
    return _interconnected(cards, count)


def _pick(cards: Sequence[Card], start: int, count: int) -> tuple[int, ...]:
    """HAMi's ``devicepick``: the first usable cards from ``start`` to the eighth position."""
    picked: list[int] = []
    for index, usable in cards[start : 2 * WING]:
        if usable:
            picked.append(index)
            if len(picked) == count:
                break
    return tuple(picked)


def _interconnected(cards: Sequence[Card], count: int) -> tuple[int, ...]:
    """HAMi's ``interconnect``: a cross-wing pair for 2, a wired quad for 4."""
    usable = [index for index, ok in cards if ok]
    if count == 2:
        for first in usable:
            for second in usable:
                if first != second and (
                    (first, second) in CROSS_PAIRS or (second, first) in CROSS_PAIRS
                ):
                    return (first, second)
        return ()
    if count == 4:
        free = set(usable)
        if len(usable) in (4, 5):
            return next((quad for quad in QUADS if free.issuperset(quad)), ())
        if len(usable) == 6:
            chosen: tuple[int, ...] = ()
            for quad in QUADS:
                if free.issuperset(quad):
                    chosen = quad
                    rest = free - set(quad)
                    # Prefer the quad that leaves a wired pair free.
                    if any(rest.issuperset(pair) for pair in CROSS_PAIRS + WING_PAIRS):
                        return quad
            return chosen
    return ()


def node_score_term(used: Iterable[int], taken: Iterable[int]) -> int:
    """HAMi's Kunlunxin term of the node score (``ScoreNode``, ``calcscore`` in
    ``pkg/device/kunlun/topo.go``), added to a node's score when every device on it is a
    Kunlunxin card: 3000, 2000, 1000 or 0 as the cards the pod takes (``taken``, by index)
    split across the wings into one fragment fewer, as many, one more or two more than the
    cards already in use (``used``); 1000 for any other difference.

    A wing's cards count as a fragment value: 4 of them 0, exactly 1 of them 2, any other
    number (0 included) 1; a set of cards is worth its two wings' values summed, and an empty
    set 1. As in HAMi, the pod's cards are weighed on their own, not added to those in use.
    """
    delta = _fragments(set(taken)) - _fragments(set(used))
    return _TERM_BY_DELTA.get(delta, 1000)


_TERM_BY_DELTA = {-1: 3000, 0: 2000, 1: 1000, 2: 0}


def _fragments(indices: set[int]) -> int:
    if not indices:
        return 1
    left = sum(1 for index in indices if index < WING)
    return _wing_value(left) + _wing_value(len(indices) - left)


def _wing_value(cards: int) -> int:
    if cards == WING:
        return 0
    if cards == 1:
        return 2
    return 1
