"""What a daemon's servicers are registered through: every handler wrapped once, as it is added.

Layer: services (runtime). The generated ``add_*Servicer_to_server`` functions hand their
handlers to ``add_registered_method_handlers`` (and a generic handler to
``add_generic_rpc_handlers``); ``Registration`` stands in for the server there and wraps each
handler on its way in: the decode guard, then the call telemetry, then what the server itself
adds (the asyncio server's dispatch of a synchronous handler to its loop or its pool). Nothing
then runs on every call but the wrappers: no interceptor asks for the handler again. Both
servers register the same way, the standard health and reflection services included
(``add_standard_services``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from services.common.server import call_telemetry
from services.common.server.call_telemetry import CallTelemetry
from services.common.server.decode_guard import guarded

Wrap = Callable[[str, Any], Any]
"""What is done to a method's handler as it is registered: ``(full method, handler) ->
handler``."""

# The daemon name used as the metrics ``service`` label, by the gRPC service it serves.
_DAEMON_BY_SERVICE = {
    "hami.accounting.v1.Admission": "admission",
    "hami.accounting.v1.Scheduler": "scheduler",
    "hami.accounting.v1.UsageRecorder": "usage",
}


class _Server(Protocol):
    """Where registered handlers go: ``grpc.Server`` and ``grpc.aio.Server`` alike."""

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[Any]) -> None: ...


def telemetry_for(
    service_names: Sequence[str],
    metrics_service: str | None,
    tracer_provider: TracerProvider | None,
) -> CallTelemetry:
    """The call telemetry of a server of ``service_names``: its metric's ``service`` label is
    ``metrics_service``, else the daemon the services name (admission, scheduler, usage)."""
    return CallTelemetry(
        metrics_service or _daemon_name(service_names),
        tracer_provider.get_tracer(call_telemetry.__name__) if tracer_provider else None,
    )


def _daemon_name(service_names: Sequence[str]) -> str:
    for name in service_names:
        if name in _DAEMON_BY_SERVICE:
            return _DAEMON_BY_SERVICE[name]
    return service_names[0].rsplit(".", 1)[-1].lower() if service_names else "unknown"


class Registration:
    """The server as servicer registration sees it: each handler added is guarded, observed
    and then given to ``dispatch`` (when the server has one), once."""

    def __init__(
        self, server: _Server, telemetry: CallTelemetry, dispatch: Wrap | None = None
    ) -> None:
        self._server = server
        self._telemetry = telemetry
        self._dispatch = dispatch

    def wrap(self, method: str, handler: Any) -> Any:
        """``handler`` of ``method`` (``/package.Service/Method``) as the server runs it."""
        observed = self._telemetry.observe(method, guarded(method, handler))
        return observed if self._dispatch is None else self._dispatch(method, observed)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Any]
    ) -> None:
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]  # grpc-stubs lag
            service_name,
            {
                name: self.wrap(f"/{service_name}/{name}", handler)
                for name, handler in method_handlers.items()
            },
        )

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(WrappedGeneric(handler, self.wrap) for handler in generic_rpc_handlers)
        )


class WrappedGeneric(grpc.GenericRpcHandler):  # type: ignore[type-arg]  # untyped messages
    """A generic handler whose method handlers are wrapped as they are found.

    grpc asks a generic handler on every call; a registered method's handler is the same object
    each time, so its wrapper is built once. A handler made per call (a generic handler may
    return one) is wrapped anew; a race between two first calls only builds it twice.
    """

    def __init__(self, inner: Any, wrap: Wrap) -> None:
        self._inner = inner
        self._wrap = wrap
        self._wrapped: dict[str, tuple[Any, Any]] = {}
        """Per method: the handler last found and its wrapper."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def add_standard_services(
    registration: Registration,
    service_names: Sequence[str],
    health_servicer: Any,
    reflection_servicer: Callable[[Sequence[str]], Any],
) -> None:
    """Registers the health service (``health_servicer``, the server's kind) and reflection of
    ``service_names``, health and reflection itself (``reflection_servicer`` makes the server's
    kind of servicer from the names)."""
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registration)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection_servicer((*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME)),
        registration,
    )
