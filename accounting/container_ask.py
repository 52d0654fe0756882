"""One container's ask for one vendor's devices, sized once per pod (not per node or device):
the one form the reference fit (``accounting.fit``), the vendors' own rules
(``accounting.vendor_fit``) and the fast path's plan (``accounting.fit.FitPlan``) read.

Layer: accounting (pure). It sits beneath both the fit and the vendor rules, which the fit
calls, so that the two read the same value.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting.model import Container, ContainerClass
from accounting.pod import EXCLUSIVE_CORE_PERCENT, DeviceDemand, device_demand
from accounting.vendor_spec import Charge, VendorSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerAsk:
    """One container's request for one vendor's devices, as the fit walks it.

    ``demand`` is the sized request; the fields after it are unpacked from it once, for the
    fit's hot loop and the vectorized fit, which read them per node.
    """

    order: int
    """Its place in the pod's fitting order over every vendor (declaration order, apps last):
    the first container in that order that fits nowhere names the node's refusal."""
    position: int
    """The container's position in declaration order."""
    is_init: bool
    """A regular init container: checked on the steady state at its point, charged nowhere."""
    demand: DeviceDemand
    """The sized request (the vendor's policy applied; zeroed but for the count where the vendor
    takes devices by slot only)."""
    count: int
    """Devices asked for (``demand.count``)."""
    memory_mib: int | None
    """Fixed MiB per device (memory factor applied); None when a share of the chosen card."""
    memory_percent: int
    """The share of the chosen card when ``memory_mib`` is None."""
    core_percent: int
    exclusive: bool
    """core_percent is 100: the card alone (refused on a 100-core card with any task on it)."""
    share_only: bool
    """core_percent is 0 on a vendor that compares compute: refused on a card whose compute is
    fully given away."""

    def memory_on_card(self, memory_total_mib: int) -> int:
        """Memory charged on one card of ``memory_total_mib``."""
        return self.demand.on_card(memory_total_mib).memory_mib


def container_ask(
    *, order: int, position: int, container: Container, spec: VendorSpec
) -> ContainerAsk | None:
    """The container's ask for the vendor of ``spec``; None when it asks for none of its
    devices."""
    demand = device_demand(container, spec.resources)
    if demand is None:
        return None
    if spec.charge is Charge.SLOTS_ONLY:
        # Devices taken by slot only (Vastai, Biren): nothing else is compared.
        demand = DeviceDemand(demand.count, 0, 0, 0)
    return ContainerAsk(
        order=order,
        position=position,
        is_init=container.container_class is ContainerClass.INIT,
        demand=demand,
        count=demand.count,
        memory_mib=demand.memory_mib,
        memory_percent=demand.memory_percent,
        core_percent=demand.core_percent,
        exclusive=demand.core_percent == EXCLUSIVE_CORE_PERCENT,
        share_only=demand.core_percent == 0 and spec.charge is not Charge.SLOTS_ONLY,
    )
