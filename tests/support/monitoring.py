"""The dashboard and alert rules of deploy/monitoring as the tests read them: every PromQL query
with the dashboard's variables filled in, every alert, and the metric families the daemons
serve (to check that a query names only those).

``tests/deploy/test_monitoring.py`` checks them offline (promtool, a PromQL parser, Grafana's
schema); ``tests/e2e/test_monitoring_e2e.py`` runs them on a real Prometheus scraping the three
daemons under a workload.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "hami-accounting-rules.yaml"
RULE_TESTS = MONITORING / "hami-accounting-rules.test.yaml"
DASHBOARD = MONITORING / "hami-accounting-dashboard.json"

GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range"})
"""Grafana's own variables a query may use."""
LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[^,]+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    """One PromQL query of the dashboard."""

    panel: str
    ref_id: str
    expr: str
    legend: str

    @property
    def where(self) -> str:
        return f"panel {self.panel!r} query {self.ref_id}"

    def filled(self, rate_interval: str = "5m") -> str:
        """The query as Grafana sends it with every variable at "All" (``.*``)."""
        return fill(self.expr, rate_interval)

    @property
    def legend_labels(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{\{\s*(\w+)\s*\}\}", self.legend))


@dataclass(frozen=True)
class Variable:
    """A query variable of the dashboard: ``label_values(metric, label)``."""

    name: str
    metric: str
    label: str
    all_value: str


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(data: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included."""
    for panel in (data or dashboard())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(data: dict[str, Any] | None = None) -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"], target.get("legendFormat", ""))
        for panel in panels(data)
        for target in panel.get("targets", [])
    ]


def variables(data: dict[str, Any] | None = None) -> list[Variable]:
    found = []
    for variable in (data or dashboard())["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, f"variable {variable['name']}: not label_values(metric, label)"
        found.append(Variable(variable["name"], match["metric"].strip(), match["label"],
                              variable.get("allValue", "")))
    return found


def fill(expr: str, rate_interval: str = "5m") -> str:
    """``expr`` with ``$__rate_interval`` and every dashboard variable at "All" (``.*``)."""
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects, read from its syntax tree."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def is_served(metric: str) -> bool:
    """Whether a sample name belongs to a family the daemons serve (``x_bucket``, ``x_count``,
    ``x_sum`` of a histogram ``x``, ``x_total`` of a counter ``x``, or ``x`` itself)."""
    served = served_families()
    return metric in served or any(
        metric.endswith(suffix) and metric.removesuffix(suffix) in served
        for suffix in ("_bucket", "_count", "_sum", "_total", "_created")
    )


@functools.cache
def served_families() -> frozenset[str]:
    """Every family the three daemons serve (prometheus_client's and the recorder's
    scrape-time ones)."""
    from prometheus_client import REGISTRY

    import services.common.metrics  # every daemon's families
    import services.scheduler.metrics  # noqa: F401  # the scheduler's families
    from services.usage import hami_metrics
    from services.usage import metrics as usage_metrics

    served = {collected.name for collected in REGISTRY.collect()}
    served |= {name for name, _help in (usage_metrics.INIT_SHARE_HELD_MIB,
                                        usage_metrics.INIT_SHARE_HELD_CORES,
                                        usage_metrics.QUOTA_USED, usage_metrics.QUOTA_LIMIT)}
    served |= set(hami_metrics.HAMI_FAMILY_NAMES) | set(hami_metrics.LEGACY_FAMILY_NAMES)
    return frozenset(served)
