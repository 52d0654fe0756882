"""The order in which a pod's GPU policy tries a node's devices, as HAMi orders them.

HAMi's ``DeviceUsageList.Less`` sorts the node's devices and its vendors' ``Fit`` walks the
sorted list from the end, so what HAMi sorts last is tried first here. Read from
``hami.io/gpu-scheduler-policy`` and ``nvidia.com/numa-bind``:

* a single value: ``binpack`` tries the busiest card first, any other value (``spread``, an
  unknown word, a word in other case) the least busy, equal scores the higher NUMA node first
  (HAMi #1806); ``mutex`` the cards with the fewest tasks first, then the higher NUMA node;
  with numa-bind, NUMA node first (binpack the lowest, otherwise the highest), then the score;
* a comma-separated chain, or the single value ``numa``: the keys ``binpack``, ``spread`` and
  ``numa`` in the order written (each trimmed, exact case, a repeated one ignored; ``mutex``
  and ``topology-aware`` are filters, not keys), ``spread`` when none is named, ``numa``
  moved to the front with numa-bind; equal keys the higher index first.

Among devices equal in every key the fit tries the higher index first (then the later
position): HAMi's list starts in index order and its sort keeps equal elements in place for
the node sizes it is used on. Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from accounting.annotations import GPU_POLICY_ANNOTATION, NUMA_BIND_ANNOTATION

SCORE_HIGH = "score-high"
"""The busier card (higher device score) first: the binpack key."""
SCORE_LOW = "score-low"
"""The less busy card first: the spread key."""
NUMA_HIGH = "numa-high"
"""The card on the higher NUMA node first."""
NUMA_LOW = "numa-low"
"""The card on the lower NUMA node first (binpack with numa-bind)."""
TASKS_FEW = "tasks-few"
"""The card with fewer tasks on it first (mutex: idle cards are walked first)."""

_CHAIN_KEYS = {"binpack": SCORE_HIGH, "spread": SCORE_LOW, "numa": NUMA_HIGH}
"""The words of a policy chain that order cards, and the key each stands for."""

OrderKey = Callable[[int], tuple[float, ...]]
"""A device position -> its place in the walk (smallest first)."""


@dataclass(frozen=True, slots=True)
class GpuOrder:
    """How one pod's GPU policy orders a node's devices for the walk."""

    keys: tuple[str, ...]
    """The sort keys, the first deciding (``SCORE_HIGH``, ``SCORE_LOW``, ``NUMA_HIGH``,
    ``NUMA_LOW``, ``TASKS_FEW``)."""
    numa_tie: bool = True
    """Devices equal in every key go by NUMA node, higher first, before index (HAMi's
    single-valued policies); False: by index alone (its chains)."""
    numa_bind: bool = False
    """nvidia.com/numa-bind: an NVIDIA container's cards come from one NUMA node, the walk
    starting again at each NUMA node it enters (HAMi's ``NumaNotFit``)."""

    @property
    def precomputed(self) -> bool:
        """The order is one of the two every node keeps ready (binpack or spread by the
        score, ties by the NUMA-and-index rank), with no NUMA grouping."""
        return self.keys in ((SCORE_HIGH,), (SCORE_LOW,)) and self.numa_tie and not self.numa_bind

    @property
    def binpack(self) -> bool:
        """The first key is the binpack one (what a precomputed order is)."""
        return bool(self.keys) and self.keys[0] == SCORE_HIGH

    def key_of(
        self,
        scores: Sequence[float],
        numas: Sequence[int],
        tasks: Sequence[int],
        rank: Sequence[int],
        index_rank: Sequence[int],
    ) -> OrderKey:
        """The walk's sort key over a node's devices, by position: ``scores`` the device
        scores, ``numas`` the NUMA nodes, ``tasks`` the slots in use, ``rank`` the NUMA-then-
        index tie-break and ``index_rank`` the index one (0 tried first)."""
        columns: list[tuple[Sequence[float] | Sequence[int], float]] = []
        for key in self.keys:
            if key == SCORE_HIGH:
                columns.append((scores, -1.0))
            elif key == SCORE_LOW:
                columns.append((scores, 1.0))
            elif key == NUMA_HIGH:
                columns.append((numas, -1.0))
            elif key == NUMA_LOW:
                columns.append((numas, 1.0))
            else:
                columns.append((tasks, 1.0))
        tie = rank if self.numa_tie else index_rank

        def key_of(p: int) -> tuple[float, ...]:
            return (*(sign * column[p] for column, sign in columns), tie[p])

        return key_of


BINPACK_ORDER = GpuOrder((SCORE_HIGH,))
"""The binpack order of a pod without a policy of its own (the daemon's default)."""
SPREAD_ORDER = GpuOrder((SCORE_LOW,))
"""The spread order of a pod without a policy of its own."""

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""What Go's strconv.ParseBool reads as true (anything it cannot read is false here, as in
HAMi, which ignores the error)."""


def numa_bind_requested(annotations: Mapping[str, str]) -> bool:
    """Whether the pod's nvidia.com/numa-bind asks for one NUMA node per container."""
    return annotations.get(NUMA_BIND_ANNOTATION) in _GO_TRUE


def gpu_order(annotations: Mapping[str, str], default_binpack: bool) -> GpuOrder:
    """The pod's device order: its hami.io/gpu-scheduler-policy read as HAMi reads it (the
    daemon's default policy when the annotation is absent), with its nvidia.com/numa-bind."""
    numa_bind = numa_bind_requested(annotations)
    policy = annotations.get(GPU_POLICY_ANNOTATION)
    if policy is None:
        policy = "binpack" if default_binpack else "spread"
    if "," in policy or policy == "numa":
        return _chain_order(policy, numa_bind)
    if policy == "mutex":
        # HAMi's mutex order comes before its NUMA grouping: numa-bind does not reorder it.
        return GpuOrder((TASKS_FEW,), numa_bind=numa_bind)
    binpack = policy == "binpack"
    if numa_bind:
        if binpack:
            return GpuOrder((NUMA_LOW, SCORE_HIGH), numa_bind=True)
        return GpuOrder((NUMA_HIGH, SCORE_LOW), numa_bind=True)
    return BINPACK_ORDER if binpack else SPREAD_ORDER


def _chain_order(policy: str, numa_bind: bool) -> GpuOrder:
    keys: list[str] = []
    for word in policy.split(","):
        key = _CHAIN_KEYS.get(word.strip())
        if key is not None and key not in keys:
            keys.append(key)
    if not keys:
        keys = [SCORE_LOW]
    if numa_bind and keys[0] != NUMA_HIGH:
        keys = [NUMA_HIGH, *(key for key in keys if key != NUMA_HIGH)]
    # A second score key never decides (equal scores are equal under both), and a chain that
    # orders by NUMA node breaks its remaining ties by index within one NUMA node, which is
    # what the NUMA-then-index rank does: written so, "binpack,numa" is the binpack order.
    first_score = next((i for i, key in enumerate(keys) if key in (SCORE_HIGH, SCORE_LOW)), None)
    if first_score is not None:
        keys = [
            key
            for i, key in enumerate(keys)
            if i <= first_score or key not in (SCORE_HIGH, SCORE_LOW)
        ]
    if NUMA_HIGH not in keys:
        return GpuOrder(tuple(keys), numa_tie=False, numa_bind=numa_bind)
    if keys[-1] == NUMA_HIGH:
        keys = keys[:-1]
    return GpuOrder(tuple(keys), numa_tie=True, numa_bind=numa_bind)
