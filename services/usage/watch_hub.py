"""The WatchUsage fan-out: each change encoded once, bounded buffers, a cap on open streams.

Layer: services/usage (streaming). The store commits a change and hands its events to
``WatchHub.publish`` under its lock; that is all a write pays for its watchers: the events are
appended to one shared log and the hub's event loop is woken (once, however many events arrive
before it runs). Everything else happens on the recorder's event loop, never on the threads
that answer unary calls (``services.common.server.event_loop``):

* **One log, one encoding.** Every watcher reads the same log through its own cursor. An
  event is encoded at most once per kind of content (namespaces, nodes, everything) the first
  time a watcher needs it, and those bytes are what every such watcher is sent: the encoding is
  assembled from parts (the change, the namespace items, the node) so the three kinds share
  their work too.
* **Batches under load.** A watcher is sent everything it has not had yet in one message when
  it asked for batches (``accept_batches``): ``UsageEvent.batch`` holds the same encoded events,
  each behind a two-part frame, without decoding or re-encoding anything.
* **The fan-out gives way to unary calls.** Streams with news take turns, one message per loop
  iteration (``_SendQueue``), so a call that arrives waits for one message at most; while calls
  keep coming each answered call lets a few messages through (``Throttle``), and a watcher sent
  less often gets larger batches. Every message costs the loop a socket write with the GIL
  held (docs/watch-usage.md has the profile): the fan-out's work grows with the number of
  watchers, not with the number of writes times watchers. On an idle loop every watcher is
  sent a change at once.
* **Bounded buffers.** A watcher's buffer is its distance from the head of the log. Once it
  is more than ``max_lag_events`` behind it is cut off: detached from the log (which then no
  longer keeps anything for it) and, as soon as the transport takes its next message, ended
  with RESOURCE_EXHAUSTED saying so; the client watches again with the initial state. A writer
  never waits for a watcher, and memory stays bounded: the log holds at most
  ``max_lag_events`` past the slowest attached watcher, a cut-off watcher at most the one
  message the transport still holds for it.
* **A cap on open streams.** Past ``max_streams`` a new stream is refused with
  RESOURCE_EXHAUSTED naming the cap (a cut-off stream counts until it has ended).
* **The initial state** is built under the store's lock (so no change falls between it and the
  first live event), encoded outside it, shared by watchers that subscribe at the same revision
  with the same content (a burst of re-subscriptions after a restart costs one encoding), and
  ended by an INITIAL_STATE_COMPLETE event, also when it is empty.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.usage import convert
from services.usage import metrics as usage_metrics
from services.usage.events import EncodedParts, EventKind, UsageEvent, WatchContent

_LOG = logging.getLogger(__name__)

DEFAULT_MAX_STREAMS = 256
"""Open WatchUsage streams a recorder serves at most (HAMI_ACCOUNTING_MAX_WATCH_STREAMS)."""
DEFAULT_MAX_LAG_EVENTS = 4096
"""Events a watcher may be behind the newest one before it is cut off."""
MAX_BATCH_EVENTS = 512
"""Events per batch message at most."""
MAX_BATCH_BYTES = 64 * 1024
"""Encoded bytes per batch message at most (one event larger than this goes alone). Also what a
cut-off watcher that stopped reading can still hold, besides its transport's window."""


@dataclass(frozen=True)
class Throttle:
    """How much of the event loop the fan-out takes while unary calls keep arriving."""

    credits_per_call: int = 1
    """Messages to watchers each answered unary call lets through (0: no throttle, the
    fan-out takes every loop iteration the calls leave)."""
    idle_s: float = 0.001
    """The loop counts as idle, and messages go one after the other, once no unary call has
    been in flight for this long."""
    max_defer_s: float = 0.05
    """A watcher with news waits at most this long for its turn, however busy the loop."""


DEFAULT_THROTTLE = Throttle()


class UnaryCallsView(Protocol):
    """The unary calls of the server the hub's streams run on
    (``services.common.server.event_loop.UnaryCalls``)."""

    in_flight: int
    last_end_s: float
    listeners: list[Callable[[bool], None]]


