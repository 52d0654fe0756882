"""Prometheus metrics only the scheduler daemon serves: how long a Filter takes, and why nodes
were refused.

Layer: services/scheduler (runtime). What HAMi's users have asked its scheduler for (a Filter
latency histogram and the refusals by reason), here for the daemon that does the fit.
Only this daemon imports the module, so the others show none of its families. The refusal
reasons are the stable codes of ``accounting.reasons`` a failed node's sentence is built from
(``3/8 CardInsufficientMemory, 5/8 CardTimeSlicingExhausted`` counts both codes once), so the
label stays a small closed set however many nodes a cluster has.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable

import prometheus_client

from accounting.reasons import NODE_UNREGISTERED

METRICS_SERVICE = "scheduler"
"""The ``service`` label of this daemon's metrics (services.common.metrics)."""

# From a Filter over a few nodes to one over thousands (docs/benchmarks.md has both ends).
_FILTER_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

FILTER_DURATION = prometheus_client.Histogram(
    "hami_accounting_filter_duration_seconds",
    "Time to place one pod (fit, recorder reads and the Reserve), by the Filter's decision "
    "(schedule, no-fit, pass-through, conflict, forgotten).",
    ["decision"],
    buckets=_FILTER_BUCKETS_S,
)
NODE_REFUSALS = prometheus_client.Counter(
    "hami_accounting_filter_node_refusals",
    "Candidate nodes a Filter refused, by reason code (a node refused for two reasons counts "
    "under both).",
    ["reason"],
)


def observe_filter(decision: str, seconds: float) -> None:
    """Records one Filter's duration under its decision."""
    _filter_series(decision).observe(seconds)


def count_node_refusals(reasons: Iterable[str], *, unregistered: int = 0) -> None:
    """Counts the refused candidates of one Filter: those the fit refused, from their reason
    sentences, and ``unregistered`` candidates the recorder has no inventory for."""
    for sentence, nodes in collections.Counter(reasons).items():
        for code in reason_codes(sentence):
            _refusal_series(code).inc(nodes)
    if unregistered:
        _refusal_series(NODE_UNREGISTERED).inc(unregistered)


@functools.cache
def reason_codes(sentence: str) -> tuple[str, ...]:
    """The reason codes of a failed node's sentence: ``"3/8 CardInsufficientMemory, 5/8
    CardTimeSlicingExhausted"`` -> both codes; a bare code (``NodeInsufficientDevice``) or
    phrase (``node unregistered``) is its own. Cached: a cluster's sentences are few and
    repeat on every Filter."""
    codes: list[str] = []
    for part in sentence.split(", "):
        count, _, code = part.partition(" ")
        if code and "/" in count and count.replace("/", "").isdigit():
            codes.append(code)
        else:
            codes.append(part)
    return tuple(dict.fromkeys(codes))


@functools.cache
def _filter_series(decision: str) -> prometheus_client.Histogram:
    return FILTER_DURATION.labels(decision=decision)


@functools.cache
def _refusal_series(reason: str) -> prometheus_client.Counter:
    return NODE_REFUSALS.labels(reason=reason)
