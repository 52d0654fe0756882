"""The scheduler at cluster scale: Filter at 1,000 and 5,000 nodes, two replicas, memory, lag.

Layer: benchmark. One recorder (journal on), two scheduler daemons reading from it (each with
its WatchUsage node cache, the default) and the no-op server; nodes of 8 × A100 40 GB,
registered in two steps. The pod is the benchmark's (2 init containers, 1 sidecar, 2 apps), a
fresh uid per call, every node a candidate (the extender's NodeNames), under the namespace
quota. Every pod a figure placed is forgotten after it, untimed, so each figure starts from
empty nodes.

At 1,000 nodes, then at 5,000:

* rounds of [no-op RPC, Filter with one caller on the first replica], back to back, so that a
  neighbour's noise hits a figure and its baseline alike; each reports the median over rounds
  of its p50 and p99, and p99 / p50 is taken per round;
* the first replica's resident memory (VmRSS) once its cache holds every node (and before the
  first node, for the difference).

At 1,000 nodes also: 8 callers spread over both replicas (4 each) for a few seconds — Filters
per second (every answer counts; the outcomes are listed) — then the double-booking check over
every node: each device's usage is exactly the sum of what the pods stored on it hold, no device
is over its capacity, each Scheduled answer names the node and cards its pod is stored with, and
as many pods are stored as were answered Scheduled (each once). Reservations the recorder
refused (each one a re-read and another fit) are counted from the replicas' logs.

Then how stale a scheduler's cache is: a ``NodeCache`` (the scheduler's own class) in this
process, watching the same recorder, and the time from a write's answer (RecordPod of a pod on
a node of its own, which carries the write's revision) until that cache has applied the
revision.

With ``profile_seconds``, py-spy samples the first replica while Filters at the largest node
count run one at a time (shares of the time inside handled calls).

``python -m bench.scheduler_scale`` runs this alone, with the vectorized fit's compute per node
(``bench.fitbench``), and prints the issue's goals; ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import burst, fitbench, load, profiling, rpc, workload
from bench.stats import combine_rounds, percentile, ratio
from hami.accounting.v1 import scheduler_pb2, usage_pb2
from services.common.server import client_channel
from services.scheduler.node_cache import NodeCache
from services.scheduler.recorder_client import RecorderClient

NODE_STEPS = (1000, 5000)
CALLERS = 8
REPLICAS = 2
FILTER_P50_LIMIT_MS = {1000: 3.0, 5000: 10.0}
P99_OVER_P50_LIMIT = 3.0
FILTERS_PER_S_LIMIT = 150.0
FIT_KERNEL_LIMIT_US = 1.5
LAG_SAMPLES = 300
CHECK_BATCH = 500
"""Nodes per GetNodeUsage of the double-booking check."""
ROUND_BUDGET = load.Budget(1.5, 8, 3000, 5)
"""One caller, per figure per round: 1.5 s (at least 8 calls)."""

Log = Callable[[str], None]


class _Placements:
    """Every Filter answer of a run: its pod's reason, node and cards (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.answers: dict[str, tuple[str, str, dict[str, int]]] = {}

    def add(self, uid: str, response: scheduler_pb2.FilterResponse) -> None:
        cards: dict[str, int] = defaultdict(int)
        for entry in response.reserved:
            cards[entry.uuid] += entry.memory_mib
        with self._lock:
            self.answers[uid] = (response.reason, response.node_name, dict(cards))


