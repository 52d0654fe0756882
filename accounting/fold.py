"""The one walk over a pod's containers: every phase of the ordering-aware formula.

Layer: accounting (pure). Kubernetes starts the entries of ``spec.initContainers`` one at a
time in declaration order; a regular init container runs to completion before the next starts,
a sidecar (``restartPolicy: Always``) keeps running beside everything after it, and the app
containers start once every init entry has. So, per key (a device UUID for grants, a vendor for
requests) and per dimension of ``Amount``:

    steady       = Σ sidecars + Σ apps
    init point i = own_i + Σ sidecars declared before i        (regular init container i)
    effective    = join(steady, every init point)              (a missing key counts as zero)
    remaining(p) = join(steady, every init point at position p or later)

This is KEP-753's ``PodRequests`` (Kubernetes' component-helpers), applied per key; the stored
usage, the progressive release, the admission request, the fit's merged usage, the ledger's
Reserve and ``explain`` all take their figures from ``phases``. ``phases`` only adds and joins:
what a container contributes (its grants, or its requests sized by a vendor's policy) is the
caller's ``own`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from accounting.amount import Amount
from accounting.model import Container, ContainerClass

K = TypeVar("K", bound=Hashable)

Amounts = Mapping[K, Amount]
"""Amounts per key: per device UUID, or per vendor."""


@dataclass(frozen=True, slots=True)
class InitPoint(Generic[K]):
    """What runs while one regular init container runs."""

    position: int
    """The container's position in declaration order (init list first)."""
    running: Mapping[K, Amount]
    """Its own amounts plus those of the sidecars declared before it."""


@dataclass(frozen=True, slots=True)
class Phases(Generic[K]):
    """Every phase of one pod's life, per key."""

    steady: Mapping[K, Amount]
    """Σ sidecars + Σ apps: what runs once the regular init containers are done."""
    init_points: tuple[InitPoint[K], ...]
    """One per regular init container, in declaration order."""
    effective: Mapping[K, Amount]
    """join(steady, every init point): the peak over the pod's whole life."""

    def remaining(self, first_unfinished_position: int) -> dict[K, Amount]:
        """join(steady, the init points from ``first_unfinished_position`` on): what the pod
        can still use once the regular init containers before that position have finished."""
        return join_all(
            (
                self.steady,
                *(p.running for p in self.init_points if p.position >= first_unfinished_position),
            )
        )


def add_into(total: dict[K, Amount], amounts: Mapping[K, Amount]) -> None:
    """``total += amounts``, key by key."""
    for key, amount in amounts.items():
        held = total.get(key)
        total[key] = amount if held is None else held + amount


def join_all(layers: Iterable[Mapping[K, Amount]]) -> dict[K, Amount]:
    """The per-key, per-dimension maximum of ``layers`` (a key missing from a layer is zero)."""
    joined: dict[K, Amount] = {}
    for layer in layers:
        for key, amount in layer.items():
            held = joined.get(key)
            joined[key] = amount if held is None else held.join(amount)
    return joined


def phases(
    containers: Sequence[Container], own: Callable[[Container], Mapping[K, Amount]]
) -> Phases[K]:
    """Walks ``containers`` in declaration order once and returns every phase.

    Args:
        containers: the pod's containers, init list first (app containers may come anywhere:
            they add to the steady state only, as Kubernetes starts them last).
        own: what one container contributes per key.
    """
    sidecars: dict[K, Amount] = {}
    apps: dict[K, Amount] = {}
    points: list[InitPoint[K]] = []
    for position, container in enumerate(containers):
        contributed = own(container)
        container_class = container.container_class
        if container_class is ContainerClass.SIDECAR:
            add_into(sidecars, contributed)
        elif container_class is ContainerClass.INIT:
            running = dict(sidecars)
            add_into(running, contributed)
            points.append(InitPoint(position, running))
        else:
            add_into(apps, contributed)
    steady = dict(sidecars)
    add_into(steady, apps)
    effective = join_all((steady, *(point.running for point in points)))
    return Phases(steady, tuple(points), effective)
