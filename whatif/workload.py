"""The workload a what-if replays: pods with their timing, the node pool, namespace quotas.

Layer: the what-if simulator (accounting and the standard library only). Times are whole
seconds from the start of the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from accounting.kube.node_json import NodeRegistration
from accounting.model import ContainerClass, Pod

DEFAULT_INIT_RUN_S = 30
"""How long a regular init container runs when the input does not record it."""


@dataclass(frozen=True, slots=True)
class ReplayPod:
    """One pod of the workload and how long its containers run."""

    pod: Pod
    """As declared: container classes and requests (grants and node are the replay's)."""
    arrival_s: int
    """When the pod is created."""
    init_run_s: tuple[int, ...]
    """How long each regular init container runs, in declaration order (one per container of
    class INIT; sidecars start at once and run for the pod's life)."""
    app_run_s: int | None
    """How long the apps run once the init containers are done; None: until the window ends."""

    def __post_init__(self) -> None:
        regular = sum(1 for c in self.pod.containers if c.container_class is ContainerClass.INIT)
        if len(self.init_run_s) != regular:
            raise ValueError(
                f"pod {self.pod.key}: {len(self.init_run_s)} init run times for {regular} "
                "regular init containers"
            )
        if self.arrival_s < 0 or any(s < 0 for s in self.init_run_s):
            raise ValueError(f"pod {self.pod.key}: negative time")
        if self.app_run_s is not None and self.app_run_s < 0:
            raise ValueError(f"pod {self.pod.key}: negative app run time")


def _frozen(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(values))


def _frozen_quotas(values: Mapping[str, Mapping[str, int]]) -> Mapping[str, Mapping[str, int]]:
    return MappingProxyType({ns: _frozen(limits) for ns, limits in values.items()})


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything a replay needs; the same value is replayed under every rule."""

    pods: tuple[ReplayPod, ...]
    """In arrival order (ties keep the input order)."""
    nodes: tuple[NodeRegistration, ...]
    window_s: int
    """The replay ends here: apps without an end run until then, later events never happen."""
    quotas: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: _frozen_quotas({}))
    """namespace -> resource name (nvidia.com/gpumem, ...) -> limit."""
    skipped: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    """What the input held that is not replayed, counted by what it was."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", _frozen_quotas(self.quotas))
        object.__setattr__(self, "skipped", _frozen(self.skipped))
        if self.window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s}")
        arrivals = [p.arrival_s for p in self.pods]
        if arrivals != sorted(arrivals):
            raise ValueError("pods must be in arrival order")
        names = [n.node_name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
