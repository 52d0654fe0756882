"""The usage store: the ledger and its journal behind one lock — the recorder's commit unit.

Layer: services/usage (recorder state). Both writers of the recorder's state — the gRPC servicer
and the Kubernetes source (through the ``UsageSink`` methods) — go through this class, so every
change is, in this order and under one lock: applied to the in-memory ledger (which decides),
committed to the journal, handed to the watch hub. If the journal write fails, the ledger change
is undone before the lock is released and the caller gets ``DependencyUnavailableError``
(UNAVAILABLE): nothing acknowledged is lost, nothing unacknowledged is half-applied.

Forgotten uids are remembered (the ledger's tombstones, journaled with the change that forgets
the pod): a RecordPod or Reserve arriving after ForgetPod answers ``Forgotten`` /
``PodForgotten`` and changes nothing, also after a restart.

Watchers are the hub's (``watch_hub``): under the lock this class only builds each change's
event (the namespace's and node's state after it, only the parts some watcher asked for) and
appends it to the hub's log, which never waits for a watcher (the events are built by
services/usage/store_events.py). Encoding and sending happen on the hub's event loop, after the
lock is released. The state the recorder starts from is services/usage/recovery.py's, the
store's metrics services/usage/store_metrics.py's; what a write accepts is checked before the
lock by services/usage/store_input.py, and what a pod write tells the operator (span attributes,
log lines) is services/usage/store_telemetry.py's.

Why one piece past 600 lines: what is left is one job, the lock and what is done under it. Every
write and every read of the ledger takes the one lock this class holds, and each write path
(record, forget, reserve, release, a node registered or forgotten, a quota set) is the same walk
(apply, commit, publish, or undo) with its own undo; split, the lock and the undo would have to
be handed between modules, and a reader could no longer see in one file that nothing reads the
ledger without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace

from accounting.believed_grants import believe
from accounting.errors import InvalidInputError
from accounting.ledger import (
    Ledger,
    LedgerChange,
    RecordOutcome,
    ReleaseOutcome,
    ReserveOutcome,
)
from accounting.lifecycle import Decision, StoredPod
from accounting.model import (
    Device,
    Pod,
    QuotaItem,
)
from accounting.policy import AccountingPolicy
from services.common import telemetry
from services.common.errors import DependencyUnavailableError
from services.usage import metrics as usage_metrics
from services.usage.events import EventKind, NodeSnapshot, UsageEvent
from services.usage.journal import (
    ON_DAMAGE_REFUSE,
    DeleteNode,
    DeletePod,
    DeleteTombstones,
    Journal,
    JournalError,
    JournalOp,
    JournalState,
    PutNode,
    PutPod,
    PutQuota,
    PutTombstone,
)
from services.usage.pod_facts import PodFacts, PodFactsBook
from services.usage.recovery import RecoverySummary, collector_paused, start_state
from services.usage.store_events import (
    initial_events,
    node_registered_events,
    node_snapshot,
    pod_change_events,
)
from services.usage.store_input import checked_inventory, checked_limits
from services.usage.store_metrics import StoreMetrics
from services.usage.store_telemetry import (
    log_refused_for_deleted,
    pod_traceparent,
    tell_forgotten,
    tell_recorded,
    tell_reserved,
)
from services.usage.watch_hub import InitialState, WatchHub, WatchStream

_LOG = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True, kw_only=True)
class StoreReading:
    """What a metrics scrape reports, read under one hold of the store's lock (a consistent
    state: every figure is of the same revision). Only references are taken under the lock:
    stored pods and inventories are immutable, so what is derived from them is worked out
    after it is released."""

    revision: int
    nodes: tuple[tuple[str, tuple[Device, ...]], ...]
    """Every registered node's inventory, in registration order."""
    pods: tuple[StoredPod, ...]
    namespaces: tuple[tuple[str, tuple[QuotaItem, ...]], ...]
    """Namespaces with usage or limits, sorted, with one item per such resource."""
    pod_facts: Mapping[str, PodFacts]
    """uid -> the init share and MIG instances of its stored value
    (``services.usage.pod_facts``): they count only while ``facts.stored`` is the very stored
    pod of ``pods``."""


