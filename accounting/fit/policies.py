"""The two node policies, binpack and spread, and how a pod's annotation chooses one (the
nodes that fit are ordered by it), and the mutex GPU policy (a filter of cards; how the GPU
policy orders a node's devices is accounting.gpu_order).

Layer: accounting (pure).
"""

from __future__ import annotations

from accounting.annotations import NODE_POLICY_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.model import Pod

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)


MUTEX = "mutex"
"""The GPU policy that gives a pod idle cards only (a filter, not an order): HAMi reads it in
any place of a comma-separated hami.io/gpu-scheduler-policy, each item trimmed."""


def _names_mutex(annotation: str | None) -> bool:
    """Whether the pod's GPU policy annotation names ``mutex`` (HAMi's ``PolicyContains``)."""
    return annotation is not None and any(
        part.strip() == MUTEX for part in annotation.split(",")
    )


TOPOLOGY_AWARE = "topology-aware"
"""The GPU policy that chooses a pod's NVIDIA cards by the node's pair scores (a choice among
the cards that pass, not an order), named as mutex is."""


def _names_topology(annotation: str | None) -> bool:
    """Whether the pod's GPU policy annotation names ``topology-aware`` (``PolicyContains``)."""
    return annotation is not None and any(
        part.strip() == TOPOLOGY_AWARE for part in annotation.split(",")
    )


def _checked_policy(name: str, value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in POLICIES:
        raise InvalidInputError.single(name, f"must be one of {', '.join(POLICIES)}, got {value!r}")
    return lowered


def node_policy_for(pod: Pod, node_policy: str = BINPACK) -> str:
    """The node policy fit_pod applies to the pod: ``node_policy`` without a
    hami.io/node-scheduler-policy annotation; with one, spread when it is exactly ``spread``
    and binpack for any other value (HAMi's NodeScoreList: a chain, another case or an unknown
    word is binpack there too).

    Raises:
        InvalidInputError: node_policy is neither binpack nor spread.
    """
    default = _checked_policy("node_policy", node_policy)
    annotation = pod.annotations.get(NODE_POLICY_ANNOTATION)
    if annotation is None:
        return default
    return SPREAD if annotation == SPREAD else BINPACK


def node_order_key(score: float, node_name: str, node_policy: str) -> tuple[float, str]:
    """fit_pod's preference among nodes that fit, as a sort key (smallest is chosen): binpack
    the highest node score (NodeState.score), spread the lowest, equal scores the smaller node
    name."""
    return (-score if node_policy == BINPACK else score, node_name)
