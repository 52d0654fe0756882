"""Pod-level formulas: container classes, how a request is sized, per-device effective and
steady-state usage, and the pod's effective request per vendor.

Layer: accounting (pure). Every figure here is ``accounting.fold.phases`` over one view of the
pod's containers:

* on grants, keyed by device UUID: what a container holds on each card (two grants on one UUID
  add up: the container really holds both; HAMi takes the max there). The stored usage, the
  progressive release and the fit's merged usage are this view;
* on requests, keyed by vendor: each container's request sized by the vendor's policy
  (``device_demand``), one slot per device asked for. The admission check is this view.

Each dimension is maximised independently, so the memory peak and the core peak may come from
different phases: the result is a conservative envelope, not the usage at any one instant.
Slots count concurrent tasks: each sidecar or app grant adds its slots, a regular init
container takes its slots on top of the sidecars declared before it, and every collapsed entry
has at least one slot (HAMi #2623).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from accounting.amount import ZERO, Amount
from accounting.fold import Phases, phases
from accounting.model import (
    Container,
    ContainerClass,
    DeviceRequest,
    DeviceUsage,
    MigInstance,
    Pod,
)
from accounting.vendors import VendorResources

SIDECAR_RESTART_POLICY = "Always"
"""The restartPolicy that makes an entry of spec.initContainers a sidecar."""
WHOLE_CARD_PERCENT = 100
"""A share of 100 percent is the whole card."""
MAX_CORE_PERCENT = 100
"""Compute of one device; a larger request is read as this (HAMi clamps it)."""
EXCLUSIVE_CORE_PERCENT = MAX_CORE_PERCENT
"""Every core of a card: a request for them asks for the card alone (HAMi's exclusive use; its
webhook also writes them for a bare count or a whole card by percentage)."""


def classify_init_container(restart_policy: str | None) -> ContainerClass:
    """Classifies an entry of spec.initContainers: restartPolicy Always makes it a sidecar.

    Any other value, or none, is a regular init container (KEP-753; a missing field keeps the
    pre-sidecar behaviour exactly, and a value the API server would have refused is read as
    the run-to-completion default, as in HAMi #2723).
    """
    return (
        ContainerClass.SIDECAR if restart_policy == SIDECAR_RESTART_POLICY else ContainerClass.INIT
    )


# -- requests: how much of each device ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceDemand:
    """What one container asks of each device it gets, for one vendor, with the vendor's policy
    applied (HAMi's ContainerDeviceRequest after GenerateResourceRequests)."""

    count: int
    """Devices asked for; each is one slot on a distinct card."""
    memory_mib: int | None
    """Fixed memory per device, MiB, memory factor applied; None when the memory is a share of
    the chosen card."""
    memory_percent: int
    """The share of the chosen card, 1..100, when ``memory_mib`` is None."""
    core_percent: int
    """Compute per device, percent, at most 100."""
    slices: int = 0
    """A partition asked by its size in slices (Enflame DRS); 0 otherwise."""

    @property
    def sized_at_scheduling(self) -> bool:
        """True when the memory is a share of a card, known only once a card is chosen."""
        return self.memory_mib is None

    def on_card(self, memory_total_mib: int) -> Amount:
        """What one of the devices takes on a card of ``memory_total_mib``: its memory (a share
        is HAMi's integer Totalmem × percentage / 100), its cores and one slot."""
        memory_mib = self.memory_mib
        if memory_mib is None:
            memory_mib = memory_total_mib * self.memory_percent // 100
        return Amount(memory_mib, self.core_percent, 1)

    @property
    def per_pod(self) -> Amount:
        """Every device together, as a namespace quota counts it: count × memory (0 for a share,
        which admission cannot size), count × cores, one slot per device."""
        count = self.count
        return Amount(count * (self.memory_mib or 0), count * self.core_percent, count)


def size_request(request: DeviceRequest, vendor: VendorResources) -> DeviceDemand:
    """Sizes one request with the vendor's policy, the one rule for every reader of requests.

    Memory written in MiB is multiplied by the memory factor; memory given as a percentage is
    a share of the card; with neither, the vendor's default memory (HAMi does not multiply a
    default by the factor) or, without a default, the whole card.
    """
    factor = max(vendor.memory_factor, 1)
    memory_mib: int | None = None
    memory_percent = 0
    if request.memory_mib > 0:
        memory_mib = request.memory_mib * (1 if request.memory_unscaled else factor)
    elif request.memory_percent > 0:
        memory_percent = min(request.memory_percent, WHOLE_CARD_PERCENT)
    elif vendor.default_memory_mib > 0:
        memory_mib = vendor.default_memory_mib
    else:
        memory_percent = WHOLE_CARD_PERCENT
    return DeviceDemand(
        request.count,
        memory_mib,
        memory_percent,
        min(request.core_percent, MAX_CORE_PERCENT),
        request.slices,
    )


def device_demand(container: Container, vendor: VendorResources) -> DeviceDemand | None:
    """The container's sized request for ``vendor``, or None when it asks for none of its
    devices (only one request per vendor is valid; the first with a count is the one)."""
    for request in container.requests:
        if request.vendor == vendor.vendor and request.count > 0:
            return size_request(request, vendor)
    return None


# -- grants: per device UUID -------------------------------------------------------------------


def grant_amounts(container: Container) -> dict[str, Amount]:
    """A container's own usage per device UUID. Two grants on one UUID (MIG instances) add up:
    the container really holds both (HAMi takes the max there)."""
    amounts: dict[str, Amount] = {}
    for grant in container.grants:
        held = amounts.get(grant.uuid, ZERO)
        amounts[grant.uuid] = held + grant.amount
    return amounts


def grant_phases(containers: Sequence[Container]) -> Phases[str]:
    """Every phase of the formula on the containers' grants, per device UUID."""
    return phases(containers, grant_amounts)


@dataclass(frozen=True, slots=True)
class _Labels:
    """What a pod's usage entries carry besides amounts: each UUID's vendor, and the MIG
    instances the pod holds there."""

    vendors: Mapping[str, str]
    instances: Mapping[str, tuple[MigInstance, ...]]


def _vendors(containers: Iterable[Container]) -> _Labels:
    vendors: dict[str, str] = {}
    instances: dict[str, set[MigInstance]] = {}
    for container in containers:
        for grant in container.grants:
            vendors[grant.uuid] = grant.vendor
            if grant.mig is not None:
                instances.setdefault(grant.uuid, set()).add(grant.mig)
    return _Labels(vendors, {uuid: tuple(sorted(held)) for uuid, held in instances.items()})


def _to_usage(amounts: Mapping[str, Amount], labels: _Labels) -> tuple[DeviceUsage, ...]:
    """Usage entries sorted by UUID. Every collapsed entry holds at least one slot (HAMi
    #2623). A MIG instance stays held for the pod's whole life, as HAMi's device plugin keeps
    it while the pod exists: a card where only a finished init container had one keeps an
    entry holding the instance, with nothing else charged but its slot."""
    vendors, instances = labels.vendors, labels.instances
    if instances:
        amounts = {**{uuid: ZERO for uuid in instances}, **amounts}
    return tuple(
        DeviceUsage(
            uuid,
            vendors[uuid],
            a.memory_mib,
            a.core_percent,
            max(a.slots, 1),
            instances.get(uuid, ()),
        )
        for uuid, a in sorted(amounts.items())
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
    """``grant_phases`` as stored usage, sorted by UUID."""
    walked = grant_phases(containers)
    vendors = _vendors(containers)
    return UsagePhases(
        steady=_to_usage(walked.steady, vendors),
        init_points=tuple((p.position, _to_usage(p.running, vendors)) for p in walked.init_points),
        effective=_to_usage(walked.effective, vendors),
    )


def collapse_grants(containers: Sequence[Container]) -> tuple[DeviceUsage, ...]:
    """Effective usage per device UUID of containers with grants (HAMi's
    CollapseInitContainerUsage after #2723), sorted by UUID."""
    return _to_usage(grant_phases(containers).effective, _vendors(containers))


def effective_usage(pod: Pod) -> tuple[DeviceUsage, ...]:
    """The pod's peak concurrent usage per device UUID over its whole life."""
    return collapse_grants(pod.containers)


def steady_state_usage(pod: Pod) -> tuple[DeviceUsage, ...]:
    """Sidecars plus app containers per device UUID: what the pod holds once its regular init
    containers have finished (HAMi's SteadyStateDeviceUsage)."""
    return _to_usage(grant_phases(pod.containers).steady, _vendors(pod.containers))


def remaining_usage(pod: Pod, first_unfinished_init_position: int) -> tuple[DeviceUsage, ...]:
    """Usage once the regular init containers before a position have finished: the envelope of
    the init points from that position on and the steady state (progressive release)."""
    walked = grant_phases(pod.containers)
    return _to_usage(
        walked.remaining(first_unfinished_init_position), _vendors(pod.containers)
    )


def usage_totals(usage: Iterable[DeviceUsage], vendor: str | None = None) -> tuple[int, int, int]:
    """(memory MiB, core percent, devices) summed over per-UUID usage (of one ``vendor`` when
    given), as a namespace sees it: a device counts once however many slots the pod holds on
    it. Plain integers: journal recovery sums this for every stored pod."""
    memory_mib = core_percent = devices = 0
    for entry in usage:
        if vendor is None or entry.vendor == vendor:
            memory_mib += entry.memory_mib
            core_percent += entry.core_percent
            devices += 1
    return memory_mib, core_percent, devices


# -- requests: per vendor ----------------------------------------------------------------------


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
        """True when the pod asks for nothing of the vendor."""
        return self.count == 0 and self.memory_mib == 0 and self.core_percent == 0


def vendors_asked(pod: Pod, vendors: Sequence[VendorResources]) -> tuple[VendorResources, ...]:
    """The vendors (in ``vendors``' order) some container of the pod asks devices of; the
    first vendor alone when it asks for none (its answer is then "no device")."""
    asked = {r.vendor for c in pod.containers for r in c.requests if r.count > 0}
    chosen = tuple(v for v in vendors if v.vendor in asked)
    return chosen or tuple(vendors[:1])


def effective_request(pod: Pod, vendor: VendorResources) -> EffectiveRequest:
    """The ordering-aware formula applied to requests, per dimension, for one vendor.

    A container's request contributes count, count × memory and count × cores (HAMi's
    fitResourceQuota), each request sized by ``size_request``: the memory factor is applied
    per container, which equals applying it once to the effective value (both are linear),
    and a default memory is not multiplied, as in HAMi.
    """
    sized_at_scheduling = False

    def own(container: Container) -> dict[str, Amount]:
        nonlocal sized_at_scheduling
        demand = device_demand(container, vendor)
        if demand is None:
            return {}
        sized_at_scheduling = sized_at_scheduling or demand.sized_at_scheduling
        return {vendor.vendor: demand.per_pod}

    total = phases(pod.containers, own).effective.get(vendor.vendor, ZERO)
    return EffectiveRequest(
        vendor=vendor.vendor,
        count=total.slots,
        memory_mib=total.memory_mib,
        core_percent=total.core_percent,
        memory_sized_at_scheduling=sized_at_scheduling,
    )
