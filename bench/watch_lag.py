"""How stale a WatchUsage cache is: the time from a write's answer to its event at a watcher.

Layer: benchmark. A watcher in this process subscribes like the admission daemon's cache
(``WATCH_CONTENT_NAMESPACES``) to the tracing-off stack's recorder, whose admission and
scheduler caches keep watching too. Then, one at a time, a pod is recorded and the clock runs
from RecordPod's answer (which carries the write's revision) until the watcher has received an
event of that revision or later. A negative lag means the event arrived before the answer did.
This is the window in which a check without ``min_usage_revision`` can miss the write.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from bench.rpc import RPC_TIMEOUT_S, UID_PLACEHOLDER, Stack, fixed_uid
from bench.stats import percentile
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common.server import client_channel

_RUN = 9_000  # fixed_uid's run number: distinct from the figures' runs


class _Watcher:
    """Receives events on a thread; remembers when each revision first arrived."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._call = usage_pb2_grpc.UsageRecorderStub(channel).WatchUsage(
            usage_pb2.WatchUsageRequest(
                send_initial_state=True, content=usage_pb2.WATCH_CONTENT_NAMESPACES),
            timeout=600)
        self._changed = threading.Condition()
        self._revision = -1
        self._arrived_ns = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                now = time.perf_counter_ns()
                with self._changed:
                    if event.revision > self._revision:
                        self._revision, self._arrived_ns = event.revision, now
                    self._changed.notify_all()
        except grpc.RpcError:
            with self._changed:
                self._changed.notify_all()

    def arrival_ns(self, revision: int, timeout_s: float) -> int | None:
        """When the first event of ``revision`` or later arrived, or None after the timeout."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._revision >= revision, timeout_s):
                return None
            return self._arrived_ns

    def wait_subscribed(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._revision >= 0, timeout_s)

    def close(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped
        self._thread.join(timeout=5)


def run(stack: Stack, samples: int) -> dict[str, Any]:
    templates = stack.record_templates
    lags_us: list[float] = []
    missed = 0
    uids: list[str] = []
    with client_channel(stack.usage.address) as watch_channel, \
            client_channel(stack.usage.address) as write_channel:
        watcher = _Watcher(watch_channel)
        if not watcher.wait_subscribed(10):
            raise RuntimeError("the WatchUsage stream sent no initial state")
        record = write_channel.unary_unary(
            "/hami.accounting.v1.UsageRecorder/RecordPod", request_serializer=None,
            response_deserializer=usage_pb2.RecordPodResponse.FromString)
        try:
            for index in range(samples):
                uid = fixed_uid("lag", _RUN, index)
                request = templates[index % len(templates)].replace(
                    UID_PLACEHOLDER.encode(), uid.encode())
                response = record(request, timeout=RPC_TIMEOUT_S)
                answered_ns = time.perf_counter_ns()
                uids.append(uid)
                arrived_ns = watcher.arrival_ns(response.revision, 5.0)
                if arrived_ns is None:
                    missed += 1
                else:
                    lags_us.append((arrived_ns - answered_ns) / 1000)
        finally:
            watcher.close()
    stack.forget(uids)
    ordered = sorted(lags_us)
    return {
        "samples": samples,
        "missed": missed,
        "p50_us": round(percentile(ordered, 0.50), 1),
        "p99_us": round(percentile(ordered, 0.99), 1),
        "max_us": round(ordered[-1], 1) if ordered else None,
        "event_first": sum(1 for lag in ordered if lag <= 0),
    }
