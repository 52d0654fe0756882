"""Hypothesis strategies for the accounting's domain values, shared by the property tests.

Pods are drawn as Kubernetes declares them: spec.initContainers (regular init containers and
sidecars in any interleaving) then spec.containers, with grants on a few shared device UUIDs so
that containers collide on a device often.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    DeviceRequest,
    Pod,
    PodPhase,
)
from accounting.pod import EffectiveRequest
from accounting.vendors import NVIDIA

UUIDS = ("g0", "g1", "g2")
NAMESPACES = ("ns-a", "ns-b")
NODES = ("node1", "node2")
INIT_LIST_CLASSES = (ContainerClass.INIT, ContainerClass.SIDECAR)

MAX_MEMORY_MIB = 81920


GRANTS: st.SearchStrategy[DeviceGrant] = st.builds(
    DeviceGrant,
    uuid=st.sampled_from(UUIDS),
    vendor=st.just(NVIDIA),
    memory_mib=st.integers(0, MAX_MEMORY_MIB),
    core_percent=st.integers(0, 100),
    slots=st.integers(0, 2),
)

REQUESTS: st.SearchStrategy[DeviceRequest] = st.builds(
    DeviceRequest,
    vendor=st.just(NVIDIA),
    count=st.integers(0, 4),
    memory_mib=st.integers(0, MAX_MEMORY_MIB),
    memory_percent=st.integers(0, 100),
    core_percent=st.integers(0, 100),
)

# Built once: constructing strategies inside a draw makes Hypothesis re-validate them each time.
_GRANT_LISTS = st.lists(GRANTS, max_size=2).map(tuple)
_REQUEST_LISTS = st.lists(REQUESTS, max_size=1).map(tuple)
_CLASSES = st.sampled_from(list(ContainerClass))


def containers(
    container_class: ContainerClass | None = None, name: str = "extra"
) -> st.SearchStrategy[Container]:
    """One container with up to two grants and at most one NVIDIA request."""
    return st.builds(
        Container,
        st.just(name),
        st.just(container_class) if container_class else _CLASSES,
        _REQUEST_LISTS,
        _GRANT_LISTS,
    )


@st.composite
def container_lists(
    draw: st.DrawFn,
    *,
    init_classes: tuple[ContainerClass, ...] = INIT_LIST_CLASSES,
    max_init: int = 4,
    min_apps: int = 0,
    max_apps: int = 3,
) -> tuple[Container, ...]:
    """Containers in declaration order: the init list first, then the apps."""
    kinds: list[ContainerClass] = []
    if init_classes:
        kinds = draw(st.lists(st.sampled_from(init_classes), max_size=max_init))
    kinds += [ContainerClass.APP] * draw(st.integers(min_apps, max_apps))
    return tuple(
        Container(f"c{index}", kind, draw(_REQUEST_LISTS), draw(_GRANT_LISTS))
        for index, kind in enumerate(kinds)
    )


_NAMESPACE_CHOICES = st.sampled_from(NAMESPACES)
_NODE_CHOICES = st.sampled_from(NODES)


@st.composite
def pods(
    draw: st.DrawFn,
    *,
    uid: str = "uid-p",
    init_classes: tuple[ContainerClass, ...] = INIT_LIST_CLASSES,
    min_apps: int = 0,
) -> Pod:
    return Pod(
        uid=uid,
        namespace=draw(_NAMESPACE_CHOICES),
        name=uid.removeprefix("uid-"),
        containers=draw(container_lists(init_classes=init_classes, min_apps=min_apps)),
        node_name=draw(_NODE_CHOICES),
    )


def init_container_count(pod: Pod) -> int:
    return sum(c.container_class is not ContainerClass.APP for c in pod.containers)


_MISSING = None
_WAITING = (ContainerState.WAITING, 0)
_RUNNING = (ContainerState.RUNNING, 0)
_EXIT_0 = (ContainerState.TERMINATED, 0)
_EXIT_1 = (ContainerState.TERMINATED, 1)
_ANY_STATE = st.sampled_from([_MISSING, _WAITING, _RUNNING, _EXIT_0, _EXIT_1])
_CURRENT_INIT_STATE = st.sampled_from([_MISSING, _WAITING, _RUNNING, _EXIT_1])
_PHASES = st.sampled_from(
    [PodPhase.PENDING, PodPhase.RUNNING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED]
)
_RESTARTS = st.integers(0, 2)


@st.composite
def status_updates(draw: st.DrawFn, pod: Pod) -> Pod:
    """The same pod at a random point of its life.

    Mostly an ordered progression (the regular init containers before a drawn stage exited 0,
    the one at the stage is waiting, running, failed or not reported yet, later ones are not
    reported), sometimes an arbitrary mix; sidecars in any state, crash-loop exit-0 gaps
    included; any phase, terminal ones included; sometimes terminating.
    """
    regular = [c.name for c in pod.containers if c.container_class is ContainerClass.INIT]
    ordered = draw(st.integers(0, 3)) > 0
    stage = draw(st.integers(0, len(regular)))
    statuses: list[ContainerStatus] = []
    for container in pod.containers:
        if container.container_class is ContainerClass.APP:
            continue
        if container.container_class is ContainerClass.SIDECAR or not ordered:
            state = draw(_ANY_STATE)
        else:
            position = regular.index(container.name)
            if position < stage:
                state = _EXIT_0
            elif position == stage:
                state = draw(_CURRENT_INIT_STATE)
            else:
                state = _MISSING
        if state is not None:
            statuses.append(ContainerStatus(container.name, state[0], state[1], draw(_RESTARTS)))
    return replace(
        pod,
        phase=draw(_PHASES),
        init_container_statuses=tuple(statuses),
        terminating=draw(st.integers(0, 4)) == 0,
    )


@dataclass(frozen=True)
class Operation:
    action: str
    """"record" an update, "reserve" the pod on its node, or "forget" it (deletion)."""
    pod: Pod


_ACTIONS = st.sampled_from(["record", "record", "record", "reserve", "forget"])


@st.composite
def ledger_scripts(draw: st.DrawFn) -> list[Operation]:
    """A few pods and a random sequence of updates, reservations and deletions of them."""
    templates = [draw(pods(uid=f"uid-{index}")) for index in range(draw(st.integers(1, 3)))]
    operations: list[Operation] = []
    for _ in range(draw(st.integers(1, 12))):
        template = draw(st.sampled_from(templates))
        action = draw(_ACTIONS)
        pod = draw(status_updates(template)) if action == "record" else template
        operations.append(Operation(action, pod))
    return operations


def effective_requests() -> st.SearchStrategy[EffectiveRequest]:
    return st.builds(
        EffectiveRequest,
        vendor=st.just(NVIDIA),
        count=st.integers(0, 8),
        memory_mib=st.integers(0, 4 * MAX_MEMORY_MIB),
        core_percent=st.integers(0, 800),
        memory_sized_at_scheduling=st.booleans(),
    )


@st.composite
def smaller_requests(draw: st.DrawFn, request: EffectiveRequest) -> EffectiveRequest:
    """A request no larger than ``request`` in every dimension."""
    return replace(
        request,
        count=draw(st.integers(0, request.count)),
        memory_mib=draw(st.integers(0, request.memory_mib)),
        core_percent=draw(st.integers(0, request.core_percent)),
    )
