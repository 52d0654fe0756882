"""The scheduler's copy of every node's device state, fed by the recorder's WatchUsage stream.

Layer: services/scheduler (adapter). With ``HAMI_ACCOUNTING_NODE_CACHE=watch`` (the default)
``NodeCache`` keeps one ``NodeState`` per registered node — built once per change, in a
background thread, not once per Filter — from ``WatchUsage(send_initial_state=True)``: a
SNAPSHOT event per node, then each change. Every event that concerns a node carries the node's
full state after the change (``UsageEvent.node``), so an event replaces the node's entry; there
is nothing to merge and no GetNodeUsage call per event. Each entry is also a row of a
``services.scheduler.node_table.NodeTable``, the columns the vectorized fit reads
(``candidates``), rewritten in place by the same event. The stream carries namespaces too: the
cache keeps every namespace's quota items, so a Filter reads its quota from the copy once the
initial state is complete (a namespace the copy does not hold has no limit and uses nothing),
and directly when asked (``fresh_quota``: a reservation refused, "no node fits" to confirm).

``candidates`` answers the same question as ``RecorderClient.snapshot`` (the candidates'
states, the unregistered candidates, the namespace quota) from the copy, and reads directly
with ``GetNodeUsage`` (batched, in parallel with the quota read) only the candidates the copy
cannot answer for:

* every candidate while no stream is open (before the first connection, after a failure, until
  the reconnection — with backoff — delivers events again): the cache is then off and Filter
  works exactly as with ``HAMI_ACCOUNTING_NODE_CACHE=off``;
* a node the stream has not described (the initial state is still arriving, a candidate the
  recorder does not know, or a registration the stream has not delivered yet);
* a node whose event carried no devices: WatchUsage sends the same empty ``NodeUsage`` for a
  node that was dropped, a node that never was registered but has pods charged on it, and a
  node registered with an empty inventory, so only a direct read tells them apart;
* the nodes the caller names in ``refresh`` (the node a lost reservation was refused on, the
  node a re-filtered pod is stored on).

A direct read's answer is kept — including "not registered", so that candidates without GPUs
(which the recorder never learns of) are not read again on every Filter — when it cannot be
older than what the stream delivers: the read started after the current stream's initial state
was complete (its ``INITIAL_STATE_COMPLETE`` event, which comes also from a recorder that holds
nothing: the recorder had subscribed the stream, so every later change arrives as an event),
and no event about that node was applied since the read started.

How stale the copy can be: by one event's propagation delay while the stream is up (the
recorder queues the event when it commits the change, before it answers the writer; the stream
delivers it, typically well under a millisecond on a local network, more under load). A stream
that dies silently is bounded by ``stream_lifetime_s``: each stream carries that deadline and is
re-opened, with a fresh initial state, when it expires; the copy is dropped whenever a stream
ends and rebuilt from the next one's initial state, never served from a dead stream.

Staleness never double-allocates: a placement counts only once the recorder's ``Reserve``
stored it, and Reserve re-checks capacity and quota atomically against the recorder's own state
(docs/design.md §2.6). A stale copy can cost a refused reservation and a retry (the refused node is
then read directly), a placement a binpack/spread ordering would not quite have chosen (Reserve
only asks that it fits), or a NoNodeFits for capacity freed within the last propagation delay —
the same as a direct read taken that much earlier.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from accounting.fit import NodeState, QuotaContext
from hami.accounting.v1 import usage_pb2
from services.common.policy import RecorderPolicy
from services.common.usage_watch import UsageWatch
from services.scheduler import convert
from services.scheduler.holds import Holds
from services.scheduler.node_table import Columns, NodeTable
from services.scheduler.recorder_client import Snapshot

_LOG = logging.getLogger(__name__)

DEFAULT_STREAM_LIFETIME_S = 300.0
"""Deadline of one WatchUsage stream; it is re-opened (with a fresh initial state) when it
expires. Bounds how long a connection that died without an error can go unnoticed; each
re-open re-sends every node, so it is longer than the admission cache's (which holds only
namespaces)."""


class _Unknown(enum.Enum):
    NODE = "unknown"


_UNKNOWN = _Unknown.NODE
"""A name the copy has no answer for: read it directly."""

_Entry = NodeState | None
"""A node's state, or None for a name the recorder does not have registered."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidates:
    """A Filter's candidates: those the cache holds, as columns for the vectorized fit, and
    those read directly, as NodeStates; the unregistered ones; the namespace quota."""

    columns: Columns | None
    """None when nothing came from the cache (the stream is down, or no cache)."""
    others: tuple[NodeState, ...]
    unknown: tuple[str, ...]
    quota: QuotaContext
    revision: int | None = None
    """The revision the cache had applied before it was read (every change up to it is in
    what came from the cache); None for a read that did not come from the cache."""

    def state_of(self, node_name: str) -> NodeState | None:
        """The candidate named ``node_name``, or None."""
        for node in self.others:
            if node.node_name == node_name:
                return node
        if self.columns is not None and node_name in self.columns.names:
            state: NodeState = self.columns.states[self.columns.names.index(node_name)]
            return state
        return None

    @classmethod
    def of(cls, snapshot: Snapshot) -> Candidates:
        """A snapshot read directly."""
        return cls(
            columns=None,
            others=snapshot.nodes,
            unknown=snapshot.unregistered,
            quota=snapshot.quota,
        )


