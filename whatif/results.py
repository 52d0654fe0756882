"""What a what-if replay reports: per pod, per namespace and for the rule, with its curves.

Layer: the what-if simulator (accounting and the standard library only). Figures, per pod
(``PodOutcome``) and for the rule (``RuleResult``): placed, refused by reason, still pending,
how long pods waited; GPU memory reserved (what the ledger stores) and requested by the
containers running at that moment (the declared classes: an init container with the sidecars
declared before it, then sidecars and apps), over time; reserved-but-idle and
running-beyond-reservation MiB·s (per pod, then summed); each namespace's peak usage against
its quota.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from accounting.counting_rules import CountingRule

PENDING_AT_END = "Pending"
"""Reason of a pod still waiting when the window ends though it fits an empty node."""
NEVER_FITS = "NoNodeFits"
"""Reason prefix of a pod that fits no node of the pool even empty, e.g.
``NoNodeFits: CardInsufficientMemory``."""


class Outcome(enum.Enum):
    """How a pod's replay ended."""

    PLACED = "placed"
    REFUSED = "refused"
    """Refused at admission (quota), or it fits no node of the pool even when empty."""
    PENDING = "pending"
    """Still waiting for capacity when the window ended."""


@dataclass(frozen=True, slots=True)
class PodOutcome:
    """One pod under one rule."""

    key: str
    """namespace/name."""
    outcome: Outcome
    reason: str
    """"" when placed; the quota reason code; ``NoNodeFits: <card reason>``; ``Pending``."""
    request_mib: int
    """The effective memory request the admission check saw (as the rule counts the pod)."""
    node_name: str
    placed_s: int | None
    waited_s: int
    """From arrival to placement, or to the window's end when never placed."""
    peak_stored_mib: int
    """The most the ledger stored for the pod at any time."""


@dataclass(frozen=True, slots=True)
class NamespaceFigures:
    """One namespace's GPU memory under one rule."""

    namespace: str
    limit_mib: int | None
    """limits.nvidia.com/gpumem; None without a quota on memory."""
    peak_used_mib: int
    refused: int
    """Pods of the namespace refused at admission."""

    @property
    def min_headroom_mib(self) -> int | None:
        """The least quota left at any time (limit - peak usage)."""
        return None if self.limit_mib is None else self.limit_mib - self.peak_used_mib


@dataclass(frozen=True, slots=True)
class RuleResult:
    """Every figure of one rule's replay."""

    rule: CountingRule
    window_s: int
    pods: tuple[PodOutcome, ...]
    """In workload order."""
    placed: int
    refused: Mapping[str, int]
    """Reason -> pods."""
    pending: int
    waited_over_threshold: int
    """Pods that waited (or were still waiting) longer than the threshold."""
    wait_threshold_s: int
    peak_reserved_mib: int
    mean_reserved_mib: int
    peak_requested_mib: int
    mean_requested_mib: int
    idle_mib_s: int
    """Σ over pods of ∫ max(0, stored - requested by its running containers) dt."""
    unreserved_mib_s: int
    """Σ over pods of ∫ max(0, requested by its running containers - stored) dt: use the rule
    did not reserve (an under-count: the card can be handed out twice)."""
    namespaces: tuple[NamespaceFigures, ...]
    times_s: tuple[int, ...]
    """Moments the totals changed, from 0; the totals hold until the next moment."""
    reserved_mib: tuple[int, ...]
    requested_mib: tuple[int, ...]
    idle_mib: tuple[int, ...]
    """Σ over pods of max(0, stored - requested by its running containers), per moment."""
    unreserved_mib: tuple[int, ...]
    """Σ over pods of max(0, requested by its running containers - stored), per moment."""
