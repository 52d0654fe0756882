"""HAMi's per-device walk for one vendor on one node: which nodes take it, the node's own
refusals, the order the cards are tried in, and one container's walk over them card by card.

Layer: accounting (pure; ``place`` and ``needs_rules`` are what ``accounting.fit`` calls). The
vendors' own steps are in the modules beside it (``ascend``, ``enflame_drs``, ``kunlun_walk``,
``metax``, ``neuron``, ``topology``), over the cards and their common steps (``cards``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from accounting import mig, pair_scores
from accounting.container_ask import ContainerAsk
from accounting.model import DeviceGrant, DeviceState, MigPlacement
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_CORDONED,
    CARD_MIG_TOPOLOGY_INFEASIBLE,
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE,
    CARD_NOT_HEALTH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    MODE_NOT_FIT,
    NODE_INSUFFICIENT_DEVICE,
    NUMA_NOT_FIT,
    RESOURCE_QUOTA_NOT_FIT,
    VENDOR_RULE_NOT_MODELLED,
    format_reasons,
)
from accounting.vendor_data import (
    ASCEND_SOFT_SPLIT_INFO,
    METAX_APP_CLASS,
    PAIR_SCORES_INFO,
    VASTAI_STRATEGY_INFO,
)
from accounting.vendor_fit.ascend import choose_ascend, collects_all, full_modules
from accounting.vendor_fit.cards import (
    Card,
    CardQuota,
    Pick,
    RuleContext,
    RuleFailure,
    capacity_refusal,
    compute_units,
    vendor_grant,
)
from accounting.vendor_fit.enflame_drs import drs_device, drs_profile, with_drs_profiles
from accounting.vendor_fit.kunlun_walk import kunlun_picks
from accounting.vendor_fit.metax import metax_picks
from accounting.vendor_fit.neuron import neuron_cores, neuron_picks
from accounting.vendor_fit.topology import MAX_COMBINATIONS, choose
from accounting.vendor_spec import Charge, VendorSpec

NOT_MODELLED_RULES: dict[str, str] = {}
"""Rules named in the vendor table that this module does not implement yet: rule -> what HAMi
does there. Their nodes are refused with ``VendorRuleNotModelled``."""


def needs_rules(spec: VendorSpec, devices: Sequence[DeviceState]) -> bool:
    """Whether the vendor's devices on this node need this module rather than the generic
    loop: the vendor names a rule or takes devices differently, or (NVIDIA) a card is in MIG
    mode, the one mode HAMi gives a path of its own (any other is placed as hami-core)."""
    if spec.rule == "nvidia":
        return any(
            s.device.vendor == spec.vendor and s.device.mode == mig.MIG_MODE for s in devices
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
    cards = [Card.of(p, s) for p, s in enumerate(devices) if s.device.vendor == spec.vendor]
    if spec.rule == "enflame-drs":
        context = with_drs_profiles(context, cards)
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
            walked = kunlun_picks(context, ask, ordered, len(cards))
        elif spec.rule == "metax-sgpu":
            walked = metax_picks(context, ask, ordered, len(cards))
        elif spec.rule == "aws-neuron" and ask.demand.count > 1:
            walked = neuron_picks(context, ask, cards)
        else:
            walked = _walk(context, ask, ordered, earlier[ask.is_init], len(cards))
        if isinstance(walked, str):
            return RuleFailure(ask.order, walked)
        if context.quota is not None:
            for position, grant in walked:
                context.quota.commit(ask.is_init, position, grant.memory_mib, grant.core_percent)
        if not ask.is_init:
            by_position = {card.position: card for card in cards}
            for position, grant in walked:
                by_position[position].charge(grant)
        earlier[ask.is_init].extend(grant.uuid for _, grant in walked)
        placement.append(walked)
    return placement


def _node_refusal(context: RuleContext, cards: Sequence[Card]) -> str | None:
    """A refusal of the whole node before any device is visited (counted once)."""
    spec = context.spec
    total = len(cards)
    if not cards:
        return None
    if spec.rule in NOT_MODELLED_RULES:
        return (
            f"{total}/{total} {VENDOR_RULE_NOT_MODELLED} "
            f"({spec.title}: {NOT_MODELLED_RULES[spec.rule]})"
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


def _mig_waiver(context: RuleContext, cards: Sequence[Card]) -> bool:
    """HAMi's ``isMIGRequest``: with a MIG card on the node, a container may ask for more
    devices than the node has cards (several instances of one card), unless the pod's
    ``nvidia.com/vgpu-mode`` leaves MIG out."""
    if context.spec.rule != "nvidia" or not any(card.is_mig for card in cards):
        return False
    mode_key = context.spec.selection.mode
    wanted = context.annotations.get(mode_key) if mode_key else None
    return wanted is None or mig.MIG_MODE in wanted


def _ordered(context: RuleContext, cards: Sequence[Card]) -> list[Card]:
    """The cards in the order the walk tries them: the pod's GPU order
    (``accounting.gpu_order``) on current usage."""
    score = context.score
    scores = [0.0] * len(context.rank)
    numas = [0] * len(context.rank)
    tasks = [0] * len(context.rank)
    for card in cards:
        device = card.state.device
        scores[card.position] = score(
            card.slots_used,
            device.slots_total,
            card.cores_used,
            device.core_percent_total,
            card.memory_used,
            device.memory_total_mib,
        )
        numas[card.position] = device.numa
        tasks[card.position] = card.slots_used
    key = context.order.key_of(scores, numas, tasks, context.rank, context.index_rank)
    return sorted(cards, key=lambda card: key(card.position))


def _walk(
    context: RuleContext,
    ask: ContainerAsk,
    ordered: Sequence[Card],
    earlier_uuids: Sequence[str],
    devices_total: int,
) -> tuple[Pick, ...] | str:
    """One container's walk over the cards: its picks, or the reason it fits nowhere."""
    reasons: dict[str, int] = {}
    picks: list[Pick] = []
    remaining = ask.demand.count
    # NVIDIA's topology-aware policy collects every card that passes, then chooses.
    topology = context.topology and context.spec.rule == "nvidia"
    collect_all = topology or collects_all(context, ask, ordered)
    # Instances already chosen for this container, per card (HAMi's toAllocate on a revisit).
    chosen: dict[int, list[MigPlacement]] = {}
    taken = [0, 0, 0]  # what this container's picks add to the quota's folded totals
    # nvidia.com/numa-bind (NVIDIA): the walk starts again at each NUMA node it enters.
    numa_groups = context.order.numa_bind and context.spec.rule == "nvidia"
    numa_now: int | None = None
    index = 0
    while index < len(ordered):
        card = ordered[index]
        if numa_groups and card.state.device.numa != numa_now and not _refused_before_numa(
            context, card
        ):
            numa_now = card.state.device.numa
            if picks:
                # HAMi counts the cards as NumaNotFit when it had taken some: under
                # topology-aware it takes none while it walks, and only starts again.
                if not topology:
                    reasons[NUMA_NOT_FIT] = reasons.get(NUMA_NOT_FIT, 0) + len(picks)
                picks = []
                chosen = {}
                taken = [0, 0, 0]
                remaining = ask.demand.count
        refusal, grant = _try(
            context, ask, card, chosen.get(card.position, []), earlier_uuids, taken
        )
        if refusal is not None:
            reasons[refusal] = reasons.get(refusal, 0) + 1
            index += 1
            continue
        assert grant is not None
        if context.quota is not None:
            added = _quota_added(context.quota, card, grant.memory_mib, grant.core_percent,
                                 picks)
            taken = [t + a for t, a in zip(taken, added, strict=True)]
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
    if topology and len(picks) >= ask.demand.count:
        return _topology_picks(ask, ordered, picks, devices_total)
    if collect_all and not topology:
        chosen_picks = choose_ascend(context, ask, ordered, picks)
        if chosen_picks is not None:
            return chosen_picks
        if context.spec.count_multiple > 1 and ask.demand.count > 1:
            modules = full_modules(ordered, picks, ask.demand.count)
            return format_reasons(
                {ALLOCATED_CARDS_INSUFFICIENT_REQUEST: len(modules)}, ask.demand.count
            )
    if picks:
        reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picks)
    return format_reasons(reasons, devices_total)