_NO_QUOTA = QuotaContext({})
"""A namespace the recorder holds no quota item for (no limit, nothing used)."""


class DirectReader(Protocol):
    """What the cache needs from the recorder client (``RecorderClient`` is one)."""

    @property
    def target(self) -> str:
        """The recorder's address, for logs."""
        ...

    @property
    def policy(self) -> RecorderPolicy:
        """The recorder's accounting policy as this daemon holds it (each stream starts with
        the recorder's, which is held from then on)."""
        ...

    def snapshot(
        self, node_names: Sequence[str], namespace: str, timeout_s: float, *, quota: bool = True
    ) -> Snapshot:
        """Reads ``node_names`` (possibly none) and, with ``quota``, the namespace quota
        directly (else the snapshot's quota is empty and means nothing).

        Raises:
            DependencyUnavailableError: the recorder cannot be reached.
        """
        ...


class NodeCache:
    """Node states fed by WatchUsage, with direct reads where it cannot answer (module doc)."""

    def __init__(
        self,
        direct: DirectReader,
        watch_channel: grpc.Channel,
        *,
        stream_lifetime_s: float = DEFAULT_STREAM_LIFETIME_S,
    ) -> None:
        self._direct = direct
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # Replaced, never cleared, when a stream ends: a Filter still reading the old dict
        # keeps a consistent (if stale) view and its answers are not stored into the new one.
        self._nodes: dict[str, _Entry] = {}
        self._table = NodeTable(encode_score=convert.score_entry)
        """The registered entries of ``_nodes`` as columns (replaced with it)."""
        self._namespaces: dict[str, QuotaContext] = {}
        """Every namespace's quota items, as the stream carries them (replaced with it)."""
        self._touched: dict[str, int] = {}
        """Node name -> value of ``_applied`` when an event about it was last applied."""
        self._applied = 0
        self._complete = False
        """The current stream's initial state is complete: the recorder has subscribed it."""
        self._live = False
        self._generation = 0
        self._revision = -1
        """Revision of the last event applied on the current stream (-1: none yet)."""
        self._watch = UsageWatch(
            watch_channel,
            direct.target,
            what="node usage",
            # Nodes for the fit, namespaces for the quota it prices cards with.
            content=usage_pb2.WATCH_CONTENT_UNSPECIFIED,
            stream_lifetime_s=stream_lifetime_s,
            on_reset=self._reset,
            on_event=self._apply,
        )

    @property
    def target(self) -> str:
        return self._direct.target

    @property
    def live(self) -> bool:
        """True while a watch stream is open (the copy is then used)."""
        with self._lock:
            return self._live

    @property
    def complete(self) -> bool:
        """True while a stream is open and its initial state is complete: the copy then holds
        everything the recorder has."""
        with self._lock:
            return self._live and self._complete

    def cached(self) -> dict[str, NodeState | None]:
        """A copy of what the cache holds: node name -> state, None for "not registered"."""
        with self._lock:
            return dict(self._nodes)

    def start(self) -> NodeCache:
        self._watch.start()
        return self

    def wait_for_revision(self, revision: int, timeout_s: float) -> bool:
        """Waits until the open stream's initial state is complete and it has applied an event
        of ``revision`` or later (tests; the recorder's revision is ``UsageStore.revision``):
        every entry the cache holds then shows at least that revision."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._live and self._complete and self._revision >= revision, timeout_s
            )

    def close(self) -> None:
        """Ends the stream and its thread and closes the watch channel (idempotent)."""
        self._watch.close()

    # -- reads -----------------------------------------------------------------------------------

    def candidates(
        self,
        node_names: Sequence[str],
        namespace: str,
        timeout_s: float,
        *,
        refresh: Collection[str] = (),
        fresh_quota: bool = False,
        holds: Holds | None = None,
        pod_uid: str = "",
    ) -> Candidates:
        """The candidates' states, the cached ones as columns (a copy of their rows of the node
        table) for the vectorized fit, the rest (and ``refresh``) read directly; the
        unregistered candidates; and the namespace quota, from the copy too once the initial
        state is complete, unless ``fresh_quota`` asks for a direct read. A
        cached node with ``holds`` the copy does not show yet (other than ``pod_uid``'s) is
        handed as a NodeState with their usage added.

        Raises:
            DependencyUnavailableError: the recorder cannot be reached.
        """
        with self._lock:
            live = self._live
            nodes = self._nodes
            table = self._table
            generation = self._generation
            started = self._applied if self._complete else None
            revision = self._revision
            cached_quota = (
                self._namespaces.get(namespace, _NO_QUOTA)
                if self._complete and not fresh_quota
                else None
            )
        if not live:
            return Candidates.of(self._direct.snapshot(node_names, namespace, timeout_s))
        unseen = holds.unseen(pod_uid, revision) if holds is not None else {}
        held = {name: usage for name, usage in unseen.items() if name not in refresh}
        columns, missing = table.gather(node_names, {*refresh, *held})
        unregistered: list[str] = []
        to_read: list[str] = []
        adjusted: list[NodeState] = []
        for name in missing:
            entry = nodes.get(name, _UNKNOWN)
            # Not in the table: held, known to be unregistered, or to be read (unknown, a
            # refresh, or a registration applied since the rows were copied).
            if name in held and isinstance(entry, NodeState):
                adjusted.append(entry.with_added(held[name]))
            elif name not in refresh and entry is None:
                unregistered.append(name)
            else:
                to_read.append(name)
        read: tuple[NodeState, ...] = ()
        not_registered: tuple[str, ...] = ()
        quota = cached_quota
        if to_read or quota is None:
            answer = self._direct.snapshot(
                to_read, namespace, timeout_s, quota=cached_quota is None
            )
            read, not_registered = answer.nodes, answer.unregistered
            quota = cached_quota or answer.quota
        if to_read:
            self._keep(read, not_registered, generation, started)
        return Candidates(
            columns=columns,
            others=(*adjusted, *read),
            unknown=(*unregistered, *not_registered),
            quota=quota,
            revision=revision,
        )

    def _keep(
        self,
        read: Sequence[NodeState],
        unregistered: Sequence[str],
        generation: int,
        started: int | None,
    ) -> None:
        """Stores a direct read where it cannot be older than the stream (module docstring)."""
        if started is None:
            return
        with self._lock:
            if self._generation != generation:
                return
            touched = self._touched
            nodes = self._nodes
            for node in read:
                if touched.get(node.node_name, 0) <= started:
                    nodes[node.node_name] = node
                    self._table.put(node)
            for name in unregistered:
                if touched.get(name, 0) <= started:
                    nodes[name] = None
                    self._table.drop(name)

    # -- the watch thread ------------------------------------------------------------------------

    def _reset(self, live: bool) -> None:
        with self._lock:
            self._nodes = {}
            self._table = NodeTable(encode_score=convert.score_entry)
            self._namespaces = {}
            self._touched = {}
            self._applied = 0
            self._complete = False
            self._revision = -1
            self._generation += 1
            self._live = live
            self._changed.notify_all()

    def _apply(self, event: usage_pb2.UsageEvent) -> None:
        if event.HasField("policy"):
            self._direct.policy.accept(event.policy)
        state: NodeState | None = None
        name = ""
        if event.HasField("node"):
            name = event.node.node_name
            # Built outside the lock: Filters keep reading meanwhile.
            if event.node.devices:
                state = convert.node_state_from_pb(event.node)
        quota = (
            convert.quota_context_from_items(event.namespace_items) if event.namespace else None
        )
        with self._lock:
            if quota is not None:
                self._namespaces[event.namespace] = quota
            if name:
                self._applied += 1
                self._touched[name] = self._applied
                if state is None:
                    # Dropped, never registered, or registered without devices: ask directly.
                    self._nodes.pop(name, None)
                    self._table.drop(name)
                else:
                    self._nodes[name] = state
                    self._table.put(state)
            elif event.kind == usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE:
                self._complete = True
            self._revision = event.revision
            self._changed.notify_all()
