"""The two policies of the fit, binpack and spread, and how a pod's annotations choose them:
the GPU policy orders a node's devices, the node policy orders the nodes that fit.

Layer: accounting (pure).
"""

from __future__ import annotations

from accounting.annotations import NODE_POLICY_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.model import Pod

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)


def _resolve_policy(annotation: str | None, default: str) -> str:
    """The pod's annotation wins when it names a known policy (first entry of a HAMi chain such
    as "binpack,numa"); anything else falls back to the configured policy."""
    if annotation is not None:
        chosen = annotation.split(",", 1)[0].strip().lower()
        if chosen in POLICIES:
            return chosen
    return default


MUTEX = "mutex"
"""The GPU policy that gives a pod idle cards only (a filter, not an order): HAMi reads it in
any place of a comma-separated hami.io/gpu-scheduler-policy, each item trimmed."""


def _names_mutex(annotation: str | None) -> bool:
    """Whether the pod's GPU policy annotation names ``mutex`` (HAMi's ``PolicyContains``)."""
    return annotation is not None and any(
        part.strip() == MUTEX for part in annotation.split(",")
    )


def _checked_policy(name: str, value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in POLICIES:
        raise InvalidInputError.single(name, f"must be one of {', '.join(POLICIES)}, got {value!r}")
    return lowered


def node_policy_for(pod: Pod, node_policy: str = BINPACK) -> str:
    """The node policy fit_pod applies to the pod: its hami.io/node-scheduler-policy
    annotation when it names one, else ``node_policy``.

    Raises:
        InvalidInputError: node_policy is neither binpack nor spread.
    """
    return _resolve_policy(
        pod.annotations.get(NODE_POLICY_ANNOTATION), _checked_policy("node_policy", node_policy)
    )


def node_order_key(score: float, node_name: str, node_policy: str) -> tuple[float, str]:
    """fit_pod's preference among nodes that fit, as a sort key (smallest is chosen): binpack
    the highest node score (NodeState.score), spread the lowest, equal scores the smaller node
    name."""
    return (-score if node_policy == BINPACK else score, node_name)
