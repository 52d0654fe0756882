"""Explains a pod's GPU accounting: the per-container, per-device table and the pod's charge
over its life under three models side by side.

Layer: accounting (pure, standard library only). Every figure comes from the formulas of
accounting.pod (usage_phases, remaining_usage, effective_request); nothing here re-states them.

* With grants (hami.io/vgpu-devices-allocated), the table is per device UUID.
* Without grants, the pod is explained on its requests: each container's request becomes one
  synthetic grant on the device ``request`` (memory = count × MiB × memory factor, cores =
  count × percent, slots = count), per vendor, and the same functions run on that pod.

The three models of the charge:

* ``hami-accounting`` (this project): the effective usage, released progressively as regular
  init containers finish, then the steady state (sidecars + apps), then 0 when terminal.
* ``HAMi v2.10``: sidecar-unaware. Every entry of spec.initContainers is an init container, so
  the charge is max(Σ apps, max over all init-list entries); it shrinks to app-only once every
  init status shows exit 0, which a running sidecar prevents for the pod's whole life.
  Computed by re-classifying sidecars as init containers and running the same functions
  (accounting.counting_rules, the rule the what-if replays as ``hami-v2.10``).
* ``Kubernetes ResourceQuota``: requests.nvidia.com/gpumem is the ordering-aware effective
  request of the quantities as written (per container, not × device count, no memory factor),
  held until the pod is terminal or deleted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

# Amount is re-exported: the explanation's figures are of the accounting's one amount type.
from accounting.amount import ZERO
from accounting.amount import Amount as Amount
from accounting.counting_rules import CountingRule, counted_pod
from accounting.model import Container, ContainerClass, DeviceGrant, DeviceRequest, DeviceUsage, Pod
from accounting.pod import (
    EffectiveRequest,
    UsagePhases,
    device_demand,
    effective_request,
    grant_amounts,
    remaining_usage,
    usage_phases,
    vendors_asked,
)
from accounting.vendors import VendorResources
from accounting.vendors import find as find_vendor

REQUEST_DEVICE = "request"
"""The device of the synthetic grants a pod without an allocation is explained on."""


class Source(enum.Enum):
    """What the per-device figures are computed from."""

    GRANTS = "grants"
    """hami.io/vgpu-devices-allocated: one device UUID per row."""
    REQUESTS = "requests"
    """The containers' requests, one synthetic device ``request`` per vendor."""


class Phase(enum.Enum):
    """A stretch of the pod's life with one charge per model."""

    INIT_RUNNING = "init_running"
    """One regular init container runs (with the sidecars declared before it)."""
    APPS_RUNNING = "apps_running"
    """The regular init containers are done; sidecars and apps run."""
    TERMINAL = "terminal"
    """Succeeded or Failed: nothing is charged."""


class Model(enum.Enum):
    """Who charges."""

    HAMI_ACCOUNTING = "hami-accounting"
    HAMI_V2_10 = "HAMi v2.10"
    KUBERNETES = "Kubernetes ResourceQuota"


@dataclass(frozen=True, slots=True)
class InitPoint:
    """What one device carries while a regular init container runs."""

    own: Amount
    """The init container's own usage."""
    sidecars: Amount
    """The sidecars declared before it, running beside it."""
    sidecar_names: tuple[str, ...]
    """Those sidecars (with usage on this device)."""

    @property
    def total(self) -> Amount:
        """Everything on the device while the init container runs."""
        return self.own + self.sidecars


@dataclass(frozen=True, slots=True)
class DeviceLine:
    """One container on one device."""

    device: str
    """Device UUID, or ``request`` when explained on requests."""
    vendor: str
    """Device type (grants) or vendor keyword (requests)."""
    amount: Amount
    """The container's own usage on the device (memory factor applied on requests)."""
    slots: int
    """Sharing slots (grants) or device count (requests)."""
    init_point: InitPoint | None
    """Regular init containers only."""


@dataclass(frozen=True, slots=True)
class ContainerExplanation:
    """One container in declaration order (init list first)."""

    position: int
    name: str
    container_class: ContainerClass
    requests: tuple[DeviceRequest, ...]
    """As written (before the memory factor)."""
    devices: tuple[DeviceLine, ...]
    """Its devices; for a regular init container also every device its init point touches."""


@dataclass(frozen=True, slots=True)
class DeviceSummary:
    """The pod's steady state and effective usage on one device."""

    device: str
    vendor: str
    steady: Amount
    steady_slots: int
    effective: Amount
    effective_slots: int


