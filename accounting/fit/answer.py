"""What the fit answers: one node's fit (``NodeFit``), the answer over candidate nodes
(``FitResult``), and the one place that answer is written (``_answer``, ``no_device_asked``).

Layer: accounting (pure).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from accounting.model import DeviceGrant, DeviceUsage, Pod
from accounting.reasons import NO_GPU_REQUEST, NO_NODE_FITS, SCHEDULED


@dataclass(frozen=True, slots=True)
class NodeFit:
    """Whether a pod fits one node, and how."""

    node_name: str
    fits: bool
    reason: str
    """"" when the pod fits; else the first container (in fitting order) that does not fit,
    per device as HAMi words it ("1/4 AllocatedCardsInsufficientRequest, 3/4
    ResourceQuotaNotFit"), or NodeInsufficientDevice."""
    score: float
    """The node score before the pod is added (HAMi's ComputeDefaultScore), plus, when the pod
    fits, a vendor's term for the cards it takes (``accounting.fit.node_score``)."""
    grants: tuple[tuple[DeviceGrant, ...], ...]
    """One tuple per container position, in declaration order; () for a GPU-less container or
    when the pod does not fit."""
    usage: tuple[DeviceUsage, ...]
    """Merged per-UUID usage this pod adds (max of steady and every init point), sorted by
    UUID; () when the pod does not fit."""


@dataclass(frozen=True, slots=True)
class FitResult:
    """The scheduler's answer for one pod over candidate nodes."""

    node_name: str | None
    """The chosen node; None when no node fits or the pod asks for no device."""
    grants: tuple[tuple[DeviceGrant, ...], ...]
    """The chosen node's grants, one tuple per container position (all () without a node)."""
    failed_nodes: Mapping[str, str]
    """Node name -> reason for every node that does not fit, sorted by node name."""
    scores: Mapping[str, float]
    """Node name -> node score, for every node that fits."""
    reason: str
    """Scheduled, NoGpuRequest or NoNodeFits."""
    message: str


def _answer(
    pod: Pod,
    node_policy: str,
    node_count: int,
    chosen: tuple[str, tuple[tuple[DeviceGrant, ...], ...], float] | None,
    failed: Mapping[str, str],
    scores: Mapping[str, float],
) -> FitResult:
    """The one place fit_pod's answer is written: ``chosen`` is (node, grants, score). A
    ``scores`` mapping that is not a dict is taken as it is (read-only, as a fast path's)."""
    # Sorted by name, like the choice itself, so the answer is the same for any node order.
    failed = dict(sorted(failed.items()))
    if isinstance(scores, dict):
        scores = MappingProxyType(dict(scores))
    if chosen is None:
        details = "; ".join(f"{name}: {reason}" for name, reason in failed.items())
        return FitResult(
            None,
            ((),) * len(pod.containers),
            MappingProxyType(failed),
            scores,
            NO_NODE_FITS,
            f"0/{node_count} nodes fit" + (f": {details}" if details else ""),
        )
    name, grants, score = chosen
    return FitResult(
        name,
        grants,
        MappingProxyType(failed),
        scores,
        SCHEDULED,
        f"{len(scores)}/{node_count} nodes fit; {node_policy} chose {name} (score {score:.2f})",
    )


def no_device_asked(pod: Pod, what: str = "device") -> FitResult:
    """The answer for a pod that asks for no ``what``: no node chosen, and any node fits."""
    return FitResult(
        None,
        ((),) * len(pod.containers),
        MappingProxyType({}),
        MappingProxyType({}),
        NO_GPU_REQUEST,
        f"pod {pod.key} asks for no {what}: any node fits",
    )


class JoinedScores(Mapping[str, float]):
    """Node name -> score over two parts with no node in common, read as one mapping without
    copying either: a fast path's own scores (taken as it gives them) and those of the nodes the
    reference fit fitted beside it (``answer_from_columns``)."""

    __slots__ = ("first", "second")

    def __init__(self, first: Mapping[str, float], second: Mapping[str, float]) -> None:
        self.first = first
        """The fast path's scores, as it gave them."""
        self.second = second
        """The reference fit's scores."""

    def __getitem__(self, name: str) -> float:
        if name in self.second:
            return self.second[name]
        return self.first[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.first
        yield from self.second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)
