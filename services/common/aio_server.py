"""The usage recorder's server: grpc.aio on an event loop of its own.

Layer: services (runtime). ``build_aio_server`` gives the same daemon shape as ``build_server``
(the call telemetry, standard health and reflection, plaintext or (mutual) TLS, message limits,
the decode guard), applied once to each handler when it is registered rather than by an
interceptor on every call. A handler written as a coroutine or an async generator (the
recorder's ``WatchUsage``, the health service) runs on the server's event loop, so a stream
never holds a thread: with Python grpc's thread-pool server each open stream held one of the
16 workers for its whole life, and 16 open streams left no thread for a unary call or a health
check. The synchronous unary handlers run on the loop too when named in ``inline_methods``
(two thread switches saved per call), else on a thread pool of ``max_workers``.
docs/watch-usage.md has the measurements behind these choices.

Health is the asyncio implementation of grpcio-health-checking, on the event loop: a probe is
answered even while every pool thread is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import _async as health_aio  # what grpc_health.v1.health exports as aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import _async as reflection_aio  # reflection.aio
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from services.common import call_telemetry
from services.common.call_telemetry import CallTelemetryInterceptor
from services.common.config import TlsConfig
from services.common.server import (
    DEFAULT_GRACE_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    LIVENESS_SERVICE,
    _bind,
    _daemon_name,
    _guarded,
    _message_options,
    _tls_mode,
    dial_target,
    serving_status,
)

_LOG = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
"""How long building and starting the server on its loop may take."""


class AioServerHandle:
    """A started aio server and its event-loop thread; ``stop`` ends both (idempotent)."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        server: grpc.aio.Server,
        port: int,
        health_servicer: health_aio.HealthServicer,
        service_names: Sequence[str],
        listen_addr: str,
        executor: futures.ThreadPoolExecutor,
    ) -> None:
        self.loop = loop
        """The event loop the server, its streams and its health service run on."""
        self._thread = thread
        self.server = server
        self.port = port
        """The bound port (the real one when listen_addr asked for port 0)."""
        self.health = health_servicer
        self.service_names = tuple(service_names)
        self.listen_addr = listen_addr
        self._executor = executor
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()

    @property
    def target(self) -> str:
        """An address a client on this machine can dial, e.g. ``127.0.0.1:50053``."""
        return dial_target(self.listen_addr, self.port)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def set_serving(self, serving: bool) -> None:
        """Sets the overall ("") health status and each registered service's (any thread)."""
        self._on_loop(self._set_all(("", *self.service_names), serving_status(serving)))

    def set_health(
        self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus
    ) -> None:
        """Sets one health service's status (any thread)."""
        self._on_loop(self.health.set(service, status))

    async def _set_all(
        self, names: Sequence[str], status: health_pb2.HealthCheckResponse.ServingStatus
    ) -> None:
        for name in names:
            await self.health.set(name, status)

    def _on_loop(self, coroutine: Any) -> None:
        if self.stopped or self.loop.is_closed():
            coroutine.close()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.loop.create_task(coroutine)
            return
        try:
            done = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError:  # the loop closed since the check above: the server has stopped
            coroutine.close()
            return
        # Cancelled: the loop stopped before running it (_run_loop), so the server has stopped.
        with contextlib.suppress(futures.CancelledError):
            done.result(timeout=START_TIMEOUT_S)

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Reports NOT_SERVING, lets in-flight calls finish for up to ``grace_s``, then stops
        the server and its loop."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            try:
                asyncio.run_coroutine_threadsafe(self._stop(grace_s), self.loop).result(
                    timeout=grace_s + START_TIMEOUT_S
                )
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout=START_TIMEOUT_S)
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._stopped.set()

    async def _stop(self, grace_s: float) -> None:
        # Health watchers (kubelet, load balancers) learn first, so no new calls arrive.
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    def wait(self) -> None:
        """Blocks until the server has stopped."""
        self._stopped.wait()


class UnaryCalls:
    """The unary calls a server is answering, counted on its event loop: work on the loop that
    can wait (the WatchUsage fan-out) gives way to them, so a write or a read is not slowed by
    the messages to the watchers of earlier writes. ``listeners`` are called (on the loop)
    whenever a call starts or ends."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_end_s = float("-inf")
        """``loop.time()`` when the last call ended."""
        self.listeners: list[Callable[[bool], None]] = []
        """Called with True when a call starts, False when it ends."""

    def started(self) -> None:
        self.in_flight += 1
        for listener in self.listeners:
            listener(True)

    def ended(self, now_s: float) -> None:
        self.in_flight -= 1
        self.last_end_s = now_s
        for listener in self.listeners:
            listener(False)


class _PoolContext:
    """The servicer context a synchronous handler sees on the pool thread: the aio call's,
    with ``abort`` run on the event loop, and ``code()`` / ``details()`` after an abort (the
    call telemetry and the error mapping read them)."""

    __slots__ = ("_code", "_details", "_inner", "_loop")

    def __init__(
        self, inner: grpc.aio.ServicerContext[Any, Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._inner = inner
        self._loop = loop
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details
        # Raises the call's AbortError once the status is on its way.
        asyncio.run_coroutine_threadsafe(self._inner.abort(code, details), self._loop).result()

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _InlineAbort(grpc.aio.AbortError):
    """An abort by a handler running on the event loop: the status is sent once it returns."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _InlineContext(_PoolContext):
    """The servicer context a synchronous handler sees on the event loop itself: ``abort``
    raises, and the coroutine around the handler sends the status."""

    __slots__ = ()

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details
        raise _InlineAbort(code, details)


