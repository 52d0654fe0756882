"""deploy/monitoring offline: the alert rules with Debian's promtool (``check rules`` and the unit
tests of ``test rules``, one firing case and one quiet case per alert), every query of the rules
and the dashboard with a real PromQL parser (promql-parser) naming only families the daemons
serve, and the dashboard through Grafana's schema (the foundation SDK's generated models) and
its layout.

tests/e2e/test_monitoring_e2e.py runs the same rules and queries on a real Prometheus scraping
the three daemons.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from typing import Any

import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog import encoder, plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.support import monitoring
from tests.support.monitoring import DASHBOARD, RULE_TESTS, RULES


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus "
                    "(scripts/system_setup.py)", pytrace=False)
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=RULES.parent)


# -- the alert rules ------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(monitoring.rules())} rules found" in checked.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _cases() -> dict[str, dict[str, int]]:
    """alert -> {"firing": cases expecting it to fire, "quiet": cases expecting it not to}."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    found: dict[str, dict[str, int]] = {}
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            kind = "firing" if check["exp_alerts"] else "quiet"
            counts = found.setdefault(check["alertname"], {"firing": 0, "quiet": 0})
            counts[kind] += 1
    return found


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    names = [alert["alert"] for alert in monitoring.alerts()]
    assert len(names) == len(set(names)), Counter(names).most_common(3)
    cases = _cases()
    assert set(cases) == set(names)
    for name in names:
        assert cases[name]["firing"] >= 1 and cases[name]["quiet"] >= 1, (name, cases[name])


@pytest.mark.parametrize("alert", monitoring.alerts(), ids=lambda a: a["alert"])
def test_every_alert_says_how_bad_and_what_to_do(alert: dict[str, Any]) -> None:
    assert alert["alert"].startswith("HamiAccounting")
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert set(alert["annotations"]) == {"summary", "description"}
    assert len(alert["annotations"]["description"].split(". ")) >= 2, "what happened, what to do"


# -- every query ----------------------------------------------------------------------------------


def _all_queries() -> list[tuple[str, str]]:
    rules = [(f"rule {rule['alert']}", rule["expr"]) for rule in monitoring.alerts()]
    panels = [(query.where, query.filled()) for query in monitoring.queries()]
    variables = [(f"variable {v.name}", v.metric) for v in monitoring.variables()]
    return rules + panels + variables


@pytest.mark.parametrize(("where", "expr"), _all_queries(), ids=lambda x: x)
def test_every_query_parses_and_names_only_served_families(where: str, expr: str) -> None:
    promql_parser.parse(expr)  # raises ValueError naming the fault
    names = monitoring.metric_names(expr)
    assert names, f"{where} selects no metric"
    unknown = {name for name in names if not monitoring.is_served(name)}
    assert not unknown, f"{where} names {sorted(unknown)}, which no daemon serves"


def test_the_parser_refuses_what_prometheus_would() -> None:
    for broken in ("sum(rate(x[5m])", "rate(x)", "x{a=}"):
        with pytest.raises(ValueError):
            promql_parser.parse(broken)


# -- the dashboard --------------------------------------------------------------------------------


def _differences(given: Any, read_back: Any, path: str = "") -> list[str]:
    """Where ``read_back`` lost or changed something of ``given``."""
    if isinstance(given, dict):
        if not isinstance(read_back, dict):
            return [f"{path}: {type(read_back).__name__} instead of an object"]
        return [
            problem
            for key, value in given.items()
            for problem in (
                [f"{path}.{key}: not in Grafana's schema"] if key not in read_back
                else _differences(value, read_back[key], f"{path}.{key}")
            )
        ]
    if isinstance(given, list):
        if not isinstance(read_back, list) or len(read_back) != len(given):
            return [f"{path}: a list of {len(given)} read back as {read_back!r:.60}"]
        return [p for i, (a, b) in enumerate(zip(given, read_back, strict=True))
                for p in _differences(a, b, f"{path}[{i}]")]
    return [] if given == read_back else [f"{path}: {given!r} read back as {read_back!r}"]


def test_the_dashboard_reads_back_through_grafanas_schema_unchanged() -> None:
    """Grafana's models keep only the fields they know: a misspelt key (``gridpos``,
    ``legendformat``, a panel option) is dropped on the way back, and named here."""
    plugins.register_default_plugins()
    given = monitoring.dashboard()
    read_back = json.loads(encoder.JSONEncoder(sort_keys=True).encode(Dashboard.from_json(given)))
    assert _differences(given, read_back) == []


def test_grafanas_schema_catches_a_misspelt_key() -> None:
    plugins.register_default_plugins()
    given = monitoring.dashboard()
    panel = next(p for p in given["panels"] if p["type"] == "timeseries")
    panel["targets"][0]["legendformat"] = panel["targets"][0].pop("legendFormat")
    read_back = json.loads(encoder.JSONEncoder(sort_keys=True).encode(Dashboard.from_json(given)))
    assert any("legendformat: not in Grafana's schema" in d
               for d in _differences(given, read_back))


def test_the_dashboard_is_laid_out_on_grafanas_grid() -> None:
    data = monitoring.dashboard()
    assert data["uid"] == "hami-accounting" and data["title"]
    ids = [panel["id"] for panel in monitoring.panels(data)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in monitoring.panels(data):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_panel_queries_the_chosen_data_source_with_known_variables() -> None:
    data = monitoring.dashboard()
    defined = {variable["name"] for variable in data["templating"]["list"]}
    assert "datasource" in defined
    for panel in monitoring.panels(data):
        if panel["type"] == "row":
            continue
        assert panel.get("description"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["datasource"] == panel["datasource"]
            used = set(re.findall(r"\$\{?(\w+)\}?", target["expr"]))
            assert used <= defined | monitoring.GRAFANA_BUILTINS, (panel["title"], used)
    for variable in monitoring.variables(data):
        assert variable.all_value == ".*", variable.name  # "All" is a regex matcher's .*


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    """Quotas, capacity per node and card, the init share, decisions, RPC and journal
    latency, WatchUsage streams and lag, the leader: each has a panel whose query names it."""
    named = " ".join(query.expr for query in monitoring.queries())
    for family in ("hami_accounting_quota_used", "hami_accounting_quota_limit",
                   "hami_gpu_memory_allocated_bytes", "hami_gpu_memory_limit_bytes",
                   "hami_node_gpu_memory_allocated_ratio", "hami_gpu_shared_count",
                   "hami_accounting_init_share_held_mib",
                   "hami_accounting_init_share_released_mib_total",
                   "hami_accounting_decisions_total",
                   "hami_accounting_filter_node_refusals_total",
                   "hami_accounting_rpc_duration_seconds_bucket",
                   "hami_accounting_filter_duration_seconds_bucket",
                   "hami_accounting_journal_write_seconds_bucket",
                   "hami_accounting_watch_streams", "hami_accounting_watch_lag_events",
                   "hami_accounting_watch_cutoffs_total", "hami_accounting_leader",
                   "hami_accounting_cache_synced"):
        assert family in named, family
    assert DASHBOARD.read_text().endswith("}\n")
