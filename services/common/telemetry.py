"""OpenTelemetry tracing for the daemons: the provider, and spans that follow a pod.

Layer: services (runtime). Only the standard ``OTEL_*`` variables configure tracing; there is no
home-made switch. The provider is returned, never installed globally, and handed to the gRPC
interceptors and servicers explicitly, so several daemons can live in one test process.

A trace follows a pod: admission starts it and returns a W3C traceparent that callers store in
the pod annotation ``hami.io/traceparent``; every later span about that pod (filter, reserve,
record, shrink, release) is parented on that annotation by ``pod_span``.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from accounting.model import TRACEPARENT_ANNOTATION, Pod

ATTR_PREFIX = "hami.accounting."
ATTR_POD_UID = ATTR_PREFIX + "pod.uid"
ATTR_POD_NAMESPACE = ATTR_PREFIX + "pod.namespace"
ATTR_POD_NAME = ATTR_PREFIX + "pod.name"

SERVICE_NAME_PREFIX = "hami-accounting-"

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT = "traceparent"


def tracer_provider_from_env(
    service_name: str, env: Mapping[str, str] = os.environ
) -> TracerProvider | None:
    """A tracer provider configured from the standard OTEL_* variables.

    * ``OTEL_SDK_DISABLED=true``: None (the daemons then trace nothing).
    * ``OTEL_SERVICE_NAME``: defaults to ``hami-accounting-<service_name>``.
    * ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``: spans are batched
      to that OTLP/gRPC endpoint (plaintext for ``http://``). Without an endpoint nothing is
      exported, but spans still get ids for logs and for the traceparent handed to callers.
    * ``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_*`` and the exporter's headers, certificate and
      timeout are read by the SDK itself from the process environment.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    name = env.get("OTEL_SERVICE_NAME", "").strip() or SERVICE_NAME_PREFIX + service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    endpoint = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
    if endpoint:
        # Imported here: the exporter pulls in its own grpc channel machinery that a daemon
        # without an endpoint never needs.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = True if endpoint.startswith("http://") else None
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))
        )
    return provider


def shutdown(provider: TracerProvider | None) -> None:
    """Exports what is still batched and stops the provider (call once, at exit)."""
    if provider is None:
        return
    provider.force_flush()
    provider.shutdown()


def tracer_for(provider: TracerProvider | None, name: str) -> trace.Tracer:
    """A tracer from ``provider``; a no-op tracer when tracing is disabled (None)."""
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(name)


def _attribute_value(value: object) -> AttributeValue:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return str(value)


def _attribute_key(key: str) -> str:
    return key if key.startswith(ATTR_PREFIX) else ATTR_PREFIX + key


def pod_attributes(pod: Pod) -> dict[str, AttributeValue]:
    """The identifying attributes of a pod (never its spec)."""
    return {ATTR_POD_UID: pod.uid, ATTR_POD_NAMESPACE: pod.namespace, ATTR_POD_NAME: pod.name}


def context_from_traceparent(traceparent: str) -> otel_context.Context | None:
    """The context carried by a W3C traceparent, or None when it is empty or malformed.

    Any trace-flags byte is accepted (the Python SDK writes ``-03``).
    """
    if not traceparent.strip():
        return None
    extracted = _PROPAGATOR.extract({_TRACEPARENT: traceparent.strip()})
    span_context = trace.get_current_span(extracted).get_span_context()
    return extracted if span_context.is_valid else None


@contextmanager
def pod_span(
    tracer: trace.Tracer,
    name: str,
    pod: Pod | None = None,
    *,
    traceparent: str | None = None,
    attributes: Mapping[str, object] | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
) -> Iterator[trace.Span]:
    """Starts the current span ``name`` about a pod, parented on the pod's trace.

    The parent is, in order: ``traceparent`` when given and valid, the pod's
    ``hami.io/traceparent`` annotation when present and valid, else the current context (so the
    span nests under the gRPC server span). When the parent comes from a traceparent, the current
    span (the RPC's) is kept as a link, so both traces lead to each other.

    Attribute keys without the ``hami.accounting.`` prefix get it; values that are not strings,
    numbers or booleans are written as strings (enums as their value).
    """
    if isinstance(tracer, trace.NoOpTracer):
        # Tracing is off: skip the parent lookup, the attributes and the context switch that
        # would only produce a span nobody records (this runs on every call of every daemon).
        yield trace.INVALID_SPAN
        return
    parent = None
    for candidate in (traceparent, pod.annotations.get(TRACEPARENT_ANNOTATION) if pod else None):
        if candidate:
            parent = context_from_traceparent(candidate)
            if parent is not None:
                break
    links: list[trace.Link] = []
    if parent is not None:
        current = trace.get_current_span().get_span_context()
        if current.is_valid:
            links.append(trace.Link(current))
    span_attributes: dict[str, AttributeValue] = pod_attributes(pod) if pod is not None else {}
    for key, value in (attributes or {}).items():
        span_attributes[_attribute_key(key)] = _attribute_value(value)
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=span_attributes, links=links
    ) as span:
        yield span


def pod_uid_trace(uid: str) -> otel_context.Context:
    """The trace of a pod that carries no ``hami.io/traceparent``, found again from its uid alone.

    The AdmissionReview endpoint cannot write the annotation (a validating webhook does not
    change the pod), yet the kube-scheduler extender that places the pod later must join the
    check's trace. Both derive the same context from the uid the API server gave the pod: a
    trace id and a parent span id taken from a SHA-256 of it, the parent a remote span that no
    daemon records (a trace viewer shows the check and the placement as the trace's top spans,
    under a parent it never received). The extender then writes the annotation, so everything
    after it (the bind, the recorder) follows the annotation as usual.
    """
    digest = hashlib.sha256(f"hami-accounting pod {uid}".encode()).digest()
    # Neither id may be all zeros (invalid in W3C trace context); a digest that gives one is
    # about 2^-64 likely, and then the low bit is set.
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    parent = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())


def current_traceparent() -> str:
    """The W3C traceparent of the current span, or "" when there is no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(_TRACEPARENT, "")


def set_attributes(span: trace.Span, attributes: Mapping[str, object]) -> None:
    """Sets attributes on a span with the same key prefixing and value rules as pod_span."""
    if not span.is_recording():
        return
    # One call: the SDK takes the span's lock once for all of them, not once per attribute.
    span.set_attributes(
        {_attribute_key(key): _attribute_value(value) for key, value in attributes.items()}
    )
