"""The gRPC adapter of the scheduler daemon: ``Scheduler.Filter`` over a ``PodPlacer``.

Layer: services/scheduler (adapter). ``SchedulerServicer`` validates and converts the request
(services.scheduler.convert), hands it to the placer (services.scheduler.placer) with the
caller's deadline, and converts the outcome; errors become status codes in ``map_errors``.
``add_to_server`` registers the service.
"""

from __future__ import annotations

import grpc

from hami.accounting.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import convert as common
from services.common.errors import map_errors
from services.scheduler import convert
from services.scheduler.placer import CallTimeout, PodPlacer

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
"""hami.accounting.v1.Scheduler"""
_MIN_TIMEOUT_S = 0.001




def _call_timeout(context: grpc.ServicerContext, limit_s: float) -> CallTimeout:
    """The configured deadline, shortened to what is left of the caller's own."""

    def timeout() -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return limit_s
        return max(min(limit_s, remaining), _MIN_TIMEOUT_S)

    return timeout


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """``Scheduler.Filter`` over a ``PodPlacer``."""

    def __init__(self, placer: PodPlacer) -> None:
        self._placer = placer
        self._node_names = convert.NodeNameReader()

    @map_errors
    def Filter(  # type: ignore[override]  # answers encoded (add_to_server)
        self, request: scheduler_pb2.FilterRequest, context: grpc.ServicerContext
    ) -> bytes:
        pod, outcome = self._placer.place_request(
            lambda vendors: convert.filter_input(
                request, vendors=vendors, names=self._node_names
            ),
            lambda: common.pod_source_asks_for_devices(request),
            _call_timeout(context, self._placer.usage_timeout_s),
        )
        return convert.filter_response_bytes(pod, outcome)


def add_to_server(servicer: SchedulerServicer, server: grpc.Server) -> None:
    """Registers the Scheduler service; Filter's answer leaves as the bytes the servicer
    encoded (grpc passes bytes through when the serializer is None)."""
    handlers = {
        "Filter": grpc.unary_unary_rpc_method_handler(
            servicer.Filter,
            request_deserializer=scheduler_pb2.FilterRequest.FromString,
            response_serializer=None,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]
