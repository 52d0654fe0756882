"""Many replicas on one recorder: calls, writes, staleness and memory with 64 WatchUsage streams.

Layer: benchmark. Two recorders run side by side, both with the recorder-only stack and the
same nodes: ``plain`` has no watcher; ``fleet`` has the streams of a ``bench.watch_fleet``
process (half watching namespaces like admission replicas, half nodes like scheduler replicas,
each stream on its own connection, all asking for batches like ``services.common.usage_watch``).
In rounds, one after the other, so that noise hits a figure and its baseline alike:

* the no-op RPC (the thread-pool server's floor, as in the rest of the benchmark);
* GetPodUsage on ``plain`` (no stream open) and on ``fleet`` (the streams open, idle);
* RecordPod (journal on) on ``plain`` and on ``fleet`` (every write fans out to every stream).

Then, on ``fleet``: how stale a watcher is (``bench.watch_lag``: a write's answer to its event at
one more watcher), and the recorder's resident memory per open stream (``memory``).

The memory per stream is what the streams add to VmRSS, over the number of streams: the growth
of ``fleet`` from before the streams opened until they are open and have carried the events of
``MEMORY_WRITES`` writes, less the growth of ``plain`` over as many writes, read at the same
moments. The writes grow a recorder by themselves (with no stream open: 170 to 370 KiB over 300
writes, 5 MB over 3,000 more, little of it Python objects; docs/watch-usage.md), and before
that correction all of it was counted as the streams' (``bytes_per_stream_uncorrected`` keeps
that figure, to compare with older runs). What is left is per connection as much as per stream
(the fleet opens one connection per stream, as separate replicas do): gRPC's own memory for the
connection and the call, the stream's Python objects, and what the allocators keep of the
messages sent.

``python -m bench.many_watchers`` runs this alone and prints the goal ratios
(``--rounds``, ``--watchers``, ``--lag-samples``, ``--seconds``, ``--fleet go|python``,
``--out FILE`` for the JSON); ``--memory-only`` measures the memory alone (no rounds, no lag).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import load, profiling, rpc, watch_lag
from bench.stats import combine_rounds, ratio
from bench.watch_fleet import Fleet
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc

WATCHERS = 64
FIGURES = ("noop", "get_pod_usage", "get_pod_usage_watched", "record_pod_plain",
           "record_pod_watched")
"""In the order each round runs them."""
RECORD_POD_LIMIT = 2.0
"""The goal: RecordPod p50 with the streams open at most this many times the no-op p50."""
LAG_P99_LIMIT_US = 5000.0
"""The goal: a watcher has a write's event at most this long after its answer, p99."""
MEMORY_WRITES = 300
"""RecordPods (then forgotten) with the streams open before the memory is read: every stream has
had events, batches and its initial state, and the allocator has settled. ``plain`` gets as
many: the control the streams' growth is measured against."""
SETTLE_S = 0.5
"""Pause before a memory reading: the last events have left for their streams."""


def _cpu_s(pid: int) -> float:
    """User + system CPU time of a process so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod_usage_caller() -> load.ClientFactory:
    request = usage_pb2.GetPodUsageRequest(pod_uid="bench-never-recorded")

    def factory(channel: Any, _k: int) -> load.Call:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        return lambda _i: stub.GetPodUsage(request, timeout=rpc.RPC_TIMEOUT_S)
    return factory


def _record(stack: rpc.Stack, budget: load.Budget, fleet: Fleet | None = None) -> dict[str, Any]:
    """RecordPod's figure, with the CPU the recorder (and the fleet) spent per call."""
    tally = rpc.Tally()
    recorder_before = _cpu_s(stack.usage.pid)
    fleet_before = _cpu_s(fleet.pid) if fleet is not None else 0.0
    try:
        summary = load.run(stack.usage.address, rpc.record_pod_caller(stack, tally), budget)
        calls = max(1, int(summary["calls"]))
        summary["recorder_cpu_us_per_call"] = round(
            (_cpu_s(stack.usage.pid) - recorder_before) / calls * 1e6, 1)
        if fleet is not None:
            summary["fleet_cpu_us_per_call"] = round(
                (_cpu_s(fleet.pid) - fleet_before) / calls * 1e6, 1)
        return summary
    finally:
        stack.forget(tally.uids)


