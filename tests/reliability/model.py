"""Pod scenarios, an independent reference model of the recorder, and the messages that carry
them — shared by the model-based, crash and load tests.

Nothing here imports ``accounting.pod`` or ``accounting.lifecycle``: the reference is written
from the rules of docs/design.md (§2.2 and §3), so a mistake in the implementation cannot hide
in the expectation.

* ``PodSpec``: containers in declaration order (regular init and sidecars interleaved, then
  apps), each with its grants on the node's devices.
* ``timeline``: the statuses the kubelet would report over the pod's life, in order: regular
  init containers one at a time (some failing and restarting first), then the apps, sometimes a
  sidecar crash-loop gap, sometimes a re-created sandbox that runs the init containers again
  (restart counts grow), sometimes a terminal phase.
* ``ReferencePod``: what the recorder must store after each status it is shown, in any order.
* ``pod_message`` / ``pod_json``: the same pod as the typed message or Kubernetes Pod JSON.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami.accounting.v1 import types_pb2

INIT, SIDECAR, APP = "init", "sidecar", "app"
RUNNING, WAITING, TERMINATED = "running", "waiting", "terminated"
PENDING, POD_RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
TERMINAL_PHASES = (SUCCEEDED, FAILED)
VENDOR = "NVIDIA"

MEMORY, CORES, COUNT = "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpu"
QUOTA_KEYS = {
    "limits.nvidia.com/gpumem": MEMORY,
    "limits.nvidia.com/gpucores": CORES,
    "limits.nvidia.com/gpu": COUNT,
}

Vector = tuple[int, int, int]
"""(memory MiB, core percent, slots) on one device."""
Usage = dict[str, Vector]
"""device UUID -> Vector."""


class Chooser(Protocol):
    """Where the random choices come from: ``random.Random`` or a Hypothesis draw."""

    def integer(self, low: int, high: int) -> int: ...

    def boolean(self, percent_true: int = 50) -> bool: ...


class RandomChooser:
    """Choices from a seeded ``random.Random`` (crash and load tests)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def boolean(self, percent_true: int = 50) -> bool:
        return self.rng.randrange(100) < percent_true


# -- the pod -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantSpec:
    uuid: str
    memory_mib: int
    core_percent: int
    slots: int = 0
    """0 or 1: a raw grant (one slot); more: a collapsed entry written with its slot count."""


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    kind: str
    grants: tuple[GrantSpec, ...] = ()


@dataclass(frozen=True)
class PodSpec:
    uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerSpec, ...]
    """Declaration order: spec.initContainers (init and sidecars), then spec.containers."""

    @property
    def regular_inits(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.containers if c.kind == INIT)

    @property
    def init_list(self) -> tuple[ContainerSpec, ...]:
        return tuple(c for c in self.containers if c.kind != APP)

    @property
    def apps(self) -> tuple[ContainerSpec, ...]:
        return tuple(c for c in self.containers if c.kind == APP)

    @property
    def has_grants(self) -> bool:
        return any(c.grants for c in self.containers)


def random_pod(
    choose: Chooser, uid: str, namespace: str, node: str, uuids: Sequence[str]
) -> PodSpec:
    """A pod with 0-3 entries in spec.initContainers (each a sidecar or a regular init) and 1-2
    apps, each container holding 0-2 grants on distinct devices of ``uuids``."""
    containers: list[ContainerSpec] = []
    for index in range(choose.integer(0, 3)):
        kind = SIDECAR if choose.boolean(40) else INIT
        containers.append(ContainerSpec(f"{kind[0]}{index}", kind, _grants(choose, uuids)))
    for index in range(choose.integer(1, 2)):
        containers.append(ContainerSpec(f"app{index}", APP, _grants(choose, uuids)))
    return PodSpec(uid, namespace, f"pod-{uid}", node, tuple(containers))


