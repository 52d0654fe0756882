"""Scheduler fit: on which node, and on which physical GPUs, a pod fits.

Layer: accounting (pure). Pure accounting rules; no I/O, no clock, no logging.

The passes follow docs/design.md §2.5 (HAMi's scoreNode after PR #2723, with the
#3052 quota misclassification fixed):

* **steady pass** — sidecars and app containers are fitted cumulatively on one copy of the
  node's device state, in declaration order (apps after every init container and sidecar, as
  Kubernetes starts them);
* **init pass** — each regular init container is fitted on the steady copy *as it stands at the
  point the container is declared*, so it is pre-charged with exactly the sidecars declared
  before it, and it does not charge that copy;
* **merge** — per device UUID and dimension, what the pod adds is max(steady, every init point),
  which equals accounting.pod.collapse_grants of the grants handed out;
* the node fails with the reason of the first container, in that order, that does not fit.

HAMi deep-copies the node for every init container. Here the steady pass keeps each device's
free capacity in three small integer lists local to one call, and an init container is checked
against those lists without changing them, so a node costs one pass over its containers whatever
the number of init containers. Only the picks are recorded per node; grants, the quota shape and
the merged usage are derived from them for the nodes that need them. After a steady container
only the cards it charged move in the device order (``_reposition``). bench/naive_fit.py keeps
the literal deep-copy version; a property test pins both to the same answers.

Device choice follows HAMi's NVIDIA Fit (docs/design.md §2.5).
A device is refused with the first reason that applies, in this order: CardNotHealth,
CardTypeMismatch (vendor, nvidia.com/use-gputype and nouse-gputype, nvidia.com/vgpu-mode),
CardUuidMismatch (nvidia.com/use-gpuuuid and nouse-gpuuuid), CardTimeSlicingExhausted,
ResourceQuotaNotFit (the namespace quota, checked per candidate card: ``_QuotaWalk``),
CardInsufficientMemory, CardInsufficientCore, ExclusiveDeviceAllocateConflict,
CardComputeUnitsExhausted. Not modelled: cordoned devices, numa-bind, the mutex and topology
GPU policies, hami.io/device-scoring-weights (always 1,1,1).

Every vendor of the policy is placed on its own devices (docs/design.md §2.7). The loop above is
the generic path; a vendor whose table entry names a rule of its own, or an NVIDIA node with a
card in MIG (or another) mode, is placed by ``accounting.vendor_fit`` instead
(``vendor_fit.needs_rules`` says which), its quota checked on the complete placement.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from accounting import quota as quota_rules
from accounting import vendor_fit
from accounting.amount import Amount
from accounting.annotations import GPU_POLICY_ANNOTATION, NODE_POLICY_ANNOTATION

# Re-exported: callers and tests read the device-selection keys from here.
from accounting.annotations import NOUSE_GPU_TYPE_ANNOTATION as NOUSE_GPU_TYPE_ANNOTATION
from accounting.annotations import NOUSE_GPU_UUID_ANNOTATION as NOUSE_GPU_UUID_ANNOTATION
from accounting.annotations import USE_GPU_TYPE_ANNOTATION as USE_GPU_TYPE_ANNOTATION
from accounting.annotations import USE_GPU_UUID_ANNOTATION as USE_GPU_UUID_ANNOTATION
from accounting.annotations import VGPU_MODE_ANNOTATION as VGPU_MODE_ANNOTATION
from accounting.device_filter import DeviceFilter
from accounting.errors import InvalidInputError
from accounting.model import (
    Container,
    ContainerClass,
    DeviceGrant,
    DeviceState,
    DeviceUsage,
    Pod,
    QuotaItem,
)
from accounting.pod import EXCLUSIVE_CORE_PERCENT, DeviceDemand, collapse_grants, device_demand
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_CAPACITY_REASON,
    CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_NOT_HEALTH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    NO_GPU_REQUEST,
    NO_NODE_FITS,
    NODE_INSUFFICIENT_DEVICE,
    NOT_EXPLAINED,
    RESOURCE_QUOTA_NOT_FIT,
    SCHEDULED,
    card_shortfall,
    format_reasons,
)
from accounting.vendor_spec import Charge, VendorSpec
from accounting.vendors import NVIDIA_RESOURCES, VendorResources, specs_for

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)


def device_score(
    slots_used: int,
    slots_total: int,
    cores_used: int,
    cores_total: int,
    memory_used_mib: int,
    memory_total_mib: int,
) -> float:
    """HAMi's usage score of one device or of a node's sums: 10 × (slots + cores + memory
    used fractions), 0 when any total is 0. Higher means busier.

    It is the only float in the fit and orders things; it never decides capacity. Both the
    per-device ordering and the node score use it, on usage before the request is added
    (HAMi's request term never matches on real nodes: docs/design.md §7).
    """
    if slots_total == 0 or cores_total == 0 or memory_total_mib == 0:
        return 0.0
    return 10 * (
        slots_used / slots_total + cores_used / cores_total + memory_used_mib / memory_total_mib
    )


class _NodeColumns:
    """A node's device state as flat per-field tuples, built once per NodeState.

    The fit reads integers by device position from these instead of walking frozen objects,
    and starts from precomputed free capacity, scores and device orders. Positions are those
    of NodeState.devices.
    """

    __slots__ = (
        "binpack_order",
        "cores_free",
        "cores_total",
        "cores_used",
        "device_scores",
        "devices",
        "memory_free",
        "memory_total",
        "memory_used",
        "node_score",
        "rank",
        "rules_needed",
        "slots_free",
        "slots_total",
        "slots_used",
        "spread_order",
        "unfiltered",
        "uuids",
    )

    def __init__(self, devices: tuple[DeviceState, ...]) -> None:
        self.devices = devices
        # One pass over the frozen objects: this runs for every node state the scheduler builds.
        uuids: list[str] = []
        slots_total: list[int] = []
        memory_total: list[int] = []
        cores_total: list[int] = []
        slots_used: list[int] = []
        memory_used: list[int] = []
        cores_used: list[int] = []
        scores: list[float] = []
        for state in devices:
            device = state.device
            uuids.append(device.uuid)
            slots_total.append(device.slots_total)
            memory_total.append(device.memory_total_mib)
            cores_total.append(device.core_percent_total)
            slots_used.append(state.slots_used)
            memory_used.append(state.memory_used_mib)
            cores_used.append(state.core_percent_used)
            scores.append(
                device_score(
                    state.slots_used,
                    device.slots_total,
                    state.core_percent_used,
                    device.core_percent_total,
                    state.memory_used_mib,
                    device.memory_total_mib,
                )
            )
        self.uuids = tuple(uuids)
        self.slots_total = tuple(slots_total)
        self.memory_total = tuple(memory_total)
        self.cores_total = tuple(cores_total)
        self.slots_used = tuple(slots_used)
        self.memory_used = tuple(memory_used)
        self.cores_used = tuple(cores_used)
        self.device_scores = tuple(scores)
        # The fit compares requests with what is left, so it starts from free capacity (negative
        # on an overcommitted device, which then refuses everything, as total - used would).
        self.slots_free = tuple(map(operator.sub, slots_total, slots_used))
        self.memory_free = tuple(map(operator.sub, memory_total, memory_used))
        self.cores_free = tuple(map(operator.sub, cores_total, cores_used))
        self.node_score = device_score(
            sum(slots_used),
            sum(slots_total),
            sum(cores_used),
            sum(cores_total),
            sum(memory_used),
            sum(memory_total),
        )
        # Ties between equally scored devices go to the higher index, under both policies:
        # HAMi sorts an index-ordered list stably and then walks it from the end.
        index_descending = sorted(
            range(len(devices)), key=lambda p: (devices[p].device.index, p), reverse=True
        )
        rank = [0] * len(devices)
        for position, p in enumerate(index_descending):
            rank[p] = position
        # Device position -> its place in the index tie-break (0 is tried first on a tie).
        self.rank = tuple(rank)
        self.binpack_order = tuple(_device_order(index_descending, scores, True))
        self.spread_order = tuple(_device_order(index_descending, scores, False))
        # Static refusals and the orders without refused devices, per vendor, for pods without
        # device-selection annotations; filled on first use. A benign race under threads: both
        # writers store the same value.
        self.unfiltered: dict[str, _Allowed] = {}
        # Per vendor: whether its devices here need accounting.vendor_fit (filled on first use).
        self.rules_needed: dict[str, bool] = {}


def _device_order(
    index_descending: Sequence[int], scores: Sequence[float], binpack: bool
) -> list[int]:
    """Device positions in the order the fit tries them: binpack the busiest card first,
    spread the least busy; Python's sort is stable (also with reverse), keeping index ties.

    Equivalently: ascending by (-score, rank) under binpack and (score, rank) under spread,
    rank being the place in ``index_descending`` — the total order ``_reposition`` keeps."""
    return sorted(index_descending, key=scores.__getitem__, reverse=binpack)


def _reposition(
    order: list[int], p: int, scores: Sequence[float], rank: Sequence[int], binpack: bool
) -> None:
    """Moves device ``p``, whose score just changed, to where ``_device_order`` would put it.

    Every other device of ``order`` is in place already, so p only has to slide past its
    neighbours: after a steady container a picked card is busier (forward under binpack, back
    under spread), usually by a few places, and re-sorting the whole node each time cost more
    than the fit of the container. Both directions are tried, so any change of score works.
    """
    # Binpack puts the higher score first, spread the lower: compare sign × score, then rank.
    sign = -1.0 if binpack else 1.0
    i = order.index(p)
    key = sign * scores[p]
    own_rank = rank[p]
    last = len(order) - 1
    while i > 0:  # forward while p goes before its predecessor q
        q = order[i - 1]
        other = sign * scores[q]
        if other < key or (other == key and rank[q] < own_rank):
            break
        order[i] = q
        i -= 1
    while i < last:  # back while its successor q goes before p
        q = order[i + 1]
        other = sign * scores[q]
        if other > key or (other == key and rank[q] > own_rank):
            break
        order[i] = q
        i += 1
    order[i] = p


@dataclass(frozen=True, slots=True)
class NodeState:
    """One candidate node: its devices with what is charged on them now."""

    node_name: str
    devices: tuple[DeviceState, ...]
    _columns: _NodeColumns = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple):
            object.__setattr__(self, "devices", tuple(self.devices))
        # Built once per snapshot; every pod fitted against this node reuses it.
        object.__setattr__(self, "_columns", _NodeColumns(self.devices))

    @property
    def score(self) -> float:
        """HAMi's node score on current usage (binpack prefers high, spread low)."""
        return self._columns.node_score

    def without(self, usage: Iterable[DeviceUsage]) -> NodeState:
        """The node as it would be without ``usage`` (a pod's own stored charge, which must
        not count against the pod when it is filtered again); never below nothing used."""
        released = {entry.uuid: entry for entry in usage}
        if not any(state.device.uuid in released for state in self.devices):
            return self
        devices = []
        for state in self.devices:
            entry = released.get(state.device.uuid)
            if entry is not None:
                state = DeviceState(
                    state.device,
                    max(state.memory_used_mib - entry.memory_mib, 0),
                    max(state.core_percent_used - entry.core_percent, 0),
                    max(state.slots_used - entry.slots, 0),
                )
            devices.append(state)
        return NodeState(self.node_name, tuple(devices))

    def with_added(self, usage: Iterable[DeviceUsage]) -> NodeState:
        """The node as it would be with ``usage`` charged too (a placement its copy does not
        show yet); a MIG card's instances are kept as they are."""
        added: dict[str, list[DeviceUsage]] = {}
        for entry in usage:
            added.setdefault(entry.uuid, []).append(entry)
        if not any(state.device.uuid in added for state in self.devices):
            return self
        devices = []
        for state in self.devices:
            for entry in added.get(state.device.uuid, ()):
                state = dataclasses.replace(
                    state,
                    memory_used_mib=state.memory_used_mib + entry.memory_mib,
                    core_percent_used=state.core_percent_used + entry.core_percent,
                    slots_used=state.slots_used + entry.slots,
                )
            devices.append(state)
        return NodeState(self.node_name, tuple(devices))


@dataclass(frozen=True, slots=True)
class QuotaContext:
    """The pod's namespace quota state, checked per candidate card with real card sizes."""

    items: Mapping[str, QuotaItem]
    """Keyed by resource name (nvidia.com/gpumem, nvidia.com/gpucores, nvidia.com/gpu)."""
    enforce_gpu_count: bool = True
    """The policy's: whether the device count limit is enforced where set."""

    def without(
        self, usage: Sequence[DeviceUsage], vendors: Iterable[VendorResources]
    ) -> QuotaContext:
        """The quota as it would be without ``usage`` (a pod's own stored charge, released
        when the pod is filtered again, as Reserve does); never below nothing used."""
        items = dict(self.items)
        for vendor in vendors:
            for resource, quantity in quota_rules.held_quantities(usage, vendor):
                item = items.get(resource)
                if item is not None:
                    used = max(item.used - quantity, 0)
                    items[resource] = QuotaItem(resource, used, item.limit, item.limit_set)
        return QuotaContext(items, self.enforce_gpu_count)


@dataclass(frozen=True, slots=True)
class NodeFit:
    """Whether a pod fits one node, and how."""

    node_name: str
    fits: bool
    reason: str
    """"" when the pod fits; else the first container (in fitting order) that does not fit,
    per device as HAMi words it ("1/4 AllocatedCardsInsufficientRequest, 3/4
    ResourceQuotaNotFit"), or NodeInsufficientDevice."""
    score: float
    """The node score before the pod is added (HAMi's ComputeDefaultScore)."""
    grants: tuple[tuple[DeviceGrant, ...], ...]
    """One tuple per container position, in declaration order; () for a GPU-less container or
    when the pod does not fit."""
    usage: tuple[DeviceUsage, ...]
    """Merged per-UUID usage this pod adds (max of steady and every init point), sorted by
    UUID; () when the pod does not fit."""


@dataclass(frozen=True, slots=True)
class FitResult:
    """The scheduler's answer for one pod over candidate nodes."""

    node_name: str | None
    """The chosen node; None when no node fits or the pod asks for no device."""
    grants: tuple[tuple[DeviceGrant, ...], ...]
    """The chosen node's grants, one tuple per container position (all () without a node)."""
    failed_nodes: Mapping[str, str]
    """Node name -> reason for every node that does not fit, sorted by node name."""
    scores: Mapping[str, float]
    """Node name -> node score, for every node that fits."""
    reason: str
    """Scheduled, NoGpuRequest or NoNodeFits."""
    message: str


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


def _blocks(
    devices: tuple[DeviceState, ...], vendor_name: str, device_filter: DeviceFilter | None
) -> tuple[str | None, ...]:
    """The static refusal of each device for one pod (None: may be tried)."""
    blocks: list[str | None] = []
    for state in devices:
        device = state.device
        if not device.healthy:
            blocks.append(CARD_NOT_HEALTH)
        elif device.vendor != vendor_name or (
            device_filter is not None
            and device_filter.type_refused(device.model, device.mode)
        ):
            blocks.append(CARD_TYPE_MISMATCH)
        elif device_filter is not None and device_filter.uuid_refused(device.uuid):
            blocks.append(CARD_UUID_MISMATCH)
        else:
            blocks.append(None)
    return tuple(blocks)


_Allowed = tuple[tuple[str | None, ...], tuple[int, ...], tuple[int, ...], int]
"""(static refusal per device, binpack order, spread order, the vendor's device count) for one
pod's vendor and filter; the orders leave out the refused devices, so the fit's device loop
never meets them."""


def _allowed(
    columns: _NodeColumns, vendor_name: str, device_filter: DeviceFilter | None
) -> _Allowed:
    blocks = _blocks(columns.devices, vendor_name, device_filter)
    return (
        blocks,
        tuple(p for p in columns.binpack_order if blocks[p] is None),
        tuple(p for p in columns.spread_order if blocks[p] is None),
        sum(1 for d in columns.devices if d.device.vendor == vendor_name),
    )


def _resolve_policy(annotation: str | None, default: str) -> str:
    """The pod's annotation wins when it names a known policy (first entry of a HAMi chain such
    as "binpack,numa"); anything else falls back to the configured policy."""
    if annotation is not None:
        chosen = annotation.split(",", 1)[0].strip().lower()
        if chosen in POLICIES:
            return chosen
    return default


def _checked_policy(name: str, value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in POLICIES:
        raise InvalidInputError.single(name, f"must be one of {', '.join(POLICIES)}, got {value!r}")
    return lowered


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
class _VendorPlan:
    """One vendor's part of a pod's plan: its asks, filter, quota room and rules."""

    spec: VendorSpec
    vendor: VendorResources
    vendor_name: str
    """vendor.vendor, read once per node."""
    asks: tuple[_Ask, ...]
    """The containers asking for the vendor's devices, in fitting order (declaration order,
    apps last)."""
    device_filter: DeviceFilter | None
    quota_room: quota_rules.QuotaRoom | None
    """What the namespace quota leaves the pod of this vendor (``quota.usage_room``); None when
    no limit could refuse anything (no quota context, or no enforced limit set)."""
    rule_asks: tuple[vendor_fit.RuleAsk, ...]
    """The same asks as ``accounting.vendor_fit`` reads them."""


@dataclass(frozen=True, slots=True)
class _PodPlan:
    """Everything about the pod that does not depend on the node, computed once per pod."""

    pod: Pod
    vendor_plans: tuple[_VendorPlan, ...]
    """One per vendor the pod asks for, in policy order."""
    gpu_binpack: bool
    explain_refusals: bool = True
    """False: a container that fits no card, with no quota in play, refuses the node as
    NOT_EXPLAINED instead of with the per-card count (a caller that only wants the first node
    that fits)."""

    @property
    def asks(self) -> tuple[_Ask, ...]:
        """Every vendor's asks."""
        return tuple(ask for plan in self.vendor_plans for ask in plan.asks)

    @classmethod
    def build(
        cls,
        pod: Pod,
        vendors: Sequence[VendorResources],
        gpu_policy: str,
        quota: QuotaContext | None,
        explain_refusals: bool = True,
    ) -> _PodPlan:
        gpu_policy = _resolve_policy(
            pod.annotations.get(GPU_POLICY_ANNOTATION), _checked_policy("gpu_policy", gpu_policy)
        )
        # Kubernetes starts app containers only after every init container and sidecar, so
        # they are fitted last even in a pod that lists them earlier: an init container is
        # pre-charged with the sidecars before it and nothing else.
        fitting_order = sorted(
            range(len(pod.containers)),
            key=lambda p: pod.containers[p].container_class is ContainerClass.APP,
        )
        plans: list[_VendorPlan] = []
        for spec in specs_for(vendors):
            asks = tuple(
                ask._replace(order=order)
                for order, position in enumerate(fitting_order)
                if (ask := _build_ask(position, pod.containers[position], spec)) is not None
            )
            if not asks:
                continue
            room = None
            if quota is not None:
                room = quota_rules.usage_room(
                    quota.items, spec.resources, enforce_gpu_count=quota.enforce_gpu_count
                )
            plans.append(
                _VendorPlan(
                    spec=spec,
                    vendor=spec.resources,
                    vendor_name=spec.vendor,
                    asks=asks,
                    device_filter=DeviceFilter.from_annotations(pod.annotations, spec.selection),
                    quota_room=room,
                    rule_asks=tuple(
                        vendor_fit.RuleAsk(ask.order, ask.position, ask.is_init, ask.demand)
                        for ask in asks
                    ),
                )
            )
        return cls(
            pod=pod,
            vendor_plans=tuple(plans),
            gpu_binpack=gpu_policy == BINPACK,
            explain_refusals=explain_refusals,
        )


class _QuotaWalk:
    """The namespace quota checked per candidate card, as HAMi's ``fitQuota`` does: a card is
    refused (``ResourceQuotaNotFit``, after its slots and before its memory are compared) when
    the pod's placement so far, plus the cards this container already took, plus this card
    would take the namespace over its quota; the walk then goes on to the next card.

    "The placement so far" is folded as the pod is stored (docs/design.md §2.2: per card,
    max(steady, every init point)), so the last check of a placement is Reserve's own check.
    Rather than re-fold the placement for every card, this keeps the pod's own steady and
    init-peak memory and cores per device of one node, and the folded totals, and prices a
    card by what it adds to them. bench/naive_fit.py re-folds literally (``collapse_grants``
    and ``quota.check_usage`` per card); a property test pins the two together.
    """

    __slots__ = (
        "cores",
        "devices",
        "held",
        "init_cores",
        "init_memory",
        "memory",
        "room",
        "steady_cores",
        "steady_memory",
    )

    def __init__(self, room: quota_rules.QuotaRoom, device_count: int) -> None:
        self.room = room
        self.steady_memory = [0] * device_count
        self.steady_cores = [0] * device_count
        self.init_memory = [0] * device_count
        """Per device: the highest init point so far (its own share plus the steady share at
        its point)."""
        self.init_cores = [0] * device_count
        self.held = [False] * device_count
        """Per device: the pod takes something there (every grant holds a slot)."""
        self.memory = 0
        self.cores = 0
        self.devices = 0
        """The folded totals of the pod's placement on this node so far."""

    def added(self, p: int, memory_mib: int, core_percent: int) -> tuple[int, int, int]:
        """What one more grant on device ``p`` adds to the folded totals. It is the same for
        a steady and an init container: max(steady + x, init peak) - max(steady, init peak)
        per dimension (an init point on p is the steady share at its point plus its own), and
        one device when the pod held nothing on p."""
        steady_memory, init_memory = self.steady_memory[p], self.init_memory[p]
        steady_cores, init_cores = self.steady_cores[p], self.init_cores[p]
        return (
            max(steady_memory + memory_mib, init_memory) - max(steady_memory, init_memory),
            max(steady_cores + core_percent, init_cores) - max(steady_cores, init_cores),
            0 if self.held[p] else 1,
        )

    def fits(self, taken: Sequence[int], added: Sequence[int]) -> bool:
        """Whether the placement so far, the container's ``taken`` cards (their ``added``
        summed) and one more card adding ``added`` stay within the room."""
        return self.room.allows(
            self.memory + taken[0] + added[0],
            self.cores + taken[1] + added[1],
            self.devices + taken[2] + added[2],
        )

    def commit(self, is_init: bool, p: int, memory_mib: int, core_percent: int) -> None:
        """Adds one grant of a container that fits: on ``p``, ``memory_mib`` and
        ``core_percent``."""
        memory, cores, devices = self.added(p, memory_mib, core_percent)
        self.memory += memory
        self.cores += cores
        self.devices += devices
        self.held[p] = True
        if is_init:
            self.init_memory[p] = max(self.init_memory[p], self.steady_memory[p] + memory_mib)
            self.init_cores[p] = max(self.init_cores[p], self.steady_cores[p] + core_percent)
        else:
            self.steady_memory[p] += memory_mib
            self.steady_cores[p] += core_percent


def _always_within(
    plan: _VendorPlan, room: quota_rules.QuotaRoom, memory_total: Sequence[int]
) -> bool:
    """Whether every placement of the pod on a node with these cards stays within the quota:
    its folded usage is at most every grant added up, each on the node's largest card. Then
    no card needs pricing (most pods, under a quota they are far from)."""
    largest = max(memory_total, default=0)
    memory = cores = devices = 0
    for ask in plan.asks:
        need = ask.memory_mib if ask.memory_mib >= 0 else largest * ask.memory_percent // 100
        memory += ask.device_count * need
        cores += ask.device_count * ask.core_percent
        devices += ask.device_count
    return room.allows(memory, cores, min(devices, len(memory_total)))


def _capacity_refusal(ask: _Ask, used: Amount, capacity: Amount) -> str | None:
    """The first capacity rule that refuses a card for one container's request, or None."""
    short = card_shortfall(ask.demand.on_card(capacity.memory_mib), capacity - used)
    if short is not None:
        return CARD_CAPACITY_REASON[short]
    cores = ask.core_percent
    if (
        cores == EXCLUSIVE_CORE_PERCENT
        and capacity.core_percent == EXCLUSIVE_CORE_PERCENT
        and used.slots
    ):
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if cores == 0 and capacity.core_percent != 0 and used.core_percent == capacity.core_percent:
        # A share-only task would land on a card whose compute is fully given away.
        return CARD_COMPUTE_UNITS_EXHAUSTED
    return None


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


def _place(plan: _PodPlan, columns: _NodeColumns) -> _NodePlacement | str:
    """Fits every container of the pod on one node, vendor by vendor (their devices are
    apart). Returns the placement, or the reason the node is refused: that of the first
    container, in fitting order, that fits nowhere (HAMi's; within a container, the first
    vendor in policy order)."""
    if len(plan.vendor_plans) == 1:
        # The usual pod asks one vendor: no first failure to choose between vendors.
        only = plan.vendor_plans[0]
        needs = columns.rules_needed.get(only.vendor_name)
        if needs is None:
            needs = columns.rules_needed[only.vendor_name] = vendor_fit.needs_rules(
                only.spec, columns.devices
            )
        if not needs:
            generic = _place_vendor(plan, only, columns)
            return generic[1] if isinstance(generic, tuple) else [_Placed(only, generic, None)]
    placed: _NodePlacement = []
    failure: tuple[int, str] | None = None
    for vendor_plan in plan.vendor_plans:
        spec = vendor_plan.spec
        needs = columns.rules_needed.get(spec.vendor)
        if needs is None:
            needs = columns.rules_needed[spec.vendor] = vendor_fit.needs_rules(
                spec, columns.devices
            )
        outcome: tuple[int, str] | None = None
        if needs:
            ruled = _place_by_rules(plan, vendor_plan, columns)
            if isinstance(ruled, vendor_fit.RuleFailure):
                outcome = (ruled.order, ruled.reason)
            else:
                placed.append(_Placed(vendor_plan, None, ruled))
        else:
            generic = _place_vendor(plan, vendor_plan, columns)
            if isinstance(generic, tuple):
                outcome = generic
            else:
                placed.append(_Placed(vendor_plan, generic, None))
        if outcome is not None and (failure is None or outcome[0] < failure[0]):
            failure = outcome
    if failure is not None:
        return failure[1]
    return placed


def _place_by_rules(
    plan: _PodPlan, vendor_plan: _VendorPlan, columns: _NodeColumns
) -> list[tuple[vendor_fit.Pick, ...]] | vendor_fit.RuleFailure:
    """accounting.vendor_fit's placement of one vendor, its quota checked on the complete
    placement (``ResourceQuotaNotFit`` against all of the vendor's devices on the node)."""
    context = vendor_fit.RuleContext(
        vendor_plan.spec,
        plan.pod.annotations,
        vendor_plan.device_filter,
        columns.rank,
        plan.gpu_binpack,
        device_score,
    )
    ruled = vendor_fit.place(context, vendor_plan.rule_asks, columns.devices)
    room = vendor_plan.quota_room
    if isinstance(ruled, vendor_fit.RuleFailure) or room is None:
        return ruled
    grants: list[tuple[DeviceGrant, ...]] = [()] * len(plan.pod.containers)
    for ask, picks in zip(vendor_plan.asks, ruled, strict=True):
        grants[ask.position] = tuple(grant for _, grant in picks)
    usage = placement_usage(plan.pod, tuple(grants))
    if room.allows(*quota_rules.vendor_totals(usage, vendor_plan.vendor)):
        return ruled
    devices = sum(1 for s in columns.devices if s.device.vendor == vendor_plan.vendor_name)
    return vendor_fit.RuleFailure(
        vendor_plan.asks[0].order, format_reasons({RESOURCE_QUOTA_NOT_FIT: devices}, devices)
    )


def _place_vendor(
    plan: _PodPlan, vendor_plan: _VendorPlan, columns: _NodeColumns
) -> _Placement | tuple[int, str]:
    """Fits every container of the pod on one node: the hot path of the scheduler. Returns the
    placement, or the reason the node is refused.

    The device loop is the one place the accounting keeps a hand-inlined copy of its rules,
    because it runs for every device of every candidate node: the capacity test is
    _capacity_refusal (Amount arithmetic) on three integer lists of free capacity, and a
    card's share of memory is DeviceDemand.on_card written out (a call per device visited
    costs as much as the rest of the loop). When a quota limit is set, every card that has a
    slot left is priced against it first (``_QuotaWalk``). ``_walk_reasons`` names the reason
    once a container fails; tests/accounting/test_fit_properties.py pins the loop to
    bench/naive_fit.py, the literal deep-copy reading, written apart on purpose, and the
    merged usage to the fold. An init container is checked against the steady copy and
    charges nothing, so its point never needs recording here: placement_usage folds the grants
    when the usage is asked for. Returns the placement, or (the failing ask's order, the
    reason).
    """
    vendor_name = vendor_plan.vendor_name
    if vendor_plan.device_filter is None:
        allowed = columns.unfiltered.get(vendor_name)
        if allowed is None:
            allowed = columns.unfiltered[vendor_name] = _allowed(columns, vendor_name, None)
    else:
        allowed = _allowed(columns, vendor_name, vendor_plan.device_filter)
    binpack = plan.gpu_binpack
    order: Sequence[int] = allowed[1] if binpack else allowed[2]
    vendor_devices = allowed[3]
    slots_total = columns.slots_total
    memory_total = columns.memory_total
    cores_total = columns.cores_total
    # The steady copy: three small lists, the only per-node mutable state.
    slots_free = list(columns.slots_free)
    memory_free = list(columns.memory_free)
    cores_free = list(columns.cores_free)
    quota = None
    room = vendor_plan.quota_room
    if room is not None and not _always_within(vendor_plan, room, memory_total):
        quota = _QuotaWalk(room, len(slots_free))
    # Devices the last steady container charged: their score changed, so their place in the
    # order is fixed up (lazily, only if another container follows).
    moved: list[int] | None = None
    reordered: list[int] | None = None
    scores: list[float] = []
    placement: _Placement = []

    for ask in vendor_plan.asks:
        _, is_init, count, memory_fixed, memory_percent, cores, exclusive, share_only, _, _ = ask
        if count > vendor_devices:
            return ask.order, NODE_INSUFFICIENT_DEVICE
        if moved is not None:
            if reordered is None:
                order = reordered = list(order)
                scores = list(columns.device_scores)
            for p in moved:
                total = slots_total[p]
                scores[p] = device_score(
                    total - slots_free[p],
                    total,
                    cores_total[p] - cores_free[p],
                    cores_total[p],
                    memory_total[p] - memory_free[p],
                    memory_total[p],
                )
                _reposition(reordered, p, scores, columns.rank, binpack)
            moved = None
        picks: list[int] = []
        remaining = count
        taken = [0, 0, 0]  # what this container's picks add to the quota's folded totals
        for p in order:
            if slots_free[p] <= 0:
                continue
            need = memory_fixed if memory_fixed >= 0 else memory_total[p] * memory_percent // 100
            if quota is not None:
                added = quota.added(p, need, cores)
                if not quota.fits(taken, added):
                    continue
            if memory_free[p] < need:
                continue
            if cores_free[p] < cores:
                continue
            if (
                exclusive
                and cores_total[p] == EXCLUSIVE_CORE_PERCENT
                and slots_free[p] != slots_total[p]
            ):
                continue
            if share_only and cores_free[p] == 0 and cores_total[p] != 0:
                continue
            if quota is not None:
                taken[0] += added[0]
                taken[1] += added[1]
                taken[2] += added[2]
            picks.append(p)
            remaining -= 1
            if not remaining:
                break
        else:
            if quota is None and not plan.explain_refusals:
                return ask.order, NOT_EXPLAINED
            return ask.order, _walk_reasons(
                ask,
                allowed[0],
                order,
                columns,
                (slots_free, memory_free, cores_free),
                quota,
                vendor_name,
                vendor_devices,
            )
        if quota is not None:
            for p in picks:
                quota.commit(is_init, p, _memory_need(ask, memory_total[p]), cores)
        if not is_init:
            for p in picks:
                slots_free[p] -= 1
                memory_free[p] -= (
                    memory_fixed if memory_fixed >= 0 else memory_total[p] * memory_percent // 100
                )
                cores_free[p] -= cores
            moved = picks
        placement.append(picks)
    return placement


def _walk_reasons(
    ask: _Ask,
    blocks: Sequence[str | None],
    order: Sequence[int],
    columns: _NodeColumns,
    free: tuple[Sequence[int], Sequence[int], Sequence[int]],
    quota: _QuotaWalk | None,
    vendor_name: str,
    vendor_devices: int,
) -> str:
    """Why one container fits nowhere on the node, as HAMi words it: every device of the
    vendor counted under the first reason that stopped it, and the cards that passed (picked
    before the walk ran out) as AllocatedCardsInsufficientRequest. Other vendors' devices are
    not the vendor's to count (HAMi hands a vendor only its own).

    Only called on failure, when HAMi's walk has visited every device. A device refused for
    its health, type or UUID is refused whatever came before it; the others are walked again
    in the order the fit tried them, because whether the quota refuses a card depends on the
    cards picked before it.
    """
    counts: dict[str, int] = {}
    devices = columns.devices
    for p, block in enumerate(blocks):
        if block is not None and devices[p].device.vendor == vendor_name:
            counts[block] = counts.get(block, 0) + 1
    slots_free, memory_free, cores_free = free
    capacities = [state.device.capacity for state in columns.devices]
    taken = [0, 0, 0]
    picked = 0
    for p in order:
        capacity = capacities[p]
        used = capacity - Amount(memory_free[p], cores_free[p], slots_free[p])
        reason: str | None = None
        if slots_free[p] <= 0:
            reason = CARD_TIME_SLICING_EXHAUSTED
        elif quota is not None:
            added = quota.added(p, _memory_need(ask, capacity.memory_mib), ask.core_percent)
            if not quota.fits(taken, added):
                reason = RESOURCE_QUOTA_NOT_FIT
        if reason is None:
            reason = _capacity_refusal(ask, used, capacity)
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
            continue
        picked += 1
        if quota is not None:
            taken = [t + a for t, a in zip(taken, added, strict=True)]
    if picked:
        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = picked
    return format_reasons(counts, vendor_devices)


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
                DeviceGrant(uuids[p], vendor, _memory_need(ask, memory_total[p]), ask.core_percent)
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


def _fit_node(plan: _PodPlan, node: NodeState) -> NodeFit:
    columns = node._columns
    no_grants: tuple[tuple[DeviceGrant, ...], ...] = ((),) * len(plan.pod.containers)
    placement = _place(plan, columns)
    if isinstance(placement, str):
        return NodeFit(node.node_name, False, placement, columns.node_score, no_grants, ())
    grants = _grants(plan, columns, placement)
    return NodeFit(
        node.node_name,
        True,
        "",
        columns.node_score,
        grants,
        placement_usage(plan.pod, grants),
    )


def _vendor_list(
    vendor: VendorResources, vendors: Sequence[VendorResources]
) -> Sequence[VendorResources]:
    return vendors or (vendor,)


def fit_node(
    pod: Pod,
    node: NodeState,
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> NodeFit:
    """Fits a pod on one node: its grants per container and the usage it would add there.

    Args:
        pod: containers in declaration order with their class and requests.
        node: the node's devices with their current usage.
        vendor: whose requests to fit when ``vendors`` is empty (NVIDIA's by default).
        vendors: the policy's vendors: every one the pod asks for is placed, on its own
            devices, with the rules of its vendor table entry.
        gpu_policy: binpack (busiest card first) or spread (least busy first); the pod's
            hami.io/gpu-scheduler-policy annotation wins when it names one of them.
        quota: the pod's namespace quota, checked per candidate card when given.

    Raises:
        InvalidInputError: gpu_policy is neither binpack nor spread, or a vendor is not in the
            vendor table.
    """
    return _fit_node(
        _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota), node
    )


def fit_nodes(
    pod: Pod,
    nodes: Iterable[NodeState],
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
    explain_refusals: bool = True,
) -> Iterator[NodeFit]:
    """``fit_node`` for each node in turn, lazily, with the pod's plan built once.

    A caller that walks the nodes in ``node_order_key`` order and stops at the first fit gets
    fit_pod's choice without fitting the nodes after it (what-if replays do this). Such a
    caller may pass ``explain_refusals=False``: a node where a container fits no card, and no
    quota could have refused one, is then refused as NOT_EXPLAINED instead of with the
    per-card count, which costs more than the fit itself; every other answer is fit_node's
    (a quota refusal is always named).

    Raises:
        InvalidInputError: gpu_policy is neither binpack nor spread (before the first node).
    """
    plan = _PodPlan.build(
        pod, _vendor_list(vendor, vendors), gpu_policy, quota, explain_refusals
    )
    return (_fit_node(plan, node) for node in nodes)


def node_policy_for(pod: Pod, node_policy: str = BINPACK) -> str:
    """The node policy fit_pod applies to the pod: its hami.io/node-scheduler-policy
    annotation when it names one, else ``node_policy``.

    Raises:
        InvalidInputError: node_policy is neither binpack nor spread.
    """
    return _resolve_policy(
        pod.annotations.get(NODE_POLICY_ANNOTATION), _checked_policy("node_policy", node_policy)
    )


def node_order_key(score: float, node_name: str, node_policy: str) -> tuple[float, str]:
    """fit_pod's preference among nodes that fit, as a sort key (smallest is chosen): binpack
    the highest node score (NodeState.score), spread the lowest, equal scores the smaller node
    name."""
    return (-score if node_policy == BINPACK else score, node_name)


def fit_pod(
    pod: Pod,
    nodes: Sequence[NodeState],
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    node_policy: str = BINPACK,
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> FitResult:
    """Chooses a node and its devices for a pod (HAMi's Filter, without side effects).

    Every node is tried. Among those that fit, binpack takes the highest node score (the
    busiest node) and spread the lowest; equal scores go to the smaller node name, so the
    answer does not depend on the order of ``nodes``. The pod's hami.io/node-scheduler-policy
    and hami.io/gpu-scheduler-policy annotations win over the arguments.

    Raises:
        InvalidInputError: a policy argument is neither binpack nor spread.
    """
    node_policy = node_policy_for(pod, node_policy)
    plan = _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota)
    if not plan.vendor_plans:
        return no_device_asked(pod, _devices_of(_vendor_list(vendor, vendors)))
    failed: dict[str, str] = {}
    scores: dict[str, float] = {}
    # Minimising (sign × score, name): binpack maximises the score, spread minimises it.
    sign = -1.0 if node_policy == BINPACK else 1.0
    best_key = 0.0
    best_name = ""
    best_node: NodeState | None = None
    best_placement: _NodePlacement | None = None
    for node in nodes:
        columns = node._columns
        placement = _place(plan, columns)
        name = node.node_name
        if isinstance(placement, str):
            failed[name] = placement
            continue
        score = scores[name] = columns.node_score
        key = sign * score
        if best_node is None or key < best_key or (key == best_key and name < best_name):
            best_key, best_name, best_node, best_placement = key, name, node, placement

    if best_node is None or best_placement is None:
        return _answer(pod, node_policy, len(nodes), None, failed, scores)
    columns = best_node._columns
    chosen = (best_node.node_name, _grants(plan, columns, best_placement), columns.node_score)
    return _answer(pod, node_policy, len(nodes), chosen, failed, scores)


def _answer(
    pod: Pod,
    node_policy: str,
    node_count: int,
    chosen: tuple[str, tuple[tuple[DeviceGrant, ...], ...], float] | None,
    failed: Mapping[str, str],
    scores: Mapping[str, float],
) -> FitResult:
    """The one place fit_pod's answer is written: ``chosen`` is (node, grants, score). A
    ``scores`` mapping that is not a dict is taken as it is (read-only, as a fast path's)."""
    # Sorted by name, like the choice itself, so the answer is the same for any node order.
    failed = dict(sorted(failed.items()))
    if isinstance(scores, dict):
        scores = MappingProxyType(dict(scores))
    if chosen is None:
        details = "; ".join(f"{name}: {reason}" for name, reason in failed.items())
        return FitResult(
            None,
            ((),) * len(pod.containers),
            MappingProxyType(failed),
            scores,
            NO_NODE_FITS,
            f"0/{node_count} nodes fit" + (f": {details}" if details else ""),
        )
    name, grants, score = chosen
    return FitResult(
        name,
        grants,
        MappingProxyType(failed),
        scores,
        SCHEDULED,
        f"{len(scores)}/{node_count} nodes fit; {node_policy} chose {name} (score {score:.2f})",
    )


# -- the plan, for fast paths ------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class FitPlan:
    """Everything ``fit_pod`` decides about a pod that asks for one vendor's devices, before
    it looks at a node, for a fast path (services/scheduler/fit_kernel.py) that must give
    exactly ``fit_pod``'s answer: the asks in fitting order, the policies, the quota room, the
    device-selection annotations, and which nodes need the vendor's own rules."""

    _plan: _PodPlan = field(repr=False)
    _vendor_plan: _VendorPlan = field(repr=False)
    node_policy: str
    """binpack or spread, the pod's annotation applied."""
    asks: tuple[ContainerAsk, ...]
    """In fitting order (declaration order, app containers last)."""

    @property
    def vendor_name(self) -> str:
        """Whose devices the pod is fitted on."""
        return self._vendor_plan.vendor_name

    @property
    def gpu_binpack(self) -> bool:
        """Devices are tried busiest first (else least busy first)."""
        return self._plan.gpu_binpack

    @property
    def quota_room(self) -> quota_rules.QuotaRoom | None:
        """What the namespace quota leaves the pod; None when no limit could refuse."""
        return self._vendor_plan.quota_room

    @property
    def selects_devices(self) -> bool:
        """The pod names devices by type, mode or UUID (``type_refused``, ``uuid_refused``)."""
        return self._vendor_plan.device_filter is not None

    def type_refused(self, model: str, mode: str) -> bool:
        """Whether the pod's type and mode annotations refuse a device (CardTypeMismatch)."""
        chosen = self._vendor_plan.device_filter
        return chosen is not None and chosen.type_refused(model, mode)

    def uuid_refused(self, uuid: str) -> bool:
        """Whether the pod's UUID annotations refuse a device (CardUuidMismatch)."""
        chosen = self._vendor_plan.device_filter
        return chosen is not None and chosen.uuid_refused(uuid)

    @property
    def uuids_allowed_only(self) -> bool:
        """The pod lists the only UUIDs it may use: every device it does not list is refused."""
        chosen = self._vendor_plan.device_filter
        return chosen is not None and bool(chosen.use_uuids)

    @property
    def listed_uuids(self) -> frozenset[str]:
        """Every UUID the pod's annotations name (to use, or not to use)."""
        chosen = self._vendor_plan.device_filter
        if chosen is None:
            return frozenset()
        return frozenset().union(*chosen.use_uuids, chosen.nouse_uuids)

    def always_within_quota(self, memory_total: Sequence[int]) -> bool:
        """Whether no card of a node with these cards could be refused by the quota (then
        the fit prices no card on it)."""
        room = self._vendor_plan.quota_room
        return room is None or _always_within(self._vendor_plan, room, memory_total)

    def needs_rules(self, devices: Sequence[DeviceState]) -> bool:
        """Whether a node with these devices is fitted by the vendor's own rules
        (``accounting.vendor_fit``: MIG-mode cards, templates, topology...) rather than by
        the generic memory, cores and slots walk. It reads only each device's vendor and
        mode."""
        return vendor_fit.needs_rules(self._vendor_plan.spec, devices)


def fit_plan(
    pod: Pod,
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    node_policy: str = BINPACK,
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> FitPlan | None:
    """The plan ``fit_pod`` makes for the pod with these arguments; None when the pod asks
    for no device, or for more than one vendor's (only ``fit_pod`` answers it then).

    Raises:
        InvalidInputError: a policy argument is neither binpack nor spread.
    """
    chosen_node_policy = node_policy_for(pod, node_policy)
    plan = _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota)
    if len(plan.vendor_plans) != 1:
        return None
    (only,) = plan.vendor_plans
    return FitPlan(
        plan,
        only,
        chosen_node_policy,
        tuple(
            ContainerAsk(
                ask.position,
                ask.is_init,
                ask.device_count,
                None if ask.memory_mib < 0 else ask.memory_mib,
                ask.memory_percent,
                ask.core_percent,
                ask.exclusive,
                ask.share_only,
            )
            for ask in only.asks
        ),
    )


def fit_node_of_plan(plan: FitPlan, node: NodeState) -> NodeFit:
    """``fit_node`` for a pod whose plan is already made."""
    return _fit_node(plan._plan, node)


def fitted_answer(
    plan: FitPlan,
    node_count: int,
    chosen: NodeFit | None,
    failed: Mapping[str, str],
    scores: Mapping[str, float],
) -> FitResult:
    """``fit_pod``'s answer from its parts: the node chosen (its fit), every failed node's
    reason and every fitting node's score, over ``node_count`` candidates."""
    pod = plan._plan.pod
    if chosen is None:
        return _answer(pod, plan.node_policy, node_count, None, failed, scores)
    picked = (chosen.node_name, chosen.grants, chosen.score)
    return _answer(pod, plan.node_policy, node_count, picked, failed, scores)


def no_device_asked(pod: Pod, what: str = "device") -> FitResult:
    """The answer for a pod that asks for no ``what``: no node chosen, and any node fits."""
    return FitResult(
        None,
        ((),) * len(pod.containers),
        MappingProxyType({}),
        MappingProxyType({}),
        NO_GPU_REQUEST,
        f"pod {pod.key} asks for no {what}: any node fits",
    )


def pod_requests_devices(
    pod: Pod,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
) -> bool:
    """True when any container asks for at least one device of the vendor (of any of
    ``vendors`` when given)."""
    names = {v.vendor for v in _vendor_list(vendor, vendors)}
    return any(
        request.vendor in names and request.count > 0
        for container in pod.containers
        for request in container.requests
    )


def _devices_of(vendors: Sequence[VendorResources]) -> str:
    if len(vendors) == 1:
        return f"{vendors[0].vendor} device"
    return "device of " + ", ".join(v.vendor for v in vendors)
