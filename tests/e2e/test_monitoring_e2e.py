"""The dashboard and the alert rules on a real Prometheus: Debian's server scrapes the three
daemons on loopback every second while a workload runs, with deploy/monitoring's rules loaded.

The workload walks pods through their lives the way HAMi's components call us: CheckQuota
(allowed, and denied over a small quota), Filter (placed, and refused on every node), RecordPod
with the init container running and then exited 0 (the shrink), ForgetPod; one pod stays in its
init container for good, so a card holds an init share. Then every query of the dashboard, as
Grafana sends it with its variables at "All", must return data: at least one series, a number in
one of them, and each label its legend names; each variable's ``label_values`` must find values;
every rule must evaluate without error and no alert may fire on this healthy stack.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.accounting.v1 import (
    admission_pb2,
    scheduler_pb2,
    usage_pb2,
)
from tests.e2e.stack import Stack, Stubs, clean_env, free_port, log_tail
from tests.support import monitoring
from tests.support.pods import (
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    running,
    terminated,
    to_json,
    waiting,
)

pytestmark = pytest.mark.timeout(240)

SCRAPE_INTERVAL = "1s"
RATE_INTERVAL = "30s"
"""What Grafana's ``$__rate_interval`` is for a 1 s scrape interval and a short time range."""
READY_TIMEOUT_S = 60.0
WORKLOAD_S = 20.0
TIMEOUT_S = 10.0
JOBS = ("usage", "admission", "scheduler")


# -- the workload ---------------------------------------------------------------------------------


NODES = {"node-a": [gpu_device("GPU-a0", memory_mib=40960, index=0),
                    gpu_device("GPU-a1", memory_mib=40960, index=1)],
         "node-b": [gpu_device("GPU-b0", memory_mib=16384, index=0)]}


def set_up(stubs: Stubs) -> None:
    for name, devices in NODES.items():
        stubs.usage.RegisterNode(usage_pb2.RegisterNodeRequest(
            node_name=name, kubernetes_node_json=to_json(kube_node(name, devices))),
            timeout=TIMEOUT_S)
    for namespace, memory_mib in (("team-a", 122880), ("team-b", 8192)):
        stubs.usage.SetQuota(usage_pb2.SetQuotaRequest(
            namespace=namespace, limits={"limits.nvidia.com/gpumem": memory_mib}),
            timeout=TIMEOUT_S)


def trainer(namespace: str = "team-a") -> dict[str, Any]:
    return kube_pod(f"trainer-{uuid.uuid4().hex[:8]}", uid=str(uuid.uuid4()), namespace=namespace,
                    init=[init_container("convert", gpumem=20480)],
                    apps=[app_container("server", gpumem=10240)])


def place(stubs: Stubs, pod: dict[str, Any]) -> dict[str, Any]:
    """CheckQuota (allowed), Filter (placed), bound; then recorded with its init running."""
    checked = stubs.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)), timeout=TIMEOUT_S)
    assert checked.allowed, checked.message
    placed = stubs.scheduler.Filter(scheduler_pb2.FilterRequest(
        kubernetes_pod_json=to_json(pod), node_names=list(NODES)), timeout=TIMEOUT_S)
    assert placed.node_name, placed.message
    pod["metadata"]["annotations"].update(placed.annotations)
    pod["spec"]["nodeName"] = placed.node_name
    pod["status"] = {"phase": "Pending", "initContainerStatuses": [running("convert")],
                     "containerStatuses": [waiting("server")]}
    recorded = stubs.usage.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)), timeout=TIMEOUT_S)
    assert recorded.tracked, recorded.message
    return pod


def one_round(stubs: Stubs) -> None:
    pod = place(stubs, trainer())
    finished = copy.deepcopy(pod)
    finished["status"] = {"phase": "Running", "initContainerStatuses": [terminated("convert")],
                          "containerStatuses": [running("server")]}
    shrunk = stubs.usage.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(finished)), timeout=TIMEOUT_S)
    assert shrunk.decision == "Shrunk", shrunk.message
    stubs.usage.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=pod["metadata"]["uid"]),
                          timeout=TIMEOUT_S)
    denied = stubs.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(trainer("team-b"))),
        timeout=TIMEOUT_S)
    assert not denied.allowed
    too_big = kube_pod(f"huge-{uuid.uuid4().hex[:8]}", uid=str(uuid.uuid4()), namespace="team-a",
                       apps=[app_container("server", gpumem=65536)])
    refused = stubs.scheduler.Filter(scheduler_pb2.FilterRequest(
        kubernetes_pod_json=to_json(too_big), node_names=list(NODES)), timeout=TIMEOUT_S)
    assert refused.reason == "NoNodeFits", refused.message


