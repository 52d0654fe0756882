"""gRPC server bootstrap shared by the three daemons, and the client channel they use.

Layer: services (runtime). ``build_server`` gives every daemon the same shape: a synchronous
``grpc.server`` on a thread pool; one interceptor for the Prometheus latency metric and, with an
*explicit* tracer provider (never the global monkey-patch), each call's SERVER span
(``call_telemetry``); client channels trace with opentelemetry-instrumentation-grpc; standard health
(grpcio-health-checking) and reflection (grpcio-reflection); plaintext, TLS or mutual TLS; and
message size limits. ``run_until_signalled`` turns SIGTERM/SIGINT into a graceful stop.
"""

from __future__ import annotations

import inspect
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from types import FrameType
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import client_interceptor, grpcext
from opentelemetry.sdk.trace import TracerProvider

from services.common import call_telemetry
from services.common.call_telemetry import CallTelemetryInterceptor
from services.common.config import CommonConfig, TlsConfig, parse_host_port
from services.common.ports import listen_problem

_LOG = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_GRACE_S = 5.0

# The daemon name used as the metrics ``service`` label, by the gRPC service it serves.
_DAEMON_BY_SERVICE = {
    "hami.accounting.v1.Admission": "admission",
    "hami.accounting.v1.Scheduler": "scheduler",
    "hami.accounting.v1.UsageRecorder": "usage",
}

# Addresses that listen everywhere; a local client reaches them through the loopback address.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})


LIVENESS_SERVICE = "liveness"
"""Health service name for liveness probes: SERVING while the process runs, whatever the
readiness (a standby or still-syncing daemon is alive but not ready, and must not be restarted)."""


class ServerStartError(RuntimeError):
    """The server cannot start, typically because its address cannot be bound."""


class DaemonServer(Protocol):
    """A started server as a daemon drives it: ``ServerHandle`` (the thread-pool server) and
    ``aio_server.AioServerHandle`` (the recorder's)."""

    @property
    def port(self) -> int: ...

    @property
    def target(self) -> str: ...

    @property
    def stopped(self) -> bool: ...

    def set_serving(self, serving: bool) -> None: ...

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None: ...

    def wait(self) -> None: ...


def _message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def dial_target(listen_addr: str, port: int) -> str:
    """An address a client on this machine can dial for a server listening on ``listen_addr``
    (a wildcard host is reached through the loopback address), at its bound ``port``."""
    host, _ = parse_host_port(listen_addr)
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


def serving_status(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    """The health status of a server that is serving, or not."""
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


class ServerHandle:
    """A started server with its health servicer; stop it with ``stop`` (idempotent)."""

    def __init__(
        self,
        *,
        server: grpc.Server,
        port: int,
        health_servicer: health.HealthServicer,
        service_names: Sequence[str],
        listen_addr: str,
        executor: futures.ThreadPoolExecutor,
    ) -> None:
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
        """Sets the overall ("") health status and each registered service's."""
        status = serving_status(serving)
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Reports NOT_SERVING, lets in-flight calls finish for up to ``grace_s``, then stops."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            # Health watchers (kubelet, load balancers) learn first, so no new calls arrive.
            self.health.enter_graceful_shutdown()
            self.server.stop(grace_s).wait()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()

    def wait(self) -> None:
        """Blocks until the server has terminated."""
        self.server.wait_for_termination()


def build_server(
    *,
    service_names: Sequence[str],
    register: Callable[[grpc.Server], None],
    listen_addr: str,
    tls: TlsConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
    serving: bool = True,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    metrics_service: str | None = None,
) -> ServerHandle:
    """Builds, binds and starts a daemon's gRPC server.

    Args:
        service_names: full names of the services ``register`` adds, e.g.
            ``hami.accounting.v1.UsageRecorder``; each gets a health status and reflection.
        register: adds the servicers, e.g. ``lambda s: add_UsageRecorderServicer_to_server(x, s)``.
        listen_addr: ``host:port``; port 0 binds a free port (see ``ServerHandle.port``).
        tls: server certificate; with a CA, clients must present a certificate (mutual TLS).
        tracer_provider: traces every call when given; None traces nothing.
        max_workers: threads serving calls; each open server stream holds one.
        serving: initial health status (the usage recorder starts NOT_SERVING until its first
            Kubernetes sync, then calls ``set_serving(True)``).
        max_message_bytes: limit for received and sent messages.
        metrics_service: ``service`` label of the latency metric; derived from service_names
            (admission, scheduler, usage) when None.

    Raises:
        ServerStartError: the address cannot be bound or the certificates cannot be read.
    """
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = [
        CallTelemetryInterceptor(
            metrics_service or _daemon_name(service_names),
            tracer_provider.get_tracer(call_telemetry.__name__) if tracer_provider else None,
        )
    ]

    executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                          thread_name_prefix="grpc-server")
    options = [
        *_message_options(max_message_bytes),
        # Without this a second server on the same port binds too (SO_REUSEPORT) and the two
        # share traffic silently; a daemon must fail instead.
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(executor, interceptors=interceptors, options=options)

    register(_DecodeGuard(server))  # type: ignore[arg-type]  # a proxy of grpc.Server
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )

    try:
        port = _bind(server, listen_addr, tls)
    except BaseException:
        executor.shutdown(wait=False)
        raise
    handle = ServerHandle(
        server=server,
        port=port,
        health_servicer=health_servicer,
        service_names=service_names,
        listen_addr=listen_addr,
        executor=executor,
    )
    handle.set_serving(serving)
    health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    server.start()
    _LOG.info("gRPC server listening", extra={"listen_addr": listen_addr, "port": port,
                                              "tls": _tls_mode(tls)})
    return handle


