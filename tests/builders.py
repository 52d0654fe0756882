"""Fluent builders for the accounting's domain values, shared by the tests.

    PodBuilder("p").init("i1", gpu("g0", mib=20480, cores=10)).sidecar("s1", gpu("g0", mib=2048))
        .app("a1", gpu("g0", mib=10240, cores=5)).terminated("i1").phase(PodPhase.RUNNING).build()

A builder keeps spec.initContainers (regular init containers and sidecars, interleaved as
declared) apart from spec.containers, so ``build()`` always yields them in declaration order
whatever order the calls came in. Status calls accumulate: calling ``terminated("i1")`` on a
builder that already said ``running("i1")`` replaces that status, and every ``build()`` returns a
fresh immutable Pod, so one builder can walk a pod through its lifecycle step by step.
"""

from __future__ import annotations

from typing import Self

from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceUsage,
    Pod,
    PodPhase,
)
from accounting.pod import SIDECAR_RESTART_POLICY, classify_init_container
from accounting.vendors import NVIDIA

GrantOrRequest = DeviceGrant | DeviceRequest


def gpu(
    uuid: str = "g0",
    *,
    mib: int = 0,
    cores: int = 0,
    slots: int = 0,
    vendor: str = NVIDIA,
) -> DeviceGrant:
    """One device granted to a container (an entry of vgpu-devices-allocated)."""
    return DeviceGrant(uuid, vendor, mib, cores, slots)


def req(
    count: int = 1,
    *,
    mib: int = 0,
    percent: int = 0,
    cores: int = 0,
    vendor: str = NVIDIA,
) -> DeviceRequest:
    """One container's request: ``count`` devices, each with ``mib`` MiB (or ``percent`` of a
    card) and ``cores`` percent."""
    return DeviceRequest(vendor, count, mib, percent, cores)


def usage(
    uuid: str, mib: int, cores: int = 0, *, slots: int = 1, vendor: str = NVIDIA
) -> DeviceUsage:
    """An expected per-device usage entry."""
    return DeviceUsage(uuid, vendor, mib, cores, slots)


def device(
    uuid: str,
    *,
    mib: int = 24576,
    cores: int = 100,
    slots: int = 10,
    index: int = 0,
    model: str = "NVIDIA A10",
) -> Device:
    """A device of a node inventory (defaults: the single 24Gi card of the design cases,
    docs/design.md §9)."""
    return Device(uuid, model, index, slots, mib, cores)


class PodBuilder:
    """Builds a domain Pod; every method returns the builder so calls chain."""

    def __init__(
        self,
        name: str,
        *,
        namespace: str = "default",
        uid: str | None = None,
        node: str = "node1",
    ) -> None:
        self._name = name
        self._namespace = namespace
        self._uid = uid or f"uid-{namespace}-{name}"
        self._node = node
        self._init_list: list[Container] = []
        self._apps: list[Container] = []
        self._statuses: dict[str, ContainerStatus] = {}
        self._phase = PodPhase.PENDING
        self._terminating = False
        self._annotations: dict[str, str] = {}

    # -- containers --------------------------------------------------------------------------

    def init(self, name: str, *items: GrantOrRequest) -> Self:
        """A regular init container (no restartPolicy)."""
        return self.init_entry(name, None, *items)

    def sidecar(self, name: str, *items: GrantOrRequest) -> Self:
        """A native sidecar (an init container with restartPolicy Always)."""
        return self.init_entry(name, SIDECAR_RESTART_POLICY, *items)

    def init_entry(self, name: str, restart_policy: str | None, *items: GrantOrRequest) -> Self:
        """An entry of spec.initContainers, classified from its restartPolicy by the classifier
        the Kubernetes pod parser uses (every init-list entry a builder makes goes through it)."""
        self._init_list.append(_container(name, classify_init_container(restart_policy), items))
        return self

    def app(self, name: str, *items: GrantOrRequest) -> Self:
        """An entry of spec.containers."""
        self._apps.append(_container(name, ContainerClass.APP, items))
        return self

    # -- status ------------------------------------------------------------------------------

    def status(
        self, name: str, state: ContainerState, *, exit_code: int = 0, restarts: int = 0
    ) -> Self:
        """Sets (or replaces) the status of the container called ``name``."""
        self._statuses[name] = ContainerStatus(name, state, exit_code, restarts)
        return self

    def running(self, name: str, *, restarts: int = 0) -> Self:
        return self.status(name, ContainerState.RUNNING, restarts=restarts)

    def waiting(self, name: str, *, restarts: int = 0) -> Self:
        return self.status(name, ContainerState.WAITING, restarts=restarts)

    def terminated(self, name: str, exit_code: int = 0, *, restarts: int = 0) -> Self:
        return self.status(name, ContainerState.TERMINATED, exit_code=exit_code, restarts=restarts)

    def forget_status(self, name: str) -> Self:
        """Drops a container's status (the kubelet has not reported it)."""
        self._statuses.pop(name, None)
        return self

    def phase(self, phase: PodPhase) -> Self:
        self._phase = phase
        return self

    def terminating(self, terminating: bool = True) -> Self:
        """metadata.deletionTimestamp is set."""
        self._terminating = terminating
        return self

    def on_node(self, node: str) -> Self:
        self._node = node
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._annotations[key] = value
        return self

    # -- result ------------------------------------------------------------------------------

    def build(self) -> Pod:
        """A fresh immutable Pod: spec.initContainers first, then spec.containers."""
        app_names = {c.name for c in self._apps}
        init_statuses = tuple(s for n, s in self._statuses.items() if n not in app_names)
        app_statuses = tuple(s for n, s in self._statuses.items() if n in app_names)
        return Pod(
            uid=self._uid,
            namespace=self._namespace,
            name=self._name,
            containers=(*self._init_list, *self._apps),
            phase=self._phase,
            init_container_statuses=init_statuses,
            container_statuses=app_statuses,
            node_name=self._node,
            annotations=dict(self._annotations),
            terminating=self._terminating,
        )


def _container(
    name: str, container_class: ContainerClass, items: tuple[GrantOrRequest, ...]
) -> Container:
    grants = tuple(i for i in items if isinstance(i, DeviceGrant))
    requests = tuple(i for i in items if isinstance(i, DeviceRequest))
    return Container(name, container_class, requests, grants)
