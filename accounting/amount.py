"""The one type for an amount of device capacity: memory, compute and sharing slots.

Layer: accounting (pure, standard library only). Every per-device figure of the accounting is
an ``Amount``: what a container is granted on a card, what a pod is charged there, a node's
total on one card, a card's capacity, what is left of it. Pod-level request figures use the
same type, with one slot per device asked for (each device a container asks for is one task on
some card, which is what a slot counts), so the effective request is the same fold as the
stored usage.

Four operations carry every rule: ``+`` (things that run at the same time), ``-`` (taking a
charge back), ``join`` (per-dimension maximum: the envelope of phases that never run at the
same time) and ``fits_in`` (capacity). ``over`` names the dimensions that do not fit, in the
order the checks report them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Dimension(enum.Enum):
    """One dimension of an ``Amount``; the value is the field that holds it."""

    MEMORY = "memory_mib"
    """Device memory, MiB."""
    CORES = "core_percent"
    """Compute, percent of one device (100 is a whole device)."""
    SLOTS = "slots"
    """Sharing slots: concurrent tasks on one device (HAMi's deviceSplitCount budget)."""


@dataclass(frozen=True, slots=True)
class Amount:
    """Memory (MiB), compute (percent of one device) and slots; integers, never floats."""

    memory_mib: int = 0
    core_percent: int = 0
    slots: int = 0

    def __add__(self, other: Amount) -> Amount:
        """Both at the same time."""
        return Amount(
            self.memory_mib + other.memory_mib,
            self.core_percent + other.core_percent,
            self.slots + other.slots,
        )

    def __sub__(self, other: Amount) -> Amount:
        """This without ``other`` (a charge taken back, or what is left of a capacity)."""
        return Amount(
            self.memory_mib - other.memory_mib,
            self.core_percent - other.core_percent,
            self.slots - other.slots,
        )

    def __bool__(self) -> bool:
        """False for the zero amount only."""
        return bool(self.memory_mib or self.core_percent or self.slots)

    def join(self, other: Amount) -> Amount:
        """The per-dimension maximum: enough for either, when the two never run together.

        The memory and the compute of a join may come from different phases, so it is an
        envelope, not the usage of any one instant.
        """
        return Amount(
            max(self.memory_mib, other.memory_mib),
            max(self.core_percent, other.core_percent),
            max(self.slots, other.slots),
        )

    def fits_in(self, capacity: Amount) -> bool:
        """True when no dimension exceeds ``capacity`` (equal fits)."""
        return (
            self.memory_mib <= capacity.memory_mib
            and self.core_percent <= capacity.core_percent
            and self.slots <= capacity.slots
        )

    def over(
        self, capacity: Amount, order: Iterable[Dimension] = tuple(Dimension)
    ) -> tuple[Dimension, ...]:
        """The dimensions in which this exceeds ``capacity``, in ``order``."""
        return tuple(d for d in order if getattr(self, d.value) > getattr(capacity, d.value))

    def as_tuple(self) -> tuple[int, int, int]:
        """(memory MiB, core percent, slots)."""
        return self.memory_mib, self.core_percent, self.slots

    @staticmethod
    def total(amounts: Iterable[Amount]) -> Amount:
        """The sum of ``amounts`` (zero for none)."""
        memory_mib = core_percent = slots = 0
        for amount in amounts:
            memory_mib += amount.memory_mib
            core_percent += amount.core_percent
            slots += amount.slots
        return Amount(memory_mib, core_percent, slots)


ZERO = Amount()
"""Nothing: the value of a device a container does not use."""