def _grants(choose: Chooser, uuids: Sequence[str]) -> tuple[GrantSpec, ...]:
    count = choose.integer(0, min(2, len(uuids)))
    first = choose.integer(0, len(uuids) - 1)
    return tuple(
        GrantSpec(
            uuids[(first + offset) % len(uuids)],
            # At least 1 GiB: a container asks in MiB for what it is given (what HAMi grants),
            # and nothing asks for 0 MiB (the recorder charges at least the request).
            memory_mib=choose.integer(1, 12) * 1024,
            core_percent=choose.integer(0, 10) * 10,
            slots=choose.integer(0, 2),
        )
        for offset in range(count)
    )


# -- statuses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """One container status: state, exit code when terminated, restart count."""

    name: str
    state: str
    exit_code: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class Snapshot:
    """One pod status as the kubelet reports it."""

    phase: str
    init_statuses: tuple[Status, ...] = ()
    app_statuses: tuple[Status, ...] = ()


def timeline(choose: Chooser, pod: PodSpec) -> tuple[Snapshot, ...]:
    """Statuses over the pod's life, oldest first, as the kubelet would report them."""
    regular = pod.regular_inits
    init_list = pod.init_list
    restarts = {c.name: 0 for c in pod.containers}
    snapshots: list[Snapshot] = []

    def snap(
        phase: str, done: int, current: Status | None, *, sidecar_gap: str | None = None
    ) -> Snapshot:
        # Regular inits before `done` finished; the one at `done` is `current`; later ones wait.
        # Sidecars declared before the running regular init (all of them once done) run.
        statuses: list[Status] = []
        seen_regular = 0
        started = True
        for container in init_list:
            name = container.name
            if container.kind == INIT:
                if seen_regular < done:
                    statuses.append(Status(name, TERMINATED, 0, restarts[name]))
                elif seen_regular == done and current is not None:
                    statuses.append(current)
                    started = False
                else:
                    statuses.append(Status(name, WAITING, 0, restarts[name]))
                    started = False
                seen_regular += 1
            elif name == sidecar_gap:
                # A crash-looping sidecar between two runs: terminated with exit code 0.
                statuses.append(Status(name, TERMINATED, 0, restarts[name]))
            else:
                statuses.append(Status(name, RUNNING if started else WAITING, 0, restarts[name]))
        apps_running = phase == POD_RUNNING
        apps = tuple(
            Status(c.name, RUNNING if apps_running else WAITING, 0, restarts[c.name])
            for c in pod.apps
        )
        return Snapshot(phase, tuple(statuses), apps)

    if choose.boolean(50):
        snapshots.append(Snapshot(PENDING))  # scheduled, the kubelet has not reported yet
    cycles = 2 if regular and choose.boolean(25) else 1
    for cycle in range(cycles):
        if cycle:
            # A re-created sandbox: the kubelet runs every init container again.
            for container in init_list:
                restarts[container.name] += 1
        for done, name in enumerate(regular):
            snapshots.append(snap(PENDING, done, Status(name, RUNNING, 0, restarts[name])))
            for _ in range(choose.integer(0, 2) if choose.boolean(30) else 0):
                failed = Status(name, TERMINATED, choose.integer(1, 255), restarts[name])
                snapshots.append(snap(PENDING, done, failed))
                if choose.boolean(15):
                    # restartPolicy Never: the pod fails for good.
                    snapshots.append(snap(FAILED, done, failed))
                    return tuple(snapshots)
                restarts[name] += 1
                snapshots.append(
                    snap(PENDING, done, Status(name, WAITING, 0, restarts[name]))
                )
            if choose.boolean(50):
                # The moment between two init containers.
                finished = Status(name, TERMINATED, 0, restarts[name])
                snapshots.append(snap(PENDING, done, finished))
        snapshots.append(snap(POD_RUNNING, len(regular), None))
        sidecars = [c.name for c in init_list if c.kind == SIDECAR]
        if sidecars and choose.boolean(30):
            gap = sidecars[choose.integer(0, len(sidecars) - 1)]
            snapshots.append(snap(POD_RUNNING, len(regular), None, sidecar_gap=gap))
            restarts[gap] += 1
            snapshots.append(snap(POD_RUNNING, len(regular), None))
    if choose.boolean(40):
        phase = SUCCEEDED if choose.boolean(50) else FAILED
        final = Snapshot(
            phase,
            tuple(Status(c.name, TERMINATED, 0, restarts[c.name]) for c in init_list),
            tuple(
                Status(c.name, TERMINATED, 0 if phase == SUCCEEDED else 1, restarts[c.name])
                for c in pod.apps
            ),
        )
        snapshots.append(final)
    return tuple(snapshots)


