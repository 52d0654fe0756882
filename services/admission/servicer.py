"""The quota check and its gRPC adapter, ``Admission.CheckQuota``; no business rules.

Layer: services/admission (adapter). ``QuotaChecker`` is the one check both front ends run (the
gRPC servicer here and the AdmissionReview endpoint in ``webhook``): it starts the pod's trace,
reads the namespace's usage, and calls the accounting (``effective_request``, ``check_quota``)
for the arithmetic. ``AdmissionServicer`` validates and converts the request, calls the checker
and converts the outcome; errors become status codes in ``map_errors``.

Tracing: a check that starts the pod's trace (the pod carries no valid ``hami.io/traceparent``
annotation) does so in the CheckQuota call's own SERVER span when the caller sent no trace
context: that span then is the pod's root span and carries the pod and the decision, one span
per check (ARCHITECTURE.md §6; a second span cost more than tracing's budget). When the caller
did send trace context, the RPC span belongs to the caller's trace, and the check is the span
``admission.check_quota``, the root of a new trace (the pod's), linked to the RPC's span; so is
a check from the AdmissionReview endpoint, which has no RPC span, except that its trace is the
one the pod's uid names (``telemetry.pod_uid_trace``): that endpoint cannot annotate the pod,
and the kube-scheduler extender finds the trace again from the uid. A pod that carries the
annotation gets ``admission.check_quota`` on its existing trace. The response's
``traceparent`` is the pod trace's span, for the caller to store in the annotation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from accounting import owned_annotations
from accounting.model import TRACEPARENT_ANNOTATION, Pod
from accounting.pod import EffectiveRequest, effective_request, vendors_asked
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import QuotaDecision, check_requests
from accounting.vendors import VendorResources
from hami.accounting.v1 import admission_pb2, admission_pb2_grpc
from services.admission import convert
from services.admission.usage_source import UsageSource
from services.common import convert as common
from services.common import telemetry
from services.common.errors import map_errors
from services.common.metrics import record_decision
from services.common.policy import (
    FixedPolicy,
    PolicySource,
    check_unchanged,
    under_recorder_policy,
)
from services.common.server.call_telemetry import root_server_span

_LOG = logging.getLogger(__name__)

SERVICE_NAME = admission_pb2.DESCRIPTOR.services_by_name["Admission"].full_name
"""hami.accounting.v1.Admission"""
METRICS_SERVICE = "admission"
"""The ``service`` label of this daemon's metrics."""
SPAN_NAME = "admission.check_quota"
VIA_ADMISSION_REVIEW = "admission-review"
"""The ``via`` of a check from the AdmissionReview endpoint (spans, logs, metrics)."""


@dataclass(frozen=True, slots=True)
class QuotaOutcome:
    """One check: the pod, its effective request per vendor, the decision, the pod's
    traceparent, and the accounting policy it was decided under ("" for none: the pod asks for
    no extended resource and no policy was held)."""

    pod: Pod
    effective: tuple[EffectiveRequest, ...]
    decision: QuotaDecision
    traceparent: str
    policy_id: str = ""


PodReader = Callable[[tuple[VendorResources, ...]], Pod]
"""Reads the request's pod with the resource names of a policy's vendors (none: no policy)."""


_ATTR_VIA = telemetry.ATTR_PREFIX + "via"
# The decision's attribute keys, prefixed once (telemetry.set_attributes would prefix each key,
# and check each value's type, on every check: these values are already ints, bools and str).
_ATTR_EFFECTIVE_MEMORY_MIB = telemetry.ATTR_PREFIX + "effective.memory_mib"
_ATTR_EFFECTIVE_CORE_PERCENT = telemetry.ATTR_PREFIX + "effective.core_percent"
_ATTR_EFFECTIVE_COUNT = telemetry.ATTR_PREFIX + "effective.count"
_ATTR_EFFECTIVE_SIZED_AT_SCHEDULING = (
    telemetry.ATTR_PREFIX + "effective.memory_sized_at_scheduling"
)
_ATTR_DECISION = telemetry.ATTR_PREFIX + "decision"
_ATTR_REASON = telemetry.ATTR_PREFIX + "reason"
_ATTR_POLICY_ID = telemetry.ATTR_PREFIX + "policy_id"


