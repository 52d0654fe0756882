"""The Filter span follows the pod's trace, and the Reserve call carries it to the recorder."""

from __future__ import annotations

import io
import json
import logging

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from services.common.logging import JsonFormatter
from tests.scheduler.conftest import NS, Recorder, Scheduler
from tests.support.pods import app_container, gpu_device, init_container, kube_pod

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
RESERVE_METHOD = "/hami.accounting.v1.UsageRecorder/Reserve"


def parent_id(span: ReadableSpan) -> int:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.span_id


def test_filter_span_is_on_the_pods_trace_and_reserve_propagates_it(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-0")])
    pod = kube_pod(
        "trainer",
        uid="uid-traced",
        namespace=NS,
        init=[init_container("convert-weights", gpumem=20480)],
        apps=[app_container("server", gpumem=10240)],
        annotations={"hami.io/traceparent": TRACEPARENT},
    )

    response = scheduler.filter(pod, ["node1", "ghost"])
    assert response.reason == "Scheduled"

    spans = scheduler.spans.get_finished_spans()
    [filter_span] = [s for s in spans if s.name == "scheduler.filter"]
    assert f"{filter_span.context.trace_id:032x}" == TRACE_ID
    assert f"{parent_id(filter_span):016x}" == PARENT_SPAN_ID
    attributes = dict(filter_span.attributes or {})
    assert attributes["hami.accounting.pod.uid"] == "uid-traced"
    assert attributes["hami.accounting.pod.namespace"] == NS
    assert attributes["hami.accounting.pod.name"] == "trainer"
    assert attributes["hami.accounting.node"] == "node1"
    assert attributes["hami.accounting.reason"] == "Scheduled"
    assert attributes["hami.accounting.node_count"] == 2
    # The RPC's own span is linked, so both traces lead to each other.
    assert filter_span.links

    # The scheduler's client span for Reserve is a child of scheduler.filter ...
    [client_span] = [
        s for s in spans if s.name == RESERVE_METHOD and s.kind == SpanKind.CLIENT
    ]
    assert parent_id(client_span) == filter_span.context.span_id
    # ... and the recorder's server span continues it: the context crossed the channel.
    [server_span] = [
        s for s in recorder.spans.get_finished_spans()
        if s.name == RESERVE_METHOD and s.kind == SpanKind.SERVER
    ]
    assert server_span.context.trace_id == filter_span.context.trace_id
    assert parent_id(server_span) == client_span.context.span_id
    [reserve_span] = [s for s in recorder.spans.get_finished_spans() if s.name == "usage.reserve"]
    assert f"{reserve_span.context.trace_id:032x}" == TRACE_ID


def test_filter_without_traceparent_nests_under_the_rpc_span(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-0")])
    pod = kube_pod("web", namespace=NS, apps=[app_container("nginx")])

    assert scheduler.filter(pod, ["node1"]).reason == "NoGpuRequest"

    spans = scheduler.spans.get_finished_spans()
    [filter_span] = [s for s in spans if s.name == "scheduler.filter"]
    [rpc_span] = [s for s in spans if s.name == "/hami.accounting.v1.Scheduler/Filter"]
    assert parent_id(filter_span) == rpc_span.context.span_id
    assert dict(filter_span.attributes or {})["hami.accounting.reason"] == "NoGpuRequest"
    assert dict(filter_span.attributes or {})["hami.accounting.node"] == ""


def test_decision_log_line_carries_the_pods_trace_id(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node1", [gpu_device("GPU-0")])
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("scheduler"))
    logger = logging.getLogger("services.scheduler.servicer")
    logger.addHandler(handler)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        pod = kube_pod("logged", namespace=NS, apps=[app_container("main", gpumem=1024)],
                       annotations={"hami.io/traceparent": TRACEPARENT})
        assert scheduler.filter(pod, ["node1"]).reason == "Scheduled"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [decision] = [
        line for line in lines if line["message"].startswith("filter Scheduled for pod team-a/")
    ]
    assert decision["trace_id"] == TRACE_ID
    assert decision["pod_uid"] == "uid-team-a-logged"
