"""Every served call's latency metric and, when tracing, its SERVER span: one wrapper a handler.

Layer: services (runtime). ``CallTelemetry.observe`` wraps a handler once, when the server
registers it (``registration``), and the wrapper does both on every call:
``hami_accounting_rpc_duration_seconds{service,method,code}``, and a SERVER span named by the
full method (``/hami.accounting.v1.Admission/CheckQuota``), parented on the W3C context the
caller sent as gRPC metadata (``traceparent``/``tracestate``), with ``rpc.system``,
``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``, an ERROR status for any other code
than OK, and the exception for a failure that is not an abort. A server-streaming call is timed
and spanned until its stream ends (WatchUsage streams for minutes: read its buckets as stream
lifetimes). Handlers written for grpc.aio (coroutines and async generators: the recorder's
WatchUsage, the aio health service) are wrapped by coroutines of the same shape, so the
asyncio server still runs them on its event loop (``event_loop``).

Why not the server interceptor of opentelemetry-instrumentation-grpc (its client interceptor is
what our channels use): it costs more on every call. Per call it copies the metadata twice,
parses the peer address into three attributes, extracts baggage, wraps the servicer context,
and needs a second wrapper for the metric; docs/observability.md has what each adds to a
no-op RPC (the SDK span itself is most of what is left). The span keeps what the traces are
read for; tests/e2e/test_trace_e2e.py checks its names, kinds and links.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import Token
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.errors import is_abort
from services.common.metrics import observe_rpc_duration

_ROOT_SERVER_SPAN = otel_context.create_key("hami.accounting.root_server_span")
"""Context key of the call's SERVER span when the caller sent no trace context."""
_PROPAGATOR = TraceContextTextMapPropagator()
_CONTEXT_KEYS = frozenset(_PROPAGATOR.fields)
"""The metadata keys the W3C context travels in (traceparent, tracestate)."""
_OK = grpc.StatusCode.OK
_CANCELLED = (GeneratorExit, asyncio.CancelledError)
"""How a call ends when its client goes away: grpc closes a stream's generator, grpc.aio
cancels the call's task."""
if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]  # generic in grpc-stubs only


def root_server_span() -> trace.Span | None:
    """The current call's SERVER span when it starts a new trace (its caller sent no trace
    context), else None. The admission daemon makes it the pod's root span: one span per check
    instead of two (ARCHITECTURE.md §6)."""
    span = otel_context.get_value(_ROOT_SERVER_SPAN)
    if isinstance(span, trace.Span) and span is trace.get_current_span():
        return span
    return None


def _status(context: grpc.ServicerContext, failed: bool, cancelled: bool) -> grpc.StatusCode:
    if cancelled:
        return grpc.StatusCode.CANCELLED
    # code() is None when the handler returned normally without setting one.
    code = getattr(context, "code", lambda: None)()  # grpc-stubs lack ServicerContext.code
    if not isinstance(code, grpc.StatusCode):
        code = _OK
    if failed and code is _OK:
        # An exception that is not an abort: grpc answers UNKNOWN.
        return grpc.StatusCode.UNKNOWN
    return code


class _Call:
    """One call's clock and span, from its start until the ``with`` block around the handler
    ends: returned, raised, or cancelled (grpc closes a stream's generator when the client goes
    away, grpc.aio cancels the call's task)."""

    __slots__ = ("_attributes", "_context", "_method", "_service", "_token", "_tracer", "span",
                 "started_s")

    def __init__(
        self, service: str, tracer: trace.Tracer | None, method: str, attributes: dict[str, Any],
        context: grpc.ServicerContext,
    ) -> None:
        self._service = service
        self._tracer = tracer
        self._method = method
        self._attributes = attributes
        self._context = context
        self.span: trace.Span | None = None
        self._token: Token[otel_context.Context] | None = None
        self.started_s = 0.0

    def __enter__(self) -> _Call:
        self.started_s = time.perf_counter()
        tracer, context = self._tracer, self._context
        if tracer is None:
            return self
        carrier = {
            key: value
            for key, value in context.invocation_metadata() or ()
            if key in _CONTEXT_KEYS and isinstance(value, str)
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        # start_span and attach rather than start_as_current_span: the same span without the
        # generator-based context manager, on every call.
        span = tracer.start_span(
            self._method, context=parent, kind=trace.SpanKind.SERVER, attributes=self._attributes
        )
        self.span = span
        current = trace.set_span_in_context(span, parent)
        if parent is None:
            # A new trace: the servicer may make this span the root of its own work's trace
            # (``root_server_span``) instead of starting a second one.
            current = otel_context.set_value(_ROOT_SERVER_SPAN, span, current)
        self._token = otel_context.attach(current)
        return self

    def __exit__(self, _type: object, error: BaseException | None, _traceback: object) -> None:
        context = self._context
        cancelled = isinstance(error, _CANCELLED)
        code = _status(context, error is not None, cancelled)
        observe_rpc_duration(
            self._service, self._method, code.name, time.perf_counter() - self.started_s
        )
        span = self.span
        if span is None:
            return
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not _OK:
            details = getattr(context, "details", lambda: None)()
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code.name}: {details or ''}"))
        # An abort raises after setting the code; anything else is a fault.
        if error is not None and not is_abort(error, context) and not cancelled:
            span.record_exception(error)
        if self._token is not None:
            otel_context.detach(self._token)
        span.end()


class CallTelemetry:
    """The latency metric of every call, and its SERVER span when ``tracer`` is given; the
    servers wrap each handler with ``observe`` once, when it is registered."""

    def __init__(self, service: str, tracer: trace.Tracer | None = None) -> None:
        self._service = service
        self._tracer = tracer

    def observe(self, method: str, handler: _Handler) -> _Handler:
        """``handler`` with every call timed and, when tracing, spanned."""
        service, tracer = self._service, self._tracer
        rpc_service, _, rpc_method = method.lstrip("/").partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": rpc_service, "rpc.method": rpc_method}

        # One wrapper per shape of handler; each is the handler inside its call's ``with``.
        def unary_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def observed(request: Any, context: grpc.ServicerContext) -> Any:
                with _Call(service, tracer, method, attributes, context):
                    return behavior(request, context)

            return observed

        def async_unary_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def observed(request: Any, context: grpc.ServicerContext) -> Any:
                with _Call(service, tracer, method, attributes, context):
                    return await behavior(request, context)

            return observed

        def stream_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def observed(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                with _Call(service, tracer, method, attributes, context):
                    yield from behavior(request, context)

            return observed

        def async_stream_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def observed(request: Any, context: grpc.ServicerContext) -> AsyncIterator[Any]:
                with _Call(service, tracer, method, attributes, context):
                    async for message in behavior(request, context):
                        yield message

            return observed

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(behavior):
                return async_unary_response(behavior)
            return unary_response(behavior)

        def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.isasyncgenfunction(behavior):
                return async_stream_response(behavior)
            if inspect.iscoroutinefunction(behavior):
                # A grpc.aio stream that writes with context.write (the aio health Watch).
                return async_unary_response(behavior)
            return stream_response(behavior)

        # One entry per kind of RPC: the handler factory and how the call is observed.
        for kind, make_handler, observe in (
            ("unary_unary", grpc.unary_unary_rpc_method_handler, unary),
            ("stream_unary", grpc.stream_unary_rpc_method_handler, unary),
            ("unary_stream", grpc.unary_stream_rpc_method_handler, streaming),
            ("stream_stream", grpc.stream_stream_rpc_method_handler, streaming),
        ):
            behavior = getattr(handler, kind)
            if behavior is not None:
                return make_handler(
                    observe(behavior),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler
