"""The RPC floor: a no-op unary method on the daemons' own server stack.

Layer: benchmark. ``python -m bench.noop_server`` serves ``/hami.accounting.bench.Noop/Call``
(google.protobuf.Empty in and out, through a grpc generic handler) with ``build_server``, the
bootstrap every daemon uses: the same thread pool, the same call telemetry (OpenTelemetry when
the OTEL_* variables turn it on, the Prometheus latency histogram), health, reflection and message
limits. Whatever a daemon's call costs above this is the daemon's own work. It reads
HAMI_ACCOUNTING_LISTEN_ADDR like the daemons and stops on SIGTERM.
"""

from __future__ import annotations

import os
import sys

import grpc
from google.protobuf import empty_pb2

from services.common import telemetry
from services.common.logging import configure_logging
from services.common.server import build_server, run_until_signalled

SERVICE_NAME = "hami.accounting.bench.Noop"
METHOD = f"/{SERVICE_NAME}/Call"


def _call(request: empty_pb2.Empty, context: grpc.ServicerContext) -> empty_pb2.Empty:
    return empty_pb2.Empty()


def _register(server: grpc.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Call": grpc.unary_unary_rpc_method_handler(
                _call,
                request_deserializer=empty_pb2.Empty.FromString,
                response_serializer=empty_pb2.Empty.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))


def main() -> int:
    configure_logging("noop")
    provider = telemetry.tracer_provider_from_env("noop")
    handle = build_server(
        service_names=[SERVICE_NAME],
        register=_register,
        listen_addr=os.environ.get("HAMI_ACCOUNTING_LISTEN_ADDR", "127.0.0.1:0"),
        tracer_provider=provider,
        metrics_service="noop",
    )
    print(f"noop serving on {handle.target}", file=sys.stderr, flush=True)
    run_until_signalled(handle, on_stop=lambda: telemetry.shutdown(provider))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