_AioContext = grpc.aio.ServicerContext[Any, Any]

_UNDECODABLE = object()
"""Stands in for a request whose bytes do not decode as its message."""


def _guarded(method: str, handler: Any) -> Any:
    """A handler whose undecodable requests get INVALID_ARGUMENT instead of grpcio's INTERNAL.

    grpcio turns a deserializer exception into INTERNAL "Exception deserializing request!"
    before any of our code runs; bad input must be INVALID_ARGUMENT naming what was wrong.
    """
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
        # A grpc.aio handler keeps its shape (coroutine or async generator): the aio server
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


class _GuardedGenericHandler(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return _guarded(handler_call_details.method, handler)


class _DecodeGuard:
    """The server as servicer registration sees it: every handler added is decode-guarded."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGenericHandler(h) for h in handlers))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Any]
    ) -> None:
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]
            service_name,
            {
                name: _guarded(f"/{service_name}/{name}", handler)
                for name, handler in method_handlers.items()
            },
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def _daemon_name(service_names: Sequence[str]) -> str:
    for name in service_names:
        if name in _DAEMON_BY_SERVICE:
            return _DAEMON_BY_SERVICE[name]
    return service_names[0].rsplit(".", 1)[-1].lower() if service_names else "unknown"


def _tls_mode(tls: TlsConfig | None) -> str:
    if tls is None:
        return "off"
    return "mutual" if tls.mutual else "server"


def _bind(server: grpc.Server, listen_addr: str, tls: TlsConfig | None) -> int:
    try:
        host, port = parse_host_port(listen_addr)
    except ValueError as error:
        raise ServerStartError(f"listen address {error}") from None
    busy = listen_problem(host, port)
    if busy is not None:
        raise ServerStartError(f"cannot listen on {listen_addr}: {busy}")
    if tls is not None:
        problem = tls.problem()
        if problem is not None:
            raise ServerStartError(problem)
    try:
        if tls is None:
            port = server.add_insecure_port(listen_addr)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.read_key(), tls.read_cert())],
                root_certificates=tls.read_ca(),
                require_client_auth=tls.mutual,
            )
            port = server.add_secure_port(listen_addr, credentials)
    except OSError as error:
        raise ServerStartError(f"cannot read TLS files: {error}") from None
    except RuntimeError as error:
        raise ServerStartError(
            f"cannot listen on {listen_addr} (address in use or not available here): {error}"
        ) from None
    if port == 0:
        # Older grpcio reports a failed bind by returning 0 instead of raising.
        raise ServerStartError(
            f"cannot listen on {listen_addr} (address in use or not available here)"
        )
    return port


def client_channel(
    target: str,
    *,
    tls: TlsConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel to another daemon, traced with ``tracer_provider`` when given.

    With ``tls``, the server is verified against its CA (the system roots when the CA is None)
    and the daemon's own certificate is presented (needed when the server runs mutual TLS).
    """
    options = [
        *_message_options(max_message_bytes),
        # gRPC's default reconnect backoff grows to 120 s: a daemon started before the recorder
        # (a rollout, a recorder restart) would answer UNAVAILABLE for minutes after the recorder
        # is back. Retry the connection at most every 2 s instead.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if tls is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.read_ca(),
            private_key=tls.read_key(),
            certificate_chain=tls.read_cert(),
        )
        channel = grpc.secure_channel(target, credentials, options=options)
    if tracer_provider is None:
        return channel
    interceptor = client_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
    # The OTel client interceptor implements OTel's own interceptor API, not grpc's.
    traced: grpc.Channel = grpcext.intercept_channel(channel, interceptor)  # type: ignore[no-untyped-call]
    return traced


def build_service_server(
    common: CommonConfig,
    service_name: str,
    register: Callable[[grpc.Server], None],
    *,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
    serving: bool = True,
) -> ServerHandle:
    """``build_server`` for one daemon's service, at its configured address and with its TLS.

    Raises:
        ServerStartError: the address cannot be bound.
    """
    return build_server(
        service_names=[service_name],
        register=register,
        listen_addr=common.listen_addr,
        tls=common.tls,
        tracer_provider=tracer_provider,
        max_workers=max_workers,
        serving=serving,
    )


class StopSignals:
    """SIGTERM and SIGINT, remembered from the moment this is made until ``restore``.

    A daemon makes it before it starts: its health can say SERVING (the gRPC server is up)
    while the rest of its start still runs, and a SIGTERM then would otherwise find the default
    action and kill it uncleanly; remembered, it stops the daemon gracefully once started.
    Must be made in the main thread.
    """

    WATCHED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received = threading.Event()
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.WATCHED}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        _LOG.info("stopping on %s", signal.Signals(signum).name)
        self.received.set()

    def restore(self) -> None:
        """Puts back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def run_until_signalled(
    handle: DaemonServer,
    on_stop: Callable[[], None] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    signals: StopSignals | None = None,
) -> None:
    """Serves until SIGTERM or SIGINT (or until the server is stopped elsewhere), then stops.

    Stopping reports NOT_SERVING, drains in-flight calls for up to ``grace_s``, then calls
    ``on_stop`` (flush the tracer provider, close the journal). Must run in the main thread.
    ``signals``: the ones the caller made before starting the server (a signal received since
    then stops it at once); restored at the end either way.
    """
    signals = signals or StopSignals()
    try:
        # A bounded wait, so a server stopped by another thread also ends the loop.
        while not signals.received.wait(0.5) and not handle.stopped:
            pass
        handle.stop(grace_s)
        if on_stop is not None:
            on_stop()
    finally:
        signals.restore()
