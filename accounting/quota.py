"""The namespace quota check, with HAMi's semantics.

Layer: accounting (pure). A "no" is a value with a reason and the numbers, never an exception.

* the boundary is inclusive: used + requested == limit passes;
* an explicit limit of 0 blocks any positive request, as in HAMi;
* memory: the request already carries the memory factor, so the limit is multiplied by the
  factor (when > 1) — HAMi's FitQuota, equal to applying the factor once to the effective value;
* the GPU count (limits.nvidia.com/gpu) is a quota dimension too, enforced when a limit is set
  (our extension: HAMi's quota has no count dimension); callers may switch it off.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from accounting import reasons
from accounting.model import DeviceUsage, QuotaItem
from accounting.pod import EffectiveRequest, usage_totals
from accounting.policy import AccountingPolicy
from accounting.vendors import VendorResources


class QuotaReason(enum.Enum):
    """Stable reason codes of a quota decision (spelled in accounting.reasons)."""

    FITS = reasons.QUOTA_FITS
    NO_GPU_REQUEST = reasons.NO_GPU_REQUEST
    MEMORY_EXCEEDED = reasons.MEMORY_QUOTA_EXCEEDED
    CORES_EXCEEDED = reasons.CORE_QUOTA_EXCEEDED
    COUNT_EXCEEDED = reasons.GPU_COUNT_QUOTA_EXCEEDED


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaCheckItem:
    """One dimension as the check saw it."""

    resource: str
    requested: int
    used: int
    limit: int
    """The limit as compared (memory: limit × memory factor when the factor > 1)."""
    limit_set: bool
    enforced: bool

    @property
    def exceeded(self) -> bool:
        """True when an enforced limit would be passed (the boundary is inclusive)."""
        return self.enforced and self.limit_set and self.used + self.requested > self.limit


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaDecision:
    """Whether a request fits a namespace's quota, with a reason code and a sentence."""

    allowed: bool
    reason: str
    message: str
    items: tuple[QuotaCheckItem, ...] = ()


_REASON_BY_DIMENSION = {
    "memory": QuotaReason.MEMORY_EXCEEDED,
    "cores": QuotaReason.CORES_EXCEEDED,
    "count": QuotaReason.COUNT_EXCEEDED,
}


def _decide(
    namespace: str,
    dimensions: Sequence[tuple[str, str, int, int]],
    items: Mapping[str, QuotaItem],
    enforced_dimensions: frozenset[str],
) -> QuotaDecision:
    checked: list[QuotaCheckItem] = []
    first_reason: QuotaReason | None = None
    for dimension, resource, requested, factor in dimensions:
        item = items.get(resource, QuotaItem(resource))
        limit = _compared_limit(item, factor)
        check = QuotaCheckItem(
            resource=resource,
            requested=requested,
            used=item.used,
            limit=limit,
            limit_set=item.limit_set,
            enforced=dimension in enforced_dimensions,
        )
        checked.append(check)
        if check.exceeded and first_reason is None:
            first_reason = _REASON_BY_DIMENSION[dimension]
    if first_reason is None:
        summary = ", ".join(
            f"{c.resource} {c.used} + {c.requested} <= {c.limit}"
            if c.limit_set
            else f"{c.resource} {c.requested} (no limit)"
            for c in checked
            if c.enforced
        )
        return QuotaDecision(
            allowed=True,
            reason=QuotaReason.FITS.value,
            message=f"namespace {namespace} quota fits: {summary}",
            items=tuple(checked),
        )
    exceeded = "; ".join(
        f"{c.resource}: requested {c.requested}, already used {c.used}, limit {c.limit}"
        for c in checked
        if c.exceeded
    )
    return QuotaDecision(
        allowed=False,
        reason=first_reason.value,
        message=f"namespace {namespace} quota exceeded: {exceeded}",
        items=tuple(checked),
    )


def _compared_limit(item: QuotaItem, memory_factor: int) -> int:
    """The limit a dimension is compared with: HAMi multiplies the memory limit by the memory
    factor when it is above 1 (the request already carries the factor)."""
    return item.limit * memory_factor if memory_factor > 1 else item.limit


