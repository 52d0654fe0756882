"""The recorder's own metric families (services/usage/metrics.py): set, removed, observed, and
served by the recorder's process only."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import REGISTRY

from services.usage import metrics
from tests.reliability.daemons import REPO, clean_env, free_port

USAGE_ONLY = (
    "hami_accounting_ledger_memory_used_mib",
    "hami_accounting_ledger_cores_used",
    "hami_accounting_journal_write_seconds",
    "hami_accounting_source_skips_total",
    "hami_accounting_source_skipped_objects",
    "hami_accounting_journal_write_failures_total",
    "hami_accounting_leader",
    "hami_accounting_watch_streams",
    "hami_accounting_watch_lag_events",
    "hami_accounting_watch_cutoffs_total",
)
"""Families a fresh recorder shows before anything happened (those with a series per device,
pod or namespace have none yet; they are checked in test_hami_metrics.py)."""
SCHEDULER_ONLY = (
    "hami_accounting_filter_duration_seconds",
    "hami_accounting_filter_node_refusals_total",
)


def _value(name: str, labels: dict[str, str]) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_ledger_totals_are_set_and_removed() -> None:
    labels = {"scope": "node", "name": "metrics-test-node"}
    metrics.set_ledger_total("node", "metrics-test-node", memory_mib=12288, core_percent=150)
    assert _value("hami_accounting_ledger_memory_used_mib", labels) == 12288
    assert _value("hami_accounting_ledger_cores_used", labels) == 150
    metrics.remove_ledger_total("node", "metrics-test-node")
    metrics.remove_ledger_total("node", "metrics-test-node")  # absent: no error
    assert _value("hami_accounting_ledger_memory_used_mib", labels) is None


def test_ledger_scope_must_be_node_or_namespace() -> None:
    with pytest.raises(ValueError, match="scope"):
        metrics.set_ledger_total("cluster", "x", 1, 1)


def test_journal_writes_are_observed() -> None:
    before = _value("hami_accounting_journal_write_seconds_count", {}) or 0.0
    metrics.observe_journal_write(0.002)
    assert _value("hami_accounting_journal_write_seconds_count", {}) == before + 1


def _scrape(daemon: str, tmp_path_str: str) -> str:
    """Starts ``daemon`` as its own process, returns its /metrics text once it has started
    (the endpoint serves from before: the recorder's own gauges are bound once it has
    recovered its journal), stops it."""
    port = free_port()
    env = clean_env(HAMI_ACCOUNTING_LISTEN_ADDR=f"127.0.0.1:{free_port()}",
                    HAMI_ACCOUNTING_METRICS_ADDR=f"127.0.0.1:{port}",
                    HAMI_ACCOUNTING_DATA_DIR=tmp_path_str,
                    HAMI_ACCOUNTING_USAGE_ADDR=f"127.0.0.1:{free_port()}")
    process = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", daemon],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                if daemon != "usage" or "\nhami_accounting_leader 1.0\n" in text:
                    return text
                assert time.monotonic() < deadline, f"{daemon} never led:\n{text}"
                time.sleep(0.1)
            except OSError:
                assert process.poll() is None, f"{daemon} exited with {process.returncode}"
                assert time.monotonic() < deadline, f"{daemon} served no /metrics"
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("daemon", ["admission", "scheduler", "usage"])
def test_only_the_recorder_serves_its_own_families(daemon: str, tmp_path: object) -> None:
    text = _scrape(daemon, str(tmp_path))

    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert "hami_accounting_rpc_duration_seconds" in families  # every daemon's
    if daemon == "usage":
        assert set(USAGE_ONLY) <= families
    else:
        assert not set(USAGE_ONLY) & families, sorted(families)
    # prometheus_client writes a family's HELP and TYPE before its first series too.
    if daemon == "scheduler":
        assert set(SCHEDULER_ONLY) <= families
    else:
        assert not set(SCHEDULER_ONLY) & families, sorted(families)
    if daemon != "usage":
        assert "hami_accounting_leader" not in text