def _topology_picks(
    ask: ContainerAsk, ordered: Sequence[Card], picks: Sequence[Pick], devices_total: int
) -> tuple[Pick, ...] | str:
    """The topology-aware choice among the picks that passed (``accounting.vendor_fit.topology``),
    in walk order. A MIG card's instances are found one after another (the card is visited
    again), so the first best combination takes its first instances, the ones HAMi charges
    when it chooses each instance again as the grants are added."""
    scores = {
        card.uuid: pair_scores.card_scores(card.state.device.info(PAIR_SCORES_INFO))
        for card in ordered
    }
    chosen = choose([grant.uuid for _, grant in picks], ask.demand.count, scores)
    if chosen is None:
        return (
            f"{devices_total}/{devices_total} {VENDOR_RULE_NOT_MODELLED} (NVIDIA: a "
            f"topology-aware choice of {ask.demand.count} of the {len(picks)} devices that "
            f"passed, more than {MAX_COMBINATIONS} combinations)"
        )
    return tuple(picks[index] for index in chosen)


def _quota_added(
    quota: CardQuota, card: Card, memory_mib: int, core_percent: int, picks: Sequence[Pick]
) -> tuple[int, int, int]:
    """What one more grant on ``card`` adds to the quota's totals; a card the container
    already took (another instance of a MIG card) is no second device."""
    memory, cores, devices = quota.added(card.position, memory_mib, core_percent)
    if devices and any(position == card.position for position, _ in picks):
        devices = 0
    return memory, cores, devices