def check_quota(
    namespace: str,
    request: EffectiveRequest,
    items: Mapping[str, QuotaItem],
    vendor: VendorResources,
    *,
    enforce_gpu_count: bool = True,
) -> QuotaDecision:
    """Checks a pod's effective request (see accounting.pod.effective_request) against its
    namespace's quota items (keyed by resource name, e.g. nvidia.com/gpumem)."""
    # HAMi skips memory and cores when both are 0 (memory given as a share of a card): the
    # scheduler re-checks with real card sizes once a card is chosen.
    unsized = request.memory_mib == 0 and request.core_percent == 0
    return _check(namespace, request, items, vendor, enforce_gpu_count, "asks for", unsized)


def check_requests(
    namespace: str,
    requests: Sequence[EffectiveRequest],
    items: Mapping[str, QuotaItem],
    policy: AccountingPolicy,
) -> QuotaDecision:
    """Checks a pod's effective request for every vendor of ``policy`` (one per vendor, in the
    policy's order) against its namespace's quota: the admission check. The first vendor that
    does not fit names the reason; a pod that asks for none of the vendors' devices passes with
    ``NoGpuRequest``."""
    decisions = []
    for request in requests:
        vendor = policy.vendor(request.vendor)
        if vendor is None:
            raise ValueError(f"no vendor {request.vendor!r} in policy {policy.policy_id}")
        decisions.append(
            check_quota(
                namespace, request, items, vendor, enforce_gpu_count=policy.enforce_gpu_count
            )
        )
    if len(decisions) == 1:
        return decisions[0]
    checked = [d for d in decisions if d.reason != QuotaReason.NO_GPU_REQUEST.value]
    denied = [d for d in checked if not d.allowed]
    if not checked:
        return QuotaDecision(
            allowed=True,
            reason=QuotaReason.NO_GPU_REQUEST.value,
            message="pod asks for no device: nothing to check",
        )
    reported = denied or checked
    return QuotaDecision(
        allowed=not denied,
        reason=reported[0].reason,
        message="; ".join(d.message for d in reported),
        items=tuple(item for d in checked for item in d.items),
    )


def check_usage(
    namespace: str,
    usage: Sequence[DeviceUsage],
    items: Mapping[str, QuotaItem],
    vendor: VendorResources,
    *,
    enforce_gpu_count: bool = True,
) -> QuotaDecision:
    """Checks per-device usage a pod would add (its collapsed grants, memory factor already in
    the granted MiB) against its namespace's quota: the recorder's atomic re-check in Reserve
    (the fit checks each candidate card with ``usage_room``, which agrees with it)."""
    memory_mib, core_percent, devices = vendor_totals(usage, vendor)
    request = EffectiveRequest(vendor.vendor, devices, memory_mib, core_percent, False)
    return _check(namespace, request, items, vendor, enforce_gpu_count, "holds", False)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaRoom:
    """What a pod may still hold in its namespace, per enforced dimension (None: no limit).

    ``check_usage`` allows a pod's usage exactly when each of its totals (memory, cores,
    devices held) is at most the room: the fit checks the quota per candidate card with it,
    adding up what each card would add instead of re-folding the placement each time.
    """

    memory_mib: int | None
    core_percent: int | None
    devices: int | None

    def allows(self, memory_mib: int, core_percent: int, devices: int) -> bool:
        """Whether usage with these totals passes every enforced limit."""
        return (
            (self.memory_mib is None or memory_mib <= self.memory_mib)
            and (self.core_percent is None or core_percent <= self.core_percent)
            and (self.devices is None or devices <= self.devices)
        )


def usage_room(
    items: Mapping[str, QuotaItem],
    vendor: VendorResources,
    *,
    enforce_gpu_count: bool = True,
) -> QuotaRoom | None:
    """The room ``check_usage`` leaves a pod of ``vendor`` with these quota items; None when no
    dimension has an enforced limit (every usage passes)."""

    def room(resource: str, factor: int, enforced: bool) -> int | None:
        item = items.get(resource)
        if not enforced or item is None or not item.limit_set:
            return None
        return _compared_limit(item, factor) - item.used

    found = QuotaRoom(
        memory_mib=room(vendor.memory_resource, vendor.memory_factor, True),
        core_percent=room(vendor.core_resource, 1, True),
        devices=room(vendor.count_resource, 1, enforce_gpu_count),
    )
    if found.memory_mib is None and found.core_percent is None and found.devices is None:
        return None
    return found