# -- the reference model -----------------------------------------------------------------------


def _own(container: ContainerSpec) -> Usage:
    own: Usage = {}
    for grant in container.grants:
        memory, cores, slots = own.get(grant.uuid, (0, 0, 0))
        own[grant.uuid] = (
            memory + grant.memory_mib, cores + grant.core_percent, slots + max(grant.slots, 1)
        )
    return own


def _add(a: Usage, b: Usage) -> Usage:
    total = dict(a)
    for uuid, (memory, cores, slots) in b.items():
        m, c, s = total.get(uuid, (0, 0, 0))
        total[uuid] = (m + memory, c + cores, s + slots)
    return total


def _envelope(a: Usage, b: Usage) -> Usage:
    merged = dict(a)
    for uuid, (memory, cores, slots) in b.items():
        m, c, s = merged.get(uuid, (0, 0, 0))
        merged[uuid] = (max(m, memory), max(c, cores), max(s, slots))
    return merged


def remaining_usage(pod: PodSpec, finished: int) -> Usage:
    """What the pod is charged once its first ``finished`` regular init containers are done.

    Per device and dimension: max(steady, every regular init i still to run of (usage_i + the
    sidecars declared before i)), steady = sidecars + apps; an entry holds at least one slot.
    ``finished = 0`` is the effective usage, all of them the steady state.
    """
    sidecars_before: Usage = {}
    apps: Usage = {}
    points: list[Usage] = []
    regular_seen = 0
    for container in pod.containers:
        own = _own(container)
        if container.kind == SIDECAR:
            sidecars_before = _add(sidecars_before, own)
        elif container.kind == INIT:
            regular_seen += 1
            if regular_seen > finished:
                points.append(_add(sidecars_before, own))
        else:
            apps = _add(apps, own)
    usage = _add(sidecars_before, apps)
    for point in points:
        usage = _envelope(usage, point)
    return {uuid: (m, c, max(s, 1)) for uuid, (m, c, s) in usage.items()}


def finished_inits(pod: PodSpec, snapshot: Snapshot) -> int:
    """How far the regular init containers got: the position (1-based) of the last one reported
    Terminated with exit code 0 (they run in order, so every one before it is done too)."""
    by_name = {s.name: s for s in snapshot.init_statuses}
    finished = 0
    for position, name in enumerate(pod.regular_inits, start=1):
        status = by_name.get(name)
        if status is not None and status.state == TERMINATED and status.exit_code == 0:
            finished = position
    return finished


def init_restarts(pod: PodSpec, snapshot: Snapshot) -> int:
    """Σ restart counts of the regular init containers (grows only when they run again)."""
    regular = set(pod.regular_inits)
    return sum(s.restarts for s in snapshot.init_statuses if s.name in regular)