def _settle_writes(stack: rpc.Stack, count: int) -> None:
    """``count`` RecordPods, then their ForgetPods: events for every stream, nothing kept."""
    tally = rpc.Tally()
    load.run(stack.usage.address, rpc.record_pod_caller(stack, tally),
             load.Budget(60.0, count, count, 0))
    stack.forget(tally.uids)


def per_stream_bytes(watched_kib: tuple[int, int], plain_kib: tuple[int, int],
                     watchers: int) -> float:
    """Bytes of resident memory per stream: the watched recorder's VmRSS growth (before, after;
    KiB) less the unwatched one's over the same writes, over ``watchers``."""
    watched_growth = watched_kib[1] - watched_kib[0]
    plain_growth = plain_kib[1] - plain_kib[0]
    return round((watched_growth - plain_growth) * 1024 / watchers, 1)


def measure_memory(plain: rpc.Stack, watched: rpc.Stack, watchers: int, work_dir: Path,
                   go: bool) -> tuple[Fleet, dict[str, Any]]:
    """Opens the fleet on ``watched`` and measures what its streams add (module docstring);
    both stacks have had their nodes and ``MEMORY_WRITES`` writes. Returns the open fleet."""
    time.sleep(SETTLE_S)
    watched_before, plain_before = watched.usage.rss_kib(), plain.usage.rss_kib()
    fleet = Fleet(watched.usage.address, watchers, work_dir, go=go)
    try:
        for stack in (watched, plain):
            _settle_writes(stack, MEMORY_WRITES)
        time.sleep(SETTLE_S)
        watched_after, plain_after = watched.usage.rss_kib(), plain.usage.rss_kib()
    except BaseException:
        fleet.stop()
        raise
    return fleet, {
        "rss_before_kib": watched_before,
        "rss_with_streams_kib": watched_after,
        "plain_rss_before_kib": plain_before,
        "plain_rss_after_kib": plain_after,
        "bytes_per_stream": per_stream_bytes(
            (watched_before, watched_after), (plain_before, plain_after), watchers),
        "bytes_per_stream_uncorrected": round(
            (watched_after - watched_before) * 1024 / watchers, 1),
    }


def _profile(stack: rpc.Stack, fleet: Fleet, budget: load.Budget, seconds: float,
             work_dir: Path) -> dict[str, Any]:
    """py-spy on the watched recorder while RecordPod runs: the GIL holders, native frames
    included (gRPC's socket writes happen with the GIL held)."""
    out = work_dir / "profile-many-watchers.raw"
    recording = profiling.record_pid(stack.usage.pid, seconds, out, gil=True, native=True)
    deadline = time.monotonic() + seconds + 0.5
    while time.monotonic() < deadline:
        _record(stack, budget, fleet)
    return profiling.finish(recording, out, None)


