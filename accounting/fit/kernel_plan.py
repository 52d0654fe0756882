"""What a fast path is handed: the plan of a pod that asks one vendor's devices
(``FitPlan``, ``fit_plan``), a node's fit from that plan and the answer from its parts, so that
services/scheduler/fit_kernel.py gives exactly ``fit_pod``'s answer.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from accounting import quota as quota_rules
from accounting import vendor_fit
from accounting.container_ask import ContainerAsk
from accounting.fit.answer import FitResult, NodeFit, _answer
from accounting.fit.node_fit import _fit_node
from accounting.fit.node_state import NodeState
from accounting.fit.plan import _always_within, _PodPlan, _vendor_list, _VendorPlan
from accounting.fit.policies import BINPACK, SPREAD, node_policy_for
from accounting.fit.quota_walk import QuotaContext
from accounting.model import DeviceState, Pod
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


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
    """In fitting order (declaration order, app containers last): the same values the
    reference fit walks."""

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
    return FitPlan(_plan=plan, _vendor_plan=only, node_policy=chosen_node_policy, asks=only.asks)


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
