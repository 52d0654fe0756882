"""Placing a pod on one node: the static refusals of each device, the generic walk over
memory, cores and slots (the scheduler's hot path), the vendors' own rules
(``accounting.vendor_fit``) with their quota check, and the first failure over vendors.

Layer: accounting (pure).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from accounting import quota as quota_rules
from accounting import vendor_fit
from accounting.device_filter import DeviceFilter
from accounting.fit.device_order import Score, _reposition
from accounting.fit.grants import _NodePlacement, _Placed, _Placement, placement_usage
from accounting.fit.node_state import _Allowed, _NodeColumns
from accounting.fit.plan import _always_within, _PodPlan, _VendorPlan
from accounting.fit.quota_walk import _QuotaWalk
from accounting.fit.refusal import _walk_reasons
from accounting.model import DeviceGrant, DeviceState
from accounting.pod import EXCLUSIVE_CORE_PERCENT
from accounting.reasons import (
    CARD_CORDONED,
    CARD_NOT_HEALTH,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    NODE_INSUFFICIENT_DEVICE,
    NOT_EXPLAINED,
    RESOURCE_QUOTA_NOT_FIT,
    format_reasons,
)
from accounting.vendors import NVIDIA


def _blocks(
    devices: tuple[DeviceState, ...], vendor_name: str, device_filter: DeviceFilter | None
) -> tuple[str | None, ...]:
    """The static refusal of each device for one pod (None: may be tried)."""
    blocks: list[str | None] = []
    for state in devices:
        device = state.device
        if not device.healthy:
            blocks.append(CARD_NOT_HEALTH)
        elif device.custom_info and device.vendor == NVIDIA and device.cordoned:
            # HAMi cordons NVIDIA cards only.
            blocks.append(CARD_CORDONED)
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


def _pod_order(
    plan: _PodPlan, columns: _NodeColumns, blocks: Sequence[str | None]
) -> tuple[list[int], list[float]]:
    """The devices a pod may be given, in the order its own policy and device score try them
    (a pod whose order is not one the node keeps ready), and every device's score under its
    weights."""
    scores = _scores(plan.score, columns, columns.slots_used, columns.cores_used,
                     columns.memory_used)
    key = plan.order.key_of(
        scores, columns.numas, columns.slots_used, columns.rank, columns.index_rank
    )
    order = sorted((p for p in range(len(scores)) if blocks[p] is None), key=key)
    return order, scores


def _scores(
    score: Score,
    columns: _NodeColumns,
    slots_used: Sequence[int],
    cores_used: Sequence[int],
    memory_used: Sequence[int],
) -> list[float]:
    return [
        score(
            slots_used[p],
            columns.slots_total[p],
            cores_used[p],
            columns.cores_total[p],
            memory_used[p],
            columns.memory_total[p],
        )
        for p in range(len(columns.devices))
    ]


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
        if not needs and not only.by_topology:
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
        if needs or vendor_plan.by_topology:
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
    """accounting.vendor_fit's placement of one vendor. NVIDIA's walk prices the quota card by
    card, as HAMi's ``fitQuota`` does (``_QuotaWalk``, handed down); every vendor's quota is
    then checked on the complete placement with what it charges (``ResourceQuotaNotFit``
    against all of the vendor's devices on the node), which is the only check of the vendors
    whose HAMi walk prices none."""
    room = vendor_plan.quota_room
    walk = None
    if (
        room is not None
        and vendor_plan.spec.rule == "nvidia"
        # Under topology-aware every card that passes is priced with those collected before
        # it, not only as many as asked: no placement bounds what the walk prices.
        and (
            vendor_plan.by_topology
            or not _always_within(vendor_plan, room, columns.memory_total)
        )
    ):
        walk = _QuotaWalk(room, len(columns.devices))
    context = vendor_fit.RuleContext(
        vendor_plan.spec,
        plan.pod.annotations,
        vendor_plan.device_filter,
        columns.rank,
        columns.index_rank,
        plan.order,
        plan.score,
        quota=walk,
        mutex=plan.mutex,
        topology=plan.topology,
    )
    ruled = vendor_fit.place(context, vendor_plan.asks, columns.devices)
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
    card_capacity_refusal (Amount arithmetic) on three integer lists of free capacity, and a
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
    mutex = plan.mutex
    score_of = plan.score
    order: Sequence[int]
    base_scores: Sequence[float]
    if plan.default_order:
        order = allowed[1] if binpack else allowed[2]
        base_scores = columns.device_scores
    else:
        order, base_scores = _pod_order(plan, columns, allowed[0])
    # An order by the score, ties by rank, is fixed up device by device after a container
    # charges cards; any other is sorted again.
    slides = plan.slides
    # nvidia.com/numa-bind: a container's NVIDIA cards come from one NUMA node; the walk
    # starts again at each NUMA node it enters (the order keeps them together).
    numa_groups = vendor_plan.numa_groups
    policy_checks = numa_groups or mutex
    numas = columns.numas
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
        is_init = ask.is_init
        count = ask.count
        # -1: a share of each card, sized per card in the loop.
        memory_fixed = -1 if ask.memory_mib is None else ask.memory_mib
        memory_percent = ask.memory_percent
        cores = ask.core_percent
        exclusive = ask.exclusive
        share_only = ask.share_only
        if count > vendor_devices:
            return ask.order, NODE_INSUFFICIENT_DEVICE
        if moved is not None:
            if reordered is None:
                order = reordered = list(order)
                scores = list(base_scores)
            for p in moved:
                total = slots_total[p]
                scores[p] = score_of(
                    total - slots_free[p],
                    total,
                    cores_total[p] - cores_free[p],
                    cores_total[p],
                    memory_total[p] - memory_free[p],
                    memory_total[p],
                )
                if slides:
                    _reposition(reordered, p, scores, columns.rank, binpack)
            if not slides:
                tasks = list(map(operator.sub, slots_total, slots_free))
                reordered.sort(
                    key=plan.order.key_of(
                        scores, numas, tasks, columns.rank, columns.index_rank
                    )
                )
            moved = None
        picks: list[int] = []
        remaining = count
        taken = [0, 0, 0]  # what this container's picks add to the quota's folded totals
        numa_now: int | None = None
        for p in order:
            if policy_checks:  # one test per card for the ordinary pod, two rules behind it
                if numa_groups and numas[p] != numa_now:
                    numa_now = numas[p]
                    if picks:
                        picks = []
                        remaining = count
                        taken = [0, 0, 0]
                if mutex and slots_free[p] < slots_total[p]:
                    continue  # after the time slices in HAMi; either refuses the card
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
                (
                    _numa_walk(
                        plan, columns, allowed[0],
                        base_scores if reordered is None else scores, slots_free,
                    )
                    if numa_groups
                    else order
                ),
                columns,
                (slots_free, memory_free, cores_free),
                quota,
                vendor_name,
                vendor_devices,
                mutex,
                numa_groups,
            )
        if quota is not None:
            for p in picks:
                quota.commit(is_init, p, ask.memory_on_card(memory_total[p]), cores)
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



def _numa_walk(
    plan: _PodPlan,
    columns: _NodeColumns,
    blocks: Sequence[str | None],
    scores: Sequence[float],
    slots_free: Sequence[int],
) -> list[int]:
    """The walk of a numa-bind pod's failing container for its reasons: the devices of its
    order with those refused by UUID among them, since HAMi's walk enters a device's NUMA node
    before it checks the UUID (on the container's current scores and tasks)."""
    tasks = list(map(operator.sub, columns.slots_total, slots_free))
    key = plan.order.key_of(scores, columns.numas, tasks, columns.rank, columns.index_rank)
    walked = (p for p, block in enumerate(blocks) if block in (None, CARD_UUID_MISMATCH))
    return sorted(walked, key=key)
