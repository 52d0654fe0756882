"""One pod during a what-if replay: where it runs, what the ledger stores for it, what its
running containers request, and the statuses the kubelet would report as it goes.

Layer: the what-if simulator (accounting and the standard library only). A pod's life after
placement: its regular init containers run one after another, each with the sidecars declared
before it; then its sidecars and apps. ``phases_mib`` gives what the running containers request
in each of those phases, ``statuses_after`` the pod as recorded once some init containers have
exited.
"""

from __future__ import annotations

from dataclasses import replace

from accounting.amount import ZERO, Amount
from accounting.fold import phases
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    Pod,
    PodPhase,
)
from whatif.workload import ReplayPod


class ReplayedPod:
    """A pod's mutable state during one replay (private to it; its results are frozen), and
    the pod's own reserved-but-idle and running-beyond-reservation MiB·s so far."""

    __slots__ = (
        "arrival_s",
        "counted",
        "granted",
        "idle",
        "index",
        "last_s",
        "node_name",
        "peak_stored",
        "phases_mib",
        "placed_s",
        "running",
        "shape",
        "stored",
        "unreserved",
    )

    def __init__(self, index: int, replay_pod: ReplayPod, counted: Pod, shape: int) -> None:
        self.index = index
        self.arrival_s = replay_pod.arrival_s
        self.counted = counted
        """The declared pod as the rule counts it."""
        self.shape = shape
        self.granted: Pod | None = None
        self.node_name = ""
        self.placed_s: int | None = None
        self.phases_mib: tuple[int, ...] = ()
        """Memory its running containers request: one entry per regular init, then steady."""
        self.stored = 0
        self.running = 0
        self.peak_stored = 0
        self.last_s = 0
        self.idle = 0
        self.unreserved = 0

    def advance(self, now_s: int) -> None:
        """Adds the stretch since the last change, at the current figures, to idle or
        unreserved."""
        elapsed = now_s - self.last_s
        if elapsed > 0:
            gap = self.stored - self.running
            if gap > 0:
                self.idle += gap * elapsed
            else:
                self.unreserved -= gap * elapsed
        self.last_s = now_s


def phases_mib(
    declared: Pod, grants: tuple[tuple[DeviceGrant, ...], ...], vendor_name: str
) -> tuple[int, ...]:
    """Memory requested by the running containers: during each regular init container (with
    the sidecars declared before it), then once they are done (sidecars and apps). The fold
    over the declared classes, keyed by vendor: what runs at once adds up across cards."""

    def own(container: Container) -> dict[str, Amount]:
        held = [g.amount for g in container.grants if g.vendor == vendor_name]
        return {vendor_name: sum(held, ZERO)} if held else {}

    walked = phases(
        tuple(replace(c, grants=g) for c, g in zip(declared.containers, grants, strict=True)),
        own,
    )
    return (
        *(p.running.get(vendor_name, ZERO).memory_mib for p in walked.init_points),
        walked.steady.get(vendor_name, ZERO).memory_mib,
    )


def statuses_after(granted: Pod, declared: Pod, finished: int) -> Pod:
    """The granted pod once ``finished`` regular init containers have exited 0: those are
    Terminated, the next one Running, every sidecar Running (as the kubelet reports them)."""
    statuses: list[ContainerStatus] = []
    seen = 0
    for container in declared.containers:
        if container.container_class is ContainerClass.APP:
            continue
        if container.container_class is ContainerClass.SIDECAR:
            statuses.append(ContainerStatus(container.name, ContainerState.RUNNING))
            continue
        if seen < finished:
            statuses.append(ContainerStatus(container.name, ContainerState.TERMINATED))
        elif seen == finished:
            statuses.append(ContainerStatus(container.name, ContainerState.RUNNING))
        else:
            statuses.append(ContainerStatus(container.name, ContainerState.WAITING))
        seen += 1
    phase = PodPhase.RUNNING if finished >= seen else PodPhase.PENDING
    return replace(granted, phase=phase, init_container_statuses=tuple(statuses))
