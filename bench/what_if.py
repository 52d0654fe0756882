"""``python -m bench.what_if``: how long ``hami-accounting what-if`` takes on a large workload.

Layer: benchmark. The goal: a 10,000-pod, 500-node replay under all four rules in under 30 s on
a 2-core machine. Each run is the whole command in a fresh interpreter, as a user runs it
(``--generate 10000 --nodes 500``, the four rules, the default ``--jobs``): generating and
reading the workload, the four replays, the JSON output. Wall time and CPU time (the command
and the processes it forks) are measured per run; the median over runs is reported, beside the
machine's load average, because other work on a shared machine stretches wall time. One more
run in process times the stages apart (generate, read, each rule's replay).

Options: --pods N (10000), --nodes N (500), --runs N (5), --seed S (1), --jobs N (the
command's default), --out FILE (bench/results/what_if.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accounting.counting_rules import CountingRule
from bench.procs import ROOT
from whatif.generate import generate
from whatif.kube_input import SourcedObject, read_workload
from whatif.replay import replay

GOAL_S = 30.0
RESULTS = ROOT / "bench" / "results" / "what_if.json"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command_run(pods: int, nodes: int, seed: int, jobs: int | None) -> dict[str, float]:
    """One run of the whole command; its wall and CPU seconds."""
    command = [
        sys.executable,
        "-m",
        "services.cli.what_if",
        "--generate",
        str(pods),
        "--nodes",
        str(nodes),
        "--seed",
        str(seed),
        "--output",
        "json",
    ]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    cpu_before = _children_cpu_s()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"what-if failed ({done.returncode}): {done.stderr[-2000:]}")
    placed = {rule["rule"]: rule["placed"] for rule in json.loads(done.stdout)["rules"]}
    if len(placed) != len(CountingRule):
        raise RuntimeError(f"expected every rule, got {sorted(placed)}")
    return {
        "wall_s": round(wall_s, 2),
        "cpu_s": round(_children_cpu_s() - cpu_before, 2),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def stages(pods: int, nodes: int, seed: int) -> dict[str, float]:
    """Each stage in this process, one after the other (CPU seconds)."""
    timings: dict[str, float] = {}
    started = time.process_time()
    made = generate(pods, seed, nodes=nodes)
    timings["generate_s"] = time.process_time() - started
    started = time.process_time()
    workload = read_workload([SourcedObject("generated", made.objects)], window_s=made.window_s)
    timings["read_s"] = time.process_time() - started
    for rule in CountingRule:
        started = time.process_time()
        replay(workload, rule)
        timings[f"replay_{rule.value}_s"] = time.process_time() - started
    return {key: round(value, 2) for key, value in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.what_if", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    runs = []
    for index in range(args.runs):
        run = command_run(args.pods, args.nodes, args.seed, args.jobs)
        runs.append(run)
        print(
            f"run {index + 1}/{args.runs}: {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} s "
            f"CPU, load {run['load_1m']}",
            flush=True,
        )
    breakdown = stages(args.pods, args.nodes, args.seed)
    median_wall_s = statistics.median(r["wall_s"] for r in runs)
    results: dict[str, Any] = {
        "pods": args.pods,
        "nodes": args.nodes,
        "seed": args.seed,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "runs": runs,
        "median_wall_s": round(median_wall_s, 2),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 2),
        "stages_cpu_s": breakdown,
        "goal_s": GOAL_S,
        "goal_met": median_wall_s < GOAL_S,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"median of {args.runs} runs: {results['median_wall_s']} s wall "
        f"({results['median_cpu_s']} s CPU); goal < {GOAL_S:.0f} s: "
        f"{'met' if results['goal_met'] else 'MISSED'}"
    )
    print("stages (CPU s, one process): " + ", ".join(f"{k} {v}" for k, v in breakdown.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
