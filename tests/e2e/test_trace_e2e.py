"""A trace follows a pod across three processes (docs/observability.md), end to end.

The three daemons run as subprocesses exporting OTLP to a receiver in this test process. Seed
cases 2 -> 3 -> 4 run for two pods, one after the other, each ending with ForgetPod:

* ``md``: the documented caller (docs/go-clients.md): the CheckQuota traceparent goes into the
  pod annotation ``hami.io/traceparent`` *and* travels as ``traceparent`` gRPC metadata on every
  later call about the pod;
* ``annotation``: the annotation only, no metadata; the servicers must still put their spans on
  the pod's trace.

Then the daemons get SIGTERM (they flush their tracer providers) and the spans are checked:
one trace per pod, the span names, the parent links, service.name per daemon, the attributes,
and no pod spec in any attribute. The CheckQuota calls carry no trace context, so each pod's
root span is the CheckQuota server span itself (ARCHITECTURE.md §6: one span per check). A
second run with OTEL_SDK_DISABLED=true must work the same and export nothing.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hami.accounting.v1 import (
    admission_pb2,
    scheduler_pb2,
    usage_pb2,
)
from tests.e2e.stack import OtlpSink, ReceivedSpan, Stack, Stubs, clean_env, span_tree
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

pytestmark = pytest.mark.timeout(90)

NODE = "e2e-node-1"
NAMESPACE = "e2e"
TRACEPARENT = "hami.io/traceparent"
UID = "hami.accounting.pod.uid"
TIMEOUT_S = 10.0
MAX_ATTRIBUTE_CHARS = 512

CHECK_QUOTA_RPC = "/hami.accounting.v1.Admission/CheckQuota"
"""The pod's root span: the CheckQuota server span (the caller sends no trace context)."""
SERVICE_OF = {
    CHECK_QUOTA_RPC: "hami-accounting-admission",
    "scheduler.filter": "hami-accounting-scheduler",
    "usage.reserve": "hami-accounting-usage",
    "usage.record": "hami-accounting-usage",
    "usage.shrink": "hami-accounting-usage",
    "usage.release": "hami-accounting-usage",
}
POD_SPAN_NAMES = set(SERVICE_OF)
RESERVE_RPC = "/hami.accounting.v1.UsageRecorder/Reserve"


@dataclass
class PodRun:
    """What the client saw while walking one pod through the daemons."""

    uid: str
    traceparent: str
    node: str = ""
    decisions: list[str] = field(default_factory=list)
    stored_mib: list[int] = field(default_factory=list)
    released_mib: int = 0

    @property
    def trace_id(self) -> str:
        return self.traceparent.split("-")[1]

    @property
    def check_span_id(self) -> str:
        return self.traceparent.split("-")[2]


def setup_cluster(stubs: Stubs) -> None:
    node = kube_node(NODE, [gpu_device("GPU-e2e-0", memory_mib=24576)])
    stubs.usage.RegisterNode(
        usage_pb2.RegisterNodeRequest(node_name=NODE, kubernetes_node_json=to_json(node)),
        timeout=TIMEOUT_S,
    )
    stubs.usage.SetQuota(
        usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits={"limits.nvidia.com/gpumem": 24576}),
        timeout=TIMEOUT_S,
    )


