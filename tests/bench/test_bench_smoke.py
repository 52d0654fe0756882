"""Smoke test of the benchmark harness: ``python -m bench --quick`` runs every section end to end
(daemons, traced stack, watch cache, recorder scale, burst, scheduler at scale) with minimal
iterations and writes its results. No timing is asserted: the figures of a quick run mean
nothing, only their shape. The chart is drawn only when matplotlib (the ``bench`` extra) is
installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {"p50_us", "p99_us", "calls_per_s", "calls", "rounds", "errors"}
FIGURES = {"noop", "check_quota", "check_quota_direct", "record_pod", "record_pod_unwatched",
           "get_node_usage", "filter", "noop_traced", "check_quota_traced", "filter_traced"}
GOALS = {"check_quota_vs_noop", "record_pod_vs_noop", "filter_compute_us_per_node",
         "fit_speedup_vs_naive", "tracing_overhead_check_quota", "recovery_s", "bytes_per_pod",
         "record_pod_many_watchers_vs_noop", "get_pod_usage_with_streams", "watch_lag_p99_ms",
         "bytes_per_stream", "filter_p50_small_ms", "filter_p50_large_ms", "filter_p99_over_p50",
         "filters_per_s_two_replicas", "fit_kernel_us_per_node", "scheduler_rss_mib",
         "cache_lag_p50_ms", "realistic_filter_vs_noop_small", "realistic_filter_vs_noop_large",
         "realistic_filter_p50_small_ms", "realistic_filter_p50_large_ms"}
MANY_WATCHERS = {"noop", "get_pod_usage", "get_pod_usage_watched", "record_pod_plain",
                 "record_pod_watched"}


def test_quick_run_writes_every_section(tmp_path: Path) -> None:
    with_chart = importlib.util.find_spec("matplotlib") is not None
    command = [sys.executable, "-m", "bench", "--quick", "--out-dir", str(tmp_path)]
    if not with_chart:
        command.append("--no-chart")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = json.loads((tmp_path / "latest.json").read_text())
    assert {"meta", "goals", "rpc", "fit", "recorder", "burst", "watch_lag", "profiles",
            "scheduler_scale", "realistic_cluster"} <= results.keys()
    lag = results["watch_lag"]
    assert lag["missed"] == 0 and lag["p50_us"] is not None, lag
    assert results["meta"]["quick"] is True
    assert {goal["key"] for goal in results["goals"]} == GOALS
    for goal in results["goals"]:
        assert {"goal", "value", "limit", "pass", "detail"} <= goal.keys()

    figures = results["rpc"]["figures"][str(results["rpc"]["node_counts"][0])]
    assert figures.keys() >= FIGURES
    for figure in FIGURES:
        for mode in ("seq", "c8"):
            assert figures[figure][mode].keys() >= SUMMARY_KEYS, (figure, mode)
            assert figures[figure][mode]["errors"] == 0, (figure, mode)
    assert figures["record_pod"]["outcomes"].keys() == {"Recorded"}

    assert {"fit_pod", "fit_node", "naive_fit_node", "node_state_build"} <= \
        results["fit"]["us_per_node"].keys()
    recorder = results["recorder"]
    assert recorder["round_recovery_s"] and recorder["bytes_per_pod"] is not None
    assert recorder["build"]["overcommitted"] == 0
    burst = results["burst"]
    assert burst["errors"] == 0
    assert burst["no_double_allocation"] is True

    many = results["many_watchers"]
    assert many["figures"].keys() == MANY_WATCHERS
    assert all(figure["errors"] == 0 for figure in many["figures"].values())
    assert many["fleet"]["errors"] == {} and many["watch_lag"]["missed"] == 0
    assert many["fleet"]["events_during_rounds"] > 0

    scheduler = results["scheduler_scale"]
    assert list(scheduler["steps"]) == ["10", "20"]
    replicas = scheduler["steps"]["10"]["replicas"]
    assert replicas["errors"] == 0 and replicas["check"]["no_double_booking"] is True, replicas
    assert replicas["check"]["stored_pods"] == replicas["outcomes"].get("Scheduled", 0) > 0
    assert scheduler["cache_lag"]["missed"] == 0
    assert all(step["filter"]["errors"] == 0 for step in scheduler["steps"].values())

    text = (tmp_path / "benchmarks.md").read_text()
    assert "## Goals" in text and "## Burst" in text and "## Many watchers" in text
    assert "## The scheduler at scale" in text
    assert (tmp_path / "benchmarks.png").is_file() == with_chart
