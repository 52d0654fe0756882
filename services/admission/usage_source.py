"""Where the admission daemon reads a namespace's GPU usage and limits: the usage recorder.

Layer: services/admission (adapter). Two sources with one method, ``namespace_items``:

* ``RecorderUsageSource`` calls ``UsageRecorder.GetNamespaceUsage`` for every check, with a
  deadline (2 s by default). This is the default (``HAMI_ACCOUNTING_USAGE_CACHE=off``): each
  answer is what the recorder had acknowledged when it answered.
* ``WatchedUsageSource`` (``HAMI_ACCOUNTING_USAGE_CACHE=watch``) keeps a local copy of every
  namespace's quota items, fed by ``WatchUsage(send_initial_state=True)`` in a background
  thread, and falls back to direct reads for a namespace it has not seen and for every
  namespace while the stream is down (the copy is dropped when the stream breaks and rebuilt
  from the next stream's initial state).

How stale the watch cache can be: while the stream is up, by one event's propagation delay
(the recorder queues the event when it commits the change; the stream delivers it, typically
well under a millisecond on a local network, more under load). A stream that dies without an
error (a silently dropped connection) is bounded by ``stream_lifetime_s``: each stream carries
that deadline and is re-opened, with a fresh snapshot, when it expires.

Neither source makes the quota check atomic. Two pods of one namespace checked at the same time
both see the same "already used", so both can pass where only one fits — exactly as in HAMi,
whose webhook reads its QuotaManager without reserving. The atomic re-check is the scheduler's
``Reserve`` in the recorder, which charges the pod's real grants under the recorder's lock and
refuses what no longer fits. Admission is the early, friendly "no"; Reserve is the guarantee.

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
from services.common.errors import DependencyUnavailableError

_LOG = logging.getLogger(__name__)

DEFAULT_USAGE_TIMEOUT_S = 2.0
"""Deadline of every GetNamespaceUsage call."""
DEFAULT_STREAM_LIFETIME_S = 60.0
"""Deadline of one WatchUsage stream; it is re-opened (with a fresh snapshot) when it expires."""
_RETRY_INITIAL_S = 0.2
_RETRY_MAX_S = 5.0

QuotaItems = Mapping[str, QuotaItem]
"""A namespace's quota items keyed by resource name (nvidia.com/gpumem, ...)."""


class UsageSource(Protocol):
    """What the quota check needs: a namespace's used and limit per resource."""

    def namespace_items(self, namespace: str) -> QuotaItems:
        """The namespace's items.

        Raises:
            DependencyUnavailableError: the recorder cannot be reached or did not answer in time.
        """
        ...

    def close(self) -> None:
        """Stops background work and closes channels (idempotent)."""
        ...


def _unavailable(target: str, error: grpc.RpcError) -> DependencyUnavailableError:
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    code_name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return DependencyUnavailableError(
        f"usage recorder unavailable at {target} ({code_name}): {details or 'no details'}; "
        "the quota cannot be checked"
    )


class RecorderUsageSource:
    """Direct reads: one GetNamespaceUsage call, with a deadline, per check."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        *,
        timeout_s: float = DEFAULT_USAGE_TIMEOUT_S,
    ) -> None:
        self._channel = channel
        self._stub = usage_pb2_grpc.UsageRecorderStub(channel)
        self.target = target
        """The recorder's address, named in every error."""
        self._timeout_s = timeout_s

    def namespace_items(self, namespace: str) -> QuotaItems:
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
            raise _unavailable(self.target, error) from None
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
        stream_lifetime_s: float = DEFAULT_STREAM_LIFETIME_S,
    ) -> None:
        self._direct = direct
        self._watch_channel = watch_channel
        self._stub = usage_pb2_grpc.UsageRecorderStub(watch_channel)
        self._stream_lifetime_s = stream_lifetime_s
        self._lock = threading.Lock()
        self._cache: dict[str, QuotaItems] = {}
        self._live = False
        # Bumped whenever the cache is dropped, so a direct read that started before cannot
        # re-insert what it read into a newer (or dead) stream's cache.
        self._generation = 0
        self._call: grpc.CallIterator[usage_pb2.UsageEvent] | None = None
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="admission-usage-watch", daemon=True
        )

    @property
    def target(self) -> str:
        return self._direct.target

    @property
    def live(self) -> bool:
        """True while a watch stream is open (the cache is then used)."""
        with self._lock:
            return self._live

    def cached_namespaces(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._cache)

    def start(self) -> WatchedUsageSource:
        self._thread.start()
        return self

    def wait_connected(self, timeout_s: float) -> bool:
        """Waits until a stream has delivered its first event (tests, start-up logs)."""
        return self._connected.wait(timeout_s)

    def namespace_items(self, namespace: str) -> QuotaItems:
        with self._lock:
            live, generation = self._live, self._generation
            cached = self._cache.get(namespace) if live else None
        if cached is not None:
            return cached
        items = self._direct.namespace_items(namespace)
        if live:
            with self._lock:
                # setdefault: an event that arrived during the read is at least as new.
                if self._live and self._generation == generation:
                    self._cache.setdefault(namespace, items)
        return items

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self._watch_channel.close()
        self._direct.close()

    # -- the watch thread ------------------------------------------------------------------------

    def _drop(self, live: bool) -> None:
        with self._lock:
            self._cache.clear()
            self._generation += 1
            self._live = live

    def _run(self) -> None:
        retry_s = _RETRY_INITIAL_S
        while not self._stop.is_set():
            call = self._stub.WatchUsage(
                usage_pb2.WatchUsageRequest(send_initial_state=True),
                timeout=self._stream_lifetime_s,
            )
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()  # type: ignore[no-untyped-call]
                break
            self._drop(live=True)
            try:
                for event in call:
                    self._apply(event)
                    retry_s = _RETRY_INITIAL_S
                # The recorder ended the stream (it is shutting down): reconnect.
                planned = False
            except grpc.RpcError as error:
                code = error.code() if callable(getattr(error, "code", None)) else None
                planned = code == grpc.StatusCode.DEADLINE_EXCEEDED
                if not planned and not self._stop.is_set():
                    _LOG.warning(
                        "usage watch stream to %s failed (%s); reading usage directly until it "
                        "is back",
                        self.target,
                        code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN",
                    )
            except Exception:
                # A bug must not end the thread: the cache would silently stay off.
                planned = False
                _LOG.exception("usage watch stream to %s broke; reconnecting", self.target)
            finally:
                self._drop(live=False)
                with self._lock:
                    self._call = None
            if not planned:
                self._stop.wait(retry_s)
                retry_s = min(retry_s * 2, _RETRY_MAX_S)

    def _apply(self, event: usage_pb2.UsageEvent) -> None:
        self._connected.set()
        # Node-only events carry no namespace; every event with one carries its full state.
        if not event.namespace:
            return
        items = MappingProxyType(dict(convert.quota_items_from_pb(event.namespace_items)))
        with self._lock:
            self._cache[event.namespace] = items