@dataclass(frozen=True, slots=True)
class PhaseCharge:
    """What each model charges to the namespace during one phase (summed over devices)."""

    phase: Phase
    container: str
    """The running regular init container (INIT_RUNNING only), else ""."""
    hami_accounting: Amount
    hami_v2_10: Amount
    kubernetes: Amount

    @property
    def label(self) -> str:
        """The phase in words, e.g. "init container convert-weights running"."""
        if self.phase is Phase.INIT_RUNNING:
            return f"init container {self.container} running"
        if self.phase is Phase.APPS_RUNNING:
            return "init containers done, apps running"
        return "terminal"

    def charge(self, model: Model) -> Amount:
        """What ``model`` charges during the phase."""
        if model is Model.HAMI_ACCOUNTING:
            return self.hami_accounting
        if model is Model.HAMI_V2_10:
            return self.hami_v2_10
        return self.kubernetes


@dataclass(frozen=True, slots=True)
class Explanation:
    """Everything ``hami-accounting explain`` prints for one pod."""

    namespace: str
    name: str
    uid: str
    source: Source
    memory_factor: int
    containers: tuple[ContainerExplanation, ...]
    devices: tuple[DeviceSummary, ...]
    steady: Amount
    """Σ over devices of the steady state (sidecars + apps)."""
    effective: Amount
    """Σ over devices of the effective usage (what hami-accounting charges first)."""
    charges: tuple[PhaseCharge, ...]
    why: str
    """One sentence on why the three models differ for this pod (memory, MiB)."""
    notes: tuple[str, ...]


def explain(pod: Pod, vendors: Sequence[VendorResources]) -> Explanation:
    """Explains ``pod``: on its grants when it carries an allocation, else on its requests.

    Args:
        pod: the parsed pod (statuses are not consulted: the explanation covers its whole life).
        vendors: the policy's vendors; those the pod asks devices of are explained (the memory
            factor of each applies on requests).
    """
    vendors = vendors_asked(pod, vendors)
    # The pods the formulas run on: the pod itself, or one synthetic request pod per vendor.
    if pod.has_grants:
        views = [pod]
        source = Source.GRANTS
    else:
        views = [_request_pod(pod, vendor) for vendor in vendors]
        source = Source.REQUESTS
    phases = [usage_phases(view.containers) for view in views]
    factor = max((max(v.memory_factor, 1) for v in vendors), default=1)

    containers = tuple(
        _container(pod, position, views, phases) for position in range(len(pod.containers))
    )
    devices = tuple(summary for view_phases in phases for summary in _summaries(view_phases))
    steady = _sum(d.steady for d in devices)
    if source is Source.REQUESTS:
        effective = _sum(_request_amount(effective_request(pod, vendor)) for vendor in vendors)
    else:
        effective = _sum(d.effective for d in devices)

    charges = _charges(pod, views, vendors)
    notes = _notes(pod, source, vendors, factor)
    return Explanation(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        source=source,
        memory_factor=factor,
        containers=containers,
        devices=devices,
        steady=steady,
        effective=effective,
        charges=charges,
        why=_why(pod, views, charges, factor),
        notes=notes,
    )


# -- the pods the formulas run on --------------------------------------------------------------


def _request_grants(container: Container, vendor: VendorResources) -> tuple[DeviceGrant, ...]:
    demand = device_demand(container, vendor)
    if demand is None:
        return ()
    per_pod = demand.per_pod
    return (
        DeviceGrant(
            REQUEST_DEVICE, vendor.vendor, per_pod.memory_mib, per_pod.core_percent, per_pod.slots
        ),
    )


def _request_pod(pod: Pod, vendor: VendorResources) -> Pod:
    """The pod with one synthetic grant per container request of ``vendor``."""
    return replace(
        pod,
        containers=tuple(replace(c, grants=_request_grants(c, vendor)) for c in pod.containers),
    )


def _kubernetes_pod(pod: Pod) -> Pod:
    """The pod as the ResourceQuota evaluator sees it: each container's quantities as written,
    per container (Kubernetes does not know nvidia.com/gpumem is per device, and a default
    memory is not written)."""
    return replace(
        pod,
        containers=tuple(
            replace(
                c,
                requests=tuple(
                    replace(r, count=1, memory_mib=0 if r.memory_unscaled else r.memory_mib)
                    for r in c.requests
                    if r.count > 0
                ),
            )
            for c in pod.containers
        ),
    )


def _as_written(vendor: VendorResources) -> VendorResources:
    """The vendor's names without HAMi's sizing: no memory factor, no default memory."""
    return replace(vendor, memory_factor=1, default_memory_mib=0)


