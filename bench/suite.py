"""The benchmark run: every figure beside its baseline, in rounds, then the goals.

Layer: benchmark. Order of a run:

1. fit vs naive fit, in process (no daemon running yet);
2. recorder scale: 100,000 pods recorded through the store, then recovered by fresh recorders;
3. the daemons: a stack with tracing off, one with tracing on (every span exported to an
   in-process OTLP receiver), both with the defaults (the admission and the scheduler keep
   WatchUsage caches), and a recorder + admission pair whose admission reads usage directly
   (no watcher on that recorder: its RecordPod shows what the watchers cost). For 100, 1,000
   and 5,000 candidate nodes, rounds of every figure run one after the other (sequential, then
   8 callers), so noise hits a figure and its baseline alike; each figure reports the median
   over rounds of p50, p99 and calls/s;
4. the burst, on the tracing-off stack, then the watch lag (how long after a write's answer a
   WatchUsage watcher has it: how stale the caches are);
5. many watchers (``bench.many_watchers``): a recorder with 64 WatchUsage streams beside one
   with none, in their own interleaved rounds with the no-op floor;
6. the scheduler at scale (``bench.scheduler_scale``): Filter at 1,000 and 5,000 nodes in
   rounds with the no-op floor, 8 callers over 2 scheduler replicas with the double-booking
   check, the scheduler's memory and its cache's lag, and a profile of Filter at 5,000 nodes;
   then the same node counts on a cluster that looks like a real one
   (``bench.realistic_cluster``: three card sizes, most nodes carrying pods, quotas, four pod
   shapes);
7. the goals, as ratios measured in this run (a ratio goal is the median over rounds of the
   ratio of the two p50s, measured back to back); each missed goal is profiled (py-spy, or
   tracemalloc for memory) while its figure runs again.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    burst,
    fitbench,
    load,
    many_watchers,
    profiling,
    realistic_cluster,
    recorder_scale,
    rpc,
    scheduler_scale,
    watch_lag,
    workload,
)
from bench.go_client import GoCaller, GoUnavailable
from bench.noop_server import METHOD as NOOP_METHOD
from bench.otlp_sink import OtlpSink
from bench.stats import combine_rounds, ratio

CALLERS = 8


@dataclass(frozen=True)
class Plan:
    """How much of everything to run; ``FULL`` for make bench, ``QUICK`` for the smoke test."""

    node_counts: tuple[int, ...]
    rounds_small: int
    """Rounds at the smallest node count (where the goal ratios are read)."""
    rounds_large: int
    sequential: load.Budget
    concurrent: load.Budget
    fit_nodes: int
    fit_rounds: int
    fit_repeat: int
    naive_nodes: int
    scale_pods: int
    recoveries: int
    go: bool
    profile_seconds: float
    watch_lag_samples: int
    watchers: int
    """WatchUsage streams of the many-watchers phase."""
    scheduler_nodes: tuple[int, ...]
    """Node counts of the scheduler-at-scale phase (the goals' 1,000 and 5,000)."""
    scheduler_rounds: int
    scheduler_budget: load.Budget
    replica_seconds: float
    """How long 8 callers run over the 2 scheduler replicas."""


FULL = Plan(
    node_counts=(100, 1000, 5000), rounds_small=7, rounds_large=3,
    sequential=load.Budget(0.6, 8, 3000, 30), concurrent=load.Budget(0.6, 16, 3000, 10),
    fit_nodes=5000, fit_rounds=5, fit_repeat=3, naive_nodes=1000,
    scale_pods=100_000, recoveries=3, go=True, profile_seconds=5.0, watch_lag_samples=500,
    watchers=64, scheduler_nodes=scheduler_scale.NODE_STEPS, scheduler_rounds=5,
    scheduler_budget=scheduler_scale.ROUND_BUDGET, replica_seconds=5.0,
)
QUICK = Plan(
    node_counts=(10,), rounds_small=1, rounds_large=1,
    sequential=load.Budget(0.05, 3, 40, 2, 0.05), concurrent=load.Budget(0.05, 8, 40, 1, 0.05),
    fit_nodes=200, fit_rounds=1, fit_repeat=1, naive_nodes=50,
    scale_pods=400, recoveries=1, go=False, profile_seconds=0.0, watch_lag_samples=20,
    watchers=4, scheduler_nodes=(10, 20), scheduler_rounds=1,
    scheduler_budget=load.Budget(0.05, 3, 40, 2, 0.05), replica_seconds=0.2,
)

# (key, limit, unit, text) of every goal; the value is computed in ``_goals``.
GOALS = (
    ("check_quota_vs_noop", 1.3, "×", "CheckQuota p50 ≤ 1.3 × no-op RPC p50"),
    ("record_pod_vs_noop", 1.5, "×",
     "RecordPod (journal on) p50 ≤ 1.5 × no-op RPC p50 with 2 watchers"),
    ("record_pod_many_watchers_vs_noop", many_watchers.RECORD_POD_LIMIT, "×",
     "RecordPod (journal on) p50 ≤ 2.0 × no-op RPC p50 with 64 watchers"),
    ("get_pod_usage_with_streams", 1.2, "×",
     "GetPodUsage p50 with 64 open WatchUsage streams ≤ 1.2 × with none"),
    ("watch_lag_p99_ms", many_watchers.LAG_P99_LIMIT_US / 1000, "ms",
     "watch lag (write answered → event at a watcher) p99 ≤ 5 ms at 64 watchers"),
    ("bytes_per_stream", 65536.0, "B", "≤ 64 KiB resident memory per open WatchUsage stream"),
    ("filter_compute_us_per_node", 10.0, "µs", "Filter compute ≤ 10 µs per node at 5,000 nodes"),
    ("fit_speedup_vs_naive", 5.0, "×", "fit ≥ 5 × faster than the naive fit"),
    ("tracing_overhead_check_quota", 0.15, "", "tracing adds ≤ 15 % to CheckQuota p50"),
    ("recovery_s", 3.0, "s", "recovery of 100,000 pods ≤ 3 s"),
    ("bytes_per_pod", 1024.0, "B", "≤ 1 KiB resident memory per tracked pod"),
)
_AT_LEAST = {"fit_speedup_vs_naive"}


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


class Figures:
    """Round results per (node count, figure, mode), combined at the end."""

    def __init__(self) -> None:
        self.rounds: dict[tuple[int, str, str], list[dict[str, float]]] = {}
        self.outcomes: dict[tuple[int, str], Counter[str]] = {}

    def add(self, nodes: int, figure: str, mode: str, summary: dict[str, float]) -> None:
        self.rounds.setdefault((nodes, figure, mode), []).append(summary)

    def combined(self) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (nodes, figure, mode), rounds in self.rounds.items():
            entry = combine_rounds(rounds)
            entry["errors"] = sum(int(r.get("errors", 0)) for r in rounds)
            codes: Counter[str] = Counter()
            for r in rounds:
                codes.update(r.get("error_codes", {}))
            if codes:
                entry["error_codes"] = dict(codes)
                entry["error_sample"] = next(r["error_sample"] for r in rounds
                                             if "error_sample" in r)
            out.setdefault(str(nodes), {}).setdefault(figure, {})[mode] = entry
        for (nodes, figure), counts in self.outcomes.items():
            out[str(nodes)][figure]["outcomes"] = dict(counts)
        return out


Measure = Callable[[int], dict[str, float]]
"""Runs one figure with this many callers and returns its summary."""


class DaemonBench:
    def __init__(self, plan: Plan, work_dir: Path) -> None:
        self.plan = plan
        self.work_dir = work_dir
        self.sink = OtlpSink()
        _log("starting daemons: tracing off, tracing on, and an admission reading directly")
        self.off = rpc.Stack("off", work_dir)
        self.on = rpc.Stack("on", work_dir, self.sink.endpoint)
        self.direct = rpc.Stack("direct", work_dir, admission_env={
            "HAMI_ACCOUNTING_USAGE_CACHE": "off"}, scheduler=False, noop=False)
        self.off.prepare_record_nodes()
        self.direct.prepare_record_nodes()
        self.figures = Figures()
        self.go: GoCaller | None = None
        self.go_note = "not run (quick mode)"
        if plan.go:
            try:
                self.go = GoCaller(work_dir)
                self.go_note = "built"
            except GoUnavailable as missing:
                self.go_note = f"skipped: {missing}"
                _log(f"Go caller {self.go_note}")

    def stop(self) -> None:
        for stack in (self.direct, self.on, self.off):
            stack.stop()
        self.sink.stop()

    # -- one figure --------------------------------------------------------------------------

    def _python(self, target: str, factory: load.ClientFactory) -> Measure:
        def measure(callers: int) -> dict[str, float]:
            budget = self.plan.sequential if callers == 1 else self.plan.concurrent
            return load.run(target, factory, budget, callers=callers)
        return measure

    def _with_cleanup(self, stack: rpc.Stack, nodes: int, figure: str,
                      make: Callable[[rpc.Tally], load.ClientFactory], target: str) -> Measure:
        """A figure that creates pods: they are forgotten after each run, untimed."""
        def measure(callers: int) -> dict[str, float]:
            tally = rpc.Tally()
            budget = self.plan.sequential if callers == 1 else self.plan.concurrent
            try:
                return load.run(target, make(tally), budget, callers=callers)
            finally:
                stack.forget(tally.uids)
                self.figures.outcomes.setdefault((nodes, figure), Counter()).update(
                    tally.reasons)
        return measure

    def _go(self, target: str, method: str, payload: bytes) -> Measure:
        assert self.go is not None
        go = self.go

        def measure(callers: int) -> dict[str, float]:
            budget = self.plan.sequential if callers == 1 else self.plan.concurrent
            return go.run(target, method, payload, budget, callers)
        return measure

    def _figures(self, nodes: int, first: bool) -> dict[str, Measure]:
        off, on = self.off, self.on
        names = [workload.node_name(i) for i in range(nodes)]
        assert off.noop and off.scheduler
        # In the order they run: each goal's figure right after its baseline.
        figures: dict[str, Measure] = {
            "noop": self._python(off.noop.address, rpc.noop_caller()),
            "check_quota": self._python(off.admission.address, rpc.check_quota_caller()),
        }
        if first:
            assert on.noop
            figures["check_quota_traced"] = self._python(on.admission.address,
                                                         rpc.check_quota_caller())
            figures["noop_traced"] = self._python(on.noop.address, rpc.noop_caller())
        figures["record_pod"] = self._with_cleanup(
            off, nodes, "record_pod", lambda t: rpc.record_pod_caller(off, t), off.usage.address)
        if first:
            direct = self.direct
            figures["record_pod_unwatched"] = self._with_cleanup(
                direct, nodes, "record_pod_unwatched",
                lambda t: rpc.record_pod_caller(direct, t), direct.usage.address)
            figures["check_quota_direct"] = self._python(direct.admission.address,
                                                         rpc.check_quota_caller())
        figures["get_node_usage"] = self._python(off.usage.address, rpc.node_usage_caller(names))
        figures["filter"] = self._with_cleanup(
            off, nodes, "filter", lambda t: rpc.filter_caller(names, t), off.scheduler.address)
        if first:
            assert on.scheduler
            figures["filter_traced"] = self._with_cleanup(
                on, nodes, "filter_traced", lambda t: rpc.filter_caller(names, t),
                on.scheduler.address)
            if self.go is not None:
                figures["go_noop"] = self._go(off.noop.address, NOOP_METHOD, b"")
                figures["go_check_quota"] = self._go(
                    off.admission.address, rpc.CHECK_QUOTA_METHOD,
                    rpc.check_quota_request().SerializeToString())
        return figures

    def run(self) -> dict[str, Any]:
        plan = self.plan
        for position, nodes in enumerate(plan.node_counts):
            first = position == 0
            self.off.grow(nodes)
            if first:
                self.on.grow(nodes)
            figures = self._figures(nodes, first)
            rounds = plan.rounds_small if first else plan.rounds_large
            for round_index in range(rounds):
                _log(f"{nodes} nodes: round {round_index + 1}/{rounds}")
                # One caller first for every figure, back to back with its baseline, then 8:
                # a concurrent run leaves the machine busy for a moment after it ends.
                for mode, callers in (("seq", 1), ("c8", CALLERS)):
                    for figure, measure in figures.items():
                        self.figures.add(nodes, figure, mode, measure(callers))
        time.sleep(0 if plan is QUICK else 6)  # one BatchSpanProcessor delay: spans reach us
        return {
            "node_counts": list(plan.node_counts),
            "callers": CALLERS,
            "figures": self.figures.combined(),
            "spans_exported": self.sink.snapshot(),
            "go_client": self.go_note,
        }

    # -- profiles of a missed goal ------------------------------------------------------------

    def profile_daemons(self, children: list[Any], measure: Measure, label: str, *,
                        focus: str = profiling.HANDLER, gil: bool = False) -> dict[str, Any]:
        """py-spy on each of ``children`` while ``measure`` runs sequentially for a while."""
        seconds = self.plan.profile_seconds
        started = []
        for child in children:
            out = self.work_dir / f"profile-{label}-{child.name}.raw"
            started.append((child, out, profiling.record_pid(child.pid, seconds, out, gil=gil)))
        deadline = time.monotonic() + seconds + 0.5
        while time.monotonic() < deadline:
            measure(1)
        return {child.name: profiling.finish(recording, out, None if gil else focus)
                for child, out, recording in started}


def _many_watchers_values(many: dict[str, Any]) -> dict[str, tuple[float, str]]:
    figures = many["figures"]
    count = many["watchers"]

    def rounds(figure: str, baseline: str) -> str:
        return ", ".join(f"{r:.2f}" for r in many_watchers.spread(many, figure, baseline))

    lag = many["watch_lag"]
    memory = many["memory"]
    watched = figures["record_pod_watched"]
    return {
        "record_pod_many_watchers_vs_noop": (
            many_watchers.paired(many, "record_pod_watched", "noop"),
            f"p50 {watched['p50_us']:.0f} µs vs no-op {figures['noop']['p50_us']:.0f} µs with "
            f"{count} streams (rounds {rounds('record_pod_watched', 'noop')}); the same recorder "
            f"code with none: {figures['record_pod_plain']['p50_us']:.0f} µs "
            f"({many_watchers.paired(many, 'record_pod_plain', 'noop'):.2f} ×); recorder CPU "
            f"{watched.get('recorder_cpu_us_per_call')} vs "
            f"{figures['record_pod_plain'].get('recorder_cpu_us_per_call')} µs per call"),
        "get_pod_usage_with_streams": (
            many_watchers.paired(many, "get_pod_usage_watched", "get_pod_usage"),
            f"p50 {figures['get_pod_usage_watched']['p50_us']:.0f} µs with {count} streams open "
            f"vs {figures['get_pod_usage']['p50_us']:.0f} µs with none (rounds "
            f"{rounds('get_pod_usage_watched', 'get_pod_usage')})"),
        "watch_lag_p99_ms": (
            round(lag["p99_us"] / 1000, 3),
            f"{lag['samples']} writes with {count} streams open: p50 {lag['p50_us']} µs, max "
            f"{lag['max_us']} µs, {lag['missed']} missed"),
        "bytes_per_stream": (
            memory["bytes_per_stream"],
            f"VmRSS {memory['rss_before_kib']} → {memory['rss_with_streams_kib']} KiB with "
            f"{count} streams open and events sent, less the unwatched recorder's growth over "
            f"the same writes ({memory['plain_rss_before_kib']} → "
            f"{memory['plain_rss_after_kib']} KiB; "
            f"{memory['bytes_per_stream_uncorrected']} B per stream without it)"),
    }


def _goal_values(rpc_results: dict[str, Any] | None, fit: dict[str, Any],
                 scale: dict[str, Any], many: dict[str, Any] | None = None
                 ) -> dict[str, tuple[float, str]]:
    values: dict[str, tuple[float, str]] = {}
    if many is not None:
        values.update(_many_watchers_values(many))
    if rpc_results is not None:
        small = rpc_results["figures"][str(rpc_results["node_counts"][0])]

        def p50(figure: str) -> float:
            return float(small[figure]["seq"]["p50_us"])

        def paired(figure: str, baseline: str) -> float:
            """Median over rounds of the round's p50 ratio (both ran back to back)."""
            pairs = zip(small[figure]["seq"]["round_p50_us"],
                        small[baseline]["seq"]["round_p50_us"], strict=True)
            return round(statistics.median(ratio(a, b) for a, b in pairs), 3)

        noop = p50("noop")
        values["check_quota_vs_noop"] = (
            paired("check_quota", "noop"),
            f"p50 {p50('check_quota'):.0f} µs vs no-op {noop:.0f} µs, usage cache watch (the "
            f"default); with direct reads {p50('check_quota_direct'):.0f} µs "
            f"({paired('check_quota_direct', 'noop'):.2f} ×)")
        values["record_pod_vs_noop"] = (
            paired("record_pod", "noop"),
            f"p50 {p50('record_pod'):.0f} µs vs {noop:.0f} µs with the admission and scheduler "
            f"caches watching; with no watcher {p50('record_pod_unwatched'):.0f} µs "
            f"({paired('record_pod_unwatched', 'noop'):.2f} ×)")
        values["tracing_overhead_check_quota"] = (
            round(paired("check_quota_traced", "check_quota") - 1, 3),
            f"p50 {p50('check_quota_traced'):.0f} µs traced vs {p50('check_quota'):.0f} µs; "
            f"no-op {p50('noop_traced'):.0f} vs {noop:.0f} µs")
    values["filter_compute_us_per_node"] = (
        fit["us_per_node"]["fit_pod"],
        f"fit_pod over {fit['nodes']} NodeStates, CPU time; best round "
        f"{min(fit['round_us_per_node']['fit_pod'])} µs")
    values["fit_speedup_vs_naive"] = (
        fit["speedup_vs_naive"],
        f"{fit['us_per_node']['fit_pod']} vs {fit['us_per_node']['naive_fit_node']} µs/node")
    values["recovery_s"] = (
        scale["recovery_s"],
        f"{scale['pods']} pods, as logged by the recorder; CPU {scale['recovery_cpu_s']} s")
    values["bytes_per_pod"] = (
        scale["bytes_per_pod"],
        f"RSS over a recorder with the same nodes; {scale['bytes_per_pod_vs_empty']} B over "
        "an empty one")
    return values


def _goals(values: dict[str, tuple[float, str]]) -> list[dict[str, Any]]:
    goals = []
    for key, limit, unit, text in GOALS:
        if key not in values:
            continue
        value, detail = values[key]
        passed = value >= limit if key in _AT_LEAST else value <= limit
        goals.append({"key": key, "goal": text, "value": value, "limit": limit, "unit": unit,
                      "pass": passed, "detail": detail})
    return goals


def run(plan: Plan, *, keep_work_dir: bool = False) -> dict[str, Any]:
    started = time.time()
    load_before = _loadavg()
    work_dir = Path(tempfile.mkdtemp(prefix="hami-bench-"))
    results: dict[str, Any] = {}
    try:
        _log(f"fit vs naive fit over {plan.fit_nodes} nodes")
        fit = fitbench.run(plan.fit_nodes, plan.fit_rounds, plan.fit_repeat, plan.naive_nodes)
        _log(f"recorder scale: recording {plan.scale_pods} pods through the store")
        scale = recorder_scale.run(work_dir, plan.scale_pods, plan.recoveries)
        daemons = DaemonBench(plan, work_dir)
        try:
            rpc_results = daemons.run()
            _log("burst: 50 pods, 8 callers, one pool")
            burst_result = burst.run(daemons.off)
            _log(f"watch lag: {plan.watch_lag_samples} writes, each until a watcher has it")
            lag = watch_lag.run(daemons.off, plan.watch_lag_samples)
            many = many_watchers.run(
                work_dir, plan.rounds_small, plan.sequential, watchers=plan.watchers,
                lag_samples=plan.watch_lag_samples, profile_seconds=plan.profile_seconds,
                go=plan.go, log=_log)
            scheduler = scheduler_scale.run(
                work_dir, plan.scheduler_rounds, plan.scheduler_budget,
                node_steps=plan.scheduler_nodes, replica_seconds=plan.replica_seconds,
                lag_samples=plan.watch_lag_samples, profile_seconds=plan.profile_seconds,
                log=_log)
            realistic = realistic_cluster.run(
                work_dir, plan.scheduler_rounds, plan.scheduler_budget,
                node_steps=plan.scheduler_nodes, profile_seconds=plan.profile_seconds,
                log=_log)
            goals = _goals(_goal_values(rpc_results, fit, scale, many))
            goals += scheduler_scale.goal_rows(scheduler, fit)
            goals += realistic_cluster.goal_rows(realistic)
            profiles = _profile_misses(plan, goals, daemons, work_dir) \
                if plan.profile_seconds else {}
            if many["profile"]:
                profiles["record_pod_many_watchers_vs_noop"] = many["profile"]
            if "profile" in scheduler:
                profiles["scheduler_scale"] = scheduler.pop("profile")
            if "profile" in realistic:
                profiles["realistic_cluster"] = realistic.pop("profile")
        finally:
            daemons.stop()
        results = {
            "meta": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                "duration_s": round(time.time() - started, 1),
                "quick": plan is QUICK,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": _loadavg(),
                "rounds": {"smallest_node_count": plan.rounds_small,
                           "other_node_counts": plan.rounds_large},
                "method": "median over rounds of each round's p50/p99/calls-per-s; rounds "
                          "interleave every figure with its baseline",
            },
            "goals": goals,
            "rpc": rpc_results,
            "fit": fit,
            "recorder": scale,
            "burst": burst_result,
            "watch_lag": lag,
            "many_watchers": many,
            "scheduler_scale": scheduler,
            "realistic_cluster": realistic,
            "profiles": profiles,
        }
    finally:
        if keep_work_dir:
            _log(f"work directory kept: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    return results


def _profile_misses(plan: Plan, goals: list[dict[str, Any]], daemons: DaemonBench,
                    work_dir: Path) -> dict[str, Any]:
    missed = {g["key"] for g in goals if not g["pass"]}
    profiles: dict[str, Any] = {}
    if profiling.pyspy_path() is None:
        return {"note": "py-spy is not installed: pip install -e '.[bench]'"}
    # Not a goal, but where a Filter's time goes at the largest cluster is always worth seeing.
    largest = plan.node_counts[-1]
    _log(f"profiling Filter at {largest} nodes (scheduler and recorder)")
    assert daemons.off.scheduler is not None
    profiles["filter_at_scale"] = daemons.profile_daemons(
        [daemons.off.scheduler, daemons.off.usage], daemons._figures(largest, False)["filter"],
        "filter")
    off, on = daemons.off, daemons.on
    first = plan.node_counts[0]
    figures = daemons._figures(first, True)
    if "check_quota_vs_noop" in missed:
        _log("profiling CheckQuota (admission, GIL holders)")
        profiles["check_quota_vs_noop"] = daemons.profile_daemons(
            [off.admission], figures["check_quota"], "check-quota", gil=True)
    if "record_pod_vs_noop" in missed:
        _log("profiling RecordPod (recorder)")
        profiles["record_pod_vs_noop"] = {
            **daemons.profile_daemons([off.usage], figures["record_pod"], "record-pod",
                                      focus="UsageRecorderServicer.RecordPod"),
            # Every thread holding the GIL: the handler, and the watch streams' sends.
            "usage_gil": daemons.profile_daemons(
                [off.usage], figures["record_pod"], "record-pod-gil", gil=True)[off.usage.name],
        }
    if "tracing_overhead_check_quota" in missed:
        _log("profiling traced CheckQuota (admission and recorder, GIL holders)")
        profiles["tracing_overhead_check_quota"] = daemons.profile_daemons(
            [on.admission, on.usage], figures["check_quota_traced"], "check-quota-traced",
            gil=True)
    scale_dir = work_dir / "scale-full"
    if "recovery_s" in missed:
        _log("profiling the recovery")
        profiles["recovery_s"] = profiling.profile_recovery(scale_dir, work_dir / "recover.raw")
    if "bytes_per_pod" in missed:
        _log("tracing the recovered state's allocations")
        profiles["bytes_per_pod"] = profiling.profile_memory(scale_dir)
    if missed & {"filter_compute_us_per_node", "fit_speedup_vs_naive"}:
        _log("profiling fit_pod")
        profiles["filter_compute_us_per_node"] = profiling.record_command(
            [sys.executable, "-m", "bench.profiling", "fit", str(plan.fit_nodes)],
            work_dir / "fit.raw")
    return profiles
