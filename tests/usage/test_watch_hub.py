"""The watch hub without a server: one encoding per change and content, batches that carry the
same bytes, cut-off past the lag bound with the log kept bounded, the stream cap, pacing, and
the initial state shared by watchers at one revision (services/usage/watch_hub.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from prometheus_client import REGISTRY

from accounting.model import QuotaItem
from hami.accounting.v1 import usage_pb2
from services.usage import convert
from services.usage.events import EncodedParts, EventKind, NodeSnapshot, UsageEvent, WatchContent
from services.usage.watch_hub import (
    MAX_BATCH_EVENTS,
    StreamCapReachedError,
    Throttle,
    WatcherCutOffError,
    WatchHub,
    WatchStream,
)

T = TypeVar("T")
K = usage_pb2


def run(coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coroutine())


class CountingEncoder:
    """convert.encode_event_parts, counting the events it encodes."""

    def __init__(self) -> None:
        self.revisions: list[int] = []

    def __call__(self, event: UsageEvent) -> EncodedParts:
        self.revisions.append(event.revision)
        return convert.encode_event_parts(event)


def change(revision: int, namespace: str = "ns", node: str = "node1") -> UsageEvent:
    return UsageEvent(
        EventKind.POD_CHANGED,
        revision,
        pod_uid=f"uid-{revision}",
        namespace=namespace,
        namespace_items=(QuotaItem("nvidia.com/gpumem", used=revision, limit=0,
                                   limit_set=False),),
        node=NodeSnapshot(node, (), (f"uid-{revision}",)),
    )


def decode(message: bytes) -> list[usage_pb2.UsageEvent]:
    """The events of one message, a batch unpacked in order."""
    parsed = usage_pb2.UsageEvent.FromString(message)
    return list(parsed.batch) if parsed.batch else [parsed]


def watch(hub: WatchHub, content: WatchContent = WatchContent.ALL,
          batches: bool = False) -> tuple[WatchStream, AsyncIterator[bytes]]:
    stream = hub.open(content, batches)
    hub.attach(stream)  # what UsageStore.subscribe does under its lock
    return stream, hub.messages(stream, None)


async def take(messages: AsyncIterator[bytes], count: int) -> list[usage_pb2.UsageEvent]:
    """Reads messages until ``count`` events have arrived."""
    events: list[usage_pb2.UsageEvent] = []
    while len(events) < count:
        events.extend(decode(await asyncio.wait_for(anext(messages), 5)))
    return events


def test_each_change_is_encoded_once_for_every_watcher_of_a_content() -> None:
    encoder = CountingEncoder()

    async def scenario() -> tuple[list[list[bytes]], list[list[bytes]]]:
        hub = WatchHub(encoder, convert.frame_batch_element)
        namespaces = [watch(hub, WatchContent.NAMESPACES) for _ in range(5)]
        nodes = [watch(hub, WatchContent.NODES) for _ in range(5)]
        for revision in (1, 2, 3):
            hub.publish([change(revision)])
            await asyncio.sleep(0)
        received = []
        for _stream, messages in (*namespaces, *nodes):
            received.append([await asyncio.wait_for(anext(messages), 5) for _ in range(3)])
        return received[:5], received[5:]

    by_namespace, by_node = run(scenario)
    assert encoder.revisions == [1, 2, 3]  # ten watchers, two contents, one encoding each
    # The same bytes object went to every watcher of a content.
    for received in (by_namespace, by_node):
        for position in range(3):
            assert len({id(messages[position]) for messages in received}) == 1
    namespace_event = decode(by_namespace[0][0])[0]
    node_event = decode(by_node[0][0])[0]
    assert namespace_event.namespace_items and not namespace_event.HasField("node")
    assert node_event.HasField("node") and not node_event.namespace_items


@pytest.mark.parametrize("content", list(WatchContent), ids=lambda c: c.name)
def test_the_parts_concatenate_into_the_event_a_watcher_of_that_content_gets(
    content: WatchContent,
) -> None:
    event = change(7)
    parts = convert.encode_event_parts(event)
    assert usage_pb2.UsageEvent.FromString(parts.for_content(content)) == convert.event_to_pb(
        event, content)


def test_a_batch_holds_the_events_in_order_and_the_same_events_as_single_messages() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        hub = WatchHub()
        _single, singles = watch(hub, batches=False)
        _batched, batches = watch(hub, batches=True)
        # Published before the watchers' senders run: they find all five waiting.
        hub.publish([change(revision) for revision in range(1, 6)])
        one_by_one = [await asyncio.wait_for(anext(singles), 5) for _ in range(5)]
        batch = [await asyncio.wait_for(anext(batches), 5)]
        return one_by_one, batch

    one_by_one, batch = run(scenario)
    assert len(batch) == 1
    batched = decode(batch[0])
    assert [e.revision for e in batched] == [1, 2, 3, 4, 5]
    assert batched == [usage_pb2.UsageEvent.FromString(m) for m in one_by_one]
    assert usage_pb2.UsageEvent.FromString(batch[0]).revision == 0  # nothing outside the batch


def test_a_long_backlog_is_split_into_bounded_batches() -> None:
    async def scenario() -> list[list[usage_pb2.UsageEvent]]:
        hub = WatchHub(max_lag_events=10_000)
        _stream, messages = watch(hub, batches=True)
        total = MAX_BATCH_EVENTS + 10
        hub.publish([change(revision) for revision in range(1, total + 1)])
        got: list[list[usage_pb2.UsageEvent]] = []
        while sum(len(m) for m in got) < total:
            got.append(decode(await asyncio.wait_for(anext(messages), 5)))
        return got

    messages = run(scenario)
    assert len(messages) >= 2
    assert all(len(events) <= MAX_BATCH_EVENTS for events in messages)
    revisions = [e.revision for events in messages for e in events]
    assert revisions == list(range(1, MAX_BATCH_EVENTS + 11))


def _cutoffs(reason: str) -> float:
    value = REGISTRY.get_sample_value("hami_accounting_watch_cutoffs_total", {"reason": reason})
    assert value is not None  # both reasons are shown from the start
    return value


def test_a_watcher_too_far_behind_is_cut_off_and_the_log_stays_bounded() -> None:
    async def scenario() -> tuple[int, int, bool, str]:
        hub = WatchHub(max_lag_events=8)
        stuck, stuck_messages = watch(hub)  # never read: its transport would be blocked
        _reader, reader_messages = watch(hub)
        for revision in range(1, 8):
            hub.publish([change(revision)])
            await take(reader_messages, 1)
        lags.append(hub.furthest_behind_events)  # the stuck one, 7 behind
        for revision in range(8, 41):
            hub.publish([change(revision)])  # a writer never waits
            await take(reader_messages, 1)
        lags.append(hub.furthest_behind_events)  # the stuck one is gone: the reader is at 0
        retained = hub.retained_events
        with pytest.raises(WatcherCutOffError) as caught:
            await asyncio.wait_for(anext(stuck_messages), 5)
        return retained, hub.attached_count, stuck.cut_off, str(caught.value)

    lags: list[int] = []
    cut_before = _cutoffs("lag")
    retained, attached, cut_off, message = run(scenario)
    assert cut_off and attached == 1
    assert lags == [7, 0]
    assert _cutoffs("lag") == cut_before + 1
    assert retained <= 8
    assert "fell more than 8 changes behind" in message and "send_initial_state" in message


def test_past_the_cap_a_new_stream_is_refused_naming_the_cap() -> None:
    async def scenario() -> str:
        hub = WatchHub(max_streams=3)
        streams = [hub.open(WatchContent.ALL, False) for _ in range(3)]
        with pytest.raises(StreamCapReachedError) as caught:
            hub.open(WatchContent.ALL, False)
        hub.close(streams[0])
        hub.close(streams[0])  # closing twice frees one place, not two
        hub.open(WatchContent.ALL, False)
        with pytest.raises(StreamCapReachedError):
            hub.open(WatchContent.ALL, False)
        return str(caught.value)

    refused_before = _cutoffs("stream_cap")
    message = run(scenario)
    assert _cutoffs("stream_cap") == refused_before + 2
    assert "cap of 3 WatchUsage streams" in message
    assert "HAMI_ACCOUNTING_MAX_WATCH_STREAMS" in message


class Calls:
    """Unary calls as the aio server counts them (services.common.server.event_loop.UnaryCalls)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_end_s = float("-inf")
        self.listeners: list[Callable[[bool], None]] = []

    def call(self, now_s: float) -> None:
        """One call, started and answered at ``now_s``."""
        self.in_flight += 1
        for listener in self.listeners:
            listener(True)
        self.in_flight -= 1
        self.last_end_s = now_s
        for listener in self.listeners:
            listener(False)