def walk_pod(stubs: Stubs, name: str, *, metadata: bool, expect_traceparent: bool = True) -> PodRun:
    """Seed cases 2 -> 3 -> 4 for one pod (init 20480 + app 10240 MiB), then ForgetPod."""
    uid = str(uuid.uuid4())
    pod: dict[str, Any] = kube_pod(
        name,
        uid=uid,
        namespace=NAMESPACE,
        init=[init_container("convert-weights", gpumem=20480)],
        apps=[app_container("server", gpumem=10240)],
    )

    # Case 2: the check starts the pod's trace; the webhook stores it in the annotation.
    checked = stubs.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)), timeout=TIMEOUT_S
    )
    assert checked.allowed, checked.message
    assert sum(v.memory_mib for v in checked.effective) == 20480
    if expect_traceparent:
        assert checked.traceparent.startswith("00-"), checked.traceparent
    else:
        assert checked.traceparent == ""
    run = PodRun(uid, checked.traceparent)
    if checked.traceparent:
        pod["metadata"]["annotations"][TRACEPARENT] = checked.traceparent
    call_metadata: tuple[tuple[str, str | bytes], ...] | None = (
        (("traceparent", checked.traceparent),) if metadata and checked.traceparent else None
    )

    placed = stubs.scheduler.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=[NODE]),
        timeout=TIMEOUT_S,
        metadata=call_metadata,
    )
    assert placed.node_name == NODE, placed.message
    run.node = placed.node_name
    # Bound the way HAMi binds: its annotations and spec.nodeName.
    pod["metadata"]["annotations"].update(placed.annotations)
    pod["spec"]["nodeName"] = placed.node_name

    # Case 3: bound, init container running: 20480 stored, not 30720.
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [running("convert-weights")],
        "containerStatuses": [waiting("server")],
    }
    recorded = stubs.usage.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)),
        timeout=TIMEOUT_S,
        metadata=call_metadata,
    )
    run.decisions.append(recorded.decision)
    run.stored_mib.append(sum(u.memory_mib for u in recorded.stored))

    # Case 4: the init container exited 0: shrunk to the app container's 10240.
    finished = copy.deepcopy(pod)
    finished["status"] = {
        "phase": "Running",
        "initContainerStatuses": [terminated("convert-weights")],
        "containerStatuses": [running("server")],
    }
    shrunk = stubs.usage.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(finished)),
        timeout=TIMEOUT_S,
        metadata=call_metadata,
    )
    run.decisions.append(shrunk.decision)
    run.stored_mib.append(sum(u.memory_mib for u in shrunk.stored))

    forgotten = stubs.usage.ForgetPod(
        usage_pb2.ForgetPodRequest(pod_uid=uid), timeout=TIMEOUT_S, metadata=call_metadata
    )
    assert forgotten.found
    run.released_mib = sum(u.memory_mib for u in forgotten.released)
    return run


def check_case1(stubs: Stubs) -> str:
    """Case 1 (init 30720 + app 4096 MiB): denied; returns the traceparent of the check."""
    pod = kube_pod(
        "too-big",
        uid=str(uuid.uuid4()),
        namespace=NAMESPACE,
        init=[init_container("convert-weights", gpumem=30720)],
        apps=[app_container("server", gpumem=4096)],
    )
    checked = stubs.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)), timeout=TIMEOUT_S
    )
    assert not checked.allowed and checked.reason == "MemoryQuotaExceeded", checked
    return checked.traceparent


def json_log_records(stack: Stack) -> list[dict[str, Any]]:
    """Every JSON line the daemons logged."""
    records = []
    for daemon in stack.daemons.values():
        for line in daemon.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
    return records