def double_booking(stack: rpc.Stack, node_names: Sequence[str],
                   placements: _Placements) -> dict[str, Any]:
    """What the recorder holds after a run, against what the answers said (module docstring)."""
    stub = stack.usage_stub
    held: dict[str, list[int]] = {}
    answered_wrong: list[str] = []
    stored_count = 0
    for uid, (reason, node, cards) in placements.answers.items():
        stored = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                  timeout=rpc.RPC_TIMEOUT_S)
        if stored.found:
            stored_count += 1
            burst.add_stored(held, stored.stored)
        if reason == "Scheduled":
            kept = {u.uuid: u.memory_mib for u in stored.stored}
            if not stored.found or stored.node_name != node or kept != cards:
                answered_wrong.append(uid)
    mismatched: list[str] = []
    over_capacity: list[str] = []
    for start in range(0, len(node_names), CHECK_BATCH):
        nodes = stub.GetNodeUsage(
            usage_pb2.GetNodeUsageRequest(node_names=node_names[start:start + CHECK_BATCH]),
            timeout=rpc.RPC_TIMEOUT_S).nodes
        wrong, over = burst.device_problems(nodes, held)
        mismatched += wrong
        over_capacity += over
    scheduled = sum(1 for reason, _, _ in placements.answers.values() if reason == "Scheduled")
    return {
        "scheduled": scheduled,
        "stored_pods": stored_count,
        "answers_not_stored": answered_wrong[:5],
        "devices_mismatched": mismatched[:5],
        "devices_over_capacity": over_capacity[:5],
        "no_double_booking": (not answered_wrong and not mismatched and not over_capacity
                              and stored_count == scheduled),
    }


def refusals(stack: rpc.Stack) -> int:
    """Reservations the recorder refused so far, over every scheduler replica (each refusal is
    a re-read and another fit: the cost of a cache that did not show a rival's placement)."""
    return sum(
        1
        for child in stack.schedulers
        for record in child.log_records()
        if str(record.get("message", "")).startswith("reservation of pod")
        and " refused (" in str(record.get("message", ""))
    )


def cache_lag(stack: rpc.Stack, samples: int) -> dict[str, Any]:
    """How long after a write's answer a scheduler's node cache has applied it (module
    docstring)."""
    client = RecorderClient(client_channel(stack.usage.address), stack.usage.address)
    cache = NodeCache(client, client_channel(stack.usage.address)).start()
    tally = rpc.Tally()
    lags_us: list[float] = []
    missed = 0
    try:
        if not cache.wait_for_revision(0, 60):
            raise RuntimeError("the node cache never received its initial state")
        method = stack.usage_stub.RecordPod
        run = next(rpc._RUN_IDS)
        for index in range(samples):
            uid = rpc.fixed_uid("cachelag", run, index)
            request = usage_pb2.RecordPodRequest.FromString(
                rpc._with_uid(stack.record_templates[index % len(stack.record_templates)], uid))
            answer = method(request, timeout=rpc.RPC_TIMEOUT_S)
            answered = time.perf_counter()
            tally.add(uid, answer.decision)
            if cache.wait_for_revision(answer.revision, 5.0):
                lags_us.append((time.perf_counter() - answered) * 1e6)
            else:
                missed += 1
    finally:
        cache.close()
        client.close()
        stack.forget(tally.uids)
    lags_us.sort()
    return {
        "samples": samples,
        "p50_us": round(percentile(lags_us, 0.50), 1),
        "p99_us": round(percentile(lags_us, 0.99), 1),
        "max_us": round(lags_us[-1], 1) if lags_us else 0.0,
        "missed": missed,
    }


def _filter_run(stack: rpc.Stack, targets: str | Sequence[str], names: Sequence[str],
                budget: load.Budget, callers: int = 1,
                placements: _Placements | None = None) -> dict[str, Any]:
    """One Filter figure; its pods are forgotten after it, untimed."""
    tally = rpc.Tally()
    try:
        summary = load.run(targets, rpc.filter_caller(
            names, tally, placements.add if placements is not None else None),
            budget, callers=callers)
    finally:
        if placements is None:
            stack.forget(tally.uids)
    summary["outcomes"] = dict(tally.reasons)
    summary["uids"] = tally.uids
    return summary