def run(work_dir: Path, rounds: int, budget: load.Budget, *, watchers: int = WATCHERS,
        lag_samples: int = 300, profile_seconds: float = 0.0, go: bool = True,
        memory_only: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every figure (module docstring); with ``memory_only`` the memory per stream alone."""
    log(f"many watchers: two recorders, {watchers} streams on one of them")
    plain = rpc.Stack("plain", work_dir, admission=False, scheduler=False)
    fleet_stack = rpc.Stack("fleet", work_dir, admission=False, scheduler=False, noop=False)
    fleet: Fleet | None = None
    try:
        for stack in (plain, fleet_stack):
            stack.prepare_record_nodes()
            stack.grow(100)
            _settle_writes(stack, MEMORY_WRITES)
        fleet, memory = measure_memory(plain, fleet_stack, watchers, work_dir, go)
        if memory_only:
            return {"watchers": watchers, "fleet": {"kind": fleet.kind}, "memory": memory}
        assert plain.noop is not None
        measures: dict[str, Callable[[], dict[str, Any]]] = {
            "noop": lambda: load.run(plain.noop.address, rpc.noop_caller(), budget),  # type: ignore[union-attr]
            "get_pod_usage": lambda: load.run(plain.usage.address, pod_usage_caller(), budget),
            "get_pod_usage_watched": lambda: load.run(fleet_stack.usage.address,
                                                      pod_usage_caller(), budget),
            "record_pod_plain": lambda: _record(plain, budget),
            "record_pod_watched": lambda: _record(fleet_stack, budget, fleet),
        }
        by_figure: dict[str, list[dict[str, Any]]] = {name: [] for name in FIGURES}
        sent_before = fleet.report()
        for round_index in range(rounds):
            log(f"many watchers: round {round_index + 1}/{rounds}")
            for name in FIGURES:
                by_figure[name].append(measures[name]())
        sent_after = fleet.report()
        log(f"many watchers: watch lag, {lag_samples} writes with {watchers} streams open")
        lag = watch_lag.run(fleet_stack, lag_samples)
        fleet_end = fleet.report()
        profile: dict[str, Any] = {}
        if profile_seconds:
            record_ratio = statistics.median(
                ratio(a["p50_us"], b["p50_us"])
                for a, b in zip(by_figure["record_pod_watched"], by_figure["noop"], strict=True))
            if record_ratio > RECORD_POD_LIMIT or lag["p99_us"] > LAG_P99_LIMIT_US:
                log("many watchers: profiling RecordPod on the watched recorder")
                profile = _profile(fleet_stack, fleet, budget, profile_seconds, work_dir)
    finally:
        if fleet is not None:
            fleet.stop()
        for stack in (fleet_stack, plain):
            stack.stop()
    figures = {name: combine_rounds(results) for name, results in by_figure.items()}
    for name, results in by_figure.items():
        figures[name]["errors"] = sum(int(r.get("errors", 0)) for r in results)
        for key in ("recorder_cpu_us_per_call", "fleet_cpu_us_per_call"):
            if key in results[0]:
                figures[name][key] = round(statistics.median(r[key] for r in results), 1)
    return {
        "watchers": watchers,
        "rounds": rounds,
        "figures": figures,
        "fleet": {
            "kind": fleet.kind,
            "messages_during_rounds": sent_after["messages"] - sent_before["messages"],
            "events_during_rounds": sent_after["events"] - sent_before["events"],
            "errors": fleet_end["errors"],
        },
        "watch_lag": lag,
        "memory": memory,
        "profile": profile,
    }


def paired(result: dict[str, Any], figure: str, baseline: str) -> float:
    """Median over rounds of the round's p50 ratio (both ran back to back)."""
    pairs = zip(result["figures"][figure]["round_p50_us"],
                result["figures"][baseline]["round_p50_us"], strict=True)
    return round(statistics.median(ratio(a, b) for a, b in pairs), 3)


def spread(result: dict[str, Any], figure: str, baseline: str) -> list[float]:
    """Every round's p50 ratio, for the spread beside the median."""
    return [ratio(a, b) for a, b in zip(result["figures"][figure]["round_p50_us"],
                                        result["figures"][baseline]["round_p50_us"], strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.many_watchers",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--watchers", type=int, default=WATCHERS)
    parser.add_argument("--lag-samples", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=0.6, help="per figure per round")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--fleet", choices=("go", "python"), default="go",
                        help="the watchers' process (go falls back to python without Go)")
    parser.add_argument("--memory-only", action="store_true",
                        help="measure the memory per stream alone")
    args = parser.parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="hami-bench-watchers-"))
    result = run(work_dir, args.rounds, load.Budget(args.seconds, 8, 3000, 30),
                 watchers=args.watchers, lag_samples=args.lag_samples,
                 go=args.fleet == "go", memory_only=args.memory_only)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    memory = result["memory"]
    memory_line = (f"memory per open stream: {memory['bytes_per_stream']} B "
                   f"({memory['bytes_per_stream_uncorrected']} B before subtracting the unwatched "
                   f"recorder's growth over the same writes; fleet {result['fleet']['kind']})")
    if args.memory_only:
        print(memory_line)
        return 0
    figures = result["figures"]
    for name in FIGURES:
        cpu = {k: v for k, v in figures[name].items() if k.endswith("cpu_us_per_call")}
        print(f"{name:24s} p50 {figures[name]['p50_us']:8.1f} µs  rounds "
              f"{figures[name]['round_p50_us']} {cpu or ''}")
    for figure, baseline in (("get_pod_usage_watched", "get_pod_usage"),
                             ("record_pod_plain", "noop"), ("record_pod_watched", "noop")):
        print(f"{figure} / {baseline}: median {paired(result, figure, baseline)} ×, rounds "
              f"{[round(r, 2) for r in spread(result, figure, baseline)]}")
    lag = result["watch_lag"]
    print(f"watch lag with {result['watchers']} streams: p50 {lag['p50_us']} µs, p99 "
          f"{lag['p99_us']} µs, max {lag['max_us']} µs, missed {lag['missed']}")
    print(memory_line)
    print(f"fleet during the rounds: {result['fleet']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
