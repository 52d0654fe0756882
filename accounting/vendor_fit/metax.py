"""Metax sGPU: the candidates HAMi's Metax fit collects, and its MetaLink preference.

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``).
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting import hami_codec
from accounting.container_ask import ContainerAsk
from accounting.model import DeviceGrant
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_QOS_POLICY_MISMATCH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_UNHEALTHY,
    CARD_UUID_MISMATCH,
    format_reasons,
)
from accounting.vendor_data import (
    METAX_DEFAULT_QOS,
    METAX_QOS_POLICY,
)
from accounting.vendor_fit.cards import WHOLE_CARD_CORES, Card, Pick, RuleContext, capacity_refusal


def metax_picks(
    context: RuleContext, ask: ContainerAsk, ordered: Sequence[Card], devices_total: int
) -> tuple[Pick, ...] | str:
    """Metax sGPU (HAMi's ``MetaxSDevices.Fit``): every sGPU that passes is a candidate, in the
    walk's order, checked as Metax does (health first, as ``CardUnhealthy``; a used sGPU takes
    only tasks of its QoS policy unless the task takes every core); the first candidates are
    taken, or for every core the ones sharing a MetaLink zone."""
    spec = context.spec
    demand = ask.demand
    wanted_qos = context.annotations.get(METAX_QOS_POLICY, METAX_DEFAULT_QOS)
    reasons: dict[str, int] = {}
    candidates: list[tuple[Card, int]] = []
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
            refusal = capacity_refusal(context, card, memory_mib, demand.core_percent)
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


def _metalink(candidates: Sequence[tuple[Card, int]], count: int) -> list[tuple[Card, int]]:
    """HAMi's ``prioritizeExclusiveDevices``: sGPUs of one MetaLink zone (the smallest zone
    that holds them all) first, then across zones, then those without a zone."""
    zones: dict[int, list[tuple[Card, int]]] = {}
    loose: list[tuple[Card, int]] = []
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