class Workload:
    """``one_round`` again and again on a thread until stopped; the first failure is kept."""

    def __init__(self, stubs: Stubs) -> None:
        self.stubs = stubs
        self.rounds = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                one_round(self.stubs)
            except BaseException as error:
                self.error = error
                return
            self.rounds += 1
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# -- Prometheus -----------------------------------------------------------------------------------


class Prometheus:
    """Debian's Prometheus on a free loopback port, scraping the stack, with the rules."""

    def __init__(self, workdir: Path, stack: Stack) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: `make test` installs Debian's prometheus "
                        "(scripts/system_setup.py)", pytrace=False)
        self.url = f"http://127.0.0.1:{free_port()}"
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"},
            "rule_files": [str(monitoring.RULES)],
            "scrape_configs": [
                {"job_name": f"hami-accounting-{name}",
                 "static_configs": [{"targets": [stack.daemons[name].metrics_addr]}]}
                for name in JOBS
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}",
                 "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=TIMEOUT_S) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, log_tail(self.log)
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"Prometheus not ready:\n{log_tail(self.log)}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Scraped:
    prometheus: Prometheus
    rounds: int


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    workdir = tmp_path_factory.mktemp("monitoring")
    stack = Stack(workdir / "stack", clean_env(OTEL_SDK_DISABLED="true"), metrics=True).start()
    prometheus: Prometheus | None = None
    stubs = Stubs.dial(stack)
    workload: Workload | None = None
    try:
        set_up(stubs)
        place(stubs, trainer())  # stays in its init container: its card holds an init share
        prometheus = Prometheus(workdir / "prometheus", stack)
        prometheus.wait_ready()
        workload = Workload(stubs).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(prometheus.query("up == 1")) < len(JOBS):
            assert time.monotonic() < deadline, prometheus.query("up")
            time.sleep(0.5)
        time.sleep(WORKLOAD_S)
        assert workload.error is None, f"workload: {workload.error!r}\n{stack.logs()}"
        yield Scraped(prometheus, workload.rounds)
    finally:
        if workload is not None:
            workload.stop()
        stubs.close()
        if prometheus is not None:
            prometheus.stop()
        stack.stop()


# -- the checks -----------------------------------------------------------------------------------


def test_the_workload_ran(scraped: Scraped) -> None:
    assert scraped.rounds >= 5


@pytest.mark.parametrize("query", monitoring.queries(), ids=lambda q: q.where)
def test_every_dashboard_query_returns_data(scraped: Scraped, query: monitoring.Query) -> None:
    result = scraped.prometheus.query(query.filled(RATE_INTERVAL))
    assert result, f"{query.where}: no series for {query.filled(RATE_INTERVAL)}"
    values = [float(series["value"][1]) for series in result]
    assert any(not math.isnan(v) for v in values), f"{query.where}: only NaN {values}"
    for series in result:
        missing = [label for label in query.legend_labels if label not in series["metric"]]
        assert not missing, f"{query.where}: legend {query.legend!r} lacks {missing}: {series}"


@pytest.mark.parametrize("variable", monitoring.variables(), ids=lambda v: v.name)
def test_every_dashboard_variable_finds_values(
    scraped: Scraped, variable: monitoring.Variable
) -> None:
    values = scraped.prometheus.get(f"/api/v1/label/{variable.label}/values",
                                    **{"match[]": [variable.metric]})
    assert values, variable


def test_the_stack_is_shown_healthy(scraped: Scraped) -> None:
    def one(expr: str) -> float:
        result = scraped.prometheus.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    assert one("sum(hami_accounting_leader)") == 1
    assert one("count(count by (policy_id) (hami_accounting_policy_info))") == 1
    assert one("sum(hami_accounting_watch_streams)") == 2  # the admission and scheduler caches
    synced = scraped.prometheus.query("hami_accounting_cache_synced")
    assert {s["metric"]["service"]: s["value"][1] for s in synced} == {
        "usage": "1", "admission": "1", "scheduler": "1"}
    # The pod left in its init container holds its 20 GiB init over its 10 GiB app; a round's
    # pod may be caught between its placement and its shrink, holding as much again.
    assert one("sum(hami_accounting_init_share_held_mib)") in (10240, 20480)


def test_every_rule_evaluates_and_no_alert_fires_on_a_healthy_stack(scraped: Scraped) -> None:
    groups = scraped.prometheus.get("/api/v1/rules")["groups"]
    evaluated = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(evaluated) == {alert["alert"] for alert in monitoring.alerts()}
    for name, rule in evaluated.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        assert rule["state"] != "firing", (name, rule["alerts"])
