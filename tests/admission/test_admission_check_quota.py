"""Admission.CheckQuota through gRPC against a real usage recorder: the design cases, the sidecar
ordering, and HAMi's admission vectors A1–A15 (docs/design.md §9), with pods sent both as
typed messages and as Kubernetes JSON.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from admission_support import (
    CORES,
    COUNT,
    MEMORY,
    TRACEPARENT,
    CheckFn,
    Recorder,
    StartAdmission,
    checker,
    container,
    item,
    json_request,
    kube_pod,
    no_gpu,
    typed_request,
)

from accounting.model import TRACEPARENT_ANNOTATION
from hami.accounting.v1 import admission_pb2, usage_pb2
from services.admission.__main__ import AdmissionDaemon
from services.common.server import client_channel
from tests.builders import PodBuilder, req

_namespaces = itertools.count(1)


def fresh_namespace(label: str) -> str:
    return f"{label.lower()}-{next(_namespaces)}"


@pytest.fixture(params=["watch", "off"], ids=["cache", "direct"])
def admission(request: pytest.FixtureRequest, start_admission_daemon: StartAdmission
              ) -> AdmissionDaemon:
    """Every case with both usage sources: they must decide alike."""
    return start_admission_daemon(usage_cache=request.param)


@pytest.fixture
def check(admission_channel: grpc.Channel, recorder: Recorder) -> CheckFn:
    # Every check reads this test's own writes, as a caller that passes the write's revision
    # does (the admission cache may otherwise trail the recorder by one event).
    return checker(admission_channel, after=recorder)


# -- one pod in both shapes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Ctr:
    """A container of a vector: ``count`` GPUs of ``mib`` MiB and ``cores`` % each."""

    name: str
    kind: str  # init, sidecar or app
    mib: int | None = None
    count: int | None = 1
    cores: int | None = None
    percent: int | None = None


@dataclass(frozen=True)
class PodCase:
    containers: tuple[Ctr, ...]
    annotations: dict[str, str] = field(default_factory=dict)

    def typed(self, namespace: str, name: str = "checked") -> admission_pb2.CheckQuotaRequest:
        builder = PodBuilder(name, namespace=namespace)
        for key, value in self.annotations.items():
            builder.annotate(key, value)
        for c in self.containers:
            items = () if c.count is None else (
                req(c.count, mib=c.mib or 0, cores=c.cores or 0, percent=c.percent or 0),
            )
            {"init": builder.init, "sidecar": builder.sidecar, "app": builder.app}[c.kind](
                c.name, *items
            )
        return typed_request(builder.build())

    def kubernetes(self, namespace: str, name: str = "checked") -> admission_pb2.CheckQuotaRequest:
        def spec(c: Ctr) -> dict[str, Any]:
            if c.count is None:
                return no_gpu(c.name)
            # Typed requests state cores explicitly; in JSON an absent gpucores with a memory
            # size is 0 as well (HAMi's exclusive default applies only without a memory size).
            return container(c.name, c.mib, count=c.count, cores=c.cores,
                             percent=c.percent, sidecar=c.kind == "sidecar")

        init = [spec(c) for c in self.containers if c.kind in ("init", "sidecar")]
        apps = [spec(c) for c in self.containers if c.kind == "app"] or [no_gpu("main")]
        return json_request(kube_pod(name, namespace, init=init, apps=apps,
                                     annotations=self.annotations))

    def request(self, source: str, namespace: str) -> admission_pb2.CheckQuotaRequest:
        return self.typed(namespace) if source == "typed" else self.kubernetes(namespace)


def init(name: str, mib: int, cores: int | None = None, count: int = 1) -> Ctr:
    return Ctr(name, "init", mib, count, cores)


def sidecar(name: str, mib: int, cores: int | None = None, count: int = 1) -> Ctr:
    return Ctr(name, "sidecar", mib, count, cores)


def app(name: str, mib: int, cores: int | None = None, count: int = 1) -> Ctr:
    return Ctr(name, "app", mib, count, cores)


SOURCES = ["typed", "kubernetes_json"]


# -- the design cases (docs/design.md §9) ----------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_seed_case_1_an_init_container_that_could_never_fit_is_denied(
    source: str, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("seed1")
    recorder.set_quota(namespace, mib=24576)
    pod = PodCase((init("convert-weights", 30720), app("server", 4096)))

    response = check(pod.request(source, namespace))

    assert not response.allowed
    assert response.reason == "MemoryQuotaExceeded"
    assert "30720" in response.message and "24576" in response.message
    assert "already used 0" in response.message
    assert response.namespace == namespace
    assert [(e.vendor, e.count, e.memory_mib) for e in response.effective] == [("NVIDIA", 1, 30720)]
    memory = item(response, MEMORY)
    assert (memory.requested, memory.used, memory.limit) == (30720, 0, 24576)
    assert memory.limit_set
    assert memory.exceeded and memory.enforced


@pytest.mark.parametrize("source", SOURCES)
def test_sidecar_declared_before_the_init_container_is_charged_with_it(
    source: str, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("order")
    recorder.set_quota(namespace, mib=21000)
    sidecar_first = PodCase((sidecar("proxy", 2048), init("warmup", 20480), app("main", 10240)))
    init_first = PodCase((init("warmup", 20480), sidecar("proxy", 2048), app("main", 10240)))

    denied = check(sidecar_first.request(source, namespace))
    allowed = check(init_first.request(source, namespace))

    assert denied.effective[0].memory_mib == 2048 + 20480 == 22528
    assert not denied.allowed and denied.reason == "MemoryQuotaExceeded"
    assert "22528" in denied.message and "21000" in denied.message
    assert allowed.effective[0].memory_mib == 20480
    assert allowed.allowed and allowed.reason == "QuotaFits"


@pytest.mark.parametrize("source", SOURCES)
def test_a_pod_without_a_gpu_request_passes_without_a_quota_item(
    source: str, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("nogpu")
    recorder.set_quota(namespace, mib=0)
    pod = PodCase((Ctr("main", "app", count=None),))

    response = check(pod.request(source, namespace))

    assert response.allowed and response.reason == "NoGpuRequest"
    assert list(response.items) == []
    assert response.effective[0].count == 0


# -- HAMi's admission vectors (#2723 / seed column) ------------------------------------------------


@dataclass(frozen=True)
class Vector:
    case_id: str
    limits: dict[str, int]
    used_mib: int
    pod: PodCase
    allowed: bool
    effective_mib: int
    used_cores: int = 0


def _vectors() -> list[Vector]:
    q2000 = {"mib": 2000}
    return [
        Vector("A1-small-app-fits", q2000, 1000, PodCase((app("a", 100),)), True, 100),
        Vector("A2-app-over-by-24", q2000, 1000, PodCase((app("a", 1024),)), False, 1024),
        Vector("A3-two-gpus-multiply", q2000, 1000, PodCase((app("a", 1024, count=2),)),
               False, 2048),
        Vector("A4-two-small-gpus-fit", q2000, 1000, PodCase((app("a", 400, count=2),)),
               True, 800),
        Vector("A5-sequential-inits-take-the-max", q2000, 1000,
               PodCase((init("i1", 800), init("i2", 800), app("a", 500))), True, 800),
        Vector("A6-init-peak-over", q2000, 1000, PodCase((init("i", 1500), app("a", 100))),
               False, 1500),
        Vector("A7-empty-namespace", {"mib": 30000}, 0,
               PodCase((init("i", 20000), app("a", 10000))), True, 20000),
        Vector("A7-half-used-denied", {"mib": 30000}, 20000,
               PodCase((init("i", 20000), app("a", 10000))), False, 20000),
        Vector("A7-boundary-is-inclusive", {"mib": 30000}, 10000,
               PodCase((init("i", 20000), app("a", 10000))), True, 20000),
        Vector("A8-seed-case-1", {"mib": 24576}, 0,
               PodCase((init("convert-weights", 30720), app("server", 4096))), False, 30720),
        Vector("A10-explicit-zero-blocks", {"mib": 0}, 0, PodCase((app("a", 1),)), False, 1),
        Vector("A11-sidecar-after-init", {"mib": 10000, "cores": 100}, 0,
               PodCase((init("i", 5000, 50), sidecar("s", 8000, 80))), True, 8000),
        Vector("A12-sidecar-before-init", {"mib": 10000, "cores": 100}, 0,
               PodCase((sidecar("s", 8000, 80), init("i", 5000, 50))), False, 13000),
        Vector("A13-ordering-aware-not-flat", {"mib": 7500}, 0,
               PodCase((init("i1", 5000), sidecar("s", 3000), init("i2", 4000), app("a", 1000))),
               True, 7000),
        Vector("A14-sidecar-runs-beside-the-app", {"mib": 7500}, 0,
               PodCase((sidecar("s", 4000), app("a", 4000))), False, 8000),
    ]


VECTORS = _vectors()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("vector", VECTORS, ids=[v.case_id for v in VECTORS])
def test_hami_admission_vectors(
    vector: Vector, source: str, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace(vector.case_id[:3])
    recorder.set_quota(namespace, **vector.limits)
    if vector.used_mib:
        recorder.use(namespace, vector.used_mib, vector.used_cores)

    response = check(vector.pod.request(source, namespace))

    assert response.allowed is vector.allowed, response.message
    assert response.effective[0].memory_mib == vector.effective_mib
    memory = item(response, MEMORY)
    assert (memory.requested, memory.used) == (vector.effective_mib, vector.used_mib)
    if vector.allowed:
        assert response.reason == "QuotaFits"
    else:
        assert response.reason in ("MemoryQuotaExceeded", "CoreQuotaExceeded")
        assert str(vector.effective_mib) in response.message or "gpucores" in response.message


@pytest.mark.parametrize("source", SOURCES)
def test_a12_reports_both_exceeded_dimensions_and_the_memory_reason_first(
    source: str, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("a12")
    recorder.set_quota(namespace, mib=10000, cores=100)
    pod = PodCase((sidecar("s", 8000, 80), init("i", 5000, 50)))

    response = check(pod.request(source, namespace))

    assert response.reason == "MemoryQuotaExceeded"
    cores = item(response, CORES)
    assert (cores.requested, cores.limit, cores.exceeded) == (130, 100, True)
    assert "requested 13000" in response.message and "requested 130," in response.message


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("app_mib", "allowed"), [(4096, True), (8193, False)])
def test_a9_the_memory_factor_is_applied_once_to_request_and_limit(
    source: str, app_mib: int, allowed: bool, start_admission_daemon: StartAdmission,
    recorder_with_policy: Callable[..., Recorder],
) -> None:
    namespace = fresh_namespace("a9")
    # The memory factor is the recorder's policy, which admission takes from it.
    recorder = recorder_with_policy(memory_factor="4")
    recorder.set_quota(namespace, mib=8192)
    daemon = start_admission_daemon(usage_addr=recorder.target)
    pod = PodCase((app("a", app_mib),))

    with client_channel(daemon.target) as channel:
        response = checker(channel)(pod.request(source, namespace))

    assert response.allowed is allowed
    memory = item(response, MEMORY)
    assert (memory.requested, memory.limit) == (app_mib * 4, 8192 * 4)
    assert response.effective[0].memory_mib == app_mib * 4


@pytest.mark.parametrize("gpu_less_init", [False, True])
def test_a15_memory_as_a_share_of_a_card_is_left_to_the_scheduler(
    gpu_less_init: bool, check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("a15")
    recorder.set_quota(namespace, mib=24000)
    apps = [container("a1", percent=40), container("a2", percent=40)]
    init = [no_gpu("setup")] if gpu_less_init else None

    response = check(json_request(kube_pod("shares", namespace, init=init, apps=apps)))

    assert response.allowed
    effective = response.effective[0]
    assert (effective.count, effective.memory_mib) == (2, 0)
    assert effective.memory_sized_at_scheduling
    assert item(response, MEMORY).requested == 0


# -- cores and GPU count ---------------------------------------------------------------------------


def test_cores_over_quota_are_denied_with_the_core_reason(
    check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("cores")
    recorder.set_quota(namespace, mib=100000, cores=100)
    recorder.use(namespace, 1000, cores=60)

    response = check(PodCase((app("a", 1000, cores=50),)).typed(namespace))

    assert not response.allowed and response.reason == "CoreQuotaExceeded"
    assert "requested 50, already used 60, limit 100" in response.message


def test_the_gpu_count_is_a_quota_dimension_enforced_by_default(
    check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("count")
    recorder.set_quota(namespace, mib=100000, count=1)

    response = check(PodCase((app("a", 100, count=2),)).typed(namespace))

    assert not response.allowed and response.reason == "GpuCountQuotaExceeded"
    count = item(response, COUNT)
    assert (count.requested, count.limit, count.enforced, count.exceeded) == (2, 1, True, True)


def test_the_gpu_count_is_reported_but_not_enforced_when_switched_off(
    start_admission_daemon: StartAdmission, recorder_with_policy: Callable[..., Recorder]
) -> None:
    namespace = fresh_namespace("count-off")
    # Switched off in the recorder's policy, which admission takes from it.
    recorder = recorder_with_policy(enforce_gpu_count="false")
    recorder.set_quota(namespace, mib=100000, count=1)
    daemon = start_admission_daemon(usage_addr=recorder.target)

    with client_channel(daemon.target) as channel:
        response = checker(channel)(PodCase((app("a", 100, count=2),)).typed(namespace))

    assert response.allowed
    count = item(response, COUNT)
    assert (count.requested, count.limit, count.enforced, count.exceeded) == (2, 1, False, False)


def test_a_namespace_without_a_quota_allows_everything(check: CheckFn) -> None:
    namespace = fresh_namespace("unlimited")

    response = check(PodCase((app("a", 10**6),)).typed(namespace))

    assert response.allowed and response.reason == "QuotaFits"
    assert not item(response, MEMORY).limit_set


# -- nothing is stored -----------------------------------------------------------------------------


def test_a_check_records_nothing(check: CheckFn, recorder: Recorder) -> None:
    namespace = fresh_namespace("readonly")
    recorder.set_quota(namespace, mib=30000, cores=300)
    recorder.use(namespace, 5000, cores=20)
    before = recorder.namespace_items(namespace)
    fits = PodCase((init("i", 20000, 50), app("a", 10000, 50)))
    too_big = PodCase((app("a", 40000),))

    for request in (fits.typed(namespace), fits.kubernetes(namespace),
                    too_big.typed(namespace), too_big.kubernetes(namespace)):
        check(request)

    assert recorder.namespace_items(namespace) == before
    stored = recorder.stub.GetPodUsage(
        usage_pb2.GetPodUsageRequest(pod_uid=f"uid-{namespace}-checked"), timeout=5
    )
    assert not stored.found


# -- the pod's trace -------------------------------------------------------------------------------


def test_the_response_starts_the_pods_trace_with_a_w3c_traceparent(
    check: CheckFn, recorder: Recorder
) -> None:
    namespace = fresh_namespace("trace")
    first = check(PodCase((app("a", 100),)).typed(namespace))
    second = check(PodCase((app("a", 100),)).typed(namespace))

    for response in (first, second):
        match = TRACEPARENT.match(response.traceparent)
        assert match, response.traceparent
        assert match["trace"] != "0" * 32 and match["span"] != "0" * 16
    # Each pod without an annotation gets its own trace.
    assert TRACEPARENT.match(first.traceparent)["trace"] != (  # type: ignore[index]
        TRACEPARENT.match(second.traceparent)["trace"]  # type: ignore[index]
    )


@pytest.mark.parametrize("source", SOURCES)
def test_a_pod_with_a_traceparent_annotation_continues_its_trace(
    source: str, check: CheckFn
) -> None:
    namespace = fresh_namespace("trace-continue")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    pod = PodCase((app("a", 100),), annotations={TRACEPARENT_ANNOTATION: parent})

    response = check(pod.request(source, namespace))

    match = TRACEPARENT.match(response.traceparent)
    assert match
    assert match["trace"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert match["span"] != "00f067aa0ba902b7"


CHECK_QUOTA_RPC = "/hami.accounting.v1.Admission/CheckQuota"


def test_the_check_span_carries_the_pod_and_the_decision(
    start_admission_daemon: StartAdmission, recorder: Recorder, spans: Any
) -> None:
    provider, exporter = spans
    namespace = fresh_namespace("span")
    recorder.set_quota(namespace, mib=24576)
    daemon = start_admission_daemon(tracer_provider=provider)
    pod = PodCase((init("convert-weights", 30720, 10), app("server", 4096, 20)))
    rpc_parent = "00-11111111111111111111111111111111-2222222222222222-01"

    with client_channel(daemon.target) as channel:
        response = checker(channel)(pod.typed(namespace))
        # A traceparent in the gRPC metadata belongs to the caller's request, not to the pod.
        from hami.accounting.v1 import admission_pb2_grpc

        second_response = admission_pb2_grpc.AdmissionStub(channel).CheckQuota(
            pod.typed(namespace, name="second"), timeout=10,
            metadata=[("traceparent", rpc_parent)],
        )

    finished = exporter.get_finished_spans()
    # Without trace context from the caller, the CheckQuota server span is the pod's root
    # span: the check makes no span of its own.
    first = [s for s in finished if dict(s.attributes or {}).get("hami.accounting.pod.name")
             == "checked"]
    assert [(s.name, s.kind.name) for s in first] == [(CHECK_QUOTA_RPC, "SERVER")]
    span = first[0]
    attributes = dict(span.attributes or {})
    assert attributes["hami.accounting.pod.uid"] == f"uid-{namespace}-checked"
    assert attributes["hami.accounting.pod.namespace"] == namespace
    assert attributes["hami.accounting.effective.memory_mib"] == 30720
    assert attributes["hami.accounting.effective.core_percent"] == 20
    assert attributes["hami.accounting.effective.count"] == 1
    assert attributes["hami.accounting.decision"] == "deny"
    assert attributes["hami.accounting.reason"] == "MemoryQuotaExceeded"
    assert attributes["rpc.method"] == "CheckQuota"
    # Exactly the attributes docs/observability.md lists, none missing and none extra.
    assert attributes == {
        "rpc.system": "grpc",
        "rpc.service": "hami.accounting.v1.Admission",
        "rpc.method": "CheckQuota",
        "rpc.grpc.status_code": 0,
        "hami.accounting.pod.uid": f"uid-{namespace}-checked",
        "hami.accounting.pod.namespace": namespace,
        "hami.accounting.pod.name": "checked",
        "hami.accounting.via": "grpc",
        "hami.accounting.effective.memory_mib": 30720,
        "hami.accounting.effective.core_percent": 20,
        "hami.accounting.effective.count": 1,
        "hami.accounting.effective.memory_sized_at_scheduling": False,
        "hami.accounting.decision": "deny",
        "hami.accounting.reason": "MemoryQuotaExceeded",
        "hami.accounting.policy_id": response.policy_id,
    }
    assert response.policy_id
    assert span.parent is None, "the check starts the pod's trace"
    assert f"{span.context.trace_id:032x}" in response.traceparent
    assert f"{span.context.span_id:016x}" in response.traceparent
    # With the caller's trace context, the RPC span is in the caller's trace; the pod's trace
    # starts in admission.check_quota, linked to it.
    checks = [s for s in finished if s.name == "admission.check_quota"]
    assert len(checks) == 1
    second = checks[0]
    assert dict(second.attributes or {})["hami.accounting.pod.name"] == "second"
    # The check's own span says what the root span says about the pod and the decision.
    assert set(second.attributes or {}) == {key for key in attributes if key.startswith("hami.")}
    assert second.parent is None
    assert f"{second.context.trace_id:032x}" != "1" * 32
    assert [f"{link.context.trace_id:032x}" for link in second.links] == ["1" * 32]
    assert f"{second.context.span_id:016x}" in second_response.traceparent
    rpc = [s for s in finished if s.name == CHECK_QUOTA_RPC and s.parent is not None]
    assert [f"{s.context.trace_id:032x}" for s in rpc] == ["1" * 32]


def test_decisions_are_counted_in_metrics(check: CheckFn, recorder: Recorder) -> None:
    from prometheus_client import REGISTRY

    def count(decision: str, reason: str) -> float:
        value = REGISTRY.get_sample_value(
            "hami_accounting_decisions_total",
            {"service": "admission", "decision": decision, "reason": reason},
        )
        return value or 0.0

    namespace = fresh_namespace("metrics")
    recorder.set_quota(namespace, mib=1000)
    allow_before = count("allow", "QuotaFits")
    deny_before = count("deny", "MemoryQuotaExceeded")

    check(PodCase((app("a", 500),)).typed(namespace))
    check(PodCase((app("a", 5000),)).typed(namespace))

    assert count("allow", "QuotaFits") == allow_before + 1
    assert count("deny", "MemoryQuotaExceeded") == deny_before + 1


def test_the_decision_log_line_carries_the_pods_trace_id(
    check: CheckFn, recorder: Recorder
) -> None:
    import io
    import json
    import logging

    from services.common.logging import JsonFormatter

    namespace = fresh_namespace("log")
    recorder.set_quota(namespace, mib=1000)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("admission"))
    logger = logging.getLogger("services.admission.servicer")
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        response = check(PodCase((app("a", 5000),)).typed(namespace, name="too-big"))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    denials = [r for r in lines if r["message"].startswith(f"quota deny for pod {namespace}/")]
    assert len(denials) == 1, lines
    assert denials[0]["trace_id"] == response.traceparent.split("-")[1]
    assert denials[0]["reason"] == "MemoryQuotaExceeded"