def _rounds(stack: rpc.Stack, names: Sequence[str], rounds: int, budget: load.Budget,
            log: Log) -> dict[str, Any]:
    assert stack.noop is not None and stack.scheduler is not None
    noop_rounds: list[dict[str, Any]] = []
    filter_rounds: list[dict[str, Any]] = []
    outcomes: Counter[str] = Counter()
    refused_before = refusals(stack)
    for round_index in range(rounds):
        log(f"scheduler scale: {len(names)} nodes, round {round_index + 1}/{rounds}")
        noop_rounds.append(load.run(stack.noop.address, rpc.noop_caller(), budget))
        filtered = _filter_run(stack, stack.scheduler.address, names, budget)
        outcomes.update(filtered.pop("outcomes"))
        filtered.pop("uids")
        filter_rounds.append(filtered)
    noop = combine_rounds(noop_rounds)
    figure = combine_rounds(filter_rounds)
    figure["errors"] = sum(int(r.get("errors", 0)) for r in filter_rounds)
    figure["outcomes"] = dict(outcomes)
    figure["reservations_refused"] = refusals(stack) - refused_before
    figure["round_p99_over_p50"] = [ratio(r["p99_us"], r["p50_us"]) for r in filter_rounds]
    figure["p99_over_p50"] = round(statistics.median(figure["round_p99_over_p50"]), 3)
    figure["round_vs_noop"] = [ratio(f["p50_us"], n["p50_us"])
                               for f, n in zip(filter_rounds, noop_rounds, strict=True)]
    figure["vs_noop"] = round(statistics.median(figure["round_vs_noop"]), 2)
    return {"noop": noop, "filter": figure}


def _replicas(stack: rpc.Stack, names: Sequence[str], seconds: float) -> dict[str, Any]:
    placements = _Placements()
    budget = load.Budget(seconds, CALLERS * 4, 100_000, 4)
    refused_before = refusals(stack)
    uids: list[str] = []
    try:
        summary = _filter_run(stack, [child.address for child in stack.schedulers], names,
                              budget, CALLERS, placements)
        uids = summary.pop("uids")
        check = double_booking(stack, names, placements)
        refused = refusals(stack) - refused_before
    finally:
        stack.forget(uids or list(placements.answers))
    return {
        **summary,
        "callers": CALLERS,
        "replicas": len(stack.schedulers),
        "reservations_refused": refused,
        "check": check,
    }


def _profile(stack: rpc.Stack, names: Sequence[str], seconds: float,
             work_dir: Path) -> dict[str, Any]:
    """py-spy on the first replica while Filters run one at a time."""
    assert stack.scheduler is not None
    out = work_dir / "profile-scheduler-scale.raw"
    recording = profiling.record_pid(stack.scheduler.pid, seconds, out)
    deadline = time.monotonic() + seconds + 0.5
    while time.monotonic() < deadline:
        _filter_run(stack, stack.scheduler.address, names, ROUND_BUDGET)
    return profiling.finish(recording, out)


def run(work_dir: Path, rounds: int, budget: load.Budget = ROUND_BUDGET, *,
        node_steps: Sequence[int] = NODE_STEPS, replica_seconds: float = 5.0,
        lag_samples: int = LAG_SAMPLES, profile_seconds: float = 0.0,
        log: Log = print) -> dict[str, Any]:
    """Every figure of the module docstring (the replicas at the first node count)."""
    log(f"scheduler scale: a recorder, {REPLICAS} scheduler replicas, up to "
        f"{node_steps[-1]} nodes")
    stack = rpc.Stack("scale", work_dir, admission=False, schedulers=REPLICAS)
    result: dict[str, Any] = {"rounds": rounds, "gpus_per_node": workload.GPUS_PER_NODE,
                              "steps": {}}
    try:
        assert stack.scheduler is not None
        result["scheduler_rss_before_nodes_kib"] = stack.scheduler.rss_kib()
        stack.prepare_record_nodes()
        names: list[str] = []
        for index, nodes in enumerate(node_steps):
            log(f"scheduler scale: registering nodes up to {nodes}")
            stack.grow(nodes)
            names = [workload.node_name(i) for i in range(nodes)]
            time.sleep(1.0)  # the replicas' caches take the registrations' events
            step = _rounds(stack, names, rounds, budget, log)
            step["scheduler_rss_kib"] = stack.scheduler.rss_kib()
            if index == 0:
                log(f"scheduler scale: {CALLERS} callers over {REPLICAS} replicas, "
                    f"{replica_seconds} s")
                step["replicas"] = _replicas(stack, names, replica_seconds)
            result["steps"][str(nodes)] = step
        log(f"scheduler scale: cache lag, {lag_samples} writes")
        result["cache_lag"] = cache_lag(stack, lag_samples)
        if profile_seconds:
            log(f"scheduler scale: profiling Filter at {node_steps[-1]} nodes")
            result["profile"] = _profile(stack, names, profile_seconds, work_dir)
    finally:
        stack.stop()
    return result


