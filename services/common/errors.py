"""The one place where exceptions become gRPC status codes.

Layer: services (runtime). Servicer methods raise; ``map_errors`` (unary) and
``map_stream_errors`` (server streaming, also as a grpc.aio async generator) turn what they
raise into ``context.abort(...)``:

* ``accounting.errors.InvalidInputError`` -> INVALID_ARGUMENT listing every ``path: message``,
  plus the same violations as a ``google.rpc.BadRequest`` status detail;
* ``NotFoundError`` -> NOT_FOUND; ``DependencyUnavailableError`` -> UNAVAILABLE;
* any other ``accounting.errors.AccountingError`` -> FAILED_PRECONDITION with its message;
* ``grpc.RpcError`` from an upstream call: UNAVAILABLE or DEADLINE_EXCEEDED -> UNAVAILABLE
  "usage recorder unavailable (...): <details>"; a code that blames the request
  (INVALID_ARGUMENT, NOT_FOUND, ...) passes through with the upstream message;
* anything else -> INTERNAL with a generic message and the trace id; the exception goes to the
  log and the span, never to the caller (it may quote request content).

An ``abort`` the servicer made itself propagates untouched.

A "no" (quota exceeded, nothing fits) is never an exception: it is an OK response with a reason.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.rpc import (  # type: ignore[import-untyped]  # googleapis-common-protos has no stubs
    code_pb2,
    error_details_pb2,
    status_pb2,
)
from grpc_status import rpc_status
from opentelemetry import trace

from accounting import errors
from accounting.errors import AccountingError, InvalidInputError

_LOG = logging.getLogger(__name__)

# The only gRPC dependency any daemon calls is the usage recorder (admission and scheduler read
# usage from it), so an upstream RpcError is named after it.
UPSTREAM_NAME = "usage recorder"

# Upstream answers that blame the request itself, so the caller's request was at fault too.
_PASS_THROUGH_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})
_UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class DependencyUnavailableError(Exception):
    """A required upstream (the usage recorder, the Kubernetes API) cannot be reached.

    The message should name the dependency and its address, e.g.
    ``usage recorder unavailable at 127.0.0.1:50053: connection refused``.
    """


def recorder_unavailable(
    target: str, error: grpc.RpcError, consequence: str
) -> DependencyUnavailableError:
    """The error for a call to the usage recorder at ``target`` that failed with ``error``,
    e.g. "usage recorder unavailable at 127.0.0.1:50053 (UNAVAILABLE): connection refused; the
    quota cannot be checked"."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    code_name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return DependencyUnavailableError(
        f"{UPSTREAM_NAME} unavailable at {target} ({code_name}): {details or 'no details'}; "
        f"{consequence}"
    )


class NotFoundError(Exception):
    """The request names something that is not tracked (an unknown pod, node or namespace)."""


@dataclass(frozen=True)
class MappedStatus:
    """What a raised exception becomes on the wire."""

    code: grpc.StatusCode
    message: str
    expected: bool
    """False for bugs: those are logged with their stack and recorded on the span."""
    bad_request: error_details_pb2.BadRequest | None = None


MAX_MESSAGE_CHARS = errors.MAX_MESSAGE_CHARS
"""Characters of any status message a daemon answers with (1,500), printable ASCII: a status
travels in HTTP/2 trailers, an INVALID_ARGUMENT's message twice (again inside its
google.rpc.Status detail, beside the BadRequest's violations), and gRPC clients refuse
metadata past 8 KiB (soft) or 16 KiB (hard) with RESOURCE_EXHAUSTED "Stream removed". A
hundred long violations (every container of a large pod refused), or a value of multi-byte
characters quoted back (each written as up to nine percent-encoded bytes), once came back that
way instead of the error. The first violations that fit are kept, and the rest counted."""
_INVALID_PREFIX = "invalid request: "


def status_for(error: Exception) -> MappedStatus:
    """The gRPC status for an exception a servicer raised (pure; see the module table)."""
    if isinstance(error, InvalidInputError):
        kept, message = error.bounded(MAX_MESSAGE_CHARS, prefix=_INVALID_PREFIX)
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.path, description=v.message)
                for v in kept
            ]
        )
        return MappedStatus(grpc.StatusCode.INVALID_ARGUMENT, message, True, bad_request)
    if isinstance(error, NotFoundError):
        return _bounded(grpc.StatusCode.NOT_FOUND, str(error))
    if isinstance(error, DependencyUnavailableError):
        return _bounded(grpc.StatusCode.UNAVAILABLE, str(error))
    if isinstance(error, AccountingError):
        return _bounded(grpc.StatusCode.FAILED_PRECONDITION, str(error))
    if isinstance(error, grpc.RpcError):
        code = _rpc_error_code(error)
        details = _rpc_error_details(error)
        if code in _UNAVAILABLE_CODES:
            return _bounded(
                grpc.StatusCode.UNAVAILABLE,
                f"{UPSTREAM_NAME} unavailable ({code.name}): {details}",
            )
        if code in _PASS_THROUGH_CODES:
            return _bounded(code, f"{UPSTREAM_NAME}: {details}")
    return MappedStatus(grpc.StatusCode.INTERNAL, _internal_message(), False)


