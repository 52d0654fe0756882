"""Prometheus metrics only the usage recorder serves: its ledger totals, journal writes, the
objects its Kubernetes source skipped, init shares, leadership and WatchUsage streams.

Layer: services/usage (runtime). Defined here rather than in ``services.common.metrics`` so
that they are registered only in the recorder's process: the admission and scheduler daemons
never import this module, and their ``/metrics`` shows no empty families of the recorder's.

Most are prometheus_client objects, set as things happen. The families with a series per
device or namespace that a scrape reads from the store (the init share held, the quota used
and limited) are only named here: ``services.usage.scrape`` writes them, with HAMi's, from one
reading of the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import prometheus_client

__all__ = [
    "INIT_SHARE_HELD_CORES",
    "INIT_SHARE_HELD_MIB",
    "INIT_SHARE_RELEASED_CORES",
    "INIT_SHARE_RELEASED_MIB",
    "JOURNAL_WRITE",
    "JOURNAL_WRITE_FAILURES",
    "LEADER",
    "LEDGER_CORES_USED",
    "LEDGER_MEMORY_USED",
    "LEDGER_SCOPES",
    "QUOTA_LIMIT",
    "QUOTA_USED",
    "SOURCE_SKIPPED_OBJECTS",
    "SOURCE_SKIPS",
    "WATCH_CUTOFFS",
    "WATCH_CUTOFF_REASONS",
    "WATCH_LAG",
    "WATCH_STREAMS",
    "bind_recorder",
    "count_init_share_released",
    "count_journal_failure",
    "count_watch_cutoffs",
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

JOURNAL_WRITE_FAILURES = prometheus_client.Counter(
    "hami_accounting_journal_write_failures",
    "Journal writes that failed: the change was undone and its caller answered UNAVAILABLE.",
)
INIT_SHARE_RELEASED_MIB = prometheus_client.Counter(
    "hami_accounting_init_share_released_mib",
    "GPU memory given back when regular init containers finished (a shrink or a partial "
    "release), MiB, per namespace.",
    ["namespace"],
)
INIT_SHARE_RELEASED_CORES = prometheus_client.Counter(
    "hami_accounting_init_share_released_cores",
    "GPU compute given back when regular init containers finished, percent of one device, per "
    "namespace.",
    ["namespace"],
)
LEADER = prometheus_client.Gauge(
    "hami_accounting_leader",
    "1 while this recorder replica may take writes: it holds the leader Lease (always, without "
    "leader election); 0 while it stands by.",
)
WATCH_STREAMS = prometheus_client.Gauge(
    "hami_accounting_watch_streams",
    "WatchUsage streams this recorder serves now (a cut-off one until it has ended).",
)
WATCH_LAG = prometheus_client.Gauge(
    "hami_accounting_watch_lag_events",
    "Changes the furthest-behind attached WatchUsage stream has not been sent yet.",
)
WATCH_CUTOFFS = prometheus_client.Counter(
    "hami_accounting_watch_cutoffs",
    "WatchUsage streams the recorder ended or refused: cut off after falling too far behind "
    "(lag), or refused at the cap of open streams (stream_cap).",
    ["reason"],
)
WATCH_CUTOFF_REASONS = ("lag", "stream_cap")
for _reason in WATCH_CUTOFF_REASONS:
    WATCH_CUTOFFS.labels(reason=_reason)  # both shown from the start, at 0

# Written at scrape time from a reading of the store (services.usage.scrape): (name, help).
INIT_SHARE_HELD_MIB = (
    "hami_accounting_init_share_held_mib",
    "GPU memory stored for pods only because of their regular init containers, MiB, per "
    "device: given back when they finish.",
)
INIT_SHARE_HELD_CORES = (
    "hami_accounting_init_share_held_cores",
    "GPU compute stored for pods only because of their regular init containers, percent of "
    "one device, per device.",
)
QUOTA_USED = (
    "hami_accounting_quota_used",
    "What a namespace uses of a quota resource: memory MiB, compute percent, devices.",
)
QUOTA_LIMIT = (
    "hami_accounting_quota_limit",
    "A namespace's limit of a quota resource, in the unit of hami_accounting_quota_used (a "
    "memory limit times the vendor's memory factor, as the quota check compares it).",
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


def count_journal_failure() -> None:
    """Counts one failed journal write."""
    JOURNAL_WRITE_FAILURES.inc()


def count_init_share_released(namespace: str, memory_mib: int, core_percent: int) -> None:
    """Counts what finished init containers gave back in one namespace."""
    INIT_SHARE_RELEASED_MIB.labels(namespace=namespace).inc(memory_mib)
    INIT_SHARE_RELEASED_CORES.labels(namespace=namespace).inc(core_percent)


def count_watch_cutoffs(reason: str, streams: int = 1) -> None:
    """Counts WatchUsage streams cut off (``lag``) or refused (``stream_cap``)."""
    if reason not in WATCH_CUTOFF_REASONS:
        raise ValueError(f"reason must be one of {WATCH_CUTOFF_REASONS}, got {reason!r}")
    WATCH_CUTOFFS.labels(reason=reason).inc(streams)


def bind_recorder(
    *,
    is_leader: Callable[[], bool],
    open_streams: Callable[[], int],
    lag_events: Callable[[], int],
) -> None:
    """Reads the leadership and WatchUsage gauges from the recorder that started last in this
    process (each scrape calls these)."""
    LEADER.set_function(lambda: 1.0 if is_leader() else 0.0)
    WATCH_STREAMS.set_function(lambda: float(open_streams()))
    WATCH_LAG.set_function(lambda: float(lag_events()))
