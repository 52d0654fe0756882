"""Where the admission daemon reads a namespace's GPU usage and limits: the usage recorder.

Layer: services/admission (adapter). Two sources with one method, ``namespace_items``:

* ``WatchedUsageSource`` (``HAMI_ACCOUNTING_USAGE_CACHE=watch``, the default) keeps a local
  copy of every namespace's quota items, fed by ``WatchUsage(send_initial_state=True)`` in a
  background thread (``services.common.usage_watch``), and reads directly while the stream is
  down (the copy is dropped when the stream breaks and rebuilt from the next stream's initial
  state). A namespace the copy does not hold yet (one that had neither usage nor limits, or a
  change the stream has not delivered yet) is read directly, so a check in a namespace just
  given its quota sees it; the read is kept once the stream's initial state is complete (its
  ``INITIAL_STATE_COMPLETE`` event, which comes also from a recorder that holds nothing): the
  recorder has then subscribed the stream, so every later change arrives as an event and no
  change can fall between the read and the stream. Each namespace is read directly once.
* ``RecorderUsageSource`` (``HAMI_ACCOUNTING_USAGE_CACHE=off``) calls
  ``UsageRecorder.GetNamespaceUsage`` for every check, with a deadline (2 s by default): each
  answer is what the recorder had acknowledged when it answered. The cache also uses it for the
  reads it cannot answer and for ``fresh=True`` reads.

How stale the watch cache can be: while the stream is up, by one event's propagation delay
(the recorder queues the event when it commits the change; the stream delivers it, typically
a fraction of a millisecond on one machine, more under load; docs/benchmarks.md has the
figure). A stream that dies without an error (a silently dropped connection) is bounded by
``stream_lifetime_s``: each stream carries that deadline and is re-opened, with a fresh
snapshot, when it expires.

Why that staleness is safe, and why it is the default: the quota check never was atomic. Two
pods of one namespace checked at the same time both see the same "already used", so both can
pass where only one fits — exactly as in HAMi, whose webhook reads its QuotaManager without
reserving — and a pod is only charged when it is recorded, seconds later. The guarantee is the
scheduler's ``Reserve`` in the recorder, which re-checks the pod's real grants against the
namespace quota under the recorder's lock and refuses what no longer fits. Admission is the
early, friendly "no"; a cached "yes" can at worst let through a pod that Reserve then refuses.
A cached "no" would be a wrong refusal of a pod that fits, so the checker confirms every denial
with a ``fresh`` read before answering (``QuotaChecker``). The direct reads cost a second
round trip per check (docs/benchmarks.md has CheckQuota with the cache and without).

A recorder that cannot be reached is ``DependencyUnavailableError`` naming its address
(UNAVAILABLE on gRPC, 503 in an AdmissionReview) — never a silent allow.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

import grpc

from accounting.model import QuotaItem
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.admission import convert
from services.common.errors import recorder_unavailable
from services.common.policy import PolicySource, RecorderPolicy
from services.common.usage_watch import UsageWatch

_LOG = logging.getLogger(__name__)

DEFAULT_USAGE_TIMEOUT_S = 2.0
"""Deadline of every GetNamespaceUsage call."""
DEFAULT_STREAM_LIFETIME_S = 60.0
"""Deadline of one WatchUsage stream; it is re-opened (with a fresh snapshot) when it expires."""
MAX_REVISION_LEAD = 10_000
"""A revision further ahead of the cache than this is not one its stream is about to deliver
(a token from another recorder's journal, or made up): it is read directly at once instead of
holding a server thread for the wait."""
DEFAULT_MIN_REVISION_WAIT_S = 0.25
"""How long a check asking for a revision the cache has not reached waits for its event before
reading the recorder directly (a revision from a restarted recorder's past, or a lagging
stream)."""

QuotaItems = Mapping[str, QuotaItem]
"""A namespace's quota items keyed by resource name (nvidia.com/gpumem, ...)."""


def should_wait_for_revision(min_revision: int, applied_revision: int) -> bool:
    """Whether a check asking for ``min_revision`` waits for the stream to deliver it, given the
    revision of the last event applied (-1: none yet).

    Never without a token (0): such a check takes the newest the cache has, or reads directly,
    and must not wait on a stream that may have nothing to send. Not for a revision already
    applied, nor for one more than ``MAX_REVISION_LEAD`` ahead.
    """
    lead = min_revision - applied_revision
    return min_revision > 0 and 0 < lead <= MAX_REVISION_LEAD


class UsageSource(Protocol):
    """What the quota check needs: a namespace's used and limit per resource."""

    def namespace_items(
        self, namespace: str, *, fresh: bool = False, min_revision: int = 0
    ) -> QuotaItems:
        """The namespace's items: with ``fresh``, as the recorder has them now (no cache); with
        ``min_revision``, at least as new as that recorder revision (read-your-writes).

        Raises:
            DependencyUnavailableError: the recorder cannot be reached or did not answer in time.
        """
        ...

    @property
    def may_be_stale(self) -> bool:
        """True when answers can come from a copy (a ``fresh`` read then asks the recorder)."""
        ...

    def close(self) -> None:
        """Stops background work and closes channels (idempotent)."""
        ...


class RecorderUsageSource:
    """Direct reads: one GetNamespaceUsage call, with a deadline, per check."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        *,
        policy: PolicySource,
        timeout_s: float = DEFAULT_USAGE_TIMEOUT_S,
    ) -> None:
        """Args: ``policy`` is told the accounting policy every answer was given under (the
        daemon's ``RecorderPolicy``)."""
        self._channel = channel
        self._stub = usage_pb2_grpc.UsageRecorderStub(channel)
        self.target = target
        """The recorder's address, named in every error."""
        self.policy = policy
        self._timeout_s = timeout_s

    @property
    def may_be_stale(self) -> bool:
        return False

    def namespace_items(
        self, namespace: str, *, fresh: bool = False, min_revision: int = 0
    ) -> QuotaItems:
        # Every direct answer is at least as new as any revision the recorder handed out.
        try:
            response = self._stub.GetNamespaceUsage(
                usage_pb2.GetNamespaceUsageRequest(namespace=namespace),
                timeout=self._timeout_s,
                # Wait out a reconnect (the recorder restarting or starting after us) within
                # the deadline instead of failing at once while the channel backs off.
                wait_for_ready=True,
            )
        except grpc.RpcError as error:
            # Every failure means the same thing here: the usage is unknown, so the quota
            # cannot be checked. Callers retry or fail closed.
            raise recorder_unavailable(
                self.target, error, "the quota cannot be checked"
            ) from None
        self.policy.observe(response.policy_id)
        return convert.quota_items_from_pb(response.items)

    def close(self) -> None:
        self._channel.close()


class WatchedUsageSource:
    """A cache of every namespace's items fed by WatchUsage; see the module docstring."""

    def __init__(
        self,
        direct: RecorderUsageSource,
        watch_channel: grpc.Channel,
        *,
        policy: RecorderPolicy | None = None,
        stream_lifetime_s: float = DEFAULT_STREAM_LIFETIME_S,
        min_revision_wait_s: float = DEFAULT_MIN_REVISION_WAIT_S,
    ) -> None:
        self._direct = direct
        # Each stream starts with the recorder's policy; it is held for every answer.
        self._policy = policy
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._cache: dict[str, QuotaItems] = {}
        self._live = False
        self._complete = False
        """The current stream's initial state is complete: the recorder has subscribed it."""
        self._revision = -1
        """Revision of the last event applied on the current stream (-1: none yet)."""
        self._min_revision_wait_s = min_revision_wait_s
        # Bumped whenever the cache is dropped, so a direct read that started before cannot
        # re-insert what it read into a newer (or dead) stream's cache.
        self._generation = 0
        self._connected = threading.Event()
        self._watch = UsageWatch(
            watch_channel,
            direct.target,
            what="namespace usage",
            content=usage_pb2.WATCH_CONTENT_NAMESPACES,
            stream_lifetime_s=stream_lifetime_s,
            on_reset=self._drop,
            on_event=self._apply,
            send_policy=policy is not None,
        )

    @property
    def target(self) -> str:
        return self._direct.target

    @property
    def may_be_stale(self) -> bool:
        return True

    @property
    def live(self) -> bool:
        """True while a watch stream is open (the cache is then used)."""
        with self._lock:
            return self._live

    def cached_namespaces(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._cache)

    @property
    def complete(self) -> bool:
        """True while the open stream's initial state is complete (the copy is then whole)."""
        with self._lock:
            return self._live and self._complete

    def start(self) -> WatchedUsageSource:
        self._watch.start()
        return self

    def wait_connected(self, timeout_s: float) -> bool:
        """Waits until a stream has delivered its first event (tests, start-up logs)."""
        return self._connected.wait(timeout_s)

    def namespace_items(
        self, namespace: str, *, fresh: bool = False, min_revision: int = 0
    ) -> QuotaItems:
        if fresh:
            # Not stored: without a revision on the answer, it cannot be told apart from an
            # older one, and the stream delivers the same change anyway.
            return self._direct.namespace_items(namespace)
        with self._changed:
            if self._live and should_wait_for_revision(min_revision, self._revision):
                # The write is usually one event away: waiting for it is cheaper than a read.
                self._changed.wait_for(
                    lambda: not self._live or self._revision >= min_revision,
                    self._min_revision_wait_s,
                )
            live, generation = self._live, self._generation
            # The initial state is complete: the recorder has subscribed the stream, so every
            # change after this moment arrives as an event.
            complete = self._complete
            cached = (
                self._cache.get(namespace) if live and self._revision >= min_revision else None
            )
        if cached is not None:
            return cached
        items = self._direct.namespace_items(namespace)
        if live and complete:
            # Kept only when no change can fall between the read and the stream: a read taken
            # before the recorder subscribed the stream could miss a change for good.
            with self._lock:
                # setdefault: an event that arrived during the read is at least as new.
                if self._live and self._generation == generation:
                    self._cache.setdefault(namespace, items)
        return items

    def close(self) -> None:
        self._watch.close()
        self._direct.close()

    # -- the watch thread ------------------------------------------------------------------------

    def _drop(self, live: bool) -> None:
        with self._lock:
            self._cache.clear()
            self._generation += 1
            self._live = live
            self._complete = False
            self._revision = -1
            self._changed.notify_all()

    def _apply(self, event: usage_pb2.UsageEvent) -> None:
        if self._policy is not None and event.HasField("policy"):
            self._policy.accept(event.policy)
        self._connected.set()
        # Node-only events carry no namespace; every event with one carries its full state.
        items = (
            MappingProxyType(dict(convert.quota_items_from_pb(event.namespace_items)))
            if event.namespace
            else None
        )
        with self._lock:
            if items is not None:
                self._cache[event.namespace] = items
            elif event.kind == usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE:
                self._complete = True
            self._revision = event.revision
            self._changed.notify_all()