def _quota_refused(
    context: RuleContext,
    ask: ContainerAsk,
    card: Card,
    chosen_here: Sequence[MigPlacement],
    picks_taken: Sequence[int],
    memory_mib: int,
) -> bool:
    """HAMi's ``fitQuota`` for one card: whether the pod's placement so far, what this
    container took (``picks_taken``) and this card would pass the quota. A MIG card is priced
    with the instance it would give (what is charged), or the request when none is left."""
    quota = context.quota
    assert quota is not None
    cores = ask.demand.core_percent
    if card.is_mig:
        occupied = [*card.mig_in_use, *chosen_here]
        choice = mig.choose_instance(card.state.device.mig_profiles, occupied, memory_mib)
        if choice is not None:
            memory_mib, cores = choice.memory_mib, choice.core_percent
    memory, core_total, devices = quota.added(card.position, memory_mib, cores)
    if chosen_here:
        devices = 0
    return not quota.fits(picks_taken, (memory, core_total, devices))


def _refused_before_numa(context: RuleContext, card: Card) -> bool:
    """Whether ``_try`` refuses the card before HAMi's walk looks at its NUMA node: for its
    health, its cordon or its type."""
    device = card.state.device
    device_filter = context.device_filter
    return (
        not device.healthy
        or (context.spec.rule == "nvidia" and device.cordoned)
        or (device_filter is not None and device_filter.type_refused(device.model, device.mode))
    )


def _try(
    context: RuleContext,
    ask: ContainerAsk,
    card: Card,
    chosen_here: Sequence[MigPlacement],
    earlier_uuids: Sequence[str],
    taken: Sequence[int] = (0, 0, 0),
) -> tuple[str | None, DeviceGrant | None]:
    """The first reason the card refuses the container, or the grant it would get (``taken``:
    what the container's picks so far add to the quota)."""
    spec = context.spec
    device = card.state.device
    demand = ask.demand
    if not device.healthy:
        return CARD_NOT_HEALTH, None
    if spec.rule == "nvidia" and device.cordoned:
        return CARD_CORDONED, None
    device_filter = context.device_filter
    if device_filter is not None and device_filter.type_refused(device.model, device.mode):
        return CARD_TYPE_MISMATCH, None
    if device_filter is not None and device_filter.uuid_refused(device.uuid):
        return CARD_UUID_MISMATCH, None
    if spec.used_device_refused and card.slots_used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None
    if device.slots_total <= card.slots_used:
        return CARD_TIME_SLICING_EXHAUSTED, None
    if context.mutex and card.slots_used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None
    if context.quota is not None and _quota_refused(
        context, ask, card, chosen_here, taken, demand.on_card(device.memory_total_mib).memory_mib
    ):
        return RESOURCE_QUOTA_NOT_FIT, None
    if spec.charge is Charge.CORE_MASK:
        return neuron_cores(spec, card, demand.core_percent)
    if spec.rule == "enflame-drs":
        return drs_device(context, card)
    memory_mib = demand.on_card(device.memory_total_mib).memory_mib
    cores = demand.core_percent
    if spec.charge is Charge.COMPUTE_UNITS:
        refusal, cores = compute_units(card, memory_mib, cores)
        if refusal is not None:
            return refusal, None
    elif spec.checks_capacity:
        refusal = capacity_refusal(context, card, memory_mib, cores)
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
    return None, vendor_grant(spec, card, memory_mib, cores)
