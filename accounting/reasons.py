"""Every stable reason code the accounting answers with: the one place each is spelled.

Layer: accounting (pure). A "no" is an ``OK`` answer carrying one of these codes and
a sentence; callers, dashboards and log parsers match on the code. Codes HAMi also has keep
HAMi's spelling (pkg/device/common), so operators read the same words from both schedulers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from accounting.amount import Amount, Dimension

# -- why one card refuses one container (the fit, and Reserve's capacity re-check) -------------

CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
"""The node's hami.io/device-cordon annotation names the card (NVIDIA): no new pod on it."""
CARD_TYPE_MISMATCH = "CardTypeMismatch"
"""Another vendor, or excluded by nvidia.com/use-gputype, nouse-gputype or vgpu-mode."""
CARD_UUID_MISMATCH = "CardUuidMismatch"
"""Excluded by nvidia.com/use-gpuuuid or nouse-gpuuuid."""
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
"""No sharing slot left."""
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
"""The container asks for the card alone and something already runs there."""
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
"""A share-only task on a card whose compute is fully given away."""
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
"""Counts the devices that did pass when too few did (HAMi counts the cards it had picked)."""
CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
"""A MIG-mode card has no instance of the card's profiles left that holds the request."""
CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
"""A vendor's own rule refuses the card (Metax GPU, Moore Threads: every container of a pod on
one device)."""
NUMA_NOT_FIT = "NumaNotFit"
"""A vendor's topology rule finds no set of devices (Kunlun, AWS Neuron: counted once)."""
MODE_NOT_FIT = "ModeNotFit"
"""The pod asks a sharing mode the node does not offer (Ascend hami-core), or no profile fits
(Enflame DRS); counted once for the node."""
CARD_UNHEALTHY = "CardUnhealthy"
"""Metax sGPU's word for CardNotHealth (HAMi's Metax backend has its own)."""
CARD_QOS_POLICY_MISMATCH = "CardQosPolicyMismatch"
"""Metax sGPU: a used sGPU runs tasks of another QoS policy."""
VENDOR_RULE_NOT_MODELLED = "VendorRuleNotModelled"
"""Ours: the vendor's devices on the node need a fit rule HAMi has and the accounting does not
model (named in the message), so the node is refused rather than fitted by the generic rule."""

CARD_CAPACITY_ORDER = (Dimension.SLOTS, Dimension.MEMORY, Dimension.CORES)
"""The order HAMi's Fit checks a card's capacity in; the first short dimension names the
refusal (the fit and Reserve's re-check both report it so)."""
CARD_CAPACITY_REASON = {
    Dimension.SLOTS: CARD_TIME_SLICING_EXHAUSTED,
    Dimension.MEMORY: CARD_INSUFFICIENT_MEMORY,
    Dimension.CORES: CARD_INSUFFICIENT_CORE,
}


def card_shortfall(need: Amount, free: Amount) -> Dimension | None:
    """The first dimension (in ``CARD_CAPACITY_ORDER``) in which ``need`` does not fit in what
    a card has ``free``, or None when it fits."""
    short = need.over(free, CARD_CAPACITY_ORDER)
    return short[0] if short else None


def format_reasons(counts: Mapping[str, int], devices_total: int) -> str:
    """HAMi's aggregated reason: "<count>/<devices> <Reason>" per reason, sorted, ", "-joined."""
    return ", ".join(
        sorted(f"{count}/{devices_total} {reason}" for reason, count in counts.items())
    )

# -- why a node refuses a pod ------------------------------------------------------------------

NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
"""Fewer of the vendor's devices than one container asks for (HAMi returns it bare)."""
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
"""The placement would take the namespace over its quota with the real card sizes."""
NOT_EXPLAINED = "NotExplained"
"""A container fits no card of the node; the per-card reasons were not asked for
(accounting.fit.fit_nodes with explain_refusals=False)."""

# -- a fit over candidate nodes ----------------------------------------------------------------

SCHEDULED = "Scheduled"
NO_GPU_REQUEST = "NoGpuRequest"
"""The pod asks for no device: admission has nothing to check, the scheduler keeps every node."""
NO_NODE_FITS = "NoNodeFits"

# -- the namespace quota -----------------------------------------------------------------------

QUOTA_FITS = "QuotaFits"
MEMORY_QUOTA_EXCEEDED = "MemoryQuotaExceeded"
CORE_QUOTA_EXCEEDED = "CoreQuotaExceeded"
GPU_COUNT_QUOTA_EXCEEDED = "GpuCountQuotaExceeded"

# -- who may write a pod's allocation ------------------------------------------------------------

SCHEDULER_OWNED_ANNOTATION = "SchedulerOwnedAnnotation"
"""A pod created with an annotation only the scheduler writes, or changed in one by a caller
that is not a HAMi component (accounting.owned_annotations)."""

# -- Reserve -----------------------------------------------------------------------------------

RESERVED = "Reserved"
MIG_PLACEMENT_TAKEN = "MigPlacementTaken"
"""Reserve: a MIG instance of the grants overlaps one another pod holds on the card."""
NO_GRANTS = "NoGrants"
"""Reserve was given a pod without grants."""
POD_FORGOTTEN = "PodForgotten"
"""The pod was deleted (forgotten with nothing stored): nothing is reserved for it again."""
POLICY_CHANGED = "PolicyChanged"
"""The grants were computed under another accounting policy than the recorder's."""
RESERVATION_CHANGED = "ReservationChanged"
"""What is stored for the pod is no longer the reservation the caller read and replaces
(another Filter for the same pod, or an update, changed it meanwhile)."""

# -- the scheduler daemon's Filter -------------------------------------------------------------

RESERVATION_CONFLICT = "ReservationConflict"
"""Every attempt's placement was taken by another scheduler first, or another Filter for the
same pod reserved it meanwhile (its placement stands); this answer reserves nothing."""
NODE_CHANGED = "NodeChanged"
"""A Reserve refused because the recorder's node no longer matches the one the fit saw."""
NODE_UNREGISTERED = "node unregistered"
"""The failed-node reason of a candidate the recorder has no inventory for."""

# -- what more room cannot fix -----------------------------------------------------------------

ROOM_CANNOT_FIX = frozenset({
    CARD_NOT_HEALTH,
    CARD_UNHEALTHY,
    CARD_CORDONED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    NODE_INSUFFICIENT_DEVICE,
    RESOURCE_QUOTA_NOT_FIT,
    VENDOR_RULE_NOT_MODELLED,
    NODE_UNREGISTERED,
})
"""Refusals that no pod leaving the node would lift: the card's health, cordon, type or UUID,
fewer devices than asked, the namespace's quota (its other pods may sit on any node), a rule not
modelled, no inventory. Every other reason is about room a pod holds on the node's cards (slots,
memory, cores, an exclusive or a MIG placement, a NUMA node's cards), which preempting that pod
could free."""

_REASON_CODE = re.compile(r"[A-Z][A-Za-z]+")


def room_cannot_fix(node_reason: str) -> bool:
    """Whether a failed node's reason (HAMi's ``"2/2 CardTypeMismatch, 1/2 CardCordoned"``, a bare
    code, or ``node unregistered``) names only refusals in ``ROOM_CANNOT_FIX``: then preempting
    pods on the node cannot make the pod fit there (kube-scheduler's
    FailedAndUnresolvableNodes). A reason naming nothing known is taken as fixable."""
    if node_reason == NODE_UNREGISTERED:
        return True
    codes = _REASON_CODE.findall(node_reason)
    return bool(codes) and all(code in ROOM_CANNOT_FIX for code in codes)