# -- the table ---------------------------------------------------------------------------------


def _charge(amount: Amount) -> Amount:
    """Memory and compute only: explain reports slots apart, as counts."""
    return Amount(amount.memory_mib, amount.core_percent)


def _amount(usage: DeviceUsage) -> Amount:
    return _charge(usage.amount)


def _request_amount(request: EffectiveRequest) -> Amount:
    return Amount(request.memory_mib, request.core_percent)


def _sum(amounts: Iterable[Amount]) -> Amount:
    return Amount.total(amounts)


def _sidecar_names(containers: Sequence[Container], position: int, uuid: str) -> tuple[str, ...]:
    return tuple(
        c.name
        for c in containers[:position]
        if c.container_class is ContainerClass.SIDECAR and any(g.uuid == uuid for g in c.grants)
    )


def _container(
    pod: Pod, position: int, views: Sequence[Pod], phases: Sequence[UsagePhases]
) -> ContainerExplanation:
    original = pod.containers[position]
    lines: list[DeviceLine] = []
    for view, view_phases in zip(views, phases, strict=True):
        container = view.containers[position]
        own = grant_amounts(container)
        kinds = {grant.uuid: grant.vendor for grant in container.grants}
        points: dict[str, DeviceUsage] = {}
        for point_position, point in view_phases.init_points:
            if point_position == position:
                points = {usage.uuid: usage for usage in point}
        for uuid in sorted(set(own) | set(points)):
            held = own.get(uuid, ZERO)
            amount = _charge(held)
            kind = kinds.get(uuid, "")
            init_point = None
            if uuid in points:
                total = _amount(points[uuid])
                kind = kind or points[uuid].vendor
                init_point = InitPoint(
                    own=amount,
                    sidecars=total - amount,
                    sidecar_names=_sidecar_names(view.containers, position, uuid),
                )
            lines.append(DeviceLine(uuid, kind, amount, held.slots, init_point))
    return ContainerExplanation(
        position=position,
        name=original.name,
        container_class=original.container_class,
        requests=original.requests,
        devices=tuple(lines),
    )


def _summaries(phases: UsagePhases) -> list[DeviceSummary]:
    steady = {u.uuid: u for u in phases.steady}
    summaries = []
    for usage in phases.effective:
        held = steady.get(usage.uuid)
        summaries.append(
            DeviceSummary(
                device=usage.uuid,
                vendor=usage.vendor,
                steady=_amount(held) if held else ZERO,
                steady_slots=held.slots if held else 0,
                effective=_amount(usage),
                effective_slots=usage.slots,
            )
        )
    return summaries


# -- the charge over the pod's life ------------------------------------------------------------


def _total(usage: Sequence[DeviceUsage]) -> Amount:
    return _sum(_amount(u) for u in usage)


def _charges(
    pod: Pod, views: Sequence[Pod], vendors: Sequence[VendorResources]
) -> tuple[PhaseCharge, ...]:
    regular = [
        (position, c.name)
        for position, c in enumerate(pod.containers)
        if c.container_class is ContainerClass.INIT
    ]
    has_sidecars = any(c.container_class is ContainerClass.SIDECAR for c in pod.containers)
    has_init_list = any(
        c.container_class in (ContainerClass.INIT, ContainerClass.SIDECAR) for c in pod.containers
    )

    steady = _sum(_total(usage_phases(v.containers).steady) for v in views)
    hami_phases = [usage_phases(counted_pod(v, CountingRule.HAMI_V2_10).containers) for v in views]
    hami_peak = _sum(_total(p.effective) for p in hami_phases)
    hami_app_only = _sum(_total(p.steady) for p in hami_phases)
    # A running sidecar keeps HAMi's gate (every init status exited 0) closed for good; a pod
    # without init containers has no statuses, and an empty list never opens the gate either.
    hami_after_init = hami_app_only if has_init_list and not has_sidecars else hami_peak
    kubernetes_pod = _kubernetes_pod(pod)
    kubernetes = _sum(
        _request_amount(effective_request(kubernetes_pod, _as_written(vendor)))
        for vendor in vendors
    )

    charges = [
        PhaseCharge(
            Phase.INIT_RUNNING,
            name,
            hami_accounting=_sum(_total(remaining_usage(v, position)) for v in views),
            hami_v2_10=hami_peak,
            kubernetes=kubernetes,
        )
        for position, name in regular
    ]
    charges.append(PhaseCharge(Phase.APPS_RUNNING, "", steady, hami_after_init, kubernetes))
    charges.append(PhaseCharge(Phase.TERMINAL, "", ZERO, ZERO, ZERO))
    return tuple(charges)