# -- the goals -----------------------------------------------------------------------------------


def _row(key: str, text: str, value: float, limit: float | None, unit: str, detail: str, *,
         at_least: bool = False) -> dict[str, Any]:
    """A goal row of bench.report; a figure only reported (no limit) passes."""
    passed = True if limit is None else (value >= limit if at_least else value <= limit)
    return {"key": key, "goal": text, "value": value, "limit": limit, "unit": unit,
            "at_least": at_least, "pass": passed, "detail": detail}


def goal_rows(result: dict[str, Any], fit: dict[str, Any] | None = None
              ) -> list[dict[str, Any]]:
    """Issue 18's goals from a run (``fit``: bench.fitbench's result, for the vectorized fit's
    compute). The limits are the 1,000- and 5,000-node ones at the first and last node counts
    (a quick run's small counts mean nothing, only the shape)."""
    steps = [(int(nodes), step) for nodes, step in result["steps"].items()]
    rows: list[dict[str, Any]] = []
    p99_ratios: list[str] = []
    worst = 0.0
    for (nodes, step), (key, limit) in zip(
            (steps[0], steps[-1]) if len(steps) > 1 else steps,
            (("filter_p50_small_ms", FILTER_P50_LIMIT_MS[1000]),
             ("filter_p50_large_ms", FILTER_P50_LIMIT_MS[5000])), strict=False):
        figure, noop = step["filter"], step["noop"]
        rows.append(_row(
            key, f"Filter p50 ≤ {limit:g} ms at {nodes:,} nodes", round(figure["p50_us"] / 1000, 2),
            limit, "ms",
            f"one caller: {figure['vs_noop']} × the no-op's {noop['p50_us']:.0f} µs in the "
            f"same rounds (round p50s {[round(v / 1000, 2) for v in figure['round_p50_us']]} "
            f"ms); p99 {figure['p99_us'] / 1000:.2f} ms; {figure['calls']} calls, "
            f"{figure['reservations_refused']} reservations refused, outcomes "
            f"{figure['outcomes']}"))
    for nodes, step in steps:
        figure = step["filter"]
        worst = max(worst, figure["p99_over_p50"])
        p99_ratios.append(f"{nodes:,} nodes {figure['p99_over_p50']} (rounds "
                          f"{figure['round_p99_over_p50']})")
    rows.append(_row("filter_p99_over_p50", "Filter p99 ≤ 3 × p50 (the worse node count)",
                     worst, P99_OVER_P50_LIMIT, "×", "; ".join(p99_ratios)))
    first_nodes, first = steps[0]
    replicas = first.get("replicas")
    if replicas is not None:
        check = replicas["check"]
        rate = replicas["calls_per_s"] if check["no_double_booking"] else 0.0
        rows.append(_row(
            "filters_per_s_two_replicas",
            f"≥ 150 Filters/s at {first_nodes:,} nodes, {replicas['callers']} callers over "
            f"{replicas['replicas']} scheduler replicas, no double booking",
            rate, FILTERS_PER_S_LIMIT, "/s",
            f"p50 {replicas['p50_us'] / 1000:.1f} ms, p99 {replicas['p99_us'] / 1000:.1f} ms; "
            f"outcomes {replicas['outcomes']}; {replicas['reservations_refused']} reservations "
            f"refused; no double booking: {check['no_double_booking']} ({check['stored_pods']} "
            f"pods stored = {check['scheduled']} Scheduled, each on its answer's node and cards;"
            f" devices off the sum of their pods {len(check['devices_mismatched'])}, over "
            f"capacity {len(check['devices_over_capacity'])}); counted 0 if any booking is off",
            at_least=True))
    if fit is not None and "fit_kernel" in fit["us_per_node"]:
        us = fit["us_per_node"]
        rows.append(_row(
            "fit_kernel_us_per_node",
            f"vectorized fit ≤ 1.5 µs per node at {fit['nodes']:,} nodes", us["fit_kernel"],
            FIT_KERNEL_LIMIT_US, "µs",
            f"services.scheduler.fit_kernel over the nodes' columns, CPU time, "
            f"{fit['fit_kernel_ms']} ms per pod (rounds {fit['round_us_per_node']['fit_kernel']}"
            f"); copying the rows first (NodeTable.gather) {us['columns_gather']} µs per node; "
            f"the reference fit_pod {us['fit_pod']} µs per node"))
    last_nodes, last = steps[-1]
    before = result["scheduler_rss_before_nodes_kib"]
    rss = last["scheduler_rss_kib"]
    rows.append(_row(
        "scheduler_rss_mib",
        f"scheduler resident memory, {last_nodes:,} nodes × {result['gpus_per_node']} GPUs "
        "(reported)", round(rss / 1024, 1), None, "MiB",
        f"VmRSS of a replica holding every node in its cache, after its Filters; "
        f"{before / 1024:.1f} MiB before any node: {(rss - before) * 1024 / last_nodes:.0f} B "
        "per node"))
    lag = result.get("cache_lag")
    if lag is not None:
        rows.append(_row(
            "cache_lag_p50_ms",
            "write at the recorder → a scheduler's cache has it, p50 (reported)",
            round(lag["p50_us"] / 1000, 3), None, "ms",
            f"{lag['samples']} RecordPod calls one at a time, each until a NodeCache in the "
            f"benchmark process applied its revision: p99 {lag['p99_us'] / 1000:.2f} ms, max "
            f"{lag['max_us'] / 1000:.2f} ms, {lag['missed']} missed"))
    return rows


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_scale",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=ROUND_BUDGET.seconds,
                        help="per figure per round")
    parser.add_argument("--replica-seconds", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODE_STEPS))
    parser.add_argument("--lag-samples", type=int, default=LAG_SAMPLES)
    parser.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                        help="py-spy the first replica at the largest node count")
    parser.add_argument("--no-fit", action="store_true", help="skip the in-process fit figures")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    load_before = _loadavg()
    fit = None if args.no_fit else fitbench.run(NODE_STEPS[-1], 3, 3, 200)
    work_dir = Path(tempfile.mkdtemp(prefix="hami-bench-scheduler-"))
    try:
        budget = load.Budget(args.seconds, ROUND_BUDGET.min_calls, ROUND_BUDGET.max_calls,
                             ROUND_BUDGET.warmup_calls)
        result = run(work_dir, args.rounds, budget, node_steps=args.nodes,
                     replica_seconds=args.replica_seconds, lag_samples=args.lag_samples,
                     profile_seconds=args.profile)
    finally:
        if args.keep:
            print(f"work directory kept: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    result["loadavg_before"], result["loadavg_after"] = load_before, _loadavg()
    if args.out:
        args.out.write_text(json.dumps({"scheduler_scale": result, "fit": fit}, indent=1) + "\n")
    for goal in goal_rows(result, fit):
        verdict = "reported" if goal["limit"] is None else "pass" if goal["pass"] else "MISS"
        print(f"{verdict:8} {goal['goal']}: {goal['value']} {goal['unit']} — {goal['detail']}")
    print(f"load average {load_before} before, {result['loadavg_after']} after")
    if "profile" in result:
        print(json.dumps(result["profile"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