class _SendQueue:
    """Who hands the next message to the transport (on the event loop).

    Streams with something to send queue up, first come first served, and one is let go per
    loop iteration: between two messages the loop polls its sockets, so a unary call that
    arrives waits for one message at most, never for a round over every watcher, and a round
    over many watchers never holds the loop. While unary calls keep coming, the ``Throttle``
    lets through a few messages per answered call, so the calls keep most of the loop and the
    watchers get fewer, larger batches.
    """

    def __init__(self, calls: UnaryCallsView | None, throttle: Throttle) -> None:
        self._calls = calls
        self._throttle = throttle
        self._queue: collections.deque[WatchStream] = collections.deque()
        self._credits = 0
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop the streams run on (``WatchHub.open`` sets it). Kept rather than asked for:
        ``asyncio.get_running_loop`` makes a ``getpid`` system call in CPython 3.11, several per
        message here (docs/watch-usage.md has the profile)."""
        if calls is not None and throttle.credits_per_call:
            calls.listeners.append(self._on_call)

    def request(self, stream: WatchStream) -> None:
        """Queues the stream for a turn (once; on the loop)."""
        if stream.queued or stream.granted or stream.closed:
            return
        stream.queued = True
        stream.queued_at_s = self._running_loop().time()
        self._queue.append(stream)
        self._schedule()

    def _on_call(self, started: bool) -> None:
        if not started:
            per_call = self._throttle.credits_per_call
            self._credits = min(self._credits + per_call, 4 * per_call)
            if self._queue:
                self._schedule()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop

    def _schedule(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._running_loop().call_soon(self._pump)

    def _may_go(self, now_s: float, queued_at_s: float) -> bool:
        calls, throttle = self._calls, self._throttle
        if calls is None or not throttle.credits_per_call:
            return True
        idle = not calls.in_flight and now_s - calls.last_end_s >= throttle.idle_s
        if idle or now_s - queued_at_s >= throttle.max_defer_s:
            return True
        if self._credits > 0:
            self._credits -= 1
            return True
        return False

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queue = self._queue
        while queue and (queue[0].closed or not queue[0].queued):
            queue.popleft()
        if not queue:
            return
        loop = self._running_loop()
        now_s = loop.time()
        head = queue[0]
        if self._may_go(now_s, head.queued_at_s):
            queue.popleft()
            head.queued = False
            head.granted = True
            head._wake.set()
            if queue:
                self._schedule()  # the next turn in the next loop iteration
            return
        calls, throttle = self._calls, self._throttle
        assert calls is not None
        wake_s = head.queued_at_s + throttle.max_defer_s
        if not calls.in_flight:
            wake_s = min(wake_s, calls.last_end_s + throttle.idle_s)
        # A call's end wakes the pump too (its credits).
        self._timer = loop.call_at(wake_s, self._schedule)


Encoder = Callable[[UsageEvent], EncodedParts]
"""Encodes an event's three parts (``convert.encode_event_parts``)."""
Framer = Callable[[bytes], bytes]
"""Frames one encoded event as an element of ``UsageEvent.batch``."""


class StreamCapReachedError(Exception):
    """A new stream would exceed the cap; the message names it."""


class WatcherCutOffError(Exception):
    """The watcher fell more than ``max_lag_events`` behind; the message says so."""


def _encoded(event: UsageEvent, content: WatchContent, encode: Encoder) -> bytes:
    return encode(event).for_content(content)


class _Entry:
    """One event of the log and its encodings, made on the event loop the first time a
    watcher needs them."""

    __slots__ = ("_encoded", "_framed", "_parts", "event")

    def __init__(self, event: UsageEvent) -> None:
        self.event = event
        self._parts: EncodedParts | None = None
        self._encoded: dict[WatchContent, bytes] = {}
        self._framed: dict[WatchContent, bytes] = {}

    def encoded(self, content: WatchContent, encode: Encoder) -> bytes:
        data = self._encoded.get(content)
        if data is None:
            if self._parts is None:
                self._parts = encode(self.event)
            data = self._encoded[content] = self._parts.for_content(content)
        return data

    def framed(self, content: WatchContent, encode: Encoder, frame: Framer) -> bytes:
        data = self._framed.get(content)
        if data is None:
            data = self._framed[content] = frame(self.encoded(content, encode))
        return data


