"""A request whose bytes do not decode as its message is the caller's fault: INVALID_ARGUMENT.

Layer: services (runtime). grpcio turns a deserializer exception into INTERNAL "Exception
deserializing request!" before any of our code runs; bad input must be INVALID_ARGUMENT naming
what was wrong. ``guarded`` gives a handler a deserializer that cannot raise and a behavior that
refuses what did not decode; registration applies it to every handler of both servers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

_AioContext = grpc.aio.ServicerContext[Any, Any]

_UNDECODABLE = object()
"""Stands in for a request whose bytes do not decode as its message."""


def guarded(method: str, handler: Any) -> Any:
    """``handler`` (of ``method``) answering undecodable requests with INVALID_ARGUMENT; a
    handler that streams its requests is returned as it is (grpcio decodes each later)."""
    deserialize = handler.request_deserializer
    if deserialize is None or handler.request_streaming:
        return handler

    def safe_deserialize(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception:  # any decode failure is the caller's bad bytes
            return _UNDECODABLE

    refusal = (
        f"request: the bytes sent to {method} do not decode as its request message "
        "(malformed protobuf or a string field that is not UTF-8)"
    )

    def refuse_undecodable(behavior: Callable[..., Any]) -> Callable[..., Any]:
        # A grpc.aio handler keeps its shape (coroutine or async generator): the asyncio server
        # runs those on its event loop, everything else on its thread pool.
        if inspect.iscoroutinefunction(behavior):
            async def guarded_coroutine(request: Any, context: _AioContext) -> Any:
                if request is _UNDECODABLE:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
                return await behavior(request, context)

            return guarded_coroutine
        if inspect.isasyncgenfunction(behavior):
            async def guarded_stream(request: Any, context: _AioContext) -> Any:
                if request is _UNDECODABLE:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
                async for message in behavior(request, context):
                    yield message

            return guarded_stream

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if request is _UNDECODABLE:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
            return behavior(request, context)

        return guarded

    if handler.unary_unary is not None:
        return handler._replace(
            request_deserializer=safe_deserialize,
            unary_unary=refuse_undecodable(handler.unary_unary),
        )
    return handler._replace(
        request_deserializer=safe_deserialize,
        unary_stream=refuse_undecodable(handler.unary_stream),
    )