def _check_attributes(pod: Pod, via: str) -> dict[str, AttributeValue]:
    """What the check's span says from its start: the pod, and the front end that asked."""
    attributes = telemetry.pod_attributes(pod)
    attributes[_ATTR_VIA] = via
    return attributes


def _decision_attributes(
    effective: tuple[EffectiveRequest, ...],
    decision: QuotaDecision,
    verdict: str,
    policy: AccountingPolicy | None,
) -> dict[str, AttributeValue]:
    """What the check's span says once it decided: the effective request over every vendor,
    the decision and the policy."""
    return {
        _ATTR_EFFECTIVE_MEMORY_MIB: sum(e.memory_mib for e in effective),
        _ATTR_EFFECTIVE_CORE_PERCENT: sum(e.core_percent for e in effective),
        _ATTR_EFFECTIVE_COUNT: sum(e.count for e in effective),
        _ATTR_EFFECTIVE_SIZED_AT_SCHEDULING: any(
            e.memory_sized_at_scheduling for e in effective
        ),
        _ATTR_DECISION: verdict,
        _ATTR_REASON: decision.reason,
        _ATTR_POLICY_ID: policy.policy_id if policy else "",
    }


@contextmanager
def _pod_trace_span(tracer: trace.Tracer, pod: Pod, via: str) -> Iterator[trace.Span]:
    """The check's span: on the pod's trace when it has one; else the call's own SERVER span
    when that starts a new trace; else the root of a new one (module docstring)."""
    if isinstance(tracer, trace.NoOpTracer):
        yield trace.INVALID_SPAN  # tracing is off: no span, no context switch
        return
    annotation = pod.annotations.get(TRACEPARENT_ANNOTATION, "")
    if telemetry.context_from_traceparent(annotation) is not None:
        with telemetry.pod_span(tracer, SPAN_NAME, pod, attributes={"via": via}) as span:
            yield span
        return
    root = root_server_span()
    if root is not None:
        # The caller sent no trace context: the RPC's span is the pod's root span.
        root.set_attributes(_check_attributes(pod, via))
        yield root
        return
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else []
    span = tracer.start_span(
        SPAN_NAME,
        # A new trace, the pod's own; from the AdmissionReview endpoint, which sees the pod's
        # uid and cannot annotate the pod, the one the extender finds again from the uid.
        context=(
            telemetry.pod_uid_trace(pod.uid)
            if via == VIA_ADMISSION_REVIEW and pod.uid
            else otel_context.Context()
        ),
        links=links,
        attributes=_check_attributes(pod, via),
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
    """Checks a pod against its namespace's quota as read from the usage recorder, under the
    recorder's accounting policy.

    Nothing is stored by a check: usage is only read.
    """

    def __init__(
        self,
        usage: UsageSource,
        *,
        policy: PolicySource | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        """Args: ``policy`` is where the accounting policy comes from: the daemon passes the
        recorder's (``RecorderPolicy``); without one, the accounting's defaults
        (``FixedPolicy``), for a checker embedded without a recorder."""
        self._usage = usage
        self._policy: PolicySource = policy or FixedPolicy(DEFAULT_POLICY)
        self._tracer = tracer or trace.NoOpTracer()

    def check_request(
        self,
        read_pod: PodReader,
        asks_for_devices: Callable[[], bool],
        *,
        via: str,
        min_usage_revision: int = 0,
    ) -> QuotaOutcome:
        """The decision for the pod ``read_pod`` reads, under the recorder's policy (see
        ``services.common.policy.under_recorder_policy``).

        Raises:
            InvalidInputError: the pod cannot be read.
            DependencyUnavailableError: the recorder cannot be reached (never a silent allow).
        """
        return under_recorder_policy(
            self._policy,
            asks_for_devices,
            lambda policy: self._check(
                read_pod(policy.vendors if policy else ()), policy, via, min_usage_revision
            ),
        )

    def check(self, pod: Pod, *, via: str = "grpc", min_usage_revision: int = 0) -> QuotaOutcome:
        """The decision for an already read ``pod``, under the policy held (read first when none
        is), on usage at least as new as ``min_usage_revision``.

        Raises:
            DependencyUnavailableError: the recorder cannot be reached (never a silent allow).
        """
        return under_recorder_policy(
            self._policy,
            lambda: True,
            lambda policy: self._check(pod, policy, via, min_usage_revision),
        )

    def _check(
        self, pod: Pod, policy: AccountingPolicy | None, via: str, min_usage_revision: int
    ) -> QuotaOutcome:
        with _pod_trace_span(self._tracer, pod, via) as span:
            # Checked before the quota and whatever the pod asks for: the device plugin hands
            # out what these annotations name, so a pod created with one took its own devices.
            owned = owned_annotations.on_create(pod.annotations)
            effective = (
                tuple(
                    effective_request(pod, vendor)
                    for vendor in vendors_asked(pod, policy.vendors)
                )
                if policy is not None
                else ()
            )
            decision = (
                self._decide(pod.namespace, effective, policy, min_usage_revision)
                if owned.allowed
                else QuotaDecision(allowed=False, reason=owned.reason, message=owned.message)
            )
            verdict = "allow" if decision.allowed else "deny"
            if span.is_recording():
                # Only when a span records: the sums are not worth computing for none.
                span.set_attributes(_decision_attributes(effective, decision, verdict, policy))
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
        return QuotaOutcome(
            pod, effective, decision, traceparent, policy.policy_id if policy else ""
        )

    def _decide(
        self,
        namespace: str,
        effective: tuple[EffectiveRequest, ...],
        policy: AccountingPolicy | None,
        min_usage_revision: int,
    ) -> QuotaDecision:
        # A pod that asks for no device needs no usage: it passes even with the recorder down.
        if policy is None or all(request.is_empty for request in effective):
            return check_requests(namespace, effective, {}, policy or DEFAULT_POLICY)
        items = self._usage.namespace_items(namespace, min_revision=min_usage_revision)
        # The read named the policy the recorder answers under: decide under it, or again.
        check_unchanged(self._policy, policy)
        decision = check_requests(namespace, effective, items, policy)
        if decision.allowed or not self._usage.may_be_stale:
            return decision
        # A cached "no" may be a release the copy has not heard of yet: refuse only on what the
        # recorder has now (usage_source module docstring). Denials are the rare path.
        items = self._usage.namespace_items(namespace, fresh=True)
        check_unchanged(self._policy, policy)
        return check_requests(namespace, effective, items, policy)


class AdmissionServicer(admission_pb2_grpc.AdmissionServicer):
    """``Admission.CheckQuota`` over a ``QuotaChecker``."""

    def __init__(self, checker: QuotaChecker) -> None:
        self._checker = checker

    @map_errors
    def CheckQuota(
        self, request: admission_pb2.CheckQuotaRequest, context: grpc.ServicerContext
    ) -> admission_pb2.CheckQuotaResponse:
        outcome = self._checker.check_request(
            lambda vendors: convert.pod_from_request(request, vendors),
            lambda: common.pod_source_asks_for_devices(request),
            via="grpc",
            min_usage_revision=convert.min_usage_revision(request),
        )
        return convert.check_response(
            outcome.pod.namespace,
            outcome.effective,
            outcome.decision,
            outcome.traceparent,
            outcome.policy_id,
        )
