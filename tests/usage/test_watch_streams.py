"""Many WatchUsage streams on one recorder (ARCHITECTURE.md §5, "The hub holds under many
replicas"): streams up to the cap never starve unary calls or health checks, a stream past the
cap is refused naming it, a watcher that stops reading is cut off with a clear status while
writes go on and memory stays bounded, and the shared client loop then re-subscribes and
resyncs. Real recorders on 127.0.0.1:0; the deadlines below detect a hang, they time nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common.usage_watch import UsageWatch
from tests.support.pods import gpu_device, kube_node, to_json
from tests.usage.conftest import RunningRecorder, StartRecorder

K = usage_pb2
ANSWER_S = 5.0
"""Deadline of each call that must be answered while the streams are open (a hang detector)."""
WORKERS = 8
"""Unary threads of the test recorders (tests/usage/conftest.py)."""


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def register(stub: usage_pb2_grpc.UsageRecorderStub, node: str, devices: int = 1,
             memory_mib: int = 1000) -> int:
    """Registers ``node`` with ``devices`` cards; returns the write's revision."""
    gpus = [gpu_device(f"GPU-{node}-{i}", index=i, memory_mib=memory_mib) for i in range(devices)]
    response = stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(kube_node(node, gpus))), timeout=ANSWER_S)
    return int(response.revision)


class Reader:
    """Reads one WatchUsage stream on a thread: its events (batches unpacked) and its end."""

    def __init__(self, stub: usage_pb2_grpc.UsageRecorderStub, *, batches: bool = False,
                 content: usage_pb2.WatchContent.ValueType = K.WATCH_CONTENT_UNSPECIFIED,
                 initial: bool = True) -> None:
        self.call = stub.WatchUsage(usage_pb2.WatchUsageRequest(
            send_initial_state=initial, accept_batches=batches, content=content), timeout=120)
        self.events: list[usage_pb2.UsageEvent] = []
        self.messages = 0
        self.error: grpc.RpcError | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                with self._changed:
                    self.messages += 1
                    self.events.extend(message.batch if message.batch else [message])
                    self._changed.notify_all()
        except grpc.RpcError as error:
            with self._changed:
                self.error = error
                self._changed.notify_all()

    @property
    def revision(self) -> int:
        with self._changed:
            return self.events[-1].revision if self.events else -1

    def complete(self) -> bool:
        with self._changed:
            return any(e.kind == K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE for e in self.events)

    def wait(self, condition: Callable[[Reader], bool], timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not condition(self) and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return condition(self)

    def close(self) -> None:
        self.call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped
        self._thread.join(5)


@contextmanager
def readers(stub: usage_pb2_grpc.UsageRecorderStub, count: int,
            **options: bool) -> Iterator[list[Reader]]:
    opened = [Reader(stub, **options) for _ in range(count)]
    try:
        yield opened
    finally:
        for reader in opened:
            reader.close()


def health(channel: grpc.Channel, service: str = "") -> str:
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=ANSWER_S)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


# -- the marker ------------------------------------------------------------------------------


@pytest.mark.parametrize("batches", [False, True], ids=["one-event-a-message", "batches"])
def test_an_empty_recorder_sends_the_end_of_its_initial_state(
    recorder: RunningRecorder, batches: bool
) -> None:
    reader = Reader(recorder.stub, batches=batches)
    assert reader.wait(Reader.complete), reader.error
    assert [(e.kind, e.revision) for e in reader.events] == [
        (K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE, recorder.app.store.revision)]
    reader.close()


def test_a_stream_without_the_initial_state_sends_no_marker(recorder: RunningRecorder) -> None:
    reader = Reader(recorder.stub, initial=False)
    wait_until(lambda: recorder.app.store.watcher_count == 1, "the subscription")
    revision = register(recorder.stub, "node1")
    assert reader.wait(lambda r: r.revision >= revision)
    assert [e.kind for e in reader.events] == [K.USAGE_EVENT_KIND_NODE_REGISTERED]
    reader.close()


# -- starvation ------------------------------------------------------------------------------