@dataclass
class InitialState:
    """A subscription's current state, encoded once per (content, policy or not, revision) and
    shared by the watchers that subscribe with it."""

    revision: int
    messages: tuple[bytes, ...]
    """One encoded event per node and namespace (SNAPSHOT, after the POLICY event when asked
    for), then INITIAL_STATE_COMPLETE: what a watcher without batches is sent."""
    batches: tuple[bytes, ...]
    """The same events as batch messages: what a watcher with batches is sent."""


class WatchStream:
    """One open WatchUsage stream: what it asked for, and its place in the log."""

    __slots__ = ("_wake", "accept_batches", "attached", "closed", "content", "cursor",
                 "cut_off", "ended", "granted", "queued", "queued_at_s")

    def __init__(self, content: WatchContent, accept_batches: bool) -> None:
        self.content = content
        self.accept_batches = accept_batches
        self.cursor = 0
        """Sequence number of the next log entry this watcher has not been sent."""
        self.attached = False
        self.cut_off = False
        self.ended = False
        """The recorder is shutting down: end the stream normally."""
        self.closed = False
        self.granted = False
        """Its turn has come: it may hand the transport one message."""
        self.queued = False
        """Waiting for a turn to send (``_SendQueue``)."""
        self.queued_at_s = 0.0
        self._wake = asyncio.Event()
        """Set when the stream's turn comes, and when it is cut off or ended."""


