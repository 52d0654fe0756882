"""NVIDIA's topology-aware GPU policy: which of the cards that passed a container's walk it
takes, by the node's pair scores (``accounting.pair_scores``).

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``). Under the policy HAMi's
NVIDIA ``Fit`` collects every card that passes (a MIG card once per instance it would give)
and then chooses: exactly as many as asked are taken as they are; one card asked is the card
least connected to the others that passed (the lowest sum of its scores with them), leaving
the well-connected ones together for a pod that asks for several; more asked are the
combination of that many with the highest sum of scores over its pairs. Ties go to the first
in walk order, as HAMi's strict comparisons keep the first. A card not scored with another
scores 0 with it; scores may be negative. Sums are exact here (Go's ``int`` would wrap past
2^63, which no device plugin writes).

HAMi enumerates every combination; this module finds the same one without listing them, and
refuses (``choose`` gives None) past ``MAX_COMBINATIONS``: 16 cards give at most 12,870
combinations (8 of 16), while a node with many MIG instances could ask for billions, which
HAMi's scheduler would not finish either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

MAX_COMBINATIONS = 100_000
"""The most combinations of the passing cards a choice of several looks through (C(n, k) of
n cards that passed, k asked): C(16, 8) = 12,870, C(32, 4) = 35,960 and C(64, 3) = 41,664
are within."""


def choose(
    uuids: Sequence[str], count: int, scores: Mapping[str, Mapping[str, int]]
) -> tuple[int, ...] | None:
    """HAMi's choice of ``count`` of the cards that passed (``uuids``, in walk order; a MIG
    card once per instance), as positions into ``uuids`` in walk order. ``scores``: each card's
    score with the others (``computeWorstSingleCard``, ``generateCombinations`` and
    ``computeBestCombination`` of HAMi's ``pkg/device/nvidia/device.go``).

    Returns None when more than ``MAX_COMBINATIONS`` combinations would have to be compared.
    Requires ``1 <= count <= len(uuids)``.
    """
    total = len(uuids)
    assert 1 <= count <= total
    if count == total:
        return tuple(range(total))
    if count == 1:
        return (_least_connected(uuids, scores),)
    if math.comb(total, count) > MAX_COMBINATIONS:
        return None
    return _best_combination(uuids, count, scores)


def _least_connected(uuids: Sequence[str], scores: Mapping[str, Mapping[str, int]]) -> int:
    """The first card with the lowest sum of its scores with every other card that passed
    (another instance of a MIG card is no other card)."""
    sums = []
    for uuid in uuids:
        own = scores.get(uuid, {})
        sums.append(sum(own.get(other, 0) for other in uuids if other != uuid))
    return min(range(len(sums)), key=sums.__getitem__)


def _best_combination(
    uuids: Sequence[str], count: int, scores: Mapping[str, Mapping[str, int]]
) -> tuple[int, ...]:
    """The first ``count`` positions, in the lexicographic order HAMi lists combinations in,
    with the highest sum over their pairs (i before j: i's score for j).

    A depth-first walk in that order carrying, for every later card, what it would add to the
    members chosen so far; the last member is then the first best of a slice, so each
    combination costs no work of its own."""
    table = [[scores.get(a, {}).get(b, 0) for b in uuids] for a in uuids]
    size = len(uuids)
    best: tuple[int, ...] = ()
    best_sum = 0
    chosen: list[int] = []

    def descend(start: int, gains: list[int], so_far: int) -> None:
        # gains[r]: what the card at start + r adds to the members chosen so far.
        nonlocal best, best_sum
        depth = len(chosen)
        if depth == count - 1:
            highest = max(gains)
            value = so_far + highest
            if not best or value > best_sum:
                best, best_sum = (*chosen, start + gains.index(highest)), value
            return
        for i in range(start, size - (count - depth) + 1):
            rest = i + 1 - start
            chosen.append(i)
            descend(
                i + 1,
                [g + s for g, s in zip(gains[rest:], table[i][i + 1 :], strict=True)],
                so_far + gains[rest - 1],
            )
            chosen.pop()

    descend(0, [0] * size, 0)
    return best
