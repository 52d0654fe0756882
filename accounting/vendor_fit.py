"""HAMi's per-device fit, written out for the devices the generic path does not cover.

Layer: accounting (pure). ``accounting.fit`` places most pods with its generic loop (memory,
cores, slots). A vendor whose entry in the vendor table names a rule, or an NVIDIA node with a
card in a mode other than hami-core or mps (MIG), is placed here instead, by a readable copy of
HAMi's ``Fit`` walk (``pkg/device/<vendor>/device.go``) with each vendor's own steps:

* the walk visits the vendor's devices in the fit's order and counts, per device visited, the
  first reason that stops it: ``CardNotHealth``, ``CardTypeMismatch`` (another model or sharing
  mode by the pod's annotations; ``CardModeUnsupported`` for a mode we do not model),
  ``CardUuidMismatch``, ``ExclusiveDeviceAllocateConflict`` (a used device where the vendor takes
  devices whole), ``CardTimeSlicingExhausted``, ``CardInsufficientMemory``,
  ``CardInsufficientCore``, ``ExclusiveDeviceAllocateConflict`` (every core asked of a used
  card), ``CardComputeUnitsExhausted``, then the vendor's own: ``CardMigTopologyInfeasible``,
  ``CardNotFoundCustomFilterRule``; too few devices passing is
  ``AllocatedCardsInsufficientRequest`` (counting those that did);
* **MIG** (NVIDIA, a card in ``mig`` mode): the request is fitted to an instance of the card's
  profiles (``accounting.mig.choose_instance``) and charged the instance; a container asking
  for several devices may get several instances of one card (HAMi visits a MIG card again);
* **whole devices** (Metax GPU, Enflame GCU, Kunlun, Vastai, Biren) and **one device per pod**
  (Metax GPU, Moore Threads); **compute units** (AMD: percent asked, CUs charged);
* **Ascend**: the hami-core gate (``ModeNotFit`` once for the node), NetworkID groups and 910C
  modules of two NPUs;
* vendors whose HAMi rule is not modelled here refuse the node with
  ``VendorRuleNotModelled``, naming the rule, instead of being fitted by a rule that is not
  theirs.

The passes are the fit's (``accounting.fit``): steady containers charge the node copy in order,
each regular init container is checked against it as it stands at its point and charges
nothing; a container's own grants are charged once its walk is done, as HAMi's do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from accounting import hami_codec, kunlun, mig, numbers
from accounting.container_ask import ContainerAsk
from accounting.device_filter import DeviceFilter
from accounting.model import DeviceGrant, DeviceState, MigPlacement
from accounting.pod import DeviceDemand
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_MIG_TOPOLOGY_INFEASIBLE,
    CARD_MODE_UNSUPPORTED,
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE,
    CARD_NOT_HEALTH,
    CARD_QOS_POLICY_MISMATCH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UNHEALTHY,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    MODE_NOT_FIT,
    NODE_INSUFFICIENT_DEVICE,
    NUMA_NOT_FIT,
    VENDOR_RULE_NOT_MODELLED,
    format_reasons,
)
from accounting.vendor_data import (
    ASCEND_SOFT_SPLIT_INFO,
    ASCEND_TOPOLOGY_PREFIX,
    AWS_INSTANCE_TYPE_INFO,
    DRS_PROFILE_NAME,
    DRS_PROFILES_INFO,
    METAX_APP_CLASS,
    METAX_DEFAULT_QOS,
    METAX_QOS_POLICY,
    NETWORK_ID_INFO,
    NEURON_BOTH_CORES,
    NEURON_CORES_PER_DEVICE,
    NPUS_PER_MODULE,
    VASTAI_STRATEGY_INFO,
)
from accounting.vendor_spec import Charge, VendorSpec

NVIDIA_MODES = ("hami-core", "mps", mig.MIG_MODE)
"""The NVIDIA sharing modes the accounting models: mps has no scheduling rule of its own in
HAMi and is charged like hami-core; a card in any other mode is refused."""
WHOLE_CARD_CORES = 100

_NOT_MODELLED: dict[str, str] = {}
"""Rules named in the vendor table that this module does not implement yet: rule -> what HAMi
does there. Their nodes are refused with ``VendorRuleNotModelled``."""


Pick = tuple[int, DeviceGrant]
"""A device's position on the node and what the container is granted there."""


