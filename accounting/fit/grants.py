"""A pod's placement on one node (the device positions picked per ask, or the vendor rules'
picks) and what it grants: the grants per container position and the usage they add.

Layer: accounting (pure).
"""

from __future__ import annotations

from typing import NamedTuple

from accounting import vendor_fit
from accounting.fit.node_state import _NodeColumns
from accounting.fit.plan import _PodPlan, _VendorPlan
from accounting.model import Container, DeviceGrant, DeviceUsage, Pod
from accounting.pod import collapse_grants

_Placement = list[list[int]]
"""The raw outcome of fitting a pod on one node: the device positions picked per ask, in the
order chosen. Everything else (memory per pick, init peaks) follows from the plan and the node
and is derived only for the placements that are used."""


class _Placed(NamedTuple):
    """One vendor's part of a pod's placement on a node."""

    plan: _VendorPlan
    positions: _Placement | None
    """The generic loop's picks (device positions per ask), or None."""
    picks: list[tuple[vendor_fit.Pick, ...]] | None
    """accounting.vendor_fit's picks (position and grant per device, per ask), or None."""


_NodePlacement = list[_Placed]


def _grants(
    plan: _PodPlan, columns: _NodeColumns, placement: _NodePlacement
) -> tuple[tuple[DeviceGrant, ...], ...]:
    """Raw grants per container position, vendors in policy order; a GPU-less container keeps
    its empty position."""
    per_position: list[tuple[DeviceGrant, ...]] = [()] * len(plan.pod.containers)
    uuids = columns.uuids
    memory_total = columns.memory_total
    for placed in placement:
        vendor_plan = placed.plan
        if placed.picks is not None:
            for ask, ruled in zip(vendor_plan.asks, placed.picks, strict=True):
                per_position[ask.position] += tuple(grant for _, grant in ruled)
            continue
        assert placed.positions is not None
        vendor = vendor_plan.vendor_name
        for ask, picks in zip(vendor_plan.asks, placed.positions, strict=True):
            per_position[ask.position] += tuple(
                DeviceGrant(uuids[p], vendor, ask.memory_on_card(memory_total[p]), ask.core_percent)
                for p in picks
            )
    return tuple(per_position)


def placement_usage(
    pod: Pod, grants: tuple[tuple[DeviceGrant, ...], ...]
) -> tuple[DeviceUsage, ...]:
    """What the pod adds per device with these grants: the fold over the containers with them
    (max of steady and every init point), sorted by UUID."""
    return collapse_grants(
        [
            Container(container.name, container.container_class, (), container_grants)
            for container, container_grants in zip(pod.containers, grants, strict=True)
        ]
    )
