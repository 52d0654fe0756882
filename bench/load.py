"""Client load: one caller in a loop, or 8 callers (threads, each with its own channel).

Layer: benchmark. A run lasts a time budget, within a minimum and maximum number of calls, so
a 0.5 ms RPC and a 100 ms one both get a stable median without a fixed count for each. Every
call is timed on its own with perf_counter_ns; calls/s is calls over the run's wall time.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from bench.stats import summarize
from services.common.server import client_channel

Call = Callable[[int], object]
"""One RPC; the argument is a number unique within the run (for fresh pod uids)."""
ClientFactory = Callable[[grpc.Channel, int], Call]
"""Builds a caller's Call on its own channel; the int is the caller's index."""


@dataclass(frozen=True)
class Budget:
    seconds: float
    """Measured time, unless min_calls takes longer or max_calls comes first."""
    min_calls: int
    max_calls: int
    warmup_calls: int
    """Per caller, before the clock starts, round robin over the callers; cut short after
    warmup_s (at least one call in all)."""
    warmup_s: float = 0.3


class LoadError(RuntimeError):
    """Every call of a run failed; the message has the first error."""


def _timed_loop(call: Call, first: int, stride: int, budget: Budget, deadline: float,
                latencies: list[int], errors: list[BaseException]) -> None:
    index = first
    clock = time.perf_counter_ns
    while True:
        count = len(latencies)
        if count >= budget.max_calls or (count >= budget.min_calls
                                         and time.perf_counter() >= deadline):
            return
        started = clock()
        try:
            call(index)
        except grpc.RpcError as error:
            errors.append(error)
            if len(errors) > 20 and not latencies:
                return
        else:
            latencies.append(clock() - started)
        index += stride


def run(
    target: str | Sequence[str],
    factory: ClientFactory,
    budget: Budget,
    *,
    callers: int = 1,
    first_index: int = 0,
) -> dict[str, Any]:
    """Runs ``callers`` loops against ``target`` and summarises the latencies.

    Each caller gets its own channel (no shared HTTP/2 connection) and warms it up first.
    Several targets (replicas of one daemon) share the callers: caller k calls target k mod n.
    Indexes: caller k uses first_index + k, + k + callers, ... (unique across callers, below
    first_index + max_calls); the warm-up uses the indexes after that range.
    """
    targets = [target] if isinstance(target, str) else list(target)
    channels = [client_channel(targets[k % len(targets)]) for k in range(callers)]
    try:
        calls = [factory(channel, k) for k, channel in enumerate(channels)]
        # Every channel connects before the clock starts; the server's path is warmed through
        # the first caller (a slow call is not repeated 8 times). Warm-up indexes follow the
        # measured ones: [first, first + max_calls) is measured.
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=30)
        warm_index = itertools.count(first_index + budget.max_calls)
        warm_until = time.perf_counter() + budget.warmup_s
        for w in range(budget.warmup_calls * callers):
            if w and time.perf_counter() > warm_until:
                break
            calls[w % callers](next(warm_index))
        per_caller = Budget(budget.seconds, max(1, budget.min_calls // callers),
                            max(1, budget.max_calls // callers), 0)
        latencies: list[list[int]] = [[] for _ in range(callers)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(callers + 1)
        ends: list[float] = [0.0] * callers

        def caller(k: int) -> None:
            barrier.wait()
            _timed_loop(calls[k], first_index + k, callers, per_caller, deadline, latencies[k],
                        errors)
            ends[k] = time.perf_counter()

        threads = [threading.Thread(target=caller, args=(k,), daemon=True)
                   for k in range(callers)]
        for thread in threads:
            thread.start()
        started = time.perf_counter()
        deadline = started + budget.seconds
        barrier.wait()
        for thread in threads:
            thread.join()
        wall = max(ends) - started
    finally:
        for channel in channels:
            channel.close()
    merged = [value for per in latencies for value in per]
    if not merged:
        raise LoadError(f"every call to {target} failed: {errors[0] if errors else 'no calls'}")
    summary: dict[str, Any] = dict(summarize(merged, wall))
    summary["errors"] = len(errors)
    if errors:
        summary["error_codes"] = dict(Counter(_code(e) for e in errors))
        summary["error_sample"] = _details(errors[0])[:300]
    return summary


def _code(error: BaseException) -> str:
    code = getattr(error, "code", None)
    return code().name if callable(code) else type(error).__name__


def _details(error: BaseException) -> str:
    details = getattr(error, "details", None)
    return str(details() if callable(details) else error)
