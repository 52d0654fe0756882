"""One container's ask for one vendor's devices, sized once per pod: the fit's own form
(``_Ask``), how it is built from a container, the memory it takes on one card, and the form a
fast path reads (``ContainerAsk``).

Layer: accounting (pure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from accounting.model import Container, ContainerClass
from accounting.pod import EXCLUSIVE_CORE_PERCENT, DeviceDemand, device_demand
from accounting.vendor_spec import Charge, VendorSpec


class _Ask(NamedTuple):
    """One container's request for the vendor, sized once per pod (not per node or device)."""

    position: int
    is_init: bool
    """A regular init container: fitted on the steady state at its point, charged nowhere."""
    device_count: int
    memory_mib: int
    """Fixed MiB per device (memory factor applied), or -1 when sized by the chosen card."""
    memory_percent: int
    core_percent: int
    exclusive: bool
    """core_percent is 100: the card alone (refused on a 100-core card with any task on it)."""
    share_only: bool
    """core_percent is 0: refused on a card whose compute is fully given away."""
    demand: DeviceDemand
    """The sized request the fields above are unpacked from (for the fit's hot loop)."""
    order: int = 0
    """Its place in the pod's fitting order over every vendor (for the first failure)."""


def _memory_need(ask: _Ask, memory_total_mib: int) -> int:
    """Memory charged on one card of ``memory_total_mib``."""
    return ask.demand.on_card(memory_total_mib).memory_mib


def _build_ask(position: int, container: Container, spec: VendorSpec) -> _Ask | None:
    demand = device_demand(container, spec.resources)
    if demand is None:
        return None
    if spec.charge is Charge.SLOTS_ONLY:
        # Devices taken by slot only (Vastai, Biren): nothing else is compared.
        demand = DeviceDemand(demand.count, 0, 0, 0)
    return _Ask(
        position=position,
        is_init=container.container_class is ContainerClass.INIT,
        device_count=demand.count,
        memory_mib=-1 if demand.memory_mib is None else demand.memory_mib,
        memory_percent=demand.memory_percent,
        core_percent=demand.core_percent,
        exclusive=demand.core_percent == EXCLUSIVE_CORE_PERCENT,
        share_only=demand.core_percent == 0 and spec.charge is not Charge.SLOTS_ONLY,
        demand=demand,
    )


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One container's request as the fit walks it (one entry of ``FitPlan.asks``)."""

    position: int
    """The container's position in declaration order."""
    is_init: bool
    """A regular init container: checked on the steady state at its point, charged nowhere."""
    count: int
    memory_mib: int | None
    """Fixed MiB per device (memory factor applied); None when a share of the chosen card."""
    memory_percent: int
    core_percent: int
    exclusive: bool
    """The card alone: refused on a 100-core card that has any task (100 cores asked)."""
    share_only: bool
    """No cores asked: refused on a card whose cores are all given away."""