def _dispatcher(
    behavior: Callable[..., Any],
    loop: asyncio.AbstractEventLoop,
    executor: futures.ThreadPoolExecutor,
    calls: UnaryCalls,
    inline: bool,
    inline_unless: Callable[[], bool] | None,
) -> Callable[..., Any]:
    """A synchronous unary handler as a coroutine on ``loop``, counted in ``calls``: run on the
    event loop itself when ``inline`` (unless ``inline_unless()`` says it could block there
    now), else on the pool. The loop is given, not asked for: ``asyncio.get_running_loop``
    makes a ``getpid`` system call in CPython 3.11."""

    async def dispatch(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        calls.started()
        try:
            if inline and (inline_unless is None or not inline_unless()):
                try:
                    return behavior(request, _InlineContext(context, loop))
                except _InlineAbort as abort:
                    await context.abort(abort.code, abort.details)
            return await loop.run_in_executor(
                executor, behavior, request, _PoolContext(context, loop)
            )
        finally:
            calls.ended(loop.time())

    return dispatch


@dataclass(frozen=True)
class _Method:
    """What the call telemetry reads of a call's details: its method (known at registration)."""

    method: str


class _Wrapping:
    """The server as registration sees it: every handler added is wrapped once, when it is
    added, rather than by an interceptor on every call (``_wrap``)."""

    def __init__(self, server: grpc.aio.Server, wrap: Callable[[str, Any], Any]) -> None:
        self._server = server
        self._wrap = wrap

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]
            service, {name: self._wrap(f"/{service}/{name}", h) for name, h in handlers.items()}
        )

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_WrappedGeneric(handler, self._wrap) for handler in handlers)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _WrappedGeneric(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose method handlers are wrapped, once per method."""

    def __init__(self, inner: Any, wrap: Callable[[str, Any], Any]) -> None:
        self._inner = inner
        self._wrap = wrap
        self._wrapped: dict[str, Any] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            wrapped = self._wrapped[method] = self._wrap(method, handler)
        return wrapped


def build_aio_server(
    *,
    service_names: Sequence[str],
    register: Callable[[grpc.aio.Server], None],
    listen_addr: str,
    tls: TlsConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
    serving: bool = True,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    metrics_service: str | None = None,
    unary_calls: UnaryCalls | None = None,
    inline_methods: Collection[str] = (),
    inline_unless: Callable[[], bool] | None = None,
) -> AioServerHandle:
    """Builds, binds and starts a grpc.aio server on a new event-loop thread.

    Arguments as ``services.common.server.build_server``; ``max_workers`` is the pool that runs
    synchronous handlers (streams and health do not use it); ``unary_calls`` counts the unary
    calls in flight (for work on the loop that gives way to them). The synchronous unary
    methods named in ``inline_methods`` (full names, ``/package.Service/Method``) run on the
    event loop itself, saving two thread switches per call, unless ``inline_unless()`` is true
    when the call arrives (they could block: run them on the pool then). Only name methods
    that never wait on I/O or on a long-held lock.

    Raises:
        ServerStartError: the address cannot be bound or the certificates cannot be read.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name="grpc-aio", daemon=True)
    thread.start()
    executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                          thread_name_prefix="grpc-server")
    telemetry = CallTelemetryInterceptor(
        metrics_service or _daemon_name(service_names),
        tracer_provider.get_tracer(call_telemetry.__name__) if tracer_provider else None,
    )
    calls = unary_calls or UnaryCalls()
    inline = frozenset(inline_methods)

    def wrap(method: str, handler: Any) -> Any:
        """Decode guard, then call telemetry, then (a synchronous unary handler) the dispatch
        to the loop or the pool: what an interceptor would do on every call, done once."""
        observed: Any = telemetry.intercept_service(
            lambda _details: _guarded(method, handler), _Method(method)  # type: ignore[arg-type]
        )
        if observed.unary_unary is None or asyncio.iscoroutinefunction(observed.unary_unary):
            return observed
        return observed._replace(unary_unary=_dispatcher(
            observed.unary_unary, loop, executor, calls, method in inline, inline_unless
        ))

    async def start() -> tuple[grpc.aio.Server, int, health_aio.HealthServicer]:
        options = [
            *_message_options(max_message_bytes),
            # Without this a second server on the same port binds too (SO_REUSEPORT) and the
            # two share traffic silently; a daemon must fail instead.
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(migration_thread_pool=executor, options=options)
        wrapping: Any = _Wrapping(server, wrap)
        register(wrapping)
        health_servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, wrapping)
        # A proxy is not a grpc.aio.Server to enable_server_reflection's eyes: register the aio
        # servicer the way it would.
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection_aio.ReflectionServicer(
                (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME)
            ),
            wrapping,
        )
        port = _bind(server, listen_addr, tls)  # type: ignore[arg-type]  # same port API
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *service_names):
            await health_servicer.set(name, status)
        await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await server.start()
        return server, port, health_servicer

    try:
        server, port, health_servicer = asyncio.run_coroutine_threadsafe(start(), loop).result(
            timeout=START_TIMEOUT_S
        )
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=START_TIMEOUT_S)
        executor.shutdown(wait=False)
        raise
    _LOG.info("gRPC server listening", extra={"listen_addr": listen_addr, "port": port,
                                              "tls": _tls_mode(tls), "streams": "asyncio"})
    return AioServerHandle(
        loop=loop,
        thread=thread,
        server=server,
        port=port,
        health_servicer=health_servicer,
        service_names=service_names,
        listen_addr=listen_addr,
        executor=executor,
    )


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        _cancel_pending(loop)
        loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancels what is still pending once the loop has stopped, and runs it to its end, as
    ``asyncio.run`` does: a health update from another thread that raced the stop would
    otherwise never run, its caller waiting ``START_TIMEOUT_S`` for it in vain."""
    while pending := asyncio.all_tasks(loop):
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