async def read_all(messages: AsyncIterator[bytes], into: list[list[usage_pb2.UsageEvent]]) -> None:
    async for message in messages:
        into.append(decode(message))


def test_while_unary_calls_keep_coming_watchers_get_few_messages_each_with_every_change() -> None:
    async def scenario() -> tuple[int, list[list[int]]]:
        calls = Calls()
        hub = WatchHub(unary_calls=calls, throttle=Throttle(credits_per_call=2, idle_s=0.05,
                                                            max_defer_s=5.0))
        watchers = [watch(hub, batches=True) for _ in range(10)]
        received: list[list[list[usage_pb2.UsageEvent]]] = [[] for _ in watchers]
        readers = [asyncio.create_task(read_all(messages, into))
                   for (_stream, messages), into in zip(watchers, received, strict=True)]
        loop = asyncio.get_running_loop()
        for revision in range(1, 101):  # a write every millisecond, each a unary call
            hub.publish([change(revision)])
            calls.call(loop.time())
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.2)  # idle now: everything left goes out
        for reader in readers:
            reader.cancel()
        return (sum(len(r) for r in received),
                [[e.revision for message in r for e in message] for r in received])

    message_count, revisions = run(scenario)
    assert all(got == list(range(1, 101)) for got in revisions)  # every change, in order
    # Two messages per call for ten watchers, then one each at the end: far fewer than one
    # message per write per watcher (1,000).
    assert message_count <= 2 * 100 + 10


