"""Smoke test of the what-if benchmark (``python -m bench.what_if``): a tiny run end to end
writes every figure. No timing is asserted: a tiny run's figures mean nothing, only their
shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "what_if.json"
    command = [sys.executable, "-m", "bench.what_if", "--pods", "120", "--nodes", "6",
               "--runs", "2", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = json.loads(out.read_text())
    assert (results["pods"], results["nodes"], results["goal_s"]) == (120, 6, 30.0)
    assert len(results["runs"]) == 2
    for run in results["runs"]:
        assert run.keys() == {"wall_s", "cpu_s", "load_1m"} and run["wall_s"] > 0
    assert results["median_wall_s"] > 0 and isinstance(results["goal_met"], bool)
    assert set(results["stages_cpu_s"]) == {
        "generate_s", "read_s", "replay_summed_s", "replay_hami-v2.10_s", "replay_shrink_s",
        "replay_progressive_s",
    }
    assert "median of 2 runs" in done.stdout