@dataclass(frozen=True, slots=True)
class RuleFailure:
    """Why the node refuses the pod: the first ask (in fitting order) that does not fit."""

    order: int
    reason: str


@dataclass(slots=True)
class _Card:
    """One of the vendor's devices while the pod is fitted: capacity and what is charged."""

    position: int
    state: DeviceState
    slots_used: int
    memory_used: int
    cores_used: int
    mig_in_use: list[MigPlacement] = field(default_factory=list)

    @classmethod
    def of(cls, position: int, state: DeviceState) -> _Card:
        return cls(
            position,
            state,
            state.slots_used,
            state.memory_used_mib,
            state.core_percent_used,
            list(state.mig_in_use),
        )

    def copy(self) -> _Card:
        return _Card(
            self.position,
            self.state,
            self.slots_used,
            self.memory_used,
            self.cores_used,
            list(self.mig_in_use),
        )

    @property
    def uuid(self) -> str:
        return self.state.device.uuid

    @property
    def is_mig(self) -> bool:
        return self.state.device.mode == mig.MIG_MODE

    def charge(self, grant: DeviceGrant) -> None:
        self.slots_used += grant.slot_weight
        self.memory_used += grant.memory_mib
        self.cores_used += grant.core_percent
        if grant.mig is not None:
            self.mig_in_use.append(grant.mig.placement)


Score = Callable[[int, int, int, int, int, int], float]
"""The fit's device score: (slots used, slots, cores used, cores, memory used, memory)."""


@dataclass(frozen=True, slots=True)
class RuleContext:
    """Everything about the pod and the node the walk reads besides the asks."""

    spec: VendorSpec
    annotations: Mapping[str, str]
    device_filter: DeviceFilter | None
    rank: Sequence[int]
    """The fit's tie-break between equally scored devices (0 is tried first)."""
    binpack: bool
    score: Score
    drs_profiles: tuple[DrsProfile, ...] | None = None
    """Enflame DRS: the node's profiles, smallest first (None: the node has none)."""
    drs_choice: DrsProfile | None = None
    """Enflame DRS: the profile of the ask being walked."""


@dataclass(frozen=True, slots=True)
class DrsProfile:
    """An Enflame DRS profile: ``<slices>g.<GB>gb``, its id, and the compute share HAMi gives
    it (slices over the GCU's largest profile, rounded up)."""

    name: str
    profile_id: str
    slices: int
    memory_gb: int
    core_percent: int


def needs_rules(spec: VendorSpec, devices: Sequence[DeviceState]) -> bool:
    """Whether the vendor's devices on this node need this module rather than the generic
    loop: the vendor names a rule or takes devices differently, or (NVIDIA) a card is in a
    mode other than hami-core or mps."""
    if spec.rule == "nvidia":
        return any(
            s.device.vendor == spec.vendor and s.device.mode not in ("hami-core", "mps")
            for s in devices
        )
    return bool(
        spec.rule
        or spec.one_device_per_pod
        or spec.used_device_refused
        or not spec.checks_capacity
        or spec.charge is not Charge.REQUEST
    )


