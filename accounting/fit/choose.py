"""Choosing the node: ``fit_pod`` fits the pod on every candidate and picks one by the node
policy, with every refused node's reason.

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting.fit.answer import FitResult, _answer, no_device_asked
from accounting.fit.grants import _grants, _NodePlacement
from accounting.fit.node_score import placed_node_score
from accounting.fit.node_state import NodeState
from accounting.fit.place import _place
from accounting.fit.plan import _PodPlan, _vendor_list
from accounting.fit.policies import BINPACK, SPREAD, node_policy_for
from accounting.fit.quota_walk import QuotaContext
from accounting.model import Pod
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


def fit_pod(
    pod: Pod,
    nodes: Sequence[NodeState],
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    node_policy: str = BINPACK,
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> FitResult:
    """Chooses a node and its devices for a pod (HAMi's Filter, without side effects).

    Every node is tried. Among those that fit, binpack takes the highest node score (the
    busiest node, with a vendor's term for the cards the pod would take: ``node_score``) and
    spread the lowest; equal scores go to the smaller node name, so the
    answer does not depend on the order of ``nodes``. The pod's hami.io/node-scheduler-policy
    and hami.io/gpu-scheduler-policy annotations win over the arguments.

    Raises:
        InvalidInputError: a policy argument is neither binpack nor spread.
    """
    node_policy = node_policy_for(pod, node_policy)
    plan = _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota)
    if not plan.vendor_plans:
        return no_device_asked(pod, _devices_of(_vendor_list(vendor, vendors)))
    failed: dict[str, str] = {}
    scores: dict[str, float] = {}
    # Minimising (sign × score, name): binpack maximises the score, spread minimises it.
    sign = -1.0 if node_policy == BINPACK else 1.0
    best_key = 0.0
    best_name = ""
    best_node: NodeState | None = None
    best_placement: _NodePlacement | None = None
    for node in nodes:
        columns = node._columns
        placement = _place(plan, columns)
        name = node.node_name
        if isinstance(placement, str):
            failed[name] = placement
            continue
        score = scores[name] = placed_node_score(plan, columns, placement)
        key = sign * score
        if best_node is None or key < best_key or (key == best_key and name < best_name):
            best_key, best_name, best_node, best_placement = key, name, node, placement

    if best_node is None or best_placement is None:
        return _answer(pod, node_policy, len(nodes), None, failed, scores)
    columns = best_node._columns
    chosen = (best_node.node_name, _grants(plan, columns, best_placement), scores[best_name])
    return _answer(pod, node_policy, len(nodes), chosen, failed, scores)


def _devices_of(vendors: Sequence[VendorResources]) -> str:
    if len(vendors) == 1:
        return f"{vendors[0].vendor} device"
    return "device of " + ", ".join(v.vendor for v in vendors)