@dataclass
class TracedRun:
    md: PodRun
    annotation: PodRun
    denied_traceparent: str
    exit_codes: dict[str, int]
    spans: list[ReceivedSpan]
    logs: str
    log_records: list[dict[str, Any]]

    def pod_spans(self, run: PodRun) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.attributes.get(UID) == run.uid]

    def by_id(self) -> dict[str, ReceivedSpan]:
        return {s.span_id: s for s in self.spans}

    def one(self, run: PodRun, name: str) -> ReceivedSpan:
        found = [s for s in self.pod_spans(run) if s.name == name]
        assert len(found) == 1, f"{len(found)} spans {name} for {run.uid}\n{self.tree(run)}"
        return found[0]

    def tree(self, run: PodRun) -> str:
        return span_tree(self.spans, run.trace_id)

    def ancestors(self, span: ReceivedSpan) -> list[str]:
        """Span ids from the parent up to the root, within the exported spans."""
        by_id = self.by_id()
        chain, current = [], span
        while current.parent_span_id in by_id:
            chain.append(current.parent_span_id)
            current = by_id[current.parent_span_id]
        return chain


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedRun]:
    sink = OtlpSink()
    workdir: Path = tmp_path_factory.mktemp("trace-e2e")
    stack = Stack(
        workdir,
        clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
            OTEL_TRACES_SAMPLER="always_on",
            OTEL_BSP_SCHEDULE_DELAY="100",
        ),
    )
    try:
        stack.start()
        stubs = Stubs.dial(stack)
        try:
            setup_cluster(stubs)
            md = walk_pod(stubs, "trainer-md", metadata=True)
            annotation = walk_pod(stubs, "trainer-annotation", metadata=False)
            denied = check_case1(stubs)
        finally:
            stubs.close()
        codes = stack.stop()
        result = TracedRun(
            md, annotation, denied, codes, sink.spans(), stack.logs(), json_log_records(stack)
        )
        (workdir / "span-tree.txt").write_text(f"{result.tree(md)}\n\n{result.tree(annotation)}\n")
        print(f"\n{result.tree(md)}\n\n{result.tree(annotation)}")
        yield result
    finally:
        stack.kill()
        sink.stop()


# -- the flow itself ---------------------------------------------------------------------------


def test_the_seed_cases_come_out_right_and_the_daemons_stop_cleanly(traced: TracedRun) -> None:
    for run in (traced.md, traced.annotation):
        assert run.stored_mib == [20480, 10240]
        assert run.decisions[1] == "Shrunk"
        assert run.released_mib == 10240
    assert traced.exit_codes == {"scheduler": 0, "admission": 0, "usage": 0}, traced.logs


# -- one trace per pod -------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["md", "annotation"])
def test_every_span_about_the_pod_is_on_the_checkquota_trace(traced: TracedRun, which: str) -> None:
    run: PodRun = getattr(traced, which)
    spans = traced.pod_spans(run)
    if which == "annotation":
        # ForgetPod carries only the uid: see test_forget_pod_without_metadata_*.
        spans = [s for s in spans if s.name != "usage.release"]
    assert spans
    assert {s.trace_id for s in spans} == {run.trace_id}, traced.tree(run)
    names = {s.name for s in spans}
    expected = POD_SPAN_NAMES - ({"usage.release"} if which == "annotation" else set())
    assert expected <= names, f"missing {expected - names}\n{traced.tree(run)}"


def test_the_pod_trace_spans_all_three_daemons(traced: TracedRun) -> None:
    services = {s.service for s in traced.spans if s.trace_id == traced.md.trace_id}
    assert services == {
        "hami-accounting-admission",
        "hami-accounting-scheduler",
        "hami-accounting-usage",
    }, traced.tree(traced.md)


def test_spans_come_from_the_daemon_named_in_service_name(traced: TracedRun) -> None:
    for run in (traced.md, traced.annotation):
        for span in traced.pod_spans(run):
            assert span.service == SERVICE_OF[span.name], span
    rpc_services = {
        s.name.split("/")[1]: s.service
        for s in traced.spans
        if s.kind == "SERVER" and s.name.startswith("/")
    }
    assert rpc_services["hami.accounting.v1.Admission"] == "hami-accounting-admission"
    assert rpc_services["hami.accounting.v1.Scheduler"] == "hami-accounting-scheduler"
    assert rpc_services["hami.accounting.v1.UsageRecorder"] == "hami-accounting-usage"


def test_forget_pod_with_metadata_releases_on_the_pod_trace(traced: TracedRun) -> None:
    release = traced.one(traced.md, "usage.release")
    assert release.trace_id == traced.md.trace_id, traced.tree(traced.md)


def test_forget_pod_without_metadata_releases_on_the_pod_trace(traced: TracedRun) -> None:
    release = traced.one(traced.annotation, "usage.release")
    assert release.trace_id == traced.annotation.trace_id, traced.tree(traced.annotation)


