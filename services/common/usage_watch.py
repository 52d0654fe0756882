"""One long-lived ``WatchUsage`` subscription, kept open in a background thread.

Layer: services (runtime). Both caches fed by the recorder — the admission daemon's namespace
items and the scheduler's node states — need the same loop: open
``WatchUsage(send_initial_state=True, accept_batches=True)`` with a deadline, hand every event to
the cache (the events of a batch one by one, in order), and when the stream ends re-open it,
with backoff unless the end was the planned deadline. This module owns that loop; a cache
supplies what to do with an event and what to do when a stream opens or closes (``on_reset``:
drop the copy, never serve it from a dead stream). The initial state ends with an
``INITIAL_STATE_COMPLETE`` event (also on an empty recorder): from it on, the cache holds
everything the recorder has of its part, so what it does not hold, the recorder does not have.

A stream the recorder ends with RESOURCE_EXHAUSTED (its cap of open streams is reached, or this
watcher fell so far behind that it was cut off) is re-opened like any failure: after a backoff,
with a fresh initial state; the cache reads directly meanwhile.

Why a deadline on a stream that is meant to live forever: a connection that dies without an
error (a silently dropped peer) would otherwise go unnoticed; the deadline bounds that, and each
re-open brings a fresh initial state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc

_LOG = logging.getLogger(__name__)

RETRY_INITIAL_S = 0.2
"""Wait before the first re-open after a failure; doubled on each failure in a row."""
RETRY_MAX_S = 5.0
"""Longest wait between re-opens."""


class UsageWatch:
    """Runs the subscription for the part of the state ``content`` names (a cache asks only for
    what it keeps); ``on_reset(live)`` runs when a stream opens (True) and closes (False),
    ``on_event`` for every event, both on the watch thread."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        *,
        what: str,
        content: usage_pb2.WatchContent.ValueType,
        stream_lifetime_s: float,
        on_reset: Callable[[bool], None],
        on_event: Callable[[usage_pb2.UsageEvent], None],
        send_policy: bool = True,
    ) -> None:
        self._channel = channel
        self._stub = usage_pb2_grpc.UsageRecorderStub(channel)
        self.target = target
        """The recorder's address, for logs."""
        self._what = what
        # Each stream starts with the recorder's accounting policy: every answer a cache gives
        # from it is under that policy (services.common.policy).
        self._request = usage_pb2.WatchUsageRequest(
            send_initial_state=True, content=content, send_policy=send_policy,
            accept_batches=True,
        )
        self._stream_lifetime_s = stream_lifetime_s
        self._on_reset = on_reset
        self._on_event = on_event
        self._lock = threading.Lock()
        self._call: grpc.CallIterator[usage_pb2.UsageEvent] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{what} watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Ends the stream and its thread and closes the channel (idempotent)."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self._channel.close()

    def _run(self) -> None:
        retry_s = RETRY_INITIAL_S
        while not self._stop.is_set():
            call = self._stub.WatchUsage(self._request, timeout=self._stream_lifetime_s)
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()  # type: ignore[no-untyped-call]
                break
            self._on_reset(True)
            try:
                for message in call:
                    if message.batch:
                        for event in message.batch:
                            self._on_event(event)
                    else:
                        self._on_event(message)
                    retry_s = RETRY_INITIAL_S
                # The recorder ended the stream (it is shutting down): reconnect.
                planned = False
            except grpc.RpcError as error:
                code = error.code() if callable(getattr(error, "code", None)) else None
                planned = code == grpc.StatusCode.DEADLINE_EXCEEDED
                if not planned and not self._stop.is_set():
                    _LOG.warning(
                        "%s watch stream to %s failed (%s: %s); reading directly until it is "
                        "back",
                        self._what,
                        self.target,
                        code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN",
                        _details(error),
                    )
            except Exception:
                # A bug must not end the thread: the cache would silently stay off.
                planned = False
                _LOG.exception("%s watch stream to %s broke; reconnecting", self._what, self.target)
            finally:
                self._on_reset(False)
                with self._lock:
                    self._call = None
            if not planned:
                self._stop.wait(retry_s)
                retry_s = min(retry_s * 2, RETRY_MAX_S)


def _details(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    return str(details() if callable(details) else "") or "no details"