@dataclass
class ReferencePod:
    """What the recorder must hold for one pod, given the statuses it was shown in order.

    * first sight: the usage still ahead of the pod (effective, or less when some regular init
      containers already finished; steady once all did);
    * a later status: regular init containers that finished release their share (progressive
      release by the last finished one); a non-zero exit holds;
    * an older status (fewer finished, or lower restart counts than already seen) changes
      nothing; fewer finished *with* higher restart counts is a re-run: the usage still ahead
      is charged again;
    * terminal phase: zero, for good; a pod first seen terminal is never charged;
    * a pod without grants is not tracked;
    * a forgotten uid (deleted, or a delete seen before the add) is never charged again:
      Kubernetes never reuses a uid.
    """

    spec: PodSpec
    tracked: bool = False
    terminal: bool = False
    finished: int = 0
    restarts_seen: int = 0
    usage: Usage = field(default_factory=dict)
    forgotten: bool = False

    def forget(self) -> None:
        self.forgotten, self.tracked, self.terminal, self.usage = True, False, False, {}

    def apply(self, snapshot: Snapshot) -> None:
        if not self.spec.has_grants or self.terminal or self.forgotten:
            return
        if snapshot.phase in TERMINAL_PHASES:
            # Tracked or not: a pod once seen finished is never charged again (issue 15).
            self.terminal = True
            self.usage = {}
            return
        finished = finished_inits(self.spec, snapshot)
        restarts = init_restarts(self.spec, snapshot)
        if not self.tracked:
            self.tracked = True
            self.finished = finished
            self.restarts_seen = restarts
            self.usage = remaining_usage(self.spec, finished)
            return
        if finished < self.finished and restarts > self.restarts_seen:
            self.finished = finished  # a re-run: the init containers run again
        elif restarts < self.restarts_seen:
            return  # an older status (restart counts never go down)
        else:
            self.finished = max(self.finished, finished)
        self.restarts_seen = max(self.restarts_seen, restarts)
        self.usage = remaining_usage(self.spec, self.finished)

    def copy(self) -> ReferencePod:
        return ReferencePod(
            self.spec, self.tracked, self.terminal, self.finished, self.restarts_seen,
            dict(self.usage), self.forgotten,
        )


def namespace_totals(usages: Iterable[Usage]) -> dict[str, int]:
    """Namespace quota usage (resource -> used; zero entries left out) of some pods' usage."""
    totals = {MEMORY: 0, CORES: 0, COUNT: 0}
    for usage in usages:
        for memory, cores, _slots in usage.values():
            totals[MEMORY] += memory
            totals[CORES] += cores
            totals[COUNT] += 1
    return {resource: used for resource, used in totals.items() if used}


def node_totals(usages: Iterable[Usage]) -> Usage:
    """Per-device totals on a node (devices with nothing charged left out)."""
    total: Usage = {}
    for usage in usages:
        total = _add(total, usage)
    return {uuid: vector for uuid, vector in total.items() if vector != (0, 0, 0)}


# -- messages ----------------------------------------------------------------------------------

_KIND_TO_PB = {
    INIT: types_pb2.CONTAINER_CLASS_INIT,
    SIDECAR: types_pb2.CONTAINER_CLASS_SIDECAR,
    APP: types_pb2.CONTAINER_CLASS_APP,
}
_STATE_TO_PB = {
    RUNNING: types_pb2.CONTAINER_STATE_RUNNING,
    WAITING: types_pb2.CONTAINER_STATE_WAITING,
    TERMINATED: types_pb2.CONTAINER_STATE_TERMINATED,
}
_PHASE_TO_PB = {
    PENDING: types_pb2.POD_PHASE_PENDING,
    POD_RUNNING: types_pb2.POD_PHASE_RUNNING,
    SUCCEEDED: types_pb2.POD_PHASE_SUCCEEDED,
    FAILED: types_pb2.POD_PHASE_FAILED,
}


def _status_pb(status: Status) -> types_pb2.ContainerStatus:
    return types_pb2.ContainerStatus(
        name=status.name,
        state=_STATE_TO_PB[status.state],
        exit_code=status.exit_code,
        restart_count=status.restarts,
    )


def pod_message(
    pod: PodSpec, snapshot: Snapshot, annotations: Mapping[str, str] | None = None
) -> types_pb2.Pod:
    """The pod in this status as the typed message."""
    return types_pb2.Pod(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node_name=pod.node,
        containers=[
            types_pb2.Container(
                name=c.name,
                container_class=_KIND_TO_PB[c.kind],
                grants=[
                    types_pb2.DeviceGrant(
                        uuid=g.uuid, device_type=VENDOR, memory_mib=g.memory_mib,
                        core_percent=g.core_percent, slots=g.slots,
                    )
                    for g in c.grants
                ],
            )
            for c in pod.containers
        ],
        status=types_pb2.PodStatus(
            phase=_PHASE_TO_PB[snapshot.phase],
            init_container_statuses=[_status_pb(s) for s in snapshot.init_statuses],
            container_statuses=[_status_pb(s) for s in snapshot.app_statuses],
        ),
        annotations=dict(annotations or {}),
    )