# -- parent links ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["md", "annotation"])
def test_checkquota_starts_the_trace_and_its_span_is_the_traceparent(
    traced: TracedRun, which: str
) -> None:
    run: PodRun = getattr(traced, which)
    check = traced.one(run, CHECK_QUOTA_RPC)
    assert check.span_id == run.check_span_id
    assert check.parent_span_id == ""  # the root of the pod's own trace
    assert check.kind == "SERVER"
    # One span per check: the server span is the check, with no second check span.
    assert not [s for s in traced.spans if s.name == "admission.check_quota"]
    # The admission daemon's only other spans on the pod's trace are its reads of the recorder
    # (usage, policy), as CLIENT spans.
    others = {(s.name.rsplit("/", 2)[1], s.kind) for s in traced.spans
              if s.trace_id == run.trace_id and s.service == "hami-accounting-admission"
              and s.span_id != check.span_id}
    assert others <= {("hami.accounting.v1.UsageRecorder", "CLIENT")}, traced.tree(run)


@pytest.mark.parametrize("which", ["md", "annotation"])
def test_later_spans_are_parented_inside_the_pod_trace(traced: TracedRun, which: str) -> None:
    run: PodRun = getattr(traced, which)
    in_trace = {s.span_id for s in traced.spans if s.trace_id == run.trace_id}
    for name in ("scheduler.filter", "usage.reserve", "usage.record", "usage.shrink"):
        span = traced.one(run, name)
        assert span.parent_span_id in in_trace, f"{name}\n{traced.tree(run)}"
        # Every span of the trace leads back to the CheckQuota span.
        assert traced.ancestors(span)[-1] == run.check_span_id, f"{name}\n{traced.tree(run)}"
    filter_span = traced.one(run, "scheduler.filter")
    assert filter_span.parent_span_id == run.check_span_id


@pytest.mark.parametrize("which", ["md", "annotation"])
def test_reserve_follows_filter_through_the_grpc_client_and_server_spans(
    traced: TracedRun, which: str
) -> None:
    run: PodRun = getattr(traced, which)
    filter_span = traced.one(run, "scheduler.filter")
    by_id = traced.by_id()
    server = [
        s
        for s in traced.spans
        if s.name == RESERVE_RPC and s.kind == "SERVER" and s.trace_id == run.trace_id
    ]
    assert len(server) == 1, traced.tree(run)
    client = by_id[server[0].parent_span_id]
    assert (client.name, client.kind, client.service) == (
        RESERVE_RPC,
        "CLIENT",
        "hami-accounting-scheduler",
    )
    assert filter_span.span_id in traced.ancestors(server[0])
    reserve = traced.one(run, "usage.reserve")
    # usage.reserve is parented on the pod's annotation and keeps the RPC's span as a link (or,
    # nested under the RPC, descends from it): either way the causal chain is recorded.
    server_ref = (server[0].trace_id, server[0].span_id)
    assert server_ref in reserve.links or server[0].span_id in traced.ancestors(reserve), (
        traced.tree(run)
    )


def test_without_metadata_the_rpc_spans_are_linked_not_parents(traced: TracedRun) -> None:
    run = traced.annotation
    by_id = traced.by_id()
    for name, rpc in (
        ("scheduler.filter", "/hami.accounting.v1.Scheduler/Filter"),
        ("usage.shrink", "/hami.accounting.v1.UsageRecorder/RecordPod"),
    ):
        span = traced.one(run, name)
        linked = [by_id[span_id] for _, span_id in span.links if span_id in by_id]
        assert [s.name for s in linked] == [rpc], f"{name}: {span.links}"
        assert linked[0].trace_id != run.trace_id


