"""The namespace quota in the fit: the pod's quota state (``QuotaContext``) and the walk that
prices each candidate card against it (``_QuotaWalk``), as HAMi's ``fitQuota`` does.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from accounting import quota as quota_rules
from accounting.model import DeviceUsage, QuotaItem
from accounting.vendors import VendorResources


@dataclass(frozen=True, slots=True)
class QuotaContext:
    """The pod's namespace quota state, checked per candidate card with real card sizes."""

    items: Mapping[str, QuotaItem]
    """Keyed by resource name (nvidia.com/gpumem, nvidia.com/gpucores, nvidia.com/gpu)."""
    enforce_gpu_count: bool = True
    """The policy's: whether the device count limit is enforced where set."""

    def without(
        self, usage: Sequence[DeviceUsage], vendors: Iterable[VendorResources]
    ) -> QuotaContext:
        """The quota as it would be without ``usage`` (a pod's own stored charge, released
        when the pod is filtered again, as Reserve does); never below nothing used."""
        items = dict(self.items)
        for vendor in vendors:
            for resource, quantity in quota_rules.held_quantities(usage, vendor):
                item = items.get(resource)
                if item is not None:
                    used = max(item.used - quantity, 0)
                    items[resource] = QuotaItem(
                        resource, used=used, limit=item.limit, limit_set=item.limit_set
                    )
        return QuotaContext(items, self.enforce_gpu_count)


class _QuotaWalk:
    """The namespace quota checked per candidate card, as HAMi's ``fitQuota`` does: a card is
    refused (``ResourceQuotaNotFit``, after its slots and before its memory are compared) when
    the pod's placement so far, plus the cards this container already took, plus this card
    would take the namespace over its quota; the walk then goes on to the next card.

    "The placement so far" is folded as the pod is stored (docs/design.md §2.2: per card,
    max(steady, every init point)), so the last check of a placement is Reserve's own check.
    Rather than re-fold the placement for every card, this keeps the pod's own steady and
    init-peak memory and cores per device of one node, and the folded totals, and prices a
    card by what it adds to them. bench/naive_fit.py re-folds literally (``collapse_grants``
    and ``quota.check_usage`` per card); a property test pins the two together.
    """

    __slots__ = (
        "cores",
        "devices",
        "held",
        "init_cores",
        "init_memory",
        "memory",
        "room",
        "steady_cores",
        "steady_memory",
    )

    def __init__(self, room: quota_rules.QuotaRoom, device_count: int) -> None:
        self.room = room
        self.steady_memory = [0] * device_count
        self.steady_cores = [0] * device_count
        self.init_memory = [0] * device_count
        """Per device: the highest init point so far (its own share plus the steady share at
        its point)."""
        self.init_cores = [0] * device_count
        self.held = [False] * device_count
        """Per device: the pod takes something there (every grant holds a slot)."""
        self.memory = 0
        self.cores = 0
        self.devices = 0
        """The folded totals of the pod's placement on this node so far."""

    def added(self, p: int, memory_mib: int, core_percent: int) -> tuple[int, int, int]:
        """What one more grant on device ``p`` adds to the folded totals. It is the same for
        a steady and an init container: max(steady + x, init peak) - max(steady, init peak)
        per dimension (an init point on p is the steady share at its point plus its own), and
        one device when the pod held nothing on p."""
        steady_memory, init_memory = self.steady_memory[p], self.init_memory[p]
        steady_cores, init_cores = self.steady_cores[p], self.init_cores[p]
        return (
            max(steady_memory + memory_mib, init_memory) - max(steady_memory, init_memory),
            max(steady_cores + core_percent, init_cores) - max(steady_cores, init_cores),
            0 if self.held[p] else 1,
        )

    def fits(self, taken: Sequence[int], added: Sequence[int]) -> bool:
        """Whether the placement so far, the container's ``taken`` cards (their ``added``
        summed) and one more card adding ``added`` stay within the room."""
        return self.room.allows(
            self.memory + taken[0] + added[0],
            self.cores + taken[1] + added[1],
            self.devices + taken[2] + added[2],
        )

    def commit(self, is_init: bool, p: int, memory_mib: int, core_percent: int) -> None:
        """Adds one grant of a container that fits: on ``p``, ``memory_mib`` and
        ``core_percent``."""
        memory, cores, devices = self.added(p, memory_mib, core_percent)
        self.memory += memory
        self.cores += cores
        self.devices += devices
        self.held[p] = True
        if is_init:
            self.init_memory[p] = max(self.init_memory[p], self.steady_memory[p] + memory_mib)
            self.init_cores[p] = max(self.init_cores[p], self.steady_cores[p] + core_percent)
        else:
            self.steady_memory[p] += memory_mib
            self.steady_cores[p] += core_percent
