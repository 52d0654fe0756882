"""The order in which the fit tries a node's devices: HAMi's usage score of a device (or of a
node's sums), the device order under binpack and spread, and the one-device fix-up after a
steady container charges a card (``_reposition``).

Layer: accounting (pure). The score is the only float in the fit; it orders, never decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from accounting.fit.scoring_weights import ScoringWeights

Score = Callable[[int, int, int, int, int, int], float]
"""A device score: (slots used, slots, cores used, cores, memory used, memory) -> score."""


def device_score(
    slots_used: int,
    slots_total: int,
    cores_used: int,
    cores_total: int,
    memory_used_mib: int,
    memory_total_mib: int,
) -> float:
    """HAMi's usage score of one device or of a node's sums: 10 × (slots + cores + memory
    used fractions), 0 when any total is 0. Higher means busier.

    It is the only float in the fit and orders things; it never decides capacity. Both the
    per-device ordering and the node score use it, on usage before the request is added
    (HAMi's request term never matches on real nodes: docs/design.md §7).
    """
    if slots_total == 0 or cores_total == 0 or memory_total_mib == 0:
        return 0.0
    return 10 * (
        slots_used / slots_total + cores_used / cores_total + memory_used_mib / memory_total_mib
    )


def weighted_score(weights: ScoringWeights) -> Score:
    """The device score under the pod's weights: ``device_score`` itself for 1, 1, 1, else
    10 × (slot × slots used fraction + core × cores + memory × memory), 0 when any total is
    0 (HAMi's ComputeScore with ``hami.io/device-scoring-weights``). It orders the devices
    only; the node score stays unweighted, as HAMi's."""
    if weights.is_default:
        return device_score
    slot, core, memory = float(weights.slot), float(weights.core), float(weights.memory)

    def score(
        slots_used: int,
        slots_total: int,
        cores_used: int,
        cores_total: int,
        memory_used_mib: int,
        memory_total_mib: int,
    ) -> float:
        if slots_total == 0 or cores_total == 0 or memory_total_mib == 0:
            return 0.0
        return 10 * (
            slot * (slots_used / slots_total)
            + core * (cores_used / cores_total)
            + memory * (memory_used_mib / memory_total_mib)
        )

    return score


def _device_order(
    by_rank: Sequence[int], scores: Sequence[float], binpack: bool
) -> list[int]:
    """Device positions in the order the fit tries them: binpack the busiest card first,
    spread the least busy; Python's sort is stable (also with reverse), keeping rank ties.

    Equivalently: ascending by (-score, rank) under binpack and (score, rank) under spread,
    rank being the place in ``by_rank`` (NUMA node, then index) — the total order
    ``_reposition`` keeps."""
    return sorted(by_rank, key=scores.__getitem__, reverse=binpack)


def _reposition(
    order: list[int], p: int, scores: Sequence[float], rank: Sequence[int], binpack: bool
) -> None:
    """Moves device ``p``, whose score just changed, to where ``_device_order`` would put it.

    Every other device of ``order`` is in place already, so p only has to slide past its
    neighbours: after a steady container a picked card is busier (forward under binpack, back
    under spread), usually by a few places, and re-sorting the whole node each time cost more
    than the fit of the container. Both directions are tried, so any change of score works.
    """
    # Binpack puts the higher score first, spread the lower: compare sign × score, then rank.
    sign = -1.0 if binpack else 1.0
    i = order.index(p)
    key = sign * scores[p]
    own_rank = rank[p]
    last = len(order) - 1
    while i > 0:  # forward while p goes before its predecessor q
        q = order[i - 1]
        other = sign * scores[q]
        if other < key or (other == key and rank[q] < own_rank):
            break
        order[i] = q
        i -= 1
    while i < last:  # back while its successor q goes before p
        q = order[i + 1]
        other = sign * scores[q]
        if other > key or (other == key and rank[q] > own_rank):
            break
        order[i] = q
        i += 1
    order[i] = p