def place(
    context: RuleContext, asks: Sequence[ContainerAsk], devices: Sequence[DeviceState]
) -> list[tuple[Pick, ...]] | RuleFailure:
    """Places one vendor's asks on one node: the picks per ask (in ``asks`` order), or why
    the node refuses the pod."""
    spec = context.spec
    cards = [_Card.of(p, s) for p, s in enumerate(devices) if s.device.vendor == spec.vendor]
    if spec.rule == "enflame-drs":
        context = _with_drs_profiles(context, cards)
    refusal = _node_refusal(context, cards)
    if refusal is not None:
        return RuleFailure(asks[0].order if asks else 0, refusal)
    placement: list[tuple[Pick, ...]] = []
    earlier: dict[bool, list[str]] = {True: [], False: []}
    for ask in asks:
        if ask.demand.count > len(cards) and not _mig_waiver(context, cards):
            return RuleFailure(ask.order, NODE_INSUFFICIENT_DEVICE)
        ordered = _ordered(context, cards)
        if spec.rule == "enflame-drs":
            choice = drs_profile(context.drs_profiles or (), ask.demand)
            if choice is None:
                return RuleFailure(ask.order, format_reasons({MODE_NOT_FIT: 1}, len(cards)))
            walked = _walk(
                replace(context, drs_choice=choice), ask, ordered, earlier[ask.is_init],
                len(cards),
            )
        elif spec.rule in ("kunlun", "kunlun-vxpu"):
            walked = _topology(context, ask, ordered, len(cards))
        elif spec.rule == "metax-sgpu":
            walked = _metax_candidates(context, ask, ordered, len(cards))
        elif spec.rule == "aws-neuron" and ask.demand.count > 1:
            walked = _neuron_devices(context, ask, cards)
        else:
            walked = _walk(context, ask, ordered, earlier[ask.is_init], len(cards))
        if isinstance(walked, str):
            return RuleFailure(ask.order, walked)
        if not ask.is_init:
            by_position = {card.position: card for card in cards}
            for position, grant in walked:
                by_position[position].charge(grant)
        earlier[ask.is_init].extend(grant.uuid for _, grant in walked)
        placement.append(walked)
    return placement


def _node_refusal(context: RuleContext, cards: Sequence[_Card]) -> str | None:
    """A refusal of the whole node before any device is visited (counted once)."""
    spec = context.spec
    total = len(cards)
    if not cards:
        return None
    if spec.rule in _NOT_MODELLED:
        return (
            f"{total}/{total} {VENDOR_RULE_NOT_MODELLED} "
            f"({spec.title}: {_NOT_MODELLED[spec.rule]})"
        )
    if spec.rule == "vastai" and any(
        card.state.device.info(VASTAI_STRATEGY_INFO) == "die" for card in cards
    ):
        return (
            f"{total}/{total} {VENDOR_RULE_NOT_MODELLED} "
            f"({spec.title}: die mode, devices grouped by physical card)"
        )
    if spec.rule == "enflame-drs" and context.drs_profiles is None:
        return format_reasons({MODE_NOT_FIT: 1}, total)
    if spec.rule == "metax-sgpu" and METAX_APP_CLASS in context.annotations:
        return (
            f"{total}/{total} {VENDOR_RULE_NOT_MODELLED} ({spec.title}: app classes "
            f"({METAX_APP_CLASS}) need the classes of the pods on each sGPU)"
        )
    if spec.soft_split(context.annotations) and not all(
        card.state.device.info(ASCEND_SOFT_SPLIT_INFO) == "true" for card in cards
    ):
        # HAMi: a pod asking for hami-core on a node without it fails once for the node.
        return format_reasons({MODE_NOT_FIT: 1}, total)
    return None


def _mig_waiver(context: RuleContext, cards: Sequence[_Card]) -> bool:
    """HAMi's ``isMIGRequest``: with a MIG card on the node, a container may ask for more
    devices than the node has cards (several instances of one card), unless the pod's
    ``nvidia.com/vgpu-mode`` leaves MIG out."""
    if context.spec.rule != "nvidia" or not any(card.is_mig for card in cards):
        return False
    mode_key = context.spec.selection.mode
    wanted = context.annotations.get(mode_key) if mode_key else None
    return wanted is None or mig.MIG_MODE in wanted