# -- logs --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("message", "which"),
    [
        pytest.param("filter Scheduled for pod e2e/trainer-md", "md", id="filter-md"),
        pytest.param(
            "filter Scheduled for pod e2e/trainer-annotation", "annotation", id="filter-annotation"
        ),
        pytest.param("quota deny for pod e2e/too-big", "denied", id="deny"),
    ],
)
def test_decision_log_lines_carry_the_pod_trace_id(
    traced: TracedRun, message: str, which: str
) -> None:
    traceparent = (
        traced.denied_traceparent if which == "denied" else getattr(traced, which).traceparent
    )
    lines = [r for r in traced.log_records if r["message"].startswith(message)]
    assert len(lines) == 1, traced.logs
    assert lines[0]["trace_id"] == traceparent.split("-")[1], lines[0]


# -- attributes --------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["md", "annotation"])
def test_pod_spans_carry_identity_decisions_and_effective_values(
    traced: TracedRun, which: str
) -> None:
    run: PodRun = getattr(traced, which)
    name = "trainer-md" if which == "md" else "trainer-annotation"
    for span in traced.pod_spans(run):
        if span.name == "usage.release" and which == "annotation":
            continue
        assert span.attributes["hami.accounting.pod.namespace"] == NAMESPACE, span
        assert span.attributes["hami.accounting.pod.name"] == name, span

    def attrs(span_name: str) -> dict[str, Any]:
        return {
            k.removeprefix("hami.accounting."): v
            for k, v in traced.one(run, span_name).attributes.items()
        }

    check = attrs(CHECK_QUOTA_RPC)
    assert (check["decision"], check["reason"]) == ("allow", "QuotaFits")
    assert check["effective.memory_mib"] == 20480
    assert check["effective.count"] == 1
    filtered = attrs("scheduler.filter")
    assert (filtered["reason"], filtered["node"]) == ("Scheduled", NODE)
    reserve = attrs("usage.reserve")
    assert (reserve["decision"], reserve["node"]) == ("reserved", NODE)
    assert reserve["stored.memory_mib"] == 20480
    record = attrs("usage.record")
    assert record["stored.memory_mib"] == 20480
    assert record["init_released"] is False
    shrink = attrs("usage.shrink")
    assert (shrink["decision"], shrink["stored.memory_mib"]) == ("Shrunk", 10240)
    assert shrink["init_released"] is True
    release = traced.one(run, "usage.release").attributes
    assert release["hami.accounting.decision"] == "Forgotten"
    assert release["hami.accounting.stored.memory_mib"] == 10240


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def test_no_span_attribute_carries_a_pod_spec(traced: TracedRun) -> None:
    assert traced.spans
    for span in traced.spans:
        for attributes in (span.attributes, *span.event_attributes):
            for key, value in attributes.items():
                for text in _strings(value):
                    assert len(text) <= MAX_ATTRIBUTE_CHARS, (span.name, key, text[:80])
                    assert "initContainers" not in text, (span.name, key, text[:80])
                    assert '"containers"' not in text, (span.name, key, text[:80])


# -- tracing off -------------------------------------------------------------------------------


def test_with_otel_sdk_disabled_everything_works_and_nothing_is_exported(
    tmp_path: Path,
) -> None:
    sink = OtlpSink()
    stack = Stack(
        tmp_path,
        clean_env(
            OTEL_SDK_DISABLED="true",
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
            OTEL_TRACES_SAMPLER="always_on",
            OTEL_BSP_SCHEDULE_DELAY="100",
        ),
    )
    try:
        stack.start()
        stubs = Stubs.dial(stack)
        try:
            setup_cluster(stubs)
            run = walk_pod(stubs, "untraced", metadata=True, expect_traceparent=False)
        finally:
            stubs.close()
        assert run.stored_mib == [20480, 10240]
        assert run.decisions[1] == "Shrunk"
        assert run.released_mib == 10240
        assert stack.stop() == {"scheduler": 0, "admission": 0, "usage": 0}, stack.logs()
        assert sink.exports == 0
        assert sink.spans() == []
    finally:
        stack.kill()
        sink.stop()
