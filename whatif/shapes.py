"""Waiting pods grouped by shape: what the fit depends on besides the nodes, so that pods of
one shape fit the same nodes.

Layer: the what-if simulator (accounting and the standard library only). A shape is the
namespace, the containers' classes and requests, and the annotations the fit reads (hami.io and
nvidia.com). Once one pod of a shape has failed in a round, the others wait for the next
release; ``ShapeQueue`` keeps them, oldest first, with what a node must have free to be tried
for the shape at all and the change number after which the shape last failed everywhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from accounting.model import Pod
from accounting.pod import device_demand
from accounting.vendors import VendorResources

_FIT_ANNOTATION_PREFIXES = ("hami.io/", "nvidia.com/")
"""Annotations the fit may read; a waiting pod's shape includes them."""


@dataclass(slots=True)
class ShapeQueue:
    """Waiting pods of one shape, oldest first, and when the shape last failed everywhere."""

    waiting: deque[int]
    node_policy: str
    asks: tuple[tuple[int, int, int], ...]
    """Necessary for a node to be tried at all, per container: (devices, memory MiB, cores)
    that many of its devices with a free slot must each have free; a node without it would
    refuse the shape (the fit checks the same, on no more than the node has free)."""
    need: tuple[int, int, int]
    """The coarse form of ``asks``: tested first, on three numbers per node."""
    fine: bool
    """``need`` alone does not imply ``asks`` (several devices, or several containers)."""
    quota_bound: bool
    """Its namespace has a quota: the quota steers which cards the fit takes (and may refuse
    them), so a change of the namespace's usage makes every node worth trying again."""
    failed_seq: int = -1
    """Every node unchanged since this change number refuses the shape (-1: never tried)."""

    @classmethod
    def for_pod(
        cls, pod: Pod, vendor: VendorResources, node_policy: str, quota_bound: bool
    ) -> ShapeQueue:
        """An empty queue for the pod's shape."""
        asks = _asks(pod, vendor)
        return cls(
            waiting=deque(),
            node_policy=node_policy,
            asks=asks,
            need=_need(asks),
            fine=len(asks) > 1 or any(count > 1 for count, _, _ in asks),
            quota_bound=quota_bound,
        )


def shape_of(pod: Pod) -> object:
    """What the fit depends on besides the nodes: pods of one shape fit the same nodes."""
    return (
        pod.namespace,
        tuple((c.container_class, c.requests) for c in pod.containers),
        tuple(
            sorted(
                (key, value)
                for key, value in pod.annotations.items()
                if key.startswith(_FIT_ANNOTATION_PREFIXES)
            )
        ),
    )


def _asks(pod: Pod, vendor: VendorResources) -> tuple[tuple[int, int, int], ...]:
    """(devices, memory MiB, cores) each container asks per device, sized by the one sizing
    rule (accounting.pod.device_demand); a share of a card counts as 0 MiB here."""
    asks = []
    for container in pod.containers:
        demand = device_demand(container, vendor)
        if demand is not None:
            asks.append((demand.count, demand.memory_mib or 0, demand.core_percent))
    return tuple(asks)


def _need(asks: tuple[tuple[int, int, int], ...]) -> tuple[int, int, int]:
    """The coarse test: as many devices with a free slot as the largest count asked, and one
    of them with the most memory, one with the most cores, any container asks per device."""
    return (
        max((count for count, _, _ in asks), default=0),
        max((memory for _, memory, _ in asks), default=0),
        max((cores for _, _, cores in asks), default=0),
    )
