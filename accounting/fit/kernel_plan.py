"""What a fast path is handed: the plan of a pod that asks one vendor's devices
(``FitPlan``, ``fit_plan``), a node's fit from that plan and the answer from its parts, so that
services/scheduler/fit_kernel.py gives exactly ``fit_pod``'s answer.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from accounting import quota as quota_rules
from accounting import vendor_fit
from accounting.container_ask import ContainerAsk
from accounting.fit.answer import FitResult, JoinedScores, NodeFit, _answer
from accounting.fit.node_fit import _fit_node
from accounting.fit.node_state import NodeState
from accounting.fit.plan import _always_within, _PodPlan, _vendor_list, _VendorPlan
from accounting.fit.policies import BINPACK, SPREAD, node_policy_for
from accounting.fit.quota_walk import QuotaContext
from accounting.model import DeviceState, Pod
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceTables:
    """A pod's device selection and its vendor's rules as tables over a fast path's
    vocabularies (``FitPlan.device_tables``), so the fast path reads arrays instead of calling
    the plan per device."""

    type_refused: tuple[bool, ...]
    """Per (model, mode) of the vocabulary: the pod's type and mode annotations refuse such a
    device (CardTypeMismatch)."""
    rules_needed: tuple[bool, ...]
    """Per device set of the vocabulary: a node with it is fitted by the vendor's own rules
    (``accounting.vendor_fit``: MIG-mode cards, templates, topology...), not the generic walk."""
    uuid_allowed: Mapping[str, bool]
    """Per UUID the pod's annotations name (to use, or not to use): whether the pod may use
    that device (CardUuidMismatch otherwise)."""
    unlisted_uuid_allowed: bool
    """Whether the pod may use a device whose UUID it does not name (false when it lists the
    only UUIDs it may use)."""


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
    def kernel_may_fit(self) -> bool:
        """Whether a fast path may fit the pod: it tries every node's devices in the order
        precomputed for all pods, refuses no card for being busy and takes the first cards that
        pass. False for a pod whose GPU policy names mutex (idle cards only) or, for NVIDIA
        cards, topology-aware (a choice among all that pass), or whose own device order
        differs (a policy chain not led by binpack or spread, nvidia.com/numa-bind, its
        hami.io/device-scoring-weights): the reference fit places it, node by node."""
        return (
            self._plan.default_order
            and not self._plan.mutex
            and not self._vendor_plan.by_topology
        )

    @property
    def quota_room(self) -> quota_rules.QuotaRoom | None:
        """What the namespace quota leaves the pod; None when no limit could refuse."""
        return self._vendor_plan.quota_room

    @property
    def selects_devices(self) -> bool:
        """The pod names devices by type, mode or UUID (``device_tables`` says which)."""
        return self._vendor_plan.device_filter is not None

    def device_tables(
        self,
        *,
        kinds: Sequence[tuple[str, str]],
        signatures: Sequence[Sequence[DeviceState]],
    ) -> DeviceTables:
        """What the plan decides of the devices a fast path lays out by vocabulary: for each
        (model, mode) of ``kinds``, for each device set of ``signatures`` (a node's devices:
        only their vendors and modes are read), and for every UUID the pod names. The fast
        path reads these tables and calls nothing back."""
        chosen = self._vendor_plan.device_filter
        spec = self._vendor_plan.spec
        rules_needed = tuple(vendor_fit.needs_rules(spec, devices) for devices in signatures)
        if chosen is None:
            return DeviceTables(
                type_refused=(False,) * len(kinds),
                rules_needed=rules_needed,
                uuid_allowed=MappingProxyType({}),
                unlisted_uuid_allowed=True,
            )
        listed = frozenset().union(*chosen.use_uuids, chosen.nouse_uuids)
        return DeviceTables(
            type_refused=tuple(chosen.type_refused(model, mode) for model, mode in kinds),
            rules_needed=rules_needed,
            uuid_allowed=MappingProxyType(
                {uuid: not chosen.uuid_refused(uuid) for uuid in sorted(listed)}
            ),
            unlisted_uuid_allowed=not chosen.use_uuids,
        )

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


def answer_from_columns(
    plan: FitPlan,
    *,
    node_count: int,
    scores: Mapping[str, float],
    best: NodeState | None,
    failed: Mapping[str, str],
    unfitted: Sequence[NodeState],
) -> FitResult | None:
    """``fit_pod``'s answer from a fast path's verdicts over ``node_count`` candidates: the
    nodes it found fit with their scores (``scores``, taken as they are), the one of them
    ``fit_pod`` prefers (``best``), the reasons of those it refused (``failed``), and the nodes
    it left to the reference fit (``unfitted``), which are fitted here. The node chosen among
    ``best`` and the reference fit's is fitted here too, for its grants. None when the
    reference fit refuses ``best``: the fast path and the reference disagree.
    """
    reference = [_fit_node(plan._plan, node) for node in unfitted]
    refused = dict(failed)
    extra: dict[str, float] = {}
    # fit_pod's choice: binpack the highest node score, spread the lowest, ties the smaller
    # name; the fast path's best first, then the reference fit's nodes.
    contenders: list[tuple[float, str, NodeFit | None]] = []
    if best is not None:
        contenders.append((best.score, best.node_name, None))
    for fitted in reference:
        if fitted.fits:
            extra[fitted.node_name] = fitted.score
            contenders.append((fitted.score, fitted.node_name, fitted))
        else:
            refused[fitted.node_name] = fitted.reason
    joined = JoinedScores(scores, extra) if extra else scores
    if not contenders:
        return fitted_answer(plan, node_count, None, refused, joined)
    sign = -1.0 if plan.node_policy == BINPACK else 1.0
    _, _, placed = min(contenders, key=lambda c: (sign * c[0], c[1]))
    if placed is None:
        assert best is not None
        placed = _fit_node(plan._plan, best)
        if not placed.fits:
            return None
    return fitted_answer(plan, node_count, placed, refused, joined)