def _container_memory(container: Container) -> int:
    return sum(g.memory_mib for g in container.grants)


def _hami_expression(views: Sequence[Pod], peak: int) -> str:
    """``max(Σ apps, each init-list entry) = peak`` when that reading equals HAMi's per-device
    figure (one device), else just the figure."""
    if len(views) != 1:
        return str(peak)
    view = views[0]
    apps = sum(
        _container_memory(c) for c in view.containers if c.container_class is ContainerClass.APP
    )
    entries = [
        _container_memory(c) for c in view.containers if c.container_class is not ContainerClass.APP
    ]
    if not entries or max([apps, *entries]) != peak:
        return str(peak)
    terms = ", ".join(str(value) for value in [apps, *entries])
    return f"max({terms}) = {peak}"


def _why(pod: Pod, views: Sequence[Pod], charges: Sequence[PhaseCharge], factor: int) -> str:
    sidecars = [c.name for c in pod.containers if c.container_class is ContainerClass.SIDECAR]
    regular = [c for c in charges if c.phase is Phase.INIT_RUNNING]
    apps_phase = next(c for c in charges if c.phase is Phase.APPS_RUNNING)
    first = regular[0] if regular else apps_phase
    steady = apps_phase.hami_accounting.memory_mib
    hami_peak = first.hami_v2_10.memory_mib
    expression = _hami_expression(views, hami_peak)

    if sidecars:
        many = len(sidecars) > 1
        hami = (
            f"HAMi v2.10 counts the sidecar{'s' if many else ''} as "
            f"{'init containers' if many else 'an init container'}, so it charges {expression} "
            f"and never releases it while the sidecar{'s run' if many else ' runs'}"
        )
        if hami_peak < steady:
            hami += f", less than the {steady} its sidecars and apps use together"
    elif regular:
        hami_after = apps_phase.hami_v2_10.memory_mib
        hami = f"HAMi v2.10 charges {expression} until every init container has exited 0" + (
            f", then {hami_after}" if hami_after != hami_peak else ""
        )
    else:
        hami = f"HAMi v2.10 charges {expression} until the pod ends"

    kubernetes = first.kubernetes.memory_mib
    as_written = " (as written, before the memory factor)" if factor > 1 else ""
    k8s = f"Kubernetes charges {kubernetes}{as_written} until the pod ends"

    figures = [c.hami_accounting.memory_mib for c in regular]
    if not figures:
        ours = f"hami-accounting charges {steady} until the pod ends"
    elif len(figures) == 1 or len(set(figures)) == 1:
        running = "the init container runs" if len(figures) == 1 else "its init containers run"
        ours = f"hami-accounting charges {figures[0]} while {running} and {steady} after"
    else:
        ours = (
            f"hami-accounting charges {', '.join(str(f) for f in figures)} as its init "
            f"containers run one by one (each one's share is released when it finishes) "
            f"and {steady} after"
        )
    return f"{hami}; {k8s}; {ours}."


def _notes(
    pod: Pod, source: Source, vendors: Sequence[VendorResources], factor: int
) -> tuple[str, ...]:
    notes: list[str] = []
    if source is Source.REQUESTS:
        keys = " or ".join(
            spec.allocated_annotation
            for vendor in vendors
            if (spec := find_vendor(vendor.vendor)) is not None
        ) or "allocation"
        notes.append(
            f"no {keys} annotation: explained on the requests "
            f'(device "{REQUEST_DEVICE}" stands for every card the pod will get)'
        )
        shared = sorted(
            {c.name for c in pod.containers for r in c.requests if r.memory_sized_at_scheduling}
        )
        if shared:
            notes.append(
                f"{', '.join(shared)} ask{'s' if len(shared) == 1 else ''} memory as a share of "
                "a card: only the scheduler can size it, so the memory figures leave it out"
            )
    devices = {g.uuid for c in pod.containers for g in c.grants}
    if source is Source.GRANTS and len(devices) > 1:
        notes.append(
            f"the pod holds {len(devices)} devices: each is charged its own peak, and the "
            "pod's charge is their sum (HAMi v2.10 alike; Kubernetes knows no devices)"
        )
    if factor > 1:
        notes.append(
            f"memory factor {factor}: HAMi and hami-accounting charge the requested MiB × "
            f"{factor}; Kubernetes charges the quantity as written"
        )
    if not any(c.requests or c.grants for c in pod.containers):
        vendor_names = ", ".join(v.vendor for v in vendors)
        notes.append(f"the pod asks for no device of {vendor_names}: nothing is charged")
    return tuple(notes)