def test_streams_up_to_the_cap_leave_unary_calls_and_health_answered(
    start_recorder: StartRecorder,
) -> None:
    # Six times as many streams as unary threads: with a thread per stream, every call and
    # every health check would wait for a stream to end (the recorder's old failure).
    cap = 6 * WORKERS
    running = start_recorder(max_watch_streams=cap)
    stub = running.stub
    register(stub, "node1")
    with readers(stub, cap // 2, batches=True) as batched, \
            readers(stub, cap // 2, batches=False) as single:
        everyone = batched + single
        wait_until(lambda: running.app.store.watcher_count == cap, f"{cap} subscriptions")
        assert running.app.store.hub.open_streams == cap
        for reader in everyone:
            assert reader.wait(Reader.complete), reader.error

        # Health, reads and writes are answered while every stream is open ...
        assert health(running.channel) == "SERVING"
        assert health(running.channel, "liveness") == "SERVING"
        revisions = [register(stub, f"node-{i}", memory_mib=1000 + i) for i in range(2 * WORKERS)]
        found = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=["node-0"]),
                                  timeout=ANSWER_S)
        assert [n.node_name for n in found.nodes] == ["node-0"]
        assert not stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="nobody"),
                                    timeout=ANSWER_S).found
        # ... also many at once, more than there are unary threads.
        with grpc.insecure_channel(running.app.target) as other:
            other_stub = usage_pb2_grpc.UsageRecorderStub(other)
            pending = [other_stub.GetNamespaceUsage.future(
                usage_pb2.GetNamespaceUsageRequest(namespace=f"ns-{i}"), timeout=ANSWER_S)
                for i in range(4 * WORKERS)]
            for future in pending:
                future.result()
            assert health(other) == "SERVING"

        # And every stream got every change.
        for reader in everyone:
            assert reader.wait(lambda r: r.revision >= revisions[-1]), reader.error
            live = [e.revision for e in reader.events
                    if e.kind == K.USAGE_EVENT_KIND_NODE_REGISTERED]
            assert live == revisions


# -- the cap ---------------------------------------------------------------------------------


def test_a_stream_past_the_cap_is_refused_naming_the_cap_and_calls_go_on(
    start_recorder: StartRecorder,
) -> None:
    running = start_recorder(max_watch_streams=3)
    with readers(running.stub, 3) as open_streams:
        for reader in open_streams:
            assert reader.wait(Reader.complete), reader.error
        refused = Reader(running.stub)
        assert refused.wait(lambda r: r.error is not None, ANSWER_S)
        assert refused.error is not None
        assert refused.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.error.details() or ""
        assert "cap of 3 WatchUsage streams" in details
        assert "HAMI_ACCOUNTING_MAX_WATCH_STREAMS" in details
        assert health(running.channel) == "SERVING"
        register(running.stub, "node1")
        open_streams[0].close()
        # A place is free again once a stream has ended.
        wait_until(lambda: running.app.store.hub.open_streams == 2, "the stream to end")
        again = Reader(running.stub)
        assert again.wait(Reader.complete), again.error
        again.close()


# -- a watcher that stops reading ------------------------------------------------------------


def stuck_channel(target: str) -> grpc.Channel:
    """A channel with a small flow-control window that does not grow: a stream that is not
    read soon leaves the recorder unable to send."""
    return grpc.insecure_channel(
        target, options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)])


BIG_NODE_DEVICES = 128
"""Devices per registration in the stuck-watcher tests: events of several KiB each."""


