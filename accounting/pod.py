"""Pod-level formulas: container classes, per-device effective and steady-state usage, and the
pod's effective request per vendor.

Layer: accounting (pure). This module holds the one implementation of the ordering-aware
formula of KEP-753 (Kubernetes' component-helpers PodRequests) that HAMi applies per device
UUID since PR #2723. Per device UUID and per dimension (memory MiB, core percent, slots):

    steady     = Σ sidecars + Σ apps
    init_peak  = max over regular init containers i of (usage_i + Σ sidecars declared before i)
    effective  = max(init_peak, steady)                  (a missing entry counts as 0)

Each dimension is maximised independently, so the memory peak and the core peak may come from
different phases: the result is a conservative envelope, not the usage at any one instant.
Slots count concurrent tasks: each sidecar or app grant adds its slots, a regular init
container takes its slots on top of the sidecars declared before it, and every collapsed entry
has at least one slot (HAMi #2623).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from accounting.model import (
    NVIDIA_RESOURCES,
    Container,
    ContainerClass,
    DeviceUsage,
    Pod,
    VendorResources,
)

SIDECAR_RESTART_POLICY = "Always"


def classify_init_container(restart_policy: str | None) -> ContainerClass:
    """Classifies an entry of spec.initContainers: restartPolicy Always makes it a sidecar.

    Any other value, or none, is a regular init container (KEP-753; a missing field keeps the
    pre-sidecar behaviour exactly).
    """
    return (
        ContainerClass.SIDECAR if restart_policy == SIDECAR_RESTART_POLICY else ContainerClass.INIT
    )


@dataclass(slots=True)
class _Vector:
    """A mutable (memory, cores, slots) accumulator; private to the formulas below."""

    memory_mib: int = 0
    core_percent: int = 0
    slots: int = 0

    def plus(self, other: _Vector) -> _Vector:
        return _Vector(
            self.memory_mib + other.memory_mib,
            self.core_percent + other.core_percent,
            self.slots + other.slots,
        )

    def max_with(self, other: _Vector) -> None:
        self.memory_mib = max(self.memory_mib, other.memory_mib)
        self.core_percent = max(self.core_percent, other.core_percent)
        self.slots = max(self.slots, other.slots)


def _container_usage(container: Container) -> dict[str, _Vector]:
    """A container's own usage per UUID. Two grants on one UUID (MIG instances) add up: the
    container really holds both (HAMi takes the max there, its known gap §9.2.8)."""
    usage: dict[str, _Vector] = {}
    for grant in container.grants:
        vector = usage.setdefault(grant.uuid, _Vector())
        vector.memory_mib += grant.memory_mib
        vector.core_percent += grant.core_percent
        vector.slots += grant.slot_weight
    return usage


def _device_types(containers: Iterable[Container]) -> dict[str, str]:
    return {grant.uuid: grant.device_type for c in containers for grant in c.grants}


def _to_usage(vectors: dict[str, _Vector], device_types: dict[str, str]) -> tuple[DeviceUsage, ...]:
    return tuple(
        DeviceUsage(uuid, device_types[uuid], v.memory_mib, v.core_percent, max(v.slots, 1))
        for uuid, v in sorted(vectors.items())
    )


@dataclass(frozen=True, slots=True)
class UsagePhases:
    """The pieces of the formula for one pod, per device UUID (for explain and the lifecycle)."""

    steady: tuple[DeviceUsage, ...]
    """Σ sidecars + Σ apps: what the pod holds once its regular init containers are done."""
    init_points: tuple[tuple[int, tuple[DeviceUsage, ...]], ...]
    """(container position, usage while that regular init container runs) in declaration order:
    its own usage plus the sidecars declared before it."""
    effective: tuple[DeviceUsage, ...]
    """max(every init point, steady) per UUID and dimension."""


def usage_phases(containers: Sequence[Container]) -> UsagePhases:
    """Walks containers in declaration order once and returns every phase of the formula."""
    sidecars_so_far: dict[str, _Vector] = {}
    apps: dict[str, _Vector] = {}
    peak: dict[str, _Vector] = {}
    init_points: list[tuple[int, dict[str, _Vector]]] = []
    for position, container in enumerate(containers):
        own = _container_usage(container)
        if container.container_class is ContainerClass.SIDECAR:
            for uuid, vector in own.items():
                sidecars_so_far[uuid] = sidecars_so_far.get(uuid, _Vector()).plus(vector)
                # A sidecar running alone is also an init-phase point; it never exceeds steady.
                peak.setdefault(uuid, _Vector()).max_with(sidecars_so_far[uuid])
        elif container.container_class is ContainerClass.INIT:
            point = {uuid: vector.plus(_Vector()) for uuid, vector in sidecars_so_far.items()}
            for uuid, vector in own.items():
                point[uuid] = point.get(uuid, _Vector()).plus(vector)
                peak.setdefault(uuid, _Vector()).max_with(point[uuid])
            init_points.append((position, point))
        else:
            for uuid, vector in own.items():
                apps[uuid] = apps.get(uuid, _Vector()).plus(vector)

    steady: dict[str, _Vector] = {uuid: v.plus(_Vector()) for uuid, v in sidecars_so_far.items()}
    for uuid, vector in apps.items():
        steady[uuid] = steady.get(uuid, _Vector()).plus(vector)
    effective: dict[str, _Vector] = {uuid: v.plus(_Vector()) for uuid, v in steady.items()}
    for uuid, vector in peak.items():
        effective.setdefault(uuid, _Vector()).max_with(vector)

    types = _device_types(containers)
    return UsagePhases(
        steady=_to_usage(steady, types),
        init_points=tuple((pos, _to_usage(point, types)) for pos, point in init_points),
        effective=_to_usage(effective, types),
    )


def collapse_grants(containers: Sequence[Container]) -> tuple[DeviceUsage, ...]:
    """Effective usage per device UUID of containers with grants (HAMi's
    CollapseInitContainerUsage after #2723), sorted by UUID."""
    return usage_phases(containers).effective


def effective_usage(pod: Pod) -> tuple[DeviceUsage, ...]:
    """The pod's peak concurrent usage per device UUID over its whole life."""
    return collapse_grants(pod.containers)


def steady_state_usage(pod: Pod) -> tuple[DeviceUsage, ...]:
    """Sidecars plus app containers per device UUID: what the pod holds once its regular init
    containers have finished (HAMi's SteadyStateDeviceUsage)."""
    return usage_phases(pod.containers).steady


def remaining_usage(pod: Pod, first_unfinished_init_position: int) -> tuple[DeviceUsage, ...]:
    """Usage once the regular init containers before a position have finished: the envelope of
    the init points from that position on and the steady state (progressive release)."""
    phases = usage_phases(pod.containers)
    remaining: dict[str, DeviceUsage] = {u.uuid: u for u in phases.steady}
    for position, point in phases.init_points:
        if position < first_unfinished_init_position:
            continue
        for usage in point:
            held = remaining.get(usage.uuid)
            remaining[usage.uuid] = (
                usage
                if held is None
                else DeviceUsage(
                    usage.uuid,
                    usage.device_type,
                    max(held.memory_mib, usage.memory_mib),
                    max(held.core_percent, usage.core_percent),
                    max(held.slots, usage.slots),
                )
            )
    return tuple(remaining[uuid] for uuid in sorted(remaining))


@dataclass(frozen=True, slots=True)
class EffectiveRequest:
    """A pod's effective request for one vendor, from its containers' requests (not grants)."""

    vendor: str
    count: int
    """Effective number of devices."""
    memory_mib: int
    """Effective memory in MiB with the vendor's memory factor applied once."""
    core_percent: int
    memory_sized_at_scheduling: bool
    """Some container asks memory as a share of a card: only the scheduler can size it."""

    @property
    def is_empty(self) -> bool:
        return self.count == 0 and self.memory_mib == 0 and self.core_percent == 0


def effective_request(pod: Pod, vendor: VendorResources = NVIDIA_RESOURCES) -> EffectiveRequest:
    """The ordering-aware formula applied to requests, per dimension, for one vendor.

    A container's request contributes count, count × memory and count × cores (HAMi's
    fitResourceQuota). The memory factor is applied once, to the effective value, which equals
    HAMi's per-container multiplication because both sides are linear.
    """
    # One (count, memory, cores) triple per running total; plain integers, not lists: this
    # runs on every admission check and every Filter.
    steady_count = steady_memory = steady_cores = 0
    sidecar_count = sidecar_memory = sidecar_cores = 0  # sidecars declared so far
    peak_count = peak_memory = peak_cores = 0
    sized_at_scheduling = False
    for container in pod.containers:
        count = memory = cores = 0
        for request in container.requests:
            if request.vendor != vendor.vendor or request.count <= 0:
                continue
            count += request.count
            memory += request.count * request.memory_mib
            cores += request.count * request.core_percent
            sized_at_scheduling = sized_at_scheduling or request.memory_sized_at_scheduling
        container_class = container.container_class
        if container_class is ContainerClass.SIDECAR:
            # Started in order and running from then on: part of every later init's peak and
            # of the steady state.
            sidecar_count += count
            sidecar_memory += memory
            sidecar_cores += cores
            steady_count += count
            steady_memory += memory
            steady_cores += cores
            peak_count = max(peak_count, sidecar_count)
            peak_memory = max(peak_memory, sidecar_memory)
            peak_cores = max(peak_cores, sidecar_cores)
        elif container_class is ContainerClass.INIT:
            # Runs alone beside the sidecars declared before it.
            peak_count = max(peak_count, sidecar_count + count)
            peak_memory = max(peak_memory, sidecar_memory + memory)
            peak_cores = max(peak_cores, sidecar_cores + cores)
        else:
            steady_count += count
            steady_memory += memory
            steady_cores += cores
    count = max(peak_count, steady_count)
    memory_mib = max(peak_memory, steady_memory)
    core_percent = max(peak_cores, steady_cores)
    return EffectiveRequest(
        vendor=vendor.vendor,
        count=count,
        memory_mib=memory_mib * max(vendor.memory_factor, 1),
        core_percent=core_percent,
        memory_sized_at_scheduling=sized_at_scheduling,
    )


def usage_totals(usage: Iterable[DeviceUsage]) -> tuple[int, int, int]:
    """(memory MiB, core percent, devices) summed over per-UUID usage, as a namespace sees it."""
    memory_mib = core_percent = devices = 0
    for entry in usage:
        memory_mib += entry.memory_mib
        core_percent += entry.core_percent
        devices += 1
    return memory_mib, core_percent, devices
