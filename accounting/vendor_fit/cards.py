"""The cards a vendor's walk fits a pod on, and the steps every vendor's walk takes on one card.

Layer: accounting (pure; the floor of ``accounting.vendor_fit``). ``Card`` is one of the
vendor's devices while the pod is fitted (its capacity and what is charged so far), and
``RuleContext`` all the walk reads of the pod and the node besides the asks. The steps:
HAMi's memory and compute checks (``capacity_refusal``, on the one card rule of
``accounting.card_capacity``), AMD's compute units (``compute_units``) and what a vendor charges
for one device (``grant``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from accounting import mig
from accounting.amount import Amount
from accounting.card_capacity import card_refusal
from accounting.device_filter import DeviceFilter
from accounting.gpu_order import GpuOrder
from accounting.model import DeviceGrant, DeviceState, MigPlacement
from accounting.reasons import (
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
)
from accounting.vendor_spec import Charge, VendorSpec

WHOLE_CARD_CORES = 100

Pick = tuple[int, DeviceGrant]
"""A device's position on the node and what the container is granted there."""


@dataclass(frozen=True, slots=True)
class RuleFailure:
    """Why the node refuses the pod: the first ask (in fitting order) that does not fit."""

    order: int
    reason: str


@dataclass(slots=True)
class Card:
    """One of the vendor's devices while the pod is fitted: capacity and what is charged."""

    position: int
    state: DeviceState
    slots_used: int
    memory_used: int
    cores_used: int
    mig_in_use: list[MigPlacement] = field(default_factory=list)

    @classmethod
    def of(cls, position: int, state: DeviceState) -> Card:
        """The card at ``position`` of the node, charged what its state says."""
        return cls(
            position,
            state,
            state.slots_used,
            state.memory_used_mib,
            state.core_percent_used,
            list(state.mig_in_use),
        )

    @property
    def uuid(self) -> str:
        """The device's UUID."""
        return self.state.device.uuid

    @property
    def is_mig(self) -> bool:
        """The card is in MIG mode (its instances are chosen by ``accounting.mig``)."""
        return self.state.device.mode == mig.MIG_MODE

    def charge(self, grant: DeviceGrant) -> None:
        """Charges the card one device's grant (a steady container's, once its walk is done)."""
        self.slots_used += grant.slot_weight
        self.memory_used += grant.memory_mib
        self.cores_used += grant.core_percent
        if grant.mig is not None:
            self.mig_in_use.append(grant.mig.placement)


class CardQuota(Protocol):
    """The namespace quota priced card by card (``accounting.fit``'s walk of it, handed down)."""

    def added(self, p: int, memory_mib: int, core_percent: int) -> tuple[int, int, int]:
        """What one more grant on the device at position ``p`` adds to the folded totals."""
        ...

    def fits(self, taken: Sequence[int], added: Sequence[int]) -> bool:
        """Whether the placement so far, ``taken`` and one more ``added`` stay within."""
        ...

    def commit(self, is_init: bool, p: int, memory_mib: int, core_percent: int) -> None:
        """Adds one grant of a container that fits, once its walk is done."""
        ...


Score = Callable[[int, int, int, int, int, int], float]
"""The fit's device score: (slots used, slots, cores used, cores, memory used, memory)."""


@dataclass(frozen=True, slots=True)
class RuleContext:
    """Everything about the pod and the node the walk reads besides the asks."""

    spec: VendorSpec
    annotations: Mapping[str, str]
    device_filter: DeviceFilter | None
    rank: Sequence[int]
    """The fit's tie-break between devices equal in the order's keys: NUMA node, then index
    (0 is tried first)."""
    index_rank: Sequence[int]
    """The tie-break by index alone (a policy chain's)."""
    order: GpuOrder
    """The order the pod's GPU policy tries the devices in."""
    score: Score
    drs_profiles: tuple[DrsProfile, ...] | None = None
    """Enflame DRS: the node's profiles, smallest first (None: the node has none)."""
    drs_choice: DrsProfile | None = None
    """Enflame DRS: the profile of the ask being walked."""
    quota: CardQuota | None = None
    """NVIDIA: the quota priced per candidate card, as HAMi's ``fitQuota`` (None: no limit
    could refuse a card here)."""
    mutex: bool = False
    """The pod's GPU policy names mutex: a card with a task on it is refused."""
    topology: bool = False
    """The pod's GPU policy names topology-aware: NVIDIA's walk collects every card that passes
    and chooses among them by the node's pair scores (``accounting.vendor_fit.topology``)."""


@dataclass(frozen=True, slots=True)
class DrsProfile:
    """An Enflame DRS profile: ``<slices>g.<GB>gb``, its id, and the compute share HAMi gives
    it (slices over the GCU's largest profile, rounded up)."""

    name: str
    profile_id: str
    slices: int
    memory_gb: int
    core_percent: int


def capacity_refusal(context: RuleContext, card: Card, memory_mib: int, cores: int) -> str | None:
    """HAMi's memory and compute checks, in its order: the one card's rules
    (``accounting.card_capacity``) on the card as the vendor reads it."""
    device = card.state.device
    # Ascend's hami-core mode compares cores with 100 whatever the NPU registers.
    total = (
        WHOLE_CARD_CORES
        if context.spec.soft_split(context.annotations)
        else device.core_percent_total
    )
    return card_refusal(
        Amount(memory_mib, cores, 1),
        Amount(card.memory_used, card.cores_used, card.slots_used),
        Amount(device.memory_total_mib, total, device.slots_total),
    )


def compute_units(card: Card, memory_mib: int, percent: int) -> tuple[str | None, int]:
    """AMD: memory as asked (none: the whole GPU); cores asked in percent become the GPU's
    compute units (at least one, at most all)."""
    device = card.state.device
    if device.memory_total_mib - card.memory_used < memory_mib:
        return CARD_INSUFFICIENT_MEMORY, 0
    units = 0
    if percent > 0:
        if device.core_percent_total <= 0:
            return CARD_INSUFFICIENT_CORE, 0
        units = min(max(device.core_percent_total * percent // 100, 1), device.core_percent_total)
    elif device.memory_total_mib > 0 and memory_mib >= device.memory_total_mib:
        units = device.core_percent_total
    if device.core_percent_total - card.cores_used < units:
        return CARD_INSUFFICIENT_CORE, 0
    return None, units


def vendor_grant(spec: VendorSpec, card: Card, memory_mib: int, cores: int) -> DeviceGrant:
    """What the vendor charges the card for one device of the request."""
    device = card.state.device
    if spec.charge is Charge.WHOLE_DEVICE:
        return DeviceGrant(device.uuid, spec.vendor, device.memory_total_mib,
                           device.core_percent_total)
    if spec.charge is Charge.SLOTS_ONLY:
        return DeviceGrant(device.uuid, spec.vendor, 0, 0)
    return DeviceGrant(device.uuid, spec.vendor, memory_mib, cores)
