"""Prometheus metrics only the usage recorder serves: its ledger totals, journal writes and the
objects its Kubernetes source skipped.

Layer: services/usage (runtime). Defined here rather than in ``services.common.metrics`` so
that they are registered only in the recorder's process: the admission and scheduler daemons
never import this module, and their ``/metrics`` shows no empty families of the recorder's.
"""

from __future__ import annotations

import contextlib

import prometheus_client

__all__ = [
    "JOURNAL_WRITE",
    "LEDGER_CORES_USED",
    "LEDGER_MEMORY_USED",
    "LEDGER_SCOPES",
    "SOURCE_SKIPPED_OBJECTS",
    "SOURCE_SKIPS",
    "observe_journal_write",
    "remove_ledger_total",
    "set_ledger_total",
]

_JOURNAL_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)

LEDGER_MEMORY_USED = prometheus_client.Gauge(
    "hami_accounting_ledger_memory_used_mib",
    "GPU memory charged in the usage ledger, MiB, per node or namespace.",
    ["scope", "name"],
)
LEDGER_CORES_USED = prometheus_client.Gauge(
    "hami_accounting_ledger_cores_used",
    "GPU compute charged in the usage ledger, percent of one device (100 = a whole device).",
    ["scope", "name"],
)
JOURNAL_WRITE = prometheus_client.Histogram(
    "hami_accounting_journal_write_seconds",
    "Time to write and commit one change to the usage recorder's journal.",
    buckets=_JOURNAL_BUCKETS_S,
)

SOURCE_SKIPS = prometheus_client.Counter(
    "hami_accounting_source_skips",
    "Objects the recorder's Kubernetes source skipped instead of applying, by kind (pod, node, "
    "resourcequota) and reason (unreadable: refused by its reader; refused: refused by the "
    "store; failed: any other error). The log line of each names the object.",
    ["kind", "reason"],
)
SOURCE_SKIPPED_OBJECTS = prometheus_client.Gauge(
    "hami_accounting_source_skipped_objects",
    "Objects the recorder's Kubernetes source skipped and has not applied since, by kind: "
    "they count as they were last applied (or not at all) until they are read again or deleted.",
    ["kind"],
)

LEDGER_SCOPES = ("node", "namespace")


def set_ledger_total(scope: str, name: str, memory_mib: int, core_percent: int) -> None:
    """Publishes the ledger total of one node or namespace."""
    if scope not in LEDGER_SCOPES:
        raise ValueError(f"scope must be one of {LEDGER_SCOPES}, got {scope!r}")
    LEDGER_MEMORY_USED.labels(scope=scope, name=name).set(memory_mib)
    LEDGER_CORES_USED.labels(scope=scope, name=name).set(core_percent)


def remove_ledger_total(scope: str, name: str) -> None:
    """Drops the series of a node or namespace that no longer exists (no-op when absent)."""
    for gauge in (LEDGER_MEMORY_USED, LEDGER_CORES_USED):
        with contextlib.suppress(KeyError):
            gauge.remove(scope, name)


def observe_journal_write(seconds: float) -> None:
    """Records the duration of one journal write."""
    JOURNAL_WRITE.observe(seconds)