class UsageStore:
    """The recorder's state: a ``Ledger`` and its ``Journal`` serialised by one lock.

    Implements the Kubernetes source's ``UsageSink`` protocol (record_pod, forget_pod,
    register_node, forget_node, set_quota, tracked_pod_uids, set_synced).
    """

    def __init__(
        self,
        ledger: Ledger,
        journal: Journal | None,
        *,
        tracer: trace.Tracer | None = None,
        hub: WatchHub | None = None,
        on_synced: Callable[[bool], None] | None = None,
    ) -> None:
        """Wraps a ledger and (optionally) its journal; without a journal nothing is durable.

        Args:
            ledger: the in-memory ledger; only this store may touch it from now on.
            journal: where each change is committed before it is acknowledged.
            tracer: spans usage.record/shrink/release/reserve; None traces nothing.
            hub: where changes go to WatchUsage streams (a default one when None).
            on_synced: told when the Kubernetes source has (or has lost) a full sync.
        """
        self._ledger = ledger
        self._journal = journal
        self._tracer = tracer or trace.NoOpTracer()
        self._lock = threading.Lock()
        self.hub = hub or WatchHub()
        """The fan-out to WatchUsage streams; a change's node snapshot (the costly part of an
        event) is only built when an attached watcher wants nodes (``hub.wanted``)."""
        self._metrics = StoreMetrics()
        self._pod_facts = PodFactsBook()
        self._traceparents: dict[str, str] = {}
        """uid -> the pod's hami.io/traceparent, for spans about it that carry no pod."""
        self._on_synced = on_synced
        self._synced = False
        self._visible_revision = 0
        """Revision of the last change a reader or watcher can see (a tombstone-only change
        bumps the ledger's revision but publishes no event, so it is not this)."""

    # -- recovery ------------------------------------------------------------------------------

    def recover(self, on_damage: str = ON_DAMAGE_REFUSE) -> RecoverySummary:
        """Loads the journal's state into the (empty) ledger; call once, before serving.

        Args:
            on_damage: what to do when the journal is damaged or incomplete
                (``services.usage.journal.ON_DAMAGE_MODES``): refuse, keep what is readable
                and log what was lost (accept-loss), or set the journal aside and start empty
                for the Kubernetes source's re-list to rebuild (rebuild-from-kubernetes).

        Raises:
            JournalDamagedError: the journal is damaged and ``on_damage`` is refuse.
            JournalError: the journal cannot be read or repaired.
        """
        started_s = time.perf_counter()
        with collector_paused() as pause:
            start = start_state(self._journal, on_damage)
            state = start.state
            with self._lock:
                self._restore(state)
            pause.freeze_if_large(len(state.pods))
        with self._lock:
            summary = RecoverySummary(
                pods=len(state.pods),
                nodes=len(state.nodes),
                namespaces=len(self._ledger.namespaces()),
                revision=self._ledger.revision,
                seconds=time.perf_counter() - started_s,
                damage=start.damage,
            )
        return summary

    def _restore(self, state: JournalState) -> None:
        ledger = self._ledger
        for node_name, devices in state.nodes.items():
            ledger.register_node(node_name, devices)
        for namespace, limits in state.quotas.items():
            ledger.set_quota(namespace, limits)
        ledger.restore_all(state.pods, interned=True)
        ledger.restore_tombstones(state.tombstones)
        self._traceparents.update(state.traceparents)
        if state.revision:
            # Watchers compare revisions across restarts: continue from the acknowledged one.
            ledger.revision = state.revision
        self._visible_revision = ledger.revision
        for node_name in self._known_nodes():
            self._metrics.publish_node(self._ledger, node_name)
        for namespace in ledger.namespaces():
            self._metrics.publish_namespace(self._ledger, namespace)

    # -- pods ----------------------------------------------------------------------------------

    def record_pod(self, pod: Pod) -> RecordOutcome:
        """Applies the lifecycle rules to the pod's current state (idempotent upsert); a
        forgotten uid answers ``Forgotten`` and changes nothing; a pod first seen finished is
        remembered (its tombstone journaled with the answer).

        Raises:
            InvalidInputError: a grant names a device its (registered) node does not have.
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        with telemetry.pod_span(self._tracer, "usage.record", pod) as span:
            with self._lock:
                revision = self._ledger.revision
                ledger = self._ledger
                # Never the grants as sent: our own reservation's, else raised to the request.
                belief = believe(
                    pod,
                    ledger.pod(pod.uid),
                    ledger.node_devices(pod.node_name),
                    ledger.policy.specs,
                )
                outcome = ledger.record(belief.pod)
                if outcome.change.changed or outcome.change.tombstone is not None:
                    self._commit_pod_change(outcome.change, revision, pod_traceparent(pod))
                self._pod_facts.note(
                    belief.pod, ledger.pod(pod.uid), decision=outcome.decision,
                    before=outcome.change.before,
                )
            tell_recorded(span, pod, belief, outcome)
        self._metrics.count_decision("record", outcome.decision.value)
        return outcome

    def forget_pod(self, pod_uid: str) -> LedgerChange:
        """Releases exactly what is stored for the pod and forgets it; ``before`` is what was
        released (None when the pod was not tracked). The uid is remembered either way (a
        delete may arrive before the pod's first update), so later updates charge nothing.

        Raises:
            InvalidInputError: the uid is empty.
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        if not pod_uid:
            raise InvalidInputError.single("pod_uid", "must not be empty")
        attributes = {telemetry.ATTR_POD_UID: pod_uid}
        with self._lock:
            # ForgetPod carries only the uid: the release joins the pod's trace through the
            # traceparent kept from the pod's last recorded state.
            traceparent = self._traceparents.get(pod_uid)
        with telemetry.pod_span(
            self._tracer, "usage.release", traceparent=traceparent, attributes=attributes
        ) as span:
            with self._lock:
                revision = self._ledger.revision
                change = self._ledger.forget(pod_uid)
                if change.changed or change.tombstone is not None:
                    self._commit_pod_change(change, revision)
                self._pod_facts.forget(pod_uid)
            released = change.before
            tell_forgotten(span, released)
        self._metrics.count_decision(
            "forget", "Forgotten" if released is not None else Decision.NOT_TRACKED.value
        )
        return change

    def reserve(
        self,
        pod: Pod,
        node_name: str,
        *,
        policy_id: str = "",
        replaces_revision: int | None = None,
    ) -> ReserveOutcome:
        """Atomically re-checks node capacity and namespace quota for the pod's grants on the
        node, then records them; a refusal (``PodForgotten`` for a deleted pod,
        ``ReservationChanged`` when what is stored is no longer ``replaces_revision``, and
        ``PolicyChanged`` for grants computed under another policy, included) changes nothing.

        Raises:
            InvalidInputError: the node is not registered or a grant names an unknown device.
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        if not node_name:
            raise InvalidInputError.single("node_name", "must not be empty")
        with telemetry.pod_span(
            self._tracer, "usage.reserve", pod, attributes={"node": node_name}
        ) as span:
            with self._lock:
                revision = self._ledger.revision
                outcome = self._ledger.reserve(
                    pod, node_name, policy_id=policy_id, replaces_revision=replaces_revision
                )
                if outcome.change is not None and outcome.change.changed:
                    self._commit_pod_change(outcome.change, revision, pod_traceparent(pod))
                if outcome.reserved:
                    self._pod_facts.note(pod, self._ledger.pod(pod.uid))
            tell_reserved(span, outcome)
        log_refused_for_deleted(pod, outcome)
        self._metrics.count_decision("reserve" if outcome.reserved else "refuse", outcome.reason)
        return outcome

    def release_reservation(self, pod_uid: str, replaces_revision: int) -> ReleaseOutcome:
        """Releases a pod's reservation without forgetting the pod (a re-filter that found no
        node), only if what is stored is still ``replaces_revision``; a refusal changes
        nothing.

        Raises:
            InvalidInputError: the uid is empty.
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        if not pod_uid:
            raise InvalidInputError.single("pod_uid", "must not be empty")
        with self._lock:
            revision = self._ledger.revision
            outcome = self._ledger.release(pod_uid, replaces_revision)
            if outcome.change is not None and outcome.change.changed:
                self._commit_pod_change(outcome.change, revision)
        self._metrics.count_decision("release", outcome.reason)
        return outcome

    def _commit_pod_change(
        self, change: LedgerChange, revision_before: int, traceparent: str = ""
    ) -> None:
        before, after, tombstone = change.before, change.after, change.tombstone
        ops: list[JournalOp] = []
        uid = _changed_uid(change)
        # An update without the annotation (a typed pod from a client that strips it) keeps the
        # trace the pod already had.
        traceparent = traceparent or self._traceparents.get(uid, "")
        if after is not None:
            ops.append(PutPod(after, traceparent))
        elif before is not None:
            ops.append(DeletePod(uid))
        if tombstone is not None:
            # Written before the evictions: a new row's rowid, which orders the tombstones at
            # load, must be the highest even while the rows it replaces still exist.
            ops.append(PutTombstone(uid, tombstone.reservable))
            if tombstone.evicted:
                ops.append(DeleteTombstones(tuple(u for u, _ in tombstone.evicted)))

        def events() -> list[UsageEvent]:
            if not change.changed or not self.hub.watching:
                return []
            return pod_change_events(self._ledger, change, uid, self.hub.wanted)

        self._commit(
            ops,
            lambda: self._ledger.undo(change, revision_before),
            revision_before,
            events,
            visible=change.changed,
        )
        if after is not None and traceparent:
            self._traceparents[uid] = traceparent
        elif after is None:
            self._traceparents.pop(uid, None)
        if not change.changed:
            return  # only a tombstone: nothing a reader or watcher sees changed
        for node_name in change.node_names:
            self._metrics.publish_node(self._ledger, node_name)
        self._metrics.publish_namespace(self._ledger, change.namespace)

    # -- nodes ---------------------------------------------------------------------------------

    def register_node(self, node_name: str, devices: Sequence[Device]) -> NodeSnapshot:
        """Registers or replaces a node's inventory; an identical inventory changes nothing.

        Raises:
            InvalidInputError: no name, or a bad inventory (duplicate UUIDs, negative totals).
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        devices = checked_inventory(node_name, devices)
        with self._lock:
            previous = self._ledger.node_devices(node_name)
            if previous != devices:
                revision = self._ledger.revision
                self._ledger.register_node(node_name, devices)

                def undo() -> None:
                    if previous is None:
                        self._ledger.forget_node(node_name)
                    else:
                        self._ledger.register_node(node_name, previous)

                self._commit(
                    [PutNode(node_name, devices)], undo, revision, self._node_events(node_name)
                )
                self._metrics.publish_node(self._ledger, node_name)
            return node_snapshot(self._ledger, node_name)

    def forget_node(self, node_name: str) -> None:
        """Drops a node's inventory (pods charged there keep their usage until forgotten).

        Raises:
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        with self._lock:
            previous = self._ledger.node_devices(node_name)
            if previous is None:
                return
            revision = self._ledger.revision
            self._ledger.forget_node(node_name)
            self._commit(
                [DeleteNode(node_name)],
                lambda: self._ledger.register_node(node_name, previous),
                revision,
                self._node_events(node_name),
            )
            self._metrics.publish_node(self._ledger, node_name)

    def _node_events(self, node_name: str) -> Callable[[], list[UsageEvent]]:
        """What a node's new inventory tells watchers (built before the change is journaled)."""

        def events() -> list[UsageEvent]:
            if not self.hub.watching:
                return []
            return node_registered_events(self._ledger, node_name, self.hub.wanted)

        return events

    # -- quotas --------------------------------------------------------------------------------

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> tuple[QuotaItem, ...]:
        """Replaces a namespace's limits, keyed like a ResourceQuota's spec.hard
        (``limits.nvidia.com/gpumem``); empty limits unset them all.

        Raises:
            InvalidInputError: no namespace, an unknown key, or a limit outside
                0..``MAX_QUOTA_LIMIT``, each named.
            DependencyUnavailableError: the journal write failed; nothing changed.
        """
        by_resource = checked_limits(namespace, limits, self.policy.vendors)
        with self._lock:
            previous = self._ledger.limits(namespace)
            if previous != by_resource:
                revision = self._ledger.revision
                self._ledger.set_quota(namespace, by_resource)
                items: tuple[QuotaItem, ...] = ()

                def events() -> list[UsageEvent]:
                    nonlocal items
                    items = tuple(self._ledger.namespace_items(namespace).values())
                    if not self.hub.watching:
                        return []
                    return [
                        UsageEvent(
                            EventKind.QUOTA_SET,
                            self._ledger.revision,
                            namespace=namespace,
                            namespace_items=items,
                        )
                    ]

                self._commit(
                    [PutQuota(namespace, by_resource)],
                    lambda: self._ledger.set_quota(namespace, previous),
                    revision,
                    events,
                )
                return items
            return tuple(self._ledger.namespace_items(namespace).values())

    # -- the commit ----------------------------------------------------------------------------

    def _commit(
        self,
        ops: Sequence[JournalOp],
        undo: Callable[[], None],
        revision: int,
        events: Callable[[], list[UsageEvent]],
        *,
        visible: bool = True,
    ) -> None:
        """Journals a change already applied to the ledger, then publishes its events to the
        watchers and (when ``visible``: a tombstone alone is not) makes its revision the one
        writes answer with. On any failure before that — the
        events' building, the journal's encoding or its write, whatever the exception — undoes
        the change and raises: a change is applied, journaled and acknowledged, or not at all.

        Called with the lock held: every reader of the ledger takes the same lock, so nobody
        sees a change that is later undone. What follows the journal write only appends to
        in-memory lists, so nothing acknowledged can fail after it.

        Raises:
            DependencyUnavailableError: the journal could not be written.
        """
        started_s = time.perf_counter()
        try:
            published = events()
            if self._journal is not None:
                self._journal.commit(ops, self._ledger.revision)
        except BaseException as error:
            try:
                undo()
            finally:
                self._ledger.revision = revision
            if isinstance(error, JournalError):
                usage_metrics.count_journal_failure()
                _LOG.error("journal write failed; change undone", extra={"error": str(error)})
                raise DependencyUnavailableError(
                    f"journal unavailable, change not recorded: {error}"
                ) from error
            _LOG.error("change undone after an unexpected error", exc_info=error)
            raise
        if self._journal is not None:
            usage_metrics.observe_journal_write(time.perf_counter() - started_s)
        if visible:
            self._visible_revision = self._ledger.revision
        if published:
            self.hub.publish(published)

    # -- queries -------------------------------------------------------------------------------

    @property
    def policy(self) -> AccountingPolicy:
        """The accounting policy the ledger decides under (fixed for the recorder's life)."""
        return self._ledger.policy

    @property
    def busy(self) -> bool:
        """Whether another thread holds the lock right now (a call that would wait for it is
        better not run on the server's event loop)."""
        return self._lock.locked()

    @property
    def revision(self) -> int:
        with self._lock:
            return self._ledger.revision

    @property
    def visible_revision(self) -> int:
        """The revision a write's response hands back as its read-your-writes token: every
        change up to it has been published to watchers (a watcher that has applied an event of
        this revision or later has seen them all)."""
        with self._lock:
            return self._visible_revision

    def reading(self) -> StoreReading:
        """Everything a metrics scrape reports, of one revision (``StoreReading``)."""
        with self._lock:
            ledger = self._ledger
            return StoreReading(
                revision=self._visible_revision,
                nodes=tuple(
                    (name, ledger.node_devices(name) or ()) for name in ledger.node_names()
                ),
                pods=tuple(ledger.pods()),
                namespaces=tuple(
                    (namespace, tuple(ledger.namespace_items(namespace).values()))
                    for namespace in ledger.namespaces()
                ),
                pod_facts=self._pod_facts.copy(),
            )

    def pod(self, pod_uid: str) -> StoredPod | None:
        """What is stored for a pod, or None."""
        with self._lock:
            return self._ledger.pod(pod_uid)

    def pods(self) -> tuple[StoredPod, ...]:
        """Every tracked pod (a copy; for reports and tests)."""
        with self._lock:
            return tuple(self._ledger.pods())

    def tombstones(self) -> tuple[tuple[str, bool], ...]:
        """(uid, reservable) of the remembered forgotten uids, oldest first (for reports and
        tests; see accounting.ledger for the two kinds)."""
        with self._lock:
            return self._ledger.tombstones()

    def namespaces(self) -> tuple[str, ...]:
        """Namespaces with usage or limits, sorted."""
        with self._lock:
            return self._ledger.namespaces()

    def node(self, node_name: str) -> NodeSnapshot | None:
        """A registered node's state, or None."""
        with self._lock:
            if self._ledger.node_devices(node_name) is None:
                return None
            return node_snapshot(self._ledger, node_name)

    def node_usage(
        self, node_names: Iterable[str] = ()
    ) -> tuple[tuple[NodeSnapshot, ...], tuple[str, ...]]:
        """(registered nodes among ``node_names``, names not registered); every registered node
        when ``node_names`` is empty."""
        names = tuple(dict.fromkeys(node_names))
        with self._lock:
            if not names:
                names = self._ledger.node_names()
            ledger = self._ledger
            found = tuple(
                node_snapshot(ledger, n) for n in names if ledger.node_devices(n) is not None
            )
            unknown = tuple(n for n in names if self._ledger.node_devices(n) is None)
        return found, unknown

    def namespace_items(self, namespace: str) -> tuple[QuotaItem, ...]:
        """One item per resource with usage or a limit in the namespace."""
        with self._lock:
            return tuple(self._ledger.namespace_items(namespace).values())

    def _known_nodes(self) -> tuple[str, ...]:
        names = dict.fromkeys(self._ledger.node_names())
        names.update(dict.fromkeys(n for n in self._ledger.pod_node_names() if n))
        return tuple(names)

    # -- UsageSink -----------------------------------------------------------------------------

    def tracked_pod_uids(self) -> frozenset[str]:
        """UIDs of every pod with something stored (the Kubernetes source reconciles these)."""
        with self._lock:
            return self._ledger.pod_uids()

    def registered_node_names(self) -> frozenset[str]:
        """Nodes with an inventory (the Kubernetes source reconciles these)."""
        with self._lock:
            return frozenset(self._ledger.node_names())

    def quota_namespaces(self) -> frozenset[str]:
        """Namespaces with limits set (the Kubernetes source reconciles these)."""
        with self._lock:
            return frozenset(
                namespace
                for namespace in self._ledger.namespaces()
                if self._ledger.limits(namespace)
            )

    def set_synced(self, synced: bool) -> None:
        """The Kubernetes source finished (or lost) its full sync; health follows it."""
        self._synced = synced
        if self._on_synced is not None:
            self._on_synced(synced)

    def set_synced_callback(self, callback: Callable[[bool], None]) -> None:
        """Installs the health callback (the server is built after the store)."""
        self._on_synced = callback

    @property
    def synced(self) -> bool:
        return self._synced

    # -- watchers ------------------------------------------------------------------------------

    def subscribe(
        self, stream: WatchStream, send_initial_state: bool, send_policy: bool = False
    ) -> InitialState | None:
        """Attaches a WatchUsage stream: it gets every later change, and with
        ``send_initial_state`` first the initial state: with ``send_policy`` a POLICY event (the
        policy every answer takes, whatever the content asks for), then a SNAPSHOT event per
        node and namespace (those its content asks for), then INITIAL_STATE_COMPLETE; no change
        falls between the initial state and the first live event. Blocks on the lock and
        encodes the initial state: call it off the event loop."""
        events: list[UsageEvent] | None = None
        initial: InitialState | None = None
        with self._lock:
            revision = self._ledger.revision
            if send_initial_state:
                initial = self.hub.initial_state(stream.content, send_policy, revision)
                if initial is None:
                    events = initial_events(self._ledger, self.policy, stream.content,
                                            send_policy=send_policy, revision=revision)
            self.hub.attach(stream)
        if events is not None:
            initial = self.hub.encode_initial_state(
                stream.content, send_policy, revision, events
            )
        return initial

    def close_watchers(self) -> None:
        """Ends every watch stream (at shutdown)."""
        self.hub.end_all()

    @property
    def watcher_count(self) -> int:
        """Watchers attached to the hub's log (a cut-off one is not)."""
        return self.hub.attached_count


def _changed_uid(change: LedgerChange) -> str:
    for stored in (change.after, change.before):
        if stored is not None:
            return stored.uid
    # A forget of an untracked uid: only its tombstone was written.
    return change.tombstone.uid if change.tombstone is not None else ""