def _ordered(context: RuleContext, cards: Sequence[_Card]) -> list[_Card]:
    """The cards in the order the walk tries them: the fit's device order on current usage
    (binpack the busiest first, spread the least busy), ties by the fit's rank."""
    score = context.score
    sign = -1.0 if context.binpack else 1.0

    def key(card: _Card) -> tuple[float, int]:
        device = card.state.device
        value = score(
            card.slots_used,
            device.slots_total,
            card.cores_used,
            device.core_percent_total,
            card.memory_used,
            device.memory_total_mib,
        )
        return sign * value, context.rank[card.position]

    return sorted(cards, key=key)


def _collects_all(context: RuleContext, ask: ContainerAsk, cards: Sequence[_Card]) -> bool:
    """Ascend: with NetworkIDs on every device, or a 910C request for more than one NPU,
    HAMi collects every device that passes and then chooses among them."""
    spec = context.spec
    if spec.rule != "ascend":
        return False
    if spec.count_multiple > 1 and ask.demand.count > 1:
        return True
    return spec.vendor.startswith(ASCEND_TOPOLOGY_PREFIX) and all(
        card.state.device.info(NETWORK_ID_INFO) is not None for card in cards
    )


def _walk(
    context: RuleContext,
    ask: ContainerAsk,
    ordered: Sequence[_Card],
    earlier_uuids: Sequence[str],
    devices_total: int,
) -> tuple[Pick, ...] | str:
    """One container's walk over the cards: its picks, or the reason it fits nowhere."""
    reasons: dict[str, int] = {}
    picks: list[Pick] = []
    remaining = ask.demand.count
    collect_all = _collects_all(context, ask, ordered)
    # Instances already chosen for this container, per card (HAMi's toAllocate on a revisit).
    chosen: dict[int, list[MigPlacement]] = {}
    index = 0
    while index < len(ordered):
        card = ordered[index]
        refusal, grant = _try(context, ask, card, chosen.get(card.position, []), earlier_uuids)
        if refusal is not None:
            reasons[refusal] = reasons.get(refusal, 0) + 1
            index += 1
            continue
        assert grant is not None
        picks.append((card.position, grant))
        if grant.mig is not None:
            chosen.setdefault(card.position, []).append(grant.mig.placement)
        if not collect_all:
            remaining -= 1
            if remaining == 0:
                return tuple(picks)
        if not card.is_mig:
            index += 1
        # A MIG card is visited again for the container's next device.
    if collect_all:
        chosen_picks = _choose_ascend(context, ask, ordered, picks)
        if chosen_picks is not None:
            return chosen_picks
        if context.spec.count_multiple > 1 and ask.demand.count > 1:
            modules = _full_modules(ordered, picks, ask.demand.count)
            return format_reasons(
                {ALLOCATED_CARDS_INSUFFICIENT_REQUEST: len(modules)}, ask.demand.count
            )
    if picks:
        reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picks)
    return format_reasons(reasons, devices_total)


