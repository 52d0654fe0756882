"""The asyncio server: grpc.aio on an event loop of its own (the usage recorder's).

Layer: services (runtime). ``build_aio_server`` gives the same daemon shape as the thread-pool
server (``thread_pool``): the same registration (decode guard and call telemetry, once per
handler), standard health and reflection, plaintext or (mutual) TLS, message limits, and the
same ``ServerHandle``. A handler written as a coroutine or an async generator (the recorder's
``WatchUsage``, the health service) runs on the server's event loop, so a stream never holds a
thread: with Python grpc's thread-pool server each open stream held one of the 16 workers for
its whole life, and 16 open streams left no thread for a unary call or a health check. The
synchronous unary handlers run on the loop too when named in ``inline_methods`` (two thread
switches saved per call), else on a thread pool of ``max_workers``. docs/watch-usage.md has
the measurements behind these choices, docs/server-choice.md why the other two daemons stay on
the thread-pool server.

Health is the asyncio implementation of grpcio-health-checking, on the event loop: a probe is
answered even while every pool thread is busy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import _async as health_aio  # what grpc_health.v1.health exports as aio
from grpc_reflection.v1alpha import _async as reflection_aio  # reflection.aio
from opentelemetry.sdk.trace import TracerProvider

from services.common.config import TlsConfig
from services.common.server.handle import ServerHandle
from services.common.server.listen import (
    DEFAULT_MAX_MESSAGE_BYTES,
    bind,
    server_options,
    tls_mode,
)
from services.common.server.loop_thread import START_TIMEOUT_S, LoopThread
from services.common.server.registration import (
    Registration,
    add_standard_services,
    telemetry_for,
)

if TYPE_CHECKING:
    from services.common.server.handle import ServingStatus

_LOG = logging.getLogger(__name__)


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


class _LoopHealth:
    """The asyncio health servicer as the handle sets it: each change handed to the loop."""

    def __init__(self, loop_thread: LoopThread, servicer: health_aio.HealthServicer) -> None:
        self._loop_thread = loop_thread
        self._servicer = servicer

    def set(self, service: str, status: ServingStatus) -> None:
        self._loop_thread.hand(self._servicer.set(service, status))

    def enter_graceful_shutdown(self) -> None:
        self._loop_thread.run(self._servicer.enter_graceful_shutdown())


class _LoopServer:
    """The started grpc.aio server, its loop and its pool, as the handle stops them."""

    def __init__(
        self,
        server: grpc.aio.Server,
        loop_thread: LoopThread,
        executor: futures.ThreadPoolExecutor,
    ) -> None:
        self._server = server
        self._loop_thread = loop_thread
        self._executor = executor

    def stop(self, grace_s: float) -> None:
        self._loop_thread.run(self._server.stop(grace_s), timeout_s=grace_s + START_TIMEOUT_S)

    def release(self) -> None:
        self._loop_thread.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)


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
) -> ServerHandle:
    """Builds, binds and starts a grpc.aio server on a new event-loop thread.

    Arguments as ``thread_pool.build_server``; ``max_workers`` is the pool that runs
    synchronous handlers (streams and health do not use it); ``unary_calls`` counts the unary
    calls in flight (for work on the loop that gives way to them). The synchronous unary
    methods named in ``inline_methods`` (full names, ``/package.Service/Method``) run on the
    event loop itself, saving two thread switches per call, unless ``inline_unless()`` is true
    when the call arrives (they could block: run them on the pool then). Only name methods
    that never wait on I/O or on a long-held lock.

    Raises:
        ServerStartError: the address cannot be bound or the certificates cannot be read.
    """
    loop_thread = LoopThread("grpc-aio")
    loop = loop_thread.loop
    executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                          thread_name_prefix="grpc-server")
    telemetry = telemetry_for(service_names, metrics_service, tracer_provider)
    calls = unary_calls or UnaryCalls()
    inline = frozenset(inline_methods)

    def dispatch(method: str, observed: Any) -> Any:
        """A synchronous unary handler as a coroutine that runs it on the loop or the pool;
        any other handler as it is."""
        if observed.unary_unary is None or asyncio.iscoroutinefunction(observed.unary_unary):
            return observed
        return observed._replace(unary_unary=_dispatcher(
            observed.unary_unary, loop, executor, calls, method in inline, inline_unless
        ))

    async def build() -> tuple[grpc.aio.Server, int, health_aio.HealthServicer]:
        # grpc.aio makes its server on the loop it will run on.
        server = grpc.aio.server(migration_thread_pool=executor,
                                 options=server_options(max_message_bytes))
        registration = Registration(server, telemetry, dispatch)
        register(registration)  # type: ignore[arg-type]  # stands in for the server
        health_servicer = health_aio.HealthServicer()
        add_standard_services(
            registration, service_names, health_servicer, reflection_aio.ReflectionServicer
        )
        return server, bind(server, listen_addr, tls), health_servicer

    try:
        server, port, health_servicer = loop_thread.run(build())
        handle = ServerHandle(
            port=port,
            listen_addr=listen_addr,
            service_names=service_names,
            health=_LoopHealth(loop_thread, health_servicer),
            server=_LoopServer(server, loop_thread, executor),
            serving=serving,
        )
        loop_thread.run(server.start())
    except BaseException:
        loop_thread.stop()
        executor.shutdown(wait=False)
        raise
    _LOG.info("gRPC server listening", extra={"listen_addr": listen_addr, "port": port,
                                              "tls": tls_mode(tls), "streams": "asyncio"})
    return handle