class WatchHub:
    """The fan-out of one store's changes to its WatchUsage streams (module docstring)."""

    def __init__(
        self,
        encode: Encoder = convert.encode_event_parts,
        frame: Framer = convert.frame_batch_element,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_lag_events: int = DEFAULT_MAX_LAG_EVENTS,
        unary_calls: UnaryCallsView | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        if max_streams < 1 or max_lag_events < 1:
            raise ValueError("max_streams and max_lag_events must be at least 1")
        self._encode = encode
        self._frame = frame
        self.max_streams = max_streams
        self.max_lag_events = max_lag_events
        self._send_queue = _SendQueue(unary_calls, throttle or DEFAULT_THROTTLE)
        self._lock = threading.Lock()
        # -- guarded by _lock (writers, subscriptions and the loop all touch these) ------------
        self._log: list[_Entry] = []
        self._log_start = 0
        """Sequence number of ``_log[0]``."""
        self._attached: set[WatchStream] = set()
        self._wanted = WatchContent(0)
        self._wake_pending = False
        self._initial: weakref.WeakValueDictionary[
            tuple[WatchContent, bool, int], InitialState
        ] = weakref.WeakValueDictionary()
        # -- the event loop's own ---------------------------------------------------------------
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = 0

    # -- the writers' side (called with the store's lock held) -----------------------------------

    @property
    def wanted(self) -> WatchContent:
        """What the attached watchers asked for together (the store builds only that)."""
        return self._wanted

    @property
    def watching(self) -> bool:
        """Whether any watcher is attached (a write without watchers builds no event)."""
        return bool(self._attached)

    def publish(self, events: Sequence[UsageEvent]) -> None:
        """Appends a change's events to the log and wakes the event loop; never blocks on a
        watcher. Call with the store's lock held, so the log is in revision order."""
        if not self._attached:
            return
        with self._lock:
            self._log.extend(_Entry(event) for event in events)
            wake = not self._wake_pending
            self._wake_pending = True
        loop = self._loop
        if wake and loop is not None:
            # RuntimeError: the loop has closed; the server is gone, and so are the streams.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._deliver)

    def attach(self, stream: WatchStream) -> None:
        """Starts the stream at the head of the log: it is sent every change published from now
        on. Call with the store's lock held, right after reading its initial state."""
        with self._lock:
            if stream.closed:
                return  # its client went away while it was subscribing
            stream.cursor = self._log_start + len(self._log)
            stream.attached = True
            self._attached.add(stream)
            self._wanted |= stream.content

    def initial_state(
        self, content: WatchContent, with_policy: bool, revision: int
    ) -> InitialState | None:
        """The encoded initial state another watcher is still using for this revision."""
        with self._lock:
            return self._initial.get((content, with_policy, revision))

    def encode_initial_state(
        self,
        content: WatchContent,
        with_policy: bool,
        revision: int,
        events: Iterable[UsageEvent],
    ) -> InitialState:
        """Encodes an initial state (outside the store's lock) and shares it with watchers
        that subscribe at the same revision while this one is in use."""
        messages = [_encoded(event, content, self._encode) for event in events]
        messages.append(_encoded(
            UsageEvent(EventKind.INITIAL_STATE_COMPLETE, revision), content, self._encode))
        # Both forms are built here, off the loop, once for every watcher that shares them.
        batches = tuple(_batched(self._frame(message) for message in messages))
        state = InitialState(revision, tuple(messages), batches)
        with self._lock:
            return self._initial.setdefault((content, with_policy, revision), state)

    # -- the event loop's side ---------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        """Streams being served, cut-off ones included (read on the event loop)."""
        return self._open

    @property
    def attached_count(self) -> int:
        with self._lock:
            return len(self._attached)

    @property
    def furthest_behind_events(self) -> int:
        """Events the attached watcher furthest behind has not been sent yet (0: none)."""
        with self._lock:
            head = self._log_start + len(self._log)
            return max((head - stream.cursor for stream in self._attached), default=0)

    @property
    def retained_events(self) -> int:
        """Events the log holds: those some attached watcher has not been sent yet."""
        with self._lock:
            return len(self._log)

    def open(self, content: WatchContent, accept_batches: bool) -> WatchStream:
        """A new stream, on the event loop; ``close`` it when it ends.

        Raises:
            StreamCapReachedError: ``max_streams`` streams are already open.
        """
        self._loop = self._send_queue.loop = asyncio.get_running_loop()
        if self._open >= self.max_streams:
            usage_metrics.count_watch_cutoffs("stream_cap")
            raise StreamCapReachedError(
                f"the recorder already serves its cap of {self.max_streams} WatchUsage streams "
                "(HAMI_ACCOUNTING_MAX_WATCH_STREAMS); watch again later, or read directly"
            )
        self._open += 1
        return WatchStream(content, accept_batches)

    def close(self, stream: WatchStream) -> None:
        """Releases the stream's place (on the event loop; idempotent per stream)."""
        if stream.closed:
            return
        stream.closed = True
        self._detach(stream)
        self._open -= 1

    def end_all(self) -> None:
        """Ends every stream normally (the recorder is stopping); callable from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._end_all)

    async def messages(
        self, stream: WatchStream, initial: InitialState | None
    ) -> AsyncIterator[bytes]:
        """What the stream sends: its initial state, then every change, batched when it
        accepts batches.

        Raises:
            WatcherCutOffError: the watcher fell too far behind.
        """
        if initial is not None:
            for message in initial.batches if stream.accept_batches else initial.messages:
                await self._turn(stream)
                yield message
            # Let go once sent (the caller keeps no reference either): the watchers that
            # subscribed at this revision share it while they are sent it, and then its memory
            # goes back, instead of each stream keeping its revision's copy for its whole life.
            initial = None
        if self._pending(stream):
            self._send_queue.request(stream)
        while True:
            if stream.cut_off:
                raise WatcherCutOffError(
                    f"this watcher fell more than {self.max_lag_events} changes behind and was "
                    "cut off (the recorder never waits for a watcher); watch again with "
                    "send_initial_state"
                )
            if stream.ended:
                return
            if not stream.granted:
                # Queued for a turn by _deliver when there is news, by itself after a message
                # when there is more.
                await stream._wake.wait()
                stream._wake.clear()
                continue
            stream.granted = False
            entries = self._take(stream)
            if stream.accept_batches:
                messages: Iterable[bytes] = self._batches(entries, stream.content)
            else:
                messages = (entry.encoded(stream.content, self._encode) for entry in entries)
            for number, message in enumerate(messages):
                if number:
                    await self._turn(stream)
                    if stream.cut_off or stream.ended:
                        break
                yield message
            if self._pending(stream):
                self._send_queue.request(stream)

    # -- internals ---------------------------------------------------------------------------------

    async def _turn(self, stream: WatchStream) -> None:
        """Queues the stream and waits for its turn to hand the transport a message
        (``_SendQueue``), or until it is cut off or ended."""
        self._send_queue.request(stream)
        while not stream.granted and not (stream.cut_off or stream.ended):
            await stream._wake.wait()
            stream._wake.clear()
        stream.granted = False

    def _pending(self, stream: WatchStream) -> bool:
        with self._lock:
            return stream.attached and stream.cursor < self._log_start + len(self._log)

    def _take(self, stream: WatchStream) -> list[_Entry]:
        with self._lock:
            if not stream.attached:
                return []
            entries = self._log[stream.cursor - self._log_start:]
            stream.cursor += len(entries)
        return entries

    def _batches(self, entries: Sequence[_Entry], content: WatchContent) -> Iterable[bytes]:
        if len(entries) == 1:
            yield entries[0].encoded(content, self._encode)
            return
        yield from _batched(entry.framed(content, self._encode, self._frame) for entry in entries)

    def _deliver(self) -> None:
        """On the loop after a publish: cut off the watchers too far behind, drop what every
        other watcher has been sent, and wake them all."""
        cut = 0
        with self._lock:
            self._wake_pending = False
            head = self._log_start + len(self._log)
            streams = list(self._attached)
            oldest = head
            for stream in streams:
                if head - stream.cursor > self.max_lag_events:
                    self._detach_locked(stream)
                    stream.cut_off = True
                    cut += 1
                elif stream.cursor < oldest:
                    oldest = stream.cursor
            read = oldest - self._log_start
            if read > 0:
                del self._log[:read]
                self._log_start = oldest
        for stream in streams:
            if stream.cut_off:
                stream._wake.set()
            elif not stream.queued:
                self._send_queue.request(stream)
        if cut:
            usage_metrics.count_watch_cutoffs("lag", cut)
            _LOG.warning(
                "cut off %d usage watcher(s) that fell more than %d changes behind",
                cut, self.max_lag_events, extra={"max_lag_events": self.max_lag_events},
            )

    def _detach(self, stream: WatchStream) -> None:
        with self._lock:
            self._detach_locked(stream)
        stream._wake.set()

    def _detach_locked(self, stream: WatchStream) -> None:
        if not stream.attached:
            return
        stream.attached = False
        self._attached.discard(stream)
        wanted = WatchContent(0)
        for other in self._attached:
            wanted |= other.content
        self._wanted = wanted
        if not self._attached:
            # Nobody reads the log any more: drop it now.
            self._log_start += len(self._log)
            self._log.clear()

    def _end_all(self) -> None:
        with self._lock:
            streams = list(self._attached)
        for stream in streams:
            stream.ended = True
            self._detach(stream)


def _batched(framed: Iterable[bytes]) -> Iterable[bytes]:
    """Joins framed events into batch messages of at most MAX_BATCH_EVENTS / MAX_BATCH_BYTES."""
    parts: list[bytes] = []
    size = 0
    for part in framed:
        if parts and (len(parts) >= MAX_BATCH_EVENTS or size + len(part) > MAX_BATCH_BYTES):
            yield b"".join(parts)
            parts, size = [], 0
        parts.append(part)
        size += len(part)
    if parts:
        yield b"".join(parts)