def _try(
    context: RuleContext,
    ask: ContainerAsk,
    card: _Card,
    chosen_here: Sequence[MigPlacement],
    earlier_uuids: Sequence[str],
) -> tuple[str | None, DeviceGrant | None]:
    """The first reason the card refuses the container, or the grant it would get."""
    spec = context.spec
    device = card.state.device
    demand = ask.demand
    if not device.healthy:
        return CARD_NOT_HEALTH, None
    if spec.rule == "nvidia" and device.mode not in NVIDIA_MODES:
        return CARD_MODE_UNSUPPORTED, None
    device_filter = context.device_filter
    if device_filter is not None and device_filter.type_refused(device.model, device.mode):
        return CARD_TYPE_MISMATCH, None
    if device_filter is not None and device_filter.uuid_refused(device.uuid):
        return CARD_UUID_MISMATCH, None
    if spec.used_device_refused and card.slots_used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None
    if device.slots_total <= card.slots_used:
        return CARD_TIME_SLICING_EXHAUSTED, None
    if spec.charge is Charge.CORE_MASK:
        return _neuron_cores(spec, card, demand.core_percent)
    if spec.rule == "enflame-drs":
        return _drs_device(context, card)
    memory_mib = demand.on_card(device.memory_total_mib).memory_mib
    cores = demand.core_percent
    if spec.charge is Charge.COMPUTE_UNITS:
        refusal, cores = _compute_units(card, memory_mib, cores)
        if refusal is not None:
            return refusal, None
    elif spec.checks_capacity:
        refusal = _capacity_refusal(context, card, memory_mib, cores)
        if refusal is not None:
            return refusal, None
    if card.is_mig:
        occupied = [*card.mig_in_use, *chosen_here]
        choice = mig.choose_instance(device.mig_profiles, occupied, memory_mib)
        if choice is None:
            return CARD_MIG_TOPOLOGY_INFEASIBLE, None
        return None, DeviceGrant(
            device.uuid, spec.vendor, choice.memory_mib, choice.core_percent, mig=choice.instance
        )
    if spec.one_device_per_pod and any(uuid != device.uuid for uuid in earlier_uuids):
        return CARD_NOT_FOUND_CUSTOM_FILTER_RULE, None
    return None, _grant(spec, card, memory_mib, cores)


def _capacity_refusal(context: RuleContext, card: _Card, memory_mib: int, cores: int) -> str | None:
    """HAMi's memory and compute checks, in its order."""
    device = card.state.device
    if device.memory_total_mib - card.memory_used < memory_mib:
        return CARD_INSUFFICIENT_MEMORY
    # Ascend's hami-core mode compares cores with 100 whatever the NPU registers.
    total = (
        WHOLE_CARD_CORES
        if context.spec.soft_split(context.annotations)
        else device.core_percent_total
    )
    if total - card.cores_used < cores:
        return CARD_INSUFFICIENT_CORE
    if total == WHOLE_CARD_CORES and cores == WHOLE_CARD_CORES and card.slots_used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if total != 0 and card.cores_used == total and cores == 0:
        return CARD_COMPUTE_UNITS_EXHAUSTED
    return None