def _check(
    namespace: str,
    request: EffectiveRequest,
    items: Mapping[str, QuotaItem],
    vendor: VendorResources,
    enforce_gpu_count: bool,
    verb: str,
    unsized: bool,
) -> QuotaDecision:
    """The one check of both: which dimensions are enforced, then ``_decide``."""
    if request.is_empty:
        return QuotaDecision(
            allowed=True,
            reason=QuotaReason.NO_GPU_REQUEST.value,
            message=f"pod {verb} no {vendor.vendor} device: nothing to check",
        )
    enforced = set() if unsized else {"memory", "cores"}
    if enforce_gpu_count:
        enforced.add("count")
    return _decide(
        namespace,
        (
            ("memory", vendor.memory_resource, request.memory_mib, vendor.memory_factor),
            ("cores", vendor.core_resource, request.core_percent, 1),
            ("count", vendor.count_resource, request.count, 1),
        ),
        items,
        frozenset(enforced),
    )


def vendor_totals(usage: Iterable[DeviceUsage], vendor: VendorResources) -> tuple[int, int, int]:
    """(memory MiB, core percent, devices) of the vendor's devices in ``usage``: what a pod
    holding it is charged in its namespace."""
    return usage_totals(usage, vendor.vendor)


def held_quantities(
    usage: Iterable[DeviceUsage], vendor: VendorResources
) -> tuple[tuple[str, int], ...]:
    """(resource name, quantity) per quota dimension of the vendor's devices in ``usage``, the
    way a namespace's used items count them; nothing when it holds none of them."""
    memory_mib, core_percent, devices = vendor_totals(usage, vendor)
    if not devices:
        return ()
    return (
        (vendor.memory_resource, memory_mib),
        (vendor.core_resource, core_percent),
        (vendor.count_resource, devices),
    )


QUOTA_KEY_PREFIX = "limits."
"""ResourceQuota spec.hard keys HAMi manages: ``limits.`` then a vendor's resource name."""


def quota_key(resource: str) -> str:
    """The ResourceQuota ``spec.hard`` key limiting ``resource``: ``limits.nvidia.com/gpumem``."""
    return f"{QUOTA_KEY_PREFIX}{resource}"


def quota_keys(vendors: Iterable[VendorResources]) -> dict[str, str]:
    """ResourceQuota key -> resource name, for every quota dimension of ``vendors``: HAMi's
    ``limits.<memory resource>`` and ``limits.<core resource>``, and the device count
    ``limits.<count resource>`` (our extension). The one place the keys are spelled."""
    return {
        quota_key(resource): resource
        for vendor in vendors
        for resource in (vendor.memory_resource, vendor.core_resource, vendor.count_resource)
    }


def quota_items_from_limits(
    limits: Mapping[str, int], vendors: Iterable[VendorResources]
) -> dict[str, int]:
    """Maps ResourceQuota-style keys (limits.nvidia.com/gpumem) to resource names.

    Only the keys HAMi manages are kept (limits.-prefixed memory and cores, plus the count as our
    extension); callers that must refuse unknown keys compare the result's size with the input.
    """
    known = quota_keys(vendors)
    return {known[key]: value for key, value in limits.items() if key in known}


def merge_quota_limits(quotas: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Merges the limits of several ResourceQuotas in one namespace: the minimum per key.

    Kubernetes enforces every ResourceQuota of a namespace, so the tightest one binds. (HAMi
    keeps one slot per namespace instead: the last quota written wins and deleting either clears
    it, HAMi #2997.)
    """
    merged: dict[str, int] = {}
    for limits in quotas:
        for key, value in limits.items():
            merged[key] = min(value, merged.get(key, value))
    return merged
