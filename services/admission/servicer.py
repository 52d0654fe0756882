"""The quota check and its gRPC adapter, ``Admission.CheckQuota``; no business rules.

Layer: services/admission (adapter). ``QuotaChecker`` is the one check both front ends run (the
gRPC servicer here and the AdmissionReview endpoint in ``webhook``): it starts the pod's trace,
reads the namespace's usage, and calls the accounting (``effective_request``, ``check_quota``)
for the arithmetic. ``AdmissionServicer`` validates and converts the request, calls the checker
and converts the outcome; errors become status codes in ``map_errors``.

Tracing: the check is the span ``admission.check_quota``. It continues the pod's trace when the
pod carries a valid ``hami.io/traceparent`` annotation; otherwise it is the root of a new trace
(the pod's), linked to the RPC's span. The response's ``traceparent`` is that span's, for the
caller to store in the annotation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from accounting.model import NVIDIA_RESOURCES, TRACEPARENT_ANNOTATION, Pod, VendorResources
from accounting.pod import EffectiveRequest, effective_request
from accounting.quota import QuotaDecision, check_quota
from hami.accounting.v1 import admission_pb2, admission_pb2_grpc
from services.admission import convert
from services.admission.usage_source import QuotaItems, UsageSource
from services.common import telemetry
from services.common.errors import map_errors
from services.common.metrics import record_decision

_LOG = logging.getLogger(__name__)

SERVICE_NAME = admission_pb2.DESCRIPTOR.services_by_name["Admission"].full_name
"""hami.accounting.v1.Admission"""
METRICS_SERVICE = "admission"
"""The ``service`` label of this daemon's metrics."""
SPAN_NAME = "admission.check_quota"


@dataclass(frozen=True, slots=True)
class QuotaOutcome:
    """One check: the pod, its effective request, the decision, and the pod's traceparent."""

    pod: Pod
    effective: EffectiveRequest
    decision: QuotaDecision
    traceparent: str


@contextmanager
def _pod_trace_span(tracer: trace.Tracer, pod: Pod, via: str) -> Iterator[trace.Span]:
    """The check's span: on the pod's trace when it has one, else the root of a new one."""
    if isinstance(tracer, trace.NoOpTracer):
        yield trace.INVALID_SPAN  # tracing is off: no span, no context switch
        return
    annotation = pod.annotations.get(TRACEPARENT_ANNOTATION, "")
    if telemetry.context_from_traceparent(annotation) is not None:
        with telemetry.pod_span(tracer, SPAN_NAME, pod, attributes={"via": via}) as span:
            yield span
        return
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else []
    span = tracer.start_span(
        SPAN_NAME,
        context=otel_context.Context(),  # empty: a new trace, the pod's own
        links=links,
        attributes={**telemetry.pod_attributes(pod), telemetry.ATTR_PREFIX + "via": via},
    )
    # start_span and attach rather than start_as_current_span: the same span and the same
    # error recording, without two more context managers on every check.
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as error:
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        raise
    finally:
        otel_context.detach(token)
        span.end()


class QuotaChecker:
    """Checks a pod against its namespace's quota as read from the usage recorder.

    Nothing is stored by a check: usage is only read.
    """

    def __init__(
        self,
        usage: UsageSource,
        *,
        vendor: VendorResources = NVIDIA_RESOURCES,
        enforce_gpu_count: bool = True,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._usage = usage
        self.vendor = vendor
        self._enforce_gpu_count = enforce_gpu_count
        self._tracer = tracer or trace.NoOpTracer()

    @property
    def vendors(self) -> tuple[VendorResources, ...]:
        """The vendors whose resources pods are read for."""
        return (self.vendor,)

    def check(self, pod: Pod, *, via: str = "grpc", min_usage_revision: int = 0) -> QuotaOutcome:
        """The decision for ``pod``, on usage at least as new as ``min_usage_revision``.

        Raises:
            DependencyUnavailableError: the recorder cannot be reached (never a silent allow).
        """
        with _pod_trace_span(self._tracer, pod, via) as span:
            effective = effective_request(pod, self.vendor)
            decision = self._decide(pod.namespace, effective, min_usage_revision)
            verdict = "allow" if decision.allowed else "deny"
            telemetry.set_attributes(
                span,
                {
                    "effective.memory_mib": effective.memory_mib,
                    "effective.core_percent": effective.core_percent,
                    "effective.count": effective.count,
                    "effective.memory_sized_at_scheduling": effective.memory_sized_at_scheduling,
                    "decision": verdict,
                    "reason": decision.reason,
                },
            )
            # Without tracing the pod keeps whatever trace it already had.
            traceparent = (
                telemetry.current_traceparent() if span.get_span_context().is_valid else ""
            ) or pod.annotations.get(TRACEPARENT_ANNOTATION, "")
            level = logging.DEBUG if decision.allowed else logging.INFO
            if _LOG.isEnabledFor(level):  # an allow is logged at DEBUG: usually off
                # Inside the span, so the log line carries the pod's trace id.
                _LOG.log(
                    level,
                    "quota %s for pod %s: %s",
                    verdict,
                    pod.key,
                    decision.message,
                    extra={"pod_uid": pod.uid, "reason": decision.reason, "via": via},
                )
        record_decision(METRICS_SERVICE, verdict, decision.reason)
        return QuotaOutcome(pod, effective, decision, traceparent)

    def _decide(
        self, namespace: str, effective: EffectiveRequest, min_usage_revision: int
    ) -> QuotaDecision:
        # A pod that asks for no device needs no usage: it passes even with the recorder down.
        if effective.is_empty:
            return self._check(namespace, effective, {})
        items = self._usage.namespace_items(namespace, min_revision=min_usage_revision)
        decision = self._check(namespace, effective, items)
        if decision.allowed or not self._usage.may_be_stale:
            return decision
        # A cached "no" may be a release the copy has not heard of yet: refuse only on what the
        # recorder has now (usage_source module docstring). Denials are the rare path.
        return self._check(
            namespace, effective, self._usage.namespace_items(namespace, fresh=True)
        )

    def _check(
        self, namespace: str, effective: EffectiveRequest, items: QuotaItems
    ) -> QuotaDecision:
        return check_quota(
            namespace, effective, items, self.vendor, enforce_gpu_count=self._enforce_gpu_count
        )


class AdmissionServicer(admission_pb2_grpc.AdmissionServicer):
    """``Admission.CheckQuota`` over a ``QuotaChecker``."""

    def __init__(self, checker: QuotaChecker) -> None:
        self._checker = checker

    @map_errors
    def CheckQuota(
        self, request: admission_pb2.CheckQuotaRequest, context: grpc.ServicerContext
    ) -> admission_pb2.CheckQuotaResponse:
        min_usage_revision = convert.min_usage_revision(request)
        pod = convert.pod_from_request(request, self._checker.vendors)
        outcome = self._checker.check(pod, via="grpc", min_usage_revision=min_usage_revision)
        return convert.check_response(
            pod.namespace, outcome.effective, outcome.decision, outcome.traceparent
        )