def _compute_units(card: _Card, memory_mib: int, percent: int) -> tuple[str | None, int]:
    """AMD: memory as asked (none: the whole GPU); cores asked in percent become the GPU's
    compute units (at least one, at most all)."""
    device = card.state.device
    if device.memory_total_mib - card.memory_used < memory_mib:
        return CARD_INSUFFICIENT_MEMORY, 0
    units = 0
    if percent > 0:
        if device.core_percent_total <= 0:
            return CARD_INSUFFICIENT_CORE, 0
        units = min(max(device.core_percent_total * percent // 100, 1), device.core_percent_total)
    elif device.memory_total_mib > 0 and memory_mib >= device.memory_total_mib:
        units = device.core_percent_total
    if device.core_percent_total - card.cores_used < units:
        return CARD_INSUFFICIENT_CORE, 0
    return None, units


def _grant(spec: VendorSpec, card: _Card, memory_mib: int, cores: int) -> DeviceGrant:
    """What the vendor charges the card for one device of the request."""
    device = card.state.device
    if spec.charge is Charge.WHOLE_DEVICE:
        return DeviceGrant(device.uuid, spec.vendor, device.memory_total_mib,
                           device.core_percent_total)
    if spec.charge is Charge.SLOTS_ONLY:
        return DeviceGrant(device.uuid, spec.vendor, 0, 0)
    return DeviceGrant(device.uuid, spec.vendor, memory_mib, cores)


def _topology(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[_Card], devices_total: int
) -> tuple[Pick, ...] | str:
    """Kunlunxin: the cards of the 8-card topology (``accounting.kunlun``), over the devices
    in HAMi's sorted order (the reverse of the order the walk tries them). A whole card is
    usable when nothing runs on it; a vXPU card when the partition fits and every partition
    on it has the request's size. Nothing found is the id filter's mismatches, else
    ``NumaNotFit`` once."""
    spec = context.spec
    demand = ask.demand
    memory_mib = demand.memory_mib if demand.memory_mib is not None else 0
    mismatched: set[str] = set()

    def usable(card: _Card) -> bool:
        device = card.state.device
        device_filter = context.device_filter
        if device_filter is not None and device_filter.uuid_refused(device.uuid):
            mismatched.add(device.uuid)
            return False
        if not device.healthy:
            return False
        if spec.rule == "kunlun":
            return card.slots_used == 0
        if memory_mib + card.memory_used > device.memory_total_mib:
            return False
        # Only partitions of one size share a card (HAMi's FitVXPU).
        return card.slots_used == 0 or card.memory_used // card.slots_used == memory_mib

    hami_order = list(reversed(ordered))
    chosen = kunlun.select([(card.state.device.index, usable(card)) for card in hami_order],
                           demand.count)
    if not chosen:
        if mismatched:
            return format_reasons({CARD_UUID_MISMATCH: len(mismatched)}, devices_total)
        return format_reasons({NUMA_NOT_FIT: 1}, devices_total)
    by_index: dict[int, _Card] = {}
    for card in hami_order:
        by_index.setdefault(card.state.device.index, card)
    picks = []
    for index in chosen:
        card = by_index[index]
        picks.append((card.position, _grant(spec, card, memory_mib, demand.core_percent)))
    return tuple(picks)


def _metax_candidates(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[_Card], devices_total: int
) -> tuple[Pick, ...] | str:
    """Metax sGPU (HAMi's ``MetaxSDevices.Fit``): every sGPU that passes is a candidate, in the
    walk's order, checked as Metax does (health first, as ``CardUnhealthy``; a used sGPU takes
    only tasks of its QoS policy unless the task takes every core); the first candidates are
    taken, or for every core the ones sharing a MetaLink zone."""
    spec = context.spec
    demand = ask.demand
    wanted_qos = context.annotations.get(METAX_QOS_POLICY, METAX_DEFAULT_QOS)
    reasons: dict[str, int] = {}
    candidates: list[tuple[_Card, int]] = []
    for card in ordered:
        device = card.state.device
        memory_mib = demand.on_card(device.memory_total_mib).memory_mib
        refusal: str | None = None
        if not device.healthy:
            refusal = CARD_UNHEALTHY
        elif (
            card.slots_used > 0
            and demand.core_percent != WHOLE_CARD_CORES
            and (device.info("QosPolicy") or wanted_qos) != wanted_qos
        ):
            refusal = CARD_QOS_POLICY_MISMATCH
        elif context.device_filter is not None and context.device_filter.uuid_refused(
            device.uuid
        ):
            refusal = CARD_UUID_MISMATCH
        elif device.slots_total <= card.slots_used:
            refusal = CARD_TIME_SLICING_EXHAUSTED
        else:
            refusal = _capacity_refusal(context, card, memory_mib, demand.core_percent)
        if refusal is not None:
            reasons[refusal] = reasons.get(refusal, 0) + 1
            continue
        candidates.append((card, memory_mib))
    if len(candidates) < demand.count:
        if candidates:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(candidates)
        return format_reasons(reasons, devices_total)
    chosen = candidates[: demand.count]
    if demand.core_percent == WHOLE_CARD_CORES and len(candidates) > demand.count:
        chosen = _metalink(candidates, demand.count)
    return tuple(
        (card.position, DeviceGrant(card.uuid, spec.vendor, memory_mib, demand.core_percent))
        for card, memory_mib in chosen
    )


def _metalink(candidates: Sequence[tuple[_Card, int]], count: int) -> list[tuple[_Card, int]]:
    """HAMi's ``prioritizeExclusiveDevices``: sGPUs of one MetaLink zone (the smallest zone
    that holds them all) first, then across zones, then those without a zone."""
    zones: dict[int, list[tuple[_Card, int]]] = {}
    loose: list[tuple[_Card, int]] = []
    for candidate in candidates:
        zone = hami_codec.custom_info_int(candidate[0].state.device.info("LinkZone"))
        if zone > 0:
            zones.setdefault(zone, []).append(candidate)
        else:
            loose.append(candidate)
    linked = sorted(zones.values(), key=len)
    for members in linked:
        if len(members) >= count:
            return members[:count]
    spread = [candidate for members in linked for candidate in members] + loose
    return spread[:count]


def _neuron_cores(
    spec: VendorSpec, card: _Card, cores: int
) -> tuple[str | None, DeviceGrant | None]:
    """AWS Neuron, one device: its NeuronCores are the bits of its compute; a free device
    gives its first core for one core asked and every core for two, a used one its other core
    (HAMi's ``addCoreUsage``)."""
    device = card.state.device
    if device.core_percent_total.bit_count() - card.cores_used.bit_count() < cores:
        return CARD_INSUFFICIENT_CORE, None
    if card.cores_used == 0:
        mask = NEURON_BOTH_CORES if cores == NEURON_CORES_PER_DEVICE else 1
    else:
        mask = NEURON_BOTH_CORES - card.cores_used
    mask &= device.core_percent_total
    return None, DeviceGrant(device.uuid, spec.vendor, 0, mask)


def _neuron_devices(
    context: RuleContext, ask: ContainerAsk, cards: Sequence[_Card]
) -> tuple[Pick, ...] | str:
    """AWS Neuron, several devices: consecutive free devices (by index) with every core of
    each; on ``inf`` instances from any device, elsewhere 1, 4, 8 or 16 devices from a multiple
    of that count (HAMi's ``graphSelect``). Nothing found is ``NumaNotFit`` once."""
    count = ask.demand.count
    by_index = sorted(cards, key=lambda card: card.state.device.index)
    total = len(cards)
    instance = by_index[0].state.device.info(AWS_INSTANCE_TYPE_INFO) if by_index else None
    if instance is None:
        return format_reasons({NUMA_NOT_FIT: 1}, total)
    ring = "inf" in instance.lower()
    if not ring and count not in (1, 4, 8, 16):
        return format_reasons({NUMA_NOT_FIT: 1}, total)
    step = 1 if ring else count
    for start in range(0, total, step):
        run = by_index[start : start + count]
        if len(run) == count and all(
            card.slots_used == 0 and card.state.device.healthy for card in run
        ):
            return tuple(
                (
                    card.position,
                    DeviceGrant(card.uuid, context.spec.vendor, card.state.device.memory_total_mib,
                                card.state.device.core_percent_total),
                )
                for card in run
            )
    return format_reasons({NUMA_NOT_FIT: 1}, total)


def _with_drs_profiles(context: RuleContext, cards: Sequence[_Card]) -> RuleContext:
    """The context with the node's DRS profiles (every device's, smallest first), for the
    request's profile choice."""
    max_slice = max(
        (hami_codec.custom_info_int(card.state.device.info("maxSlice")) for card in cards),
        default=0,
    )
    seen: dict[str, DrsProfile] = {}
    for card in cards:
        listed = hami_codec.custom_info_profiles(card.state.device.info(DRS_PROFILES_INFO))
        for name, profile_id in listed.items():
            shape = DRS_PROFILE_NAME.fullmatch(name.strip().lower())
            if shape is None or max_slice <= 0:
                continue
            slices = numbers.decimal_integer(shape.group(1)) or 0
            memory_gb = numbers.decimal_integer(shape.group(2)) or 0
            if slices <= 0 or memory_gb <= 0:
                continue
            seen[name] = DrsProfile(name, str(profile_id), slices, memory_gb,
                                    -(-slices * 100 // max_slice))
    profiles = tuple(sorted(seen.values(), key=lambda p: (p.slices, p.memory_gb)))
    return replace(context, drs_profiles=profiles or None)


def drs_profile(profiles: Sequence[DrsProfile], demand: DeviceDemand) -> DrsProfile | None:
    """HAMi's ``selectProfileByRequest``: the profile with exactly the slices asked, or the
    smallest with at least the memory (GB; a number above twice the largest profile's GB is
    MiB) and the compute share asked."""
    if demand.slices:
        return next((p for p in profiles if p.slices == demand.slices), None)
    largest = profiles[-1].memory_gb if profiles else 0
    memory = demand.memory_mib or 0
    memory_gb = -(-memory // 1024) if largest and memory > 2 * largest else memory
    for profile in profiles:
        if memory_gb and profile.memory_gb < memory_gb:
            continue
        if demand.core_percent and profile.core_percent < demand.core_percent:
            continue
        return profile
    return None


def _drs_device(context: RuleContext, card: _Card) -> tuple[str | None, DeviceGrant | None]:
    """One GCU for the request's DRS profile: room for the profile's memory and compute; it
    takes as many slots as the profile has slices."""
    device = card.state.device
    profile = context.drs_choice
    assert profile is not None
    memory_mib = profile.memory_gb * 1024
    # HAMi checks only that one slice is left; the profile takes all of its slices, so all of
    # them must be free (else Reserve would refuse what the fit chose).
    if device.slots_total - card.slots_used < profile.slices:
        return CARD_TIME_SLICING_EXHAUSTED, None
    if device.memory_total_mib - card.memory_used < memory_mib:
        return CARD_INSUFFICIENT_MEMORY, None
    if (
        device.core_percent_total > 0
        and device.core_percent_total - card.cores_used < profile.core_percent
    ):
        return CARD_INSUFFICIENT_CORE, None
    return None, DeviceGrant(device.uuid, context.spec.vendor, memory_mib, profile.core_percent,
                             slots=profile.slices)


def _choose_ascend(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[_Card], picks: Sequence[Pick]
) -> tuple[Pick, ...] | None:
    """HAMi's choice among every Ascend NPU that passed: 910C takes whole modules; with
    NetworkIDs, one NPU is the first that passed and more come from the fullest network group
    first. None when too few passed."""
    count = ask.demand.count
    if context.spec.count_multiple > 1 and count > 1:
        modules = _full_modules(ordered, picks, count)
        return modules if len(modules) == count else None
    if len(picks) < count:
        return None
    if count == 1:
        return (picks[0],)
    cards = {card.position: card for card in ordered}
    groups: dict[str, list[Pick]] = {}
    for pick in picks:
        network = cards[pick[0]].state.device.info(NETWORK_ID_INFO) or ""
        groups.setdefault(network, []).append(pick)
    # The fullest group first; equal groups in the order their first NPU passed.
    ranked = sorted(groups.values(), key=len, reverse=True)
    return tuple(pick for group in ranked for pick in group)[:count]


def _full_modules(
    ordered: Sequence[_Card], picks: Sequence[Pick], count: int
) -> tuple[Pick, ...]:
    """Ascend 910C: the picks of modules (device index // 2) whose two NPUs both passed, in
    the order their first NPU passed, until ``count`` NPUs."""
    cards = {card.position: card for card in ordered}
    modules: dict[int, list[Pick]] = {}
    for pick in picks:
        module = cards[pick[0]].state.device.index // NPUS_PER_MODULE
        modules.setdefault(module, []).append(pick)
    chosen: list[Pick] = []
    for members in modules.values():
        if len(chosen) >= count:
            break
        if len(members) == NPUS_PER_MODULE:
            chosen.extend(sorted(members, key=lambda p: cards[p[0]].state.device.index))
    return tuple(chosen)