def test_a_change_on_an_idle_loop_goes_to_every_watcher_at_once() -> None:
    async def scenario() -> list[int]:
        calls = Calls()
        hub = WatchHub(unary_calls=calls, throttle=Throttle(credits_per_call=1, idle_s=0.0,
                                                            max_defer_s=60.0))
        watchers = [watch(hub) for _ in range(5)]
        hub.publish([change(1)])
        return [decode(await asyncio.wait_for(anext(messages), 5))[0].revision
                for _stream, messages in watchers]

    assert run(scenario) == [1] * 5


def test_news_waits_no_longer_than_the_longest_deferral_however_busy_the_loop() -> None:
    async def scenario() -> float:
        calls = Calls()
        # No call lets a message through and the loop never looks idle ...
        hub = WatchHub(unary_calls=calls, throttle=Throttle(credits_per_call=1, idle_s=60.0,
                                                            max_defer_s=0.05))
        calls.last_end_s = asyncio.get_running_loop().time()
        _stream, messages = watch(hub)
        loop = asyncio.get_running_loop()
        started = loop.time()
        hub.publish([change(1)])
        await asyncio.wait_for(anext(messages), 5)
        return loop.time() - started

    assert 0.04 <= run(scenario) < 2.0  # ... and the change still goes after the deferral


def test_ending_every_stream_ends_them_normally() -> None:
    async def scenario() -> list[str]:
        hub = WatchHub()
        watchers = [watch(hub) for _ in range(3)]
        hub.end_all()
        ends = []
        for _stream, messages in watchers:
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(messages), 5)
            ends.append("ended")
        return ends

    assert run(scenario) == ["ended"] * 3


def test_watchers_at_one_revision_share_one_encoded_initial_state() -> None:
    encoder = CountingEncoder()
    hub = WatchHub(encoder, convert.frame_batch_element)
    snapshot = [UsageEvent(EventKind.SNAPSHOT, 4, namespace="ns")]
    first = hub.encode_initial_state(WatchContent.NAMESPACES, False, 4, snapshot)
    assert hub.initial_state(WatchContent.NAMESPACES, False, 4) is first
    assert hub.initial_state(WatchContent.NODES, False, 4) is None
    assert hub.initial_state(WatchContent.NAMESPACES, True, 4) is None  # with the policy
    assert hub.initial_state(WatchContent.NAMESPACES, False, 5) is None
    kinds = [usage_pb2.UsageEvent.FromString(m).kind for m in first.messages]
    assert kinds == [K.USAGE_EVENT_KIND_SNAPSHOT, K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE]
    assert encoder.revisions == [4, 4]
    del first
    # Nobody holds it any more: the next watcher at that revision encodes afresh.
    assert hub.initial_state(WatchContent.NAMESPACES, False, 4) is None


def test_a_stream_lets_go_of_its_initial_state_once_it_has_sent_it() -> None:
    hub = WatchHub()
    snapshot = [UsageEvent(EventKind.SNAPSHOT, 4, namespace="ns")]

    def shared() -> bool:
        return hub.initial_state(WatchContent.NAMESPACES, False, 4) is not None

    async def scenario() -> list[bool]:
        stream = hub.open(WatchContent.NAMESPACES, False)
        initial = hub.encode_initial_state(WatchContent.NAMESPACES, False, 4, snapshot)
        hub.attach(stream)
        messages = hub.messages(stream, initial)
        del initial  # as the servicer does: only the stream holds it
        seen = [shared()]
        await take(messages, 2)  # the snapshot and INITIAL_STATE_COMPLETE
        seen.append(shared())  # a watcher subscribing now at revision 4 would share it
        hub.publish([change(5)])
        await take(messages, 1)
        # Still open, past its initial state: a stream no longer pins its revision's copy (a
        # replica that subscribed at its own revision used to hold one for the stream's life).
        seen.append(shared())
        hub.close(stream)
        return seen

    assert run(scenario) == [True, True, False]