def test_a_watcher_that_stops_reading_is_cut_off_while_writes_go_on(
    start_recorder: StartRecorder,
) -> None:
    lag_bound = 16
    running = start_recorder(max_watch_events=lag_bound)
    stub = running.stub
    with stuck_channel(running.app.target) as channel:
        stuck = usage_pb2_grpc.UsageRecorderStub(channel).WatchUsage(
            usage_pb2.WatchUsageRequest(send_initial_state=True), timeout=120)
        wait_until(lambda: running.app.store.watcher_count == 1, "the subscription")
        retained = []
        writes = 0
        # The stuck watcher never slows a write: each one is answered within its deadline.
        while running.app.store.watcher_count and writes < 400:
            register(stub, "big", BIG_NODE_DEVICES, memory_mib=1000 + writes)
            retained.append(running.app.store.hub.retained_events)
            writes += 1
        assert running.app.store.watcher_count == 0, "never cut off"
        # Memory stays bounded: the log never held more than the watcher's lag bound.
        assert max(retained) <= lag_bound + 1
        for _ in range(20):
            register(stub, "big", BIG_NODE_DEVICES, memory_mib=5000 + writes)
            writes += 1
        assert running.app.store.hub.retained_events == 0  # nobody attached: nothing kept
        assert health(running.channel) == "SERVING"

        # Once the client reads again it gets what the transport held, then a clear status.
        received = 0
        with pytest.raises(grpc.RpcError) as caught:
            for _event in stuck:
                received += 1
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = caught.value.details() or ""
        assert f"fell more than {lag_bound} changes behind" in details
        assert "send_initial_state" in details
        assert received < writes
    wait_until(lambda: running.app.store.hub.open_streams == 0, "the stream's place freed")


class SlowCache:
    """What the caches do with UsageWatch, with a gate that stops reading the stream."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.reading.set()
        self.lock = threading.Lock()
        self.nodes: dict[str, int] = {}
        self.opened = 0
        self.resets = 0
        self.complete = False
        self.revision = -1

    def on_reset(self, live: bool) -> None:
        with self.lock:
            self.nodes.clear()
            self.complete = False
            self.revision = -1
            if live:
                self.opened += 1
            else:
                self.resets += 1

    def on_event(self, event: usage_pb2.UsageEvent) -> None:
        self.reading.wait()  # closed: the watch thread stops reading the stream
        with self.lock:
            if event.HasField("node") and event.node.devices:
                self.nodes[event.node.node_name] = event.node.devices[0].memory_total_mib
            if event.kind == K.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE:
                self.complete = True
            self.revision = event.revision


def test_the_client_loop_resubscribes_after_a_cut_off_and_resyncs(
    start_recorder: StartRecorder,
) -> None:
    running = start_recorder(max_watch_events=16)
    stub = running.stub
    register(stub, "steady", memory_mib=777)
    cache = SlowCache()
    watch = UsageWatch(
        stuck_channel(running.app.target), running.app.target, what="test",
        content=K.WATCH_CONTENT_NODES, stream_lifetime_s=120,
        on_reset=cache.on_reset, on_event=cache.on_event)
    watch.start()
    try:
        wait_until(lambda: cache.complete, "the first initial state")
        cache.reading.clear()
        writes = 0
        while running.app.store.watcher_count and writes < 400:
            register(stub, "big", BIG_NODE_DEVICES, memory_mib=1000 + writes)
            writes += 1
        assert running.app.store.watcher_count == 0, "never cut off"
        last = register(stub, "big", BIG_NODE_DEVICES, memory_mib=99_999)
        cache.reading.set()

        # RESOURCE_EXHAUSTED ends the stream; the loop opens a new one with the initial state.
        wait_until(lambda: cache.opened == 2 and cache.complete and cache.revision >= last,
                   "the resubscription")
        with cache.lock:
            assert cache.resets >= 1
            assert cache.nodes == {"steady": 777, "big": 99_999}
    finally:
        watch.close()


# -- the event loop is never blocked ---------------------------------------------------------


def test_a_call_that_would_wait_for_the_store_runs_off_the_event_loop(
    recorder: RunningRecorder,
) -> None:
    store = recorder.app.store
    # Another thread holds the store's lock, as a long read or the Kubernetes source can.
    with store._lock:
        waiting = recorder.stub.GetPodUsage.future(
            usage_pb2.GetPodUsageRequest(pod_uid="nobody"), timeout=ANSWER_S)
        time.sleep(0.2)
        assert not waiting.done()
        # The call waits on the pool, not on the event loop: health is still answered.
        assert health(recorder.channel) == "SERVING"
    assert not waiting.result().found
