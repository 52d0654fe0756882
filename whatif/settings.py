"""What a what-if replay is configured with: the same for every rule it compares.

Layer: the what-if simulator (accounting and the standard library only).
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting.fit import BINPACK, SPREAD
from accounting.policy import DEFAULT_POLICY, AccountingPolicy


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """What the scheduler and the report are configured with (the same for every rule)."""

    wait_threshold_s: int = 60
    """Pods that wait longer than this are counted."""
    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    policy: AccountingPolicy = DEFAULT_POLICY
    """The recorder's policy; the replay accounts its first vendor's devices."""
