"""A started server as a daemon drives it: its address, its health, and a graceful stop.

Layer: services (runtime). One ``ServerHandle`` for both servers: what differs between them
(how health is set, how the server stops and what threads it frees) comes in as its ``health``
and its ``server``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

from grpc_health.v1 import health_pb2

from services.common.server.listen import dial_target

DEFAULT_GRACE_S = 5.0

LIVENESS_SERVICE = "liveness"
"""Health service name for liveness probes: SERVING while the process runs, whatever the
readiness (a standby or still-syncing daemon is alive but not ready, and must not be restarted)."""

if TYPE_CHECKING:
    ServingStatus: TypeAlias = health_pb2.HealthCheckResponse.ServingStatus.ValueType


def serving_status(serving: bool) -> ServingStatus:
    """The health status of a server that is serving, or not."""
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


class Health(Protocol):
    """The server's health service as the handle sets it, from any thread."""

    def set(self, service: str, status: ServingStatus) -> None: ...

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on, whatever is set later."""


class RunningServer(Protocol):
    """The started gRPC server and the threads that run it."""

    def stop(self, grace_s: float) -> None:
        """Takes no new calls and lets in-flight ones finish for up to ``grace_s``."""

    def release(self) -> None:
        """Frees its threads (after ``stop``, or after a ``stop`` that failed)."""


class ServerHandle:
    """A started server with its health service; stop it with ``stop`` (idempotent).

    Made once the server is bound, before it starts: the overall ("") health status and each
    service's start as ``serving`` says, the liveness service SERVING.
    """

    def __init__(
        self,
        *,
        port: int,
        listen_addr: str,
        service_names: Sequence[str],
        health: Health,
        server: RunningServer,
        serving: bool,
    ) -> None:
        self.port = port
        """The bound port (the real one when listen_addr asked for port 0)."""
        self.listen_addr = listen_addr
        self.service_names = tuple(service_names)
        self._health = health
        self._server = server
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.set_serving(serving)
        health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    @property
    def target(self) -> str:
        """An address a client on this machine can dial, e.g. ``127.0.0.1:50053``."""
        return dial_target(self.listen_addr, self.port)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def set_serving(self, serving: bool) -> None:
        """Sets the overall ("") health status and each registered service's (any thread)."""
        status = serving_status(serving)
        for name in ("", *self.service_names):
            self._health.set(name, status)

    def set_health(self, service: str, serving: bool) -> None:
        """Sets one more health service's status (any thread), e.g. the recorder's readiness."""
        self._health.set(service, serving_status(serving))

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Reports NOT_SERVING, lets in-flight calls finish for up to ``grace_s``, then stops."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            try:
                # Health watchers (kubelet, load balancers) learn first, so no new calls arrive.
                self._health.enter_graceful_shutdown()
                self._server.stop(grace_s)
            finally:
                self._server.release()
                self._stopped.set()
