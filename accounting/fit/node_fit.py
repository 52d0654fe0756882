"""One pod on one node at a time: ``fit_node`` and the lazy ``fit_nodes`` (the pod's plan built
once), each answering a ``NodeFit`` with the grants and usage.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from accounting.fit.answer import NodeFit
from accounting.fit.grants import _grants, placement_usage
from accounting.fit.node_score import placed_node_score
from accounting.fit.node_state import NodeState
from accounting.fit.place import _place
from accounting.fit.plan import _PodPlan, _vendor_list
from accounting.fit.policies import SPREAD
from accounting.fit.quota_walk import QuotaContext
from accounting.model import DeviceGrant, Pod
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


def _fit_node(plan: _PodPlan, node: NodeState) -> NodeFit:
    columns = node._columns
    no_grants: tuple[tuple[DeviceGrant, ...], ...] = ((),) * len(plan.pod.containers)
    placement = _place(plan, columns)
    if isinstance(placement, str):
        return NodeFit(node.node_name, False, placement, columns.node_score, no_grants, ())
    grants = _grants(plan, columns, placement)
    return NodeFit(
        node.node_name,
        True,
        "",
        placed_node_score(plan, columns, placement),
        grants,
        placement_usage(plan.pod, grants),
    )


def fit_node(
    pod: Pod,
    node: NodeState,
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> NodeFit:
    """Fits a pod on one node: its grants per container and the usage it would add there.

    Args:
        pod: containers in declaration order with their class and requests.
        node: the node's devices with their current usage.
        vendor: whose requests to fit when ``vendors`` is empty (NVIDIA's by default).
        vendors: the policy's vendors: every one the pod asks for is placed, on its own
            devices, with the rules of its vendor table entry.
        gpu_policy: binpack (busiest card first) or spread (least busy first); the pod's
            hami.io/gpu-scheduler-policy annotation wins when it names one of them.
        quota: the pod's namespace quota, checked per candidate card when given.

    Raises:
        InvalidInputError: gpu_policy is neither binpack nor spread, or a vendor is not in the
            vendor table.
    """
    return _fit_node(
        _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota), node
    )


def fit_nodes(
    pod: Pod,
    nodes: Iterable[NodeState],
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
    explain_refusals: bool = True,
) -> Iterator[NodeFit]:
    """``fit_node`` for each node in turn, lazily, with the pod's plan built once.

    A caller that walks the nodes in ``node_order_key`` order and stops at the first fit gets
    fit_pod's choice without fitting the nodes after it (what-if replays do this). Such a
    caller may pass ``explain_refusals=False``: a node where a container fits no card, and no
    quota could have refused one, is then refused as NOT_EXPLAINED instead of with the
    per-card count, which costs more than the fit itself; every other answer is fit_node's
    (a quota refusal is always named).

    Raises:
        InvalidInputError: gpu_policy is neither binpack nor spread (before the first node).
    """
    plan = _PodPlan.build(
        pod, _vendor_list(vendor, vendors), gpu_policy, quota, explain_refusals
    )
    return (_fit_node(plan, node) for node in nodes)
