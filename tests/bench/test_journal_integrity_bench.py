"""Smoke test of bench/journal_integrity.py at a tiny size: it loads the journal with and without
its checks and reports both (no timing asserted; the figures of 300 pods mean nothing)."""

from __future__ import annotations

from pathlib import Path

from bench import journal_integrity


def test_the_integrity_cost_bench_runs(tmp_path: Path) -> None:
    result = journal_integrity.run(tmp_path, pods=300, rounds=1)
    assert result["pods"] == 300
    assert set(result["rounds"]) == {"checked", "unchecked", "quick_check"}  # type: ignore[arg-type]
    assert result["load_checked_s"] > 0 and result["load_unchecked_s"] > 0  # type: ignore[operator]
