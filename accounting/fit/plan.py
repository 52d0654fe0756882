"""The pod's plan: everything the fit decides about a pod before it looks at a node, built
once per pod (``_PodPlan``, one ``_VendorPlan`` per vendor asked for: asks in fitting order,
device filter, quota room, the vendor rules' asks), and whether a pod asks for a device at all.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accounting import quota as quota_rules
from accounting.annotations import GPU_POLICY_ANNOTATION
from accounting.container_ask import ContainerAsk, container_ask
from accounting.device_filter import DeviceFilter
from accounting.fit.device_order import Score, device_score, weighted_score
from accounting.fit.policies import BINPACK, _checked_policy, _names_mutex, _names_topology
from accounting.fit.quota_walk import QuotaContext
from accounting.fit.scoring_weights import DEFAULT_WEIGHTS, ScoringWeights, scoring_weights
from accounting.gpu_order import GpuOrder, gpu_order
from accounting.model import ContainerClass, Pod
from accounting.vendor_spec import VendorSpec
from accounting.vendors import NVIDIA, NVIDIA_RESOURCES, VendorResources, specs_for


@dataclass(frozen=True, slots=True)
class _VendorPlan:
    """One vendor's part of a pod's plan: its asks, filter, quota room and rules (the asks are
    the same values for the generic loop and for ``accounting.vendor_fit``)."""

    spec: VendorSpec
    vendor: VendorResources
    vendor_name: str
    """vendor.vendor, read once per node."""
    asks: tuple[ContainerAsk, ...]
    """The containers asking for the vendor's devices, in fitting order (declaration order,
    apps last)."""
    device_filter: DeviceFilter | None
    quota_room: quota_rules.QuotaRoom | None
    """What the namespace quota leaves the pod of this vendor (``quota.usage_room``); None when
    no limit could refuse anything (no quota context, or no enforced limit set)."""
    by_topology: bool = False
    """The pod's cards of this vendor are chosen by the topology-aware policy (NVIDIA's alone,
    as in HAMi): the vendors' walk places them, never the generic loop."""
    numa_groups: bool = False
    """nvidia.com/numa-bind on NVIDIA's cards: a container's cards come from one NUMA node."""


@dataclass(frozen=True, slots=True)
class _PodPlan:
    """Everything about the pod that does not depend on the node, computed once per pod."""

    pod: Pod
    vendor_plans: tuple[_VendorPlan, ...]
    """One per vendor the pod asks for, in policy order."""
    order: GpuOrder
    """The order the pod's GPU policy tries a node's devices in (accounting.gpu_order)."""
    mutex: bool = False
    """The pod's GPU policy names mutex: a card with a task on it is refused
    (ExclusiveDeviceAllocateConflict), after its time slices, as HAMi's every vendor does."""
    topology: bool = False
    """The pod's GPU policy names topology-aware: its NVIDIA cards are chosen among all that
    pass by the node's pair scores, on NVIDIA's walk (``accounting.vendor_fit``)."""
    explain_refusals: bool = True
    """False: a container that fits no card, with no quota in play, refuses the node as
    NOT_EXPLAINED instead of with the per-card count (a caller that only wants the first node
    that fits)."""
    weights: ScoringWeights = DEFAULT_WEIGHTS
    """The pod's hami.io/device-scoring-weights (1, 1, 1 without it)."""
    score: Score = device_score
    """The device score under ``weights``, which orders the node's devices for the pod."""
    # Read of the order and the weights once per pod, not per node (the placing reads them
    # for every candidate).
    gpu_binpack: bool = False
    """The pod's devices are tried busiest first (its order's first key)."""
    slides: bool = True
    """The order is by the score, ties by rank (``GpuOrder.precomputed``): after a container
    charges cards they slide into place (``_reposition``) instead of a new sort."""
    default_order: bool = True
    """The node's devices are tried in an order precomputed for every pod (binpack or spread
    by the default device score, ties by NUMA node and index, no NUMA grouping): the fast
    paths' order."""

    @property
    def asks(self) -> tuple[ContainerAsk, ...]:
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
        """The pod's plan.

        Raises:
            InvalidInputError: gpu_policy (the daemon's default) is neither binpack nor
                spread, or the pod's hami.io/device-scoring-weights annotation is malformed.
        """
        weights = scoring_weights(pod.annotations)
        annotation = pod.annotations.get(GPU_POLICY_ANNOTATION)
        walk_order = gpu_order(
            pod.annotations, _checked_policy("gpu_policy", gpu_policy) == BINPACK
        )
        topology = _names_topology(annotation)
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
                ask
                for order, position in enumerate(fitting_order)
                if (
                    ask := container_ask(
                        order=order,
                        position=position,
                        container=pod.containers[position],
                        spec=spec,
                    )
                )
                is not None
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
                    by_topology=topology and spec.rule == "nvidia",
                    numa_groups=walk_order.numa_bind and spec.vendor == NVIDIA,
                )
            )
        return cls(
            pod=pod,
            vendor_plans=tuple(plans),
            order=walk_order,
            mutex=_names_mutex(annotation),
            topology=topology,
            explain_refusals=explain_refusals,
            weights=weights,
            score=weighted_score(weights),
            gpu_binpack=walk_order.binpack,
            slides=walk_order.precomputed,
            default_order=weights.is_default and walk_order.precomputed,
        )


def _always_within(
    plan: _VendorPlan, room: quota_rules.QuotaRoom, memory_total: Sequence[int]
) -> bool:
    """Whether every placement of the pod on a node with these cards stays within the quota:
    its folded usage is at most every grant added up, each on the node's largest card. Then
    no card needs pricing (most pods, under a quota they are far from)."""
    largest = max(memory_total, default=0)
    memory = cores = devices = 0
    for ask in plan.asks:
        need = ask.memory_mib if ask.memory_mib is not None else largest * ask.memory_percent // 100
        memory += ask.count * need
        cores += ask.count * ask.core_percent
        devices += ask.count
    return room.allows(memory, cores, min(devices, len(memory_total)))


def _vendor_list(
    vendor: VendorResources, vendors: Sequence[VendorResources]
) -> Sequence[VendorResources]:
    return vendors or (vendor,)


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