def _bounded(code: grpc.StatusCode, message: str) -> MappedStatus:
    """An expected status whose message is cut to ``MAX_MESSAGE_CHARS`` of printable ASCII
    (it may quote a name or an upstream answer of any length)."""
    return MappedStatus(code, errors.bounded_text(message, MAX_MESSAGE_CHARS), True)


def _rpc_error_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    # A client-side RpcError is also a grpc.Call; a hand-made one may not be.
    code = getattr(error, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else None


def _rpc_error_details(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    value = details() if callable(details) else None
    return str(value) if value else "no details"


def _internal_message() -> str:
    # Never the exception text: it may quote request content. The trace id lets an operator
    # find the logged stack.
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        return f"internal error (trace_id {trace.format_trace_id(span_context.trace_id)})"
    return "internal error"


def is_abort(error: BaseException, context: grpc.ServicerContext) -> bool:
    """True for what grpc raises from context.abort() (a bare Exception with no message once
    the call's status is set, or grpc.aio's AbortError): the status is already the call's, so
    it propagates untouched and is no fault. The one rule, read by the error mapping here and
    by the call telemetry."""
    if isinstance(error, grpc.aio.AbortError):
        return True
    if type(error) is not Exception or error.args:
        return False
    code = getattr(context, "code", None)
    try:
        value = code() if callable(code) else None
    except RuntimeError:
        # OTel's context wrapper raises RuntimeError when grpcio has no code(); trust the type.
        return True
    return value is not None and value != grpc.StatusCode.OK


def _mapped(error: Exception, context: grpc.ServicerContext, method: str) -> MappedStatus:
    """The status to abort with; logs bugs and sets the BadRequest trailer."""
    status = status_for(error)
    if not status.expected:
        _LOG.error("unhandled error in %s", method, exc_info=error)
        span = trace.get_current_span()
        span.record_exception(error)
    if status.bad_request is not None:
        detail = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=status.message)
        detail.details.add().Pack(status.bad_request)
        # The same status as a google.rpc.Status trailer, so Go clients can read each
        # field violation with status.FromError(err).Details().
        context.set_trailing_metadata(rpc_status.to_status(detail).trailing_metadata)
    return status


def _refusal(error: Exception, context: grpc.ServicerContext, method: str) -> MappedStatus:
    """The status a servicer's ``error`` ends its call with; an abort it made itself is raised
    again untouched. The wrappers below abort with it, each the way its kind of call does."""
    if is_abort(error, context):
        raise error
    return _mapped(error, context, method)


_Self = TypeVar("_Self")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def map_errors(
    method: Callable[[_Self, _Request, grpc.ServicerContext], _Response],
) -> Callable[[_Self, _Request, grpc.ServicerContext], _Response]:
    """Decorates a unary servicer method ``(self, request, context)``; see the module table.

    A generator method (server streaming) is handed to ``map_stream_errors``.
    """
    if inspect.isgeneratorfunction(method) or inspect.isasyncgenfunction(method):
        return map_stream_errors(method)  # type: ignore[arg-type, return-value]  # same shape

    @functools.wraps(method)
    def wrapper(self: _Self, request: _Request, context: grpc.ServicerContext) -> _Response:
        try:
            return method(self, request, context)
        except Exception as error:
            status = _refusal(error, context, method.__qualname__)
            context.abort(status.code, status.message)

    return wrapper


def map_stream_errors(
    method: Callable[[_Self, _Request, grpc.ServicerContext], Iterator[_Response]],
) -> Callable[[_Self, _Request, grpc.ServicerContext], Iterator[_Response]]:
    """Decorates a server-streaming servicer method (a generator); see the module table.

    Errors raised before or between messages end the stream with the mapped status. An async
    generator (a grpc.aio handler) gets an async wrapper that awaits the abort.
    """
    if inspect.isasyncgenfunction(method):
        return _map_async_stream_errors(method)  # type: ignore[arg-type, return-value]

    @functools.wraps(method)
    def wrapper(
        self: _Self, request: _Request, context: grpc.ServicerContext
    ) -> Iterator[_Response]:
        try:
            yield from method(self, request, context)
        except Exception as error:
            status = _refusal(error, context, method.__qualname__)
            context.abort(status.code, status.message)

    return wrapper


_AioContext = grpc.aio.ServicerContext[Any, Any]


def _map_async_stream_errors(
    method: Callable[[_Self, _Request, _AioContext], AsyncIterator[_Response]],
) -> Callable[[_Self, _Request, _AioContext], AsyncIterator[_Response]]:
    @functools.wraps(method)
    async def wrapper(
        self: _Self, request: _Request, context: _AioContext
    ) -> AsyncIterator[_Response]:
        try:
            async for message in method(self, request, context):
                yield message
        except Exception as error:
            status = _refusal(error, context, method.__qualname__)  # type: ignore[arg-type]
            await context.abort(status.code, status.message)

    return wrapper
