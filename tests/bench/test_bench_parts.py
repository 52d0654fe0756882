"""The benchmark's parts that run on their own (``python -m bench.many_watchers``, ``python -m
bench.tracing_cost``, ``python -m bench.scheduler_scale``, ``python -m bench.metrics_scrape``):
each runs end to end at the smallest size and prints its figures. No timing is asserted: at
this size the figures mean nothing, only that every part runs; the arithmetic of the memory per
stream is checked on its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import many_watchers

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_many_watchers_runs_alone() -> None:
    out = run("bench.many_watchers", "--rounds", "1", "--watchers", "4", "--lag-samples", "10",
              "--seconds", "0.05", "--fleet", "python")
    for line in ("record_pod_watched / noop: median", "get_pod_usage_watched / get_pod_usage",
                 "watch lag with 4 streams", "memory per open stream", "missed 0",
                 "'errors': {}"):
        assert line in out, out


def test_memory_per_stream_leaves_out_what_the_writes_grow() -> None:
    # 64 streams; the watched recorder grew 6,000 KiB, the unwatched one 200 KiB over the same
    # writes: the streams' share is 5,800 KiB.
    assert many_watchers.per_stream_bytes((60_000, 66_000), (59_000, 59_200), 64) == 92_800.0
    # An unwatched recorder that shrank adds its shrinking back rather than hiding it.
    assert many_watchers.per_stream_bytes((60_000, 66_000), (59_000, 58_936), 64) == 97_024.0


def test_many_watchers_memory_alone() -> None:
    out = run("bench.many_watchers", "--memory-only", "--watchers", "4", "--fleet", "python")
    assert "memory per open stream:" in out, out
    assert "before subtracting the unwatched recorder" in out, out
    assert "record_pod_watched" not in out, out


def test_tracing_cost_runs_alone() -> None:
    out = run("bench.tracing_cost", "--rounds", "1", "--seconds", "0.05")
    assert "tracing adds" in out and "hami-accounting-admission" in out, out


def test_scheduler_scale_runs_alone() -> None:
    out = run("bench.scheduler_scale", "--nodes", "10", "20", "--rounds", "1", "--seconds",
              "0.05", "--replica-seconds", "0.2", "--lag-samples", "10", "--no-fit")
    for line in ("Filter p50 ≤ 3 ms at 10 nodes", "Filter p50 ≤ 10 ms at 20 nodes",
                 "8 callers over 2 scheduler replicas", "no double booking: True",
                 "scheduler resident memory, 20 nodes", "0 missed", "load average"):
        assert line in out, out


def test_metrics_scrape_runs_alone() -> None:
    out = run("bench.metrics_scrape", "--nodes", "20", "--rounds", "1")
    assert "20 nodes × 8 GPUs, 160 pods" in out, out
    for figure in ("lock:", "cold:", "steady:", "churn:", "gzip:", "http:"):
        assert figure in out, out
