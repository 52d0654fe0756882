"""Prometheus metrics: the helper functions and the /metrics endpoint."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from services.common import metrics


def _value(name: str, labels: dict[str, str]) -> float | None:
    return metrics.prometheus_client.REGISTRY.get_sample_value(name, labels)


def test_decisions_are_counted_by_service_decision_and_reason() -> None:
    labels = {"service": "metrics-test", "decision": "deny", "reason": "MEMORY_QUOTA_EXCEEDED"}
    before = _value("hami_accounting_decisions_total", labels) or 0.0
    metrics.record_decision("metrics-test", "deny", "MEMORY_QUOTA_EXCEEDED")
    metrics.record_decision("metrics-test", "deny", "MEMORY_QUOTA_EXCEEDED")
    assert _value("hami_accounting_decisions_total", labels) == before + 2


def test_each_series_counts_on_its_own_once_bound() -> None:
    # The series are looked up once and reused: a second value of any label is its own series,
    # and a reused one keeps counting.
    allow = {"service": "metrics-bound", "decision": "allow", "reason": "WITHIN_QUOTA"}
    deny = {**allow, "decision": "deny", "reason": "MEMORY_QUOTA_EXCEEDED"}
    before = {k: _value("hami_accounting_decisions_total", v) or 0.0
              for k, v in (("allow", allow), ("deny", deny))}
    for decision, reason in (("allow", "WITHIN_QUOTA"), ("deny", "MEMORY_QUOTA_EXCEEDED"),
                             ("allow", "WITHIN_QUOTA")):
        metrics.record_decision("metrics-bound", decision, reason)
    assert _value("hami_accounting_decisions_total", allow) == before["allow"] + 2
    assert _value("hami_accounting_decisions_total", deny) == before["deny"] + 1


def test_rpc_durations_are_observed_by_service_method_and_code() -> None:
    ok = {"service": "metrics-bound", "method": "/x.Y/Z", "code": "OK"}
    failed = {**ok, "code": "INVALID_ARGUMENT"}
    name = "hami_accounting_rpc_duration_seconds"
    samples = {"ok": (f"{name}_count", ok), "ok_sum": (f"{name}_sum", ok),
               "ok_fast": (f"{name}_bucket", {**ok, "le": "0.25"}),
               "failed": (f"{name}_count", failed)}

    def read() -> dict[str, float]:
        return {key: _value(*sample) or 0.0 for key, sample in samples.items()}

    before = read()
    metrics.observe_rpc_duration("metrics-bound", "/x.Y/Z", "OK", 0.25)
    metrics.observe_rpc_duration("metrics-bound", "/x.Y/Z", "OK", 0.5)
    metrics.observe_rpc_duration("metrics-bound", "/x.Y/Z", "INVALID_ARGUMENT", 0.125)
    after = read()
    assert {key: after[key] - before[key] for key in samples} == {
        "ok": 2, "ok_sum": 0.75, "ok_fast": 1, "failed": 1}


def test_metrics_endpoint_serves_the_metrics_on_a_free_port() -> None:
    metrics.record_decision("metrics-test", "allow", "WITHIN_QUOTA")
    port = metrics.start_metrics_server("127.0.0.1:0")
    assert port is not None and port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert ('hami_accounting_decisions_total{decision="allow",reason="WITHIN_QUOTA",'
            'service="metrics-test"}') in body
    assert "# TYPE hami_accounting_rpc_duration_seconds histogram" in body


def test_metrics_endpoint_off_does_nothing() -> None:
    assert metrics.start_metrics_server(None) is None


def test_metrics_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(metrics.MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics.start_metrics_server(f"127.0.0.1:{port}")
