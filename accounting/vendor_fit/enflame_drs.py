"""Enflame DRS: the node's profiles, the profile a request is fitted to, and one GCU for it.

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``). HAMi's Enflame DRS sizes a
request by a profile (``<slices>g.<GB>gb``) its GCUs list, and charges the profile's memory,
compute share and slices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from accounting import hami_codec, numbers
from accounting.model import DeviceGrant
from accounting.pod import DeviceDemand
from accounting.reasons import (
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_TIME_SLICING_EXHAUSTED,
)
from accounting.vendor_data import (
    DRS_PROFILE_NAME,
    DRS_PROFILES_INFO,
)
from accounting.vendor_fit.cards import Card, DrsProfile, RuleContext


def with_drs_profiles(context: RuleContext, cards: Sequence[Card]) -> RuleContext:
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


def drs_device(context: RuleContext, card: Card) -> tuple[str | None, DeviceGrant | None]:
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
