"""The thread-pool server: a synchronous ``grpc.server``, each call on a thread of its pool.

Layer: services (runtime). What the admission and the scheduler daemons run on
(docs/server-choice.md): they serve unary calls only, and each can wait on the recorder inside
a call. ``build_server`` registers the servicers (``registration``: decode guard and call
telemetry, once per handler), the standard health (grpcio-health-checking) and reflection
(grpcio-reflection), binds plaintext, TLS or mutual TLS with the message limits (``listen``),
and starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider

from services.common.config import CommonConfig, TlsConfig
from services.common.server.handle import ServerHandle
from services.common.server.listen import (
    DEFAULT_MAX_MESSAGE_BYTES,
    bind,
    server_options,
    tls_mode,
)
from services.common.server.registration import (
    Registration,
    add_standard_services,
    telemetry_for,
)

_LOG = logging.getLogger(__name__)


class _PoolServer:
    """The started ``grpc.server`` and its pool, as the handle stops them."""

    def __init__(self, server: grpc.Server, executor: futures.ThreadPoolExecutor) -> None:
        self._server = server
        self._executor = executor

    def stop(self, grace_s: float) -> None:
        self._server.stop(grace_s).wait()

    def release(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


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
        serving: initial health status (a daemon that must sync or win an election first
            starts NOT_SERVING, then calls ``set_serving(True)``).
        max_message_bytes: limit for received and sent messages.
        metrics_service: ``service`` label of the latency metric; derived from service_names
            (admission, scheduler, usage) when None.

    Raises:
        ServerStartError: the address cannot be bound or the certificates cannot be read.
    """
    executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                          thread_name_prefix="grpc-server")
    server = grpc.server(executor, options=server_options(max_message_bytes))
    registration = Registration(
        server, telemetry_for(service_names, metrics_service, tracer_provider)
    )
    register(registration)  # type: ignore[arg-type]  # stands in for the server
    health_servicer = health.HealthServicer()
    add_standard_services(
        registration, service_names, health_servicer, reflection.ReflectionServicer
    )
    try:
        port = bind(server, listen_addr, tls)
    except BaseException:
        executor.shutdown(wait=False)
        raise
    handle = ServerHandle(
        port=port,
        listen_addr=listen_addr,
        service_names=service_names,
        health=health_servicer,
        server=_PoolServer(server, executor),
        serving=serving,
    )
    server.start()
    _LOG.info("gRPC server listening", extra={"listen_addr": listen_addr, "port": port,
                                              "tls": tls_mode(tls)})
    return handle


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
