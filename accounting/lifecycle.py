"""The lifecycle decision: given what is stored for a pod and its current state, what is stored
next.

Layer: accounting (pure). The rules of docs/design.md §3, in one place:

* first sight: the collapsed effective usage, unless the regular init containers have already
  finished (then the steady state straight away: HAMi re-charges the peak after a restart, a
  gap we do not copy: docs/design.md §7);
* shrink: once every regular (non-sidecar) init container is Terminated with exit code 0, matched
  to the spec by name, the stored usage becomes the steady state (sidecars stay counted, also
  through a crash-loop's exit-0 gap, because the gate never looks at sidecars);
* hold: a regular init container that exited non-zero keeps the init-inclusive usage (the pod may
  restart it);
* terminal phase (Succeeded/Failed): nothing is stored any more, and that is final;
* deletion is the ledger's job: it subtracts exactly what is stored.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from accounting.model import (
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    DeviceUsage,
    Pod,
)
from accounting.pod import remaining_usage, steady_state_usage


class Decision(enum.Enum):
    """What the lifecycle decided for one update; the values are the stable reason codes."""

    RECORDED = "Recorded"
    """First sight: the collapsed effective usage is stored."""
    RECORDED_STEADY_STATE = "RecordedSteadyState"
    """First sight after the regular init containers finished: the steady state is stored."""
    PARTIALLY_RELEASED = "PartiallyReleased"
    """Some regular init containers finished: their share is released, the rest is held."""
    RERUN_RESTORED = "InitRerunRestored"
    """The kubelet is running the init containers again: init-inclusive usage is restored."""
    UPDATED = "Updated"
    """The grants changed before the shrink: the new effective usage replaces the old."""
    SHRUNK = "Shrunk"
    """The regular init containers finished: the stored usage became the steady state."""
    HELD = "Held"
    """A regular init container exited non-zero: the init-inclusive usage is held."""
    UNCHANGED = "Unchanged"
    """Nothing the accounting depends on changed."""
    RELEASED = "Released"
    """The pod reached a terminal phase: nothing is stored any more."""
    NOT_TRACKED = "NotTracked"
    """The pod carries no device allocation; it is not accounted."""
    FORGOTTEN = "Forgotten"
    """The pod's uid was forgotten (deleted) before: a late or retried update charges nothing.
    Decided by the ledger, which keeps the tombstones; ``decide`` never returns it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredPod:
    """What the ledger keeps for one pod."""

    uid: str
    namespace: str
    name: str
    node_name: str
    usage: tuple[DeviceUsage, ...]
    init_released: bool = False
    """The shrink ran (HAMi's initContainerResourceReleased): later updates keep steady state."""
    terminal: bool = False
    """The pod reached Succeeded or Failed: its usage is zero for good."""
    init_progress: int = 0
    """How many regular init containers are known finished (their share is released)."""
    init_restarts: int = 0
    """Σ restartCount of the regular init containers when last seen (detects a re-run)."""
    revision: int = field(default=0, compare=False)
    """The ledger revision of the change that stored this value (0 until the ledger stores
    it): what a re-filter's Reserve states it replaces. Not part of the value: an update that
    stores an equal value changes nothing, its revision included."""
    reserved_grants: tuple[tuple[DeviceGrant, ...], ...] | None = None
    """The grants per container position a ``Reserve`` stored: what this recorder placed, the
    only grants believed for the pod from then on (its annotations are not: a later update
    cannot move or shrink them, accounting.believed_grants). None for a pod recorded from its
    annotations alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleDecision:
    """The outcome of one update: the next stored value and why."""

    decision: Decision
    stored: StoredPod | None
    """None when the pod is not tracked (no allocation, never recorded)."""
    message: str


def _statuses_by_name(statuses: tuple[ContainerStatus, ...]) -> Mapping[str, ContainerStatus]:
    return {status.name: status for status in statuses}


def regular_init_gate_open(pod: Pod) -> bool:
    """True when every regular init container is Terminated with exit code 0.

    Statuses are matched to the spec by name; sidecars are ignored entirely, so a sidecar's
    exit-0 gap can neither open nor close the gate. A pod with no entry in spec.initContainers
    has nothing to release (False); a pod whose init containers are all sidecars passes at once.
    """
    init_list = [
        c
        for c in pod.containers
        if c.container_class in (ContainerClass.INIT, ContainerClass.SIDECAR)
    ]
    if not init_list:
        return False
    statuses = _statuses_by_name(pod.init_container_statuses)
    for container in init_list:
        if container.container_class is not ContainerClass.INIT:
            continue
        status = statuses.get(container.name)
        if status is None or status.state is not ContainerState.TERMINATED or status.exit_code != 0:
            return False
    return True


def failed_regular_init(pod: Pod) -> str | None:
    """The name of a regular init container that exited non-zero, if any (the hold rule)."""
    statuses = _statuses_by_name(pod.init_container_statuses)
    for container in pod.containers:
        if container.container_class is not ContainerClass.INIT:
            continue
        status = statuses.get(container.name)
        if (
            status is not None
            and status.state is ContainerState.TERMINATED
            and status.exit_code != 0
        ):
            return container.name
    return None


def regular_init_progress(pod: Pod) -> int:
    """How many regular init containers are known finished, in declaration order.

    They run one after another, so once regular init container k has exited 0 every one before
    it is done too (progressive release, docs/design.md §3).
    """
    statuses = _statuses_by_name(pod.init_container_statuses)
    regular = [c for c in pod.containers if c.container_class is ContainerClass.INIT]
    done = 0
    for index, container in enumerate(regular, start=1):
        status = statuses.get(container.name)
        if (
            status is not None
            and status.state is ContainerState.TERMINATED
            and not status.exit_code
        ):
            done = index
    return done


def regular_init_restarts(pod: Pod) -> int:
    """Σ restartCount of the regular init containers: it grows when the kubelet runs them again
    (a re-created sandbox), never when an older status is replayed."""
    regular = {c.name for c in pod.containers if c.container_class is ContainerClass.INIT}
    return sum(s.restart_count for s in pod.init_container_statuses if s.name in regular)


def _first_unfinished_position(pod: Pod, progress: int) -> int:
    """The container position of the first regular init container not known finished."""
    seen = 0
    for position, container in enumerate(pod.containers):
        if container.container_class is ContainerClass.INIT:
            if seen == progress:
                return position
            seen += 1
    return len(pod.containers)


def _held_usage(pod: Pod, progress: int) -> tuple[DeviceUsage, ...]:
    """What the pod can still use once `progress` regular init containers have finished."""
    return remaining_usage(pod, _first_unfinished_position(pod, progress))


def _stored(
    pod: Pod,
    usage: tuple[DeviceUsage, ...],
    *,
    released: bool,
    progress: int,
    restarts: int,
    terminal: bool = False,
    previous: StoredPod | None = None,
) -> StoredPod:
    # The node never changes once recorded: a later update without it keeps the first one.
    node_name = pod.node_name or (previous.node_name if previous else "")
    return StoredPod(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node_name=node_name,
        usage=usage,
        init_released=released,
        terminal=terminal,
        init_progress=progress,
        init_restarts=restarts,
        reserved_grants=previous.reserved_grants if previous else None,
    )


def decide(
    pod: Pod, previous: StoredPod | None, *, progressive_release: bool = True
) -> LifecycleDecision:
    """Decides what is stored for a pod after this update; replaying an update changes nothing.

    Regular init containers release their share one by one as they finish (stored usage = the
    envelope of the init points still to come and the steady state). A status that shows fewer
    finished init containers than already seen is an older status replayed (ignored) unless the
    init containers' restart counts grew: then the kubelet is running them again (a re-created
    sandbox) and the init-inclusive usage is restored.

    Args:
        pod: the pod's current state.
        previous: what is stored for it now (None: never recorded).
        progressive_release: False holds the init-inclusive usage until every regular init
            container has exited 0 and then shrinks at once (the design documents' rule, kept
            for comparing the two: accounting.counting_rules); progress is still recorded.
    """
    if previous is not None and previous.terminal:
        return LifecycleDecision(
            decision=Decision.UNCHANGED,
            stored=previous,
            message="pod already reached a terminal phase",
        )
    if pod.phase.is_terminal:
        if previous is None:
            return LifecycleDecision(
                decision=Decision.NOT_TRACKED,
                stored=None,
                message=f"pod is {pod.phase.value}: nothing to charge",
            )
        return LifecycleDecision(
            decision=Decision.RELEASED,
            stored=replace(previous, usage=(), terminal=True),
            message=f"pod is {pod.phase.value}: every container finished, usage released",
        )
    if not pod.has_grants:
        if previous is None:
            return LifecycleDecision(
                decision=Decision.NOT_TRACKED,
                stored=None,
                message="pod carries no device allocation",
            )
        return LifecycleDecision(
            decision=Decision.UNCHANGED,
            stored=previous,
            message="update carries no device allocation; keeping what is stored",
        )

    regular_count = sum(1 for c in pod.containers if c.container_class is ContainerClass.INIT)
    progress = regular_init_progress(pod)
    restarts = regular_init_restarts(pod)
    gate_open = regular_init_gate_open(pod)

    def stored(progress_now: int, released: bool) -> StoredPod:
        # Without progressive release, nothing is let go before the gate opens (released).
        held_from = progress_now if released or progressive_release else 0
        return _stored(
            pod,
            _held_usage(pod, held_from),
            released=released,
            progress=progress_now,
            restarts=max(restarts, previous.init_restarts if previous else 0),
            previous=previous,
        )

    if previous is None:
        if gate_open:
            return LifecycleDecision(
                decision=Decision.RECORDED_STEADY_STATE,
                stored=stored(regular_count, released=True),
                message="regular init containers already finished: recorded at steady state",
            )
        note = (
            f" ({progress} of {regular_count} init containers already finished)" if progress else ""
        )
        return LifecycleDecision(
            decision=Decision.RECORDED,
            stored=stored(progress, released=False),
            message="recorded the effective usage (init-phase peak vs sidecars + apps)" + note,
        )

    rerun = progress < previous.init_progress and restarts > previous.init_restarts
    if rerun:
        return LifecycleDecision(
            decision=Decision.RERUN_RESTORED,
            stored=stored(progress, released=False),
            message=(
                "init containers are running again (re-created sandbox): init-inclusive usage "
                "restored"
            ),
        )
    if restarts < previous.init_restarts:
        # Restart counts never go down: this status is older than one already seen (from before
        # a re-run), however many init containers it shows finished.
        return LifecycleDecision(
            decision=Decision.UNCHANGED,
            stored=previous,
            message="older status (lower init restart counts): ignored",
        )
    if previous.init_released:
        # Remember higher restart counts (a re-run finished unseen), so an older status from
        # during that re-run is not mistaken for a new one.
        return LifecycleDecision(
            decision=Decision.UNCHANGED,
            stored=replace(previous, init_restarts=max(restarts, previous.init_restarts)),
            message="init share already released",
        )
    if gate_open:
        return LifecycleDecision(
            decision=Decision.SHRUNK,
            stored=stored(regular_count, released=True),
            message="every regular init container exited 0: shrunk to sidecars + apps",
        )
    # An older status replayed never undoes what was already released.
    progress_now = max(progress, previous.init_progress)
    candidate = stored(progress_now, released=False)
    if progress_now > previous.init_progress and candidate.usage != previous.usage:
        return LifecycleDecision(
            decision=Decision.PARTIALLY_RELEASED,
            stored=candidate,
            message=(
                f"{progress_now} of {regular_count} init containers finished: released their "
                "share"
            ),
        )
    if candidate.usage != previous.usage:
        return LifecycleDecision(
            decision=Decision.UPDATED,
            stored=candidate,
            message="device allocation changed: recorded the new effective usage",
        )
    failed = failed_regular_init(pod)
    if failed is not None:
        return LifecycleDecision(
            decision=Decision.HELD,
            stored=candidate,
            message=f"init container {failed} exited non-zero: holding the init-inclusive usage",
        )
    # `candidate` may differ from `previous` only in the progress it records.
    return LifecycleDecision(
        decision=Decision.UNCHANGED,
        stored=candidate,
        message="regular init containers still running",
    )


def init_share_held(pod: Pod, stored: StoredPod | None) -> tuple[DeviceUsage, ...]:
    """The part of what is stored for ``pod`` that only its regular init containers hold, per
    device UUID: stored minus steady state, each dimension floored at 0, sorted by UUID.

    This is what the shrink (or a partial release) will give back once they finish; nothing
    once released or terminal, or for a pod without a regular init container. ``stored`` must
    be what the ledger keeps for ``pod`` after this update.
    """
    if stored is None or stored.init_released or stored.terminal or not stored.usage:
        return ()
    if not any(c.container_class is ContainerClass.INIT for c in pod.containers):
        return ()
    steady = {entry.uuid: entry for entry in steady_state_usage(pod)}
    held: list[DeviceUsage] = []
    for entry in stored.usage:
        base = steady.get(entry.uuid)
        memory_mib = entry.memory_mib - (base.memory_mib if base else 0)
        core_percent = entry.core_percent - (base.core_percent if base else 0)
        slots = entry.slots - (base.slots if base else 0)
        if memory_mib > 0 or core_percent > 0 or slots > 0:
            held.append(DeviceUsage(
                entry.uuid, entry.vendor, max(memory_mib, 0), max(core_percent, 0),
                max(slots, 0),
            ))
    return tuple(sorted(held, key=lambda e: e.uuid))