def allocation_annotation(pod: PodSpec) -> str:
    """hami.io/vgpu-devices-allocated in HAMi's format, written by hand (not by the codec)."""
    def entry(g: GrantSpec) -> str:
        fields = f"{g.uuid},{VENDOR},{g.memory_mib},{g.core_percent}"
        return (fields + f",{g.slots}" if g.slots > 1 else fields) + ":"

    return "".join("".join(entry(g) for g in c.grants) + ";" for c in pod.containers)


def _status_json(status: Status) -> dict[str, Any]:
    if status.state == RUNNING:
        state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    elif status.state == TERMINATED:
        state = {"terminated": {"exitCode": status.exit_code,
                                "reason": "Completed" if status.exit_code == 0 else "Error"}}
    else:
        state = {"waiting": {"reason": "PodInitializing"}}
    return {"name": status.name, "state": state, "restartCount": status.restarts,
            "ready": status.state == RUNNING}


def _container_json(container: ContainerSpec, env: Mapping[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": container.name, "image": "registry.example/worker:1"}
    if container.grants:
        body["resources"] = {"limits": {
            "nvidia.com/gpu": str(len(container.grants)),
            # Per device: what the smallest of its grants gives, so every grant holds at least
            # the request, as an honest pod's do.
            "nvidia.com/gpumem": str(min(g.memory_mib for g in container.grants)),
        }}
    if container.kind == SIDECAR:
        body["restartPolicy"] = "Always"
    if env:
        body["env"] = [{"name": key, "value": value} for key, value in env.items()]
    return body


def pod_json_object(
    pod: PodSpec,
    snapshot: Snapshot,
    *,
    annotations: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """The pod in this status as the Kubernetes Pod object (what Go's json.Marshal writes)."""
    meta_annotations = dict(annotations or {})
    if allocated and pod.has_grants:
        meta_annotations["hami.io/vgpu-devices-allocated"] = allocation_annotation(pod)
        meta_annotations["hami.io/vgpu-node"] = pod.node
    spec: dict[str, Any] = {
        "containers": [_container_json(c, env or {}) for c in pod.apps],
    }
    if pod.init_list:
        spec["initContainers"] = [_container_json(c, env or {}) for c in pod.init_list]
    if allocated and pod.node:
        spec["nodeName"] = pod.node
    status: dict[str, Any] = {"phase": snapshot.phase}
    if snapshot.init_statuses:
        status["initContainerStatuses"] = [_status_json(s) for s in snapshot.init_statuses]
    if snapshot.app_statuses:
        status["containerStatuses"] = [_status_json(s) for s in snapshot.app_statuses]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "annotations": meta_annotations},
        "spec": spec,
        "status": status,
    }


def pod_json(pod: PodSpec, snapshot: Snapshot, **options: Any) -> bytes:
    return json.dumps(pod_json_object(pod, snapshot, **options), separators=(",", ":")).encode()


def device_message(
    uuid: str, index: int, memory_mib: int = 81920, cores: int = 100, slots: int = 64
) -> types_pb2.Device:
    return types_pb2.Device(
        uuid=uuid, device_type="NVIDIA A100", index=index, slots_total=slots,
        memory_total_mib=memory_mib, cores_total=cores, healthy=True, vendor=VENDOR,
    )


def usage_from_pb(entries: Iterable[types_pb2.DeviceUsage]) -> Usage:
    """Per-device usage of a response (GetPodUsage.stored, RecordPod.stored)."""
    usage: Usage = {}
    for entry in entries:
        assert entry.uuid not in usage, f"device {entry.uuid} listed twice"
        assert entry.device_type == VENDOR, entry
        usage[entry.uuid] = (entry.memory_mib, entry.core_percent, entry.slots)
    return usage
