"""``hami-accounting health ADDR [--service NAME]``: a daemon's gRPC health, in one word.

Layer: services/cli (a subcommand). Prints the status (SERVING, NOT_SERVING, ...) and exits 0
only when SERVING: the container HEALTHCHECK and compose use it, and ``up`` waits on
``check_health`` for each daemon it starts. When nothing answers, the sentence says why when
it can be found out (a TLS mismatch, say), instead of gRPC's bare code.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import ConfigError, TlsConfig
from services.common.reachability import unreachable_reason
from services.common.server import client_channel

DAEMONS = ("admission", "scheduler", "usage")

SERVICE_NAMES = {
    "admission": "hami.accounting.v1.Admission",
    "scheduler": "hami.accounting.v1.Scheduler",
    "usage": "hami.accounting.v1.UsageRecorder",
}
"""The gRPC service each daemon serves, and reports its health under."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``health``."""
    parser.add_argument("addr", help="host:port")
    parser.add_argument("--service", default="",
                        help='full service name, e.g. hami.accounting.v1.UsageRecorder '
                             '(default: "" = the whole server)')
    parser.add_argument("--timeout-s", type=float, default=3.0)


def check_health(target: str, service: str = "", *, timeout_s: float = 3.0,
                 tls: TlsConfig | None = None) -> str:
    """The health status name of ``service`` at ``target`` (SERVING, NOT_SERVING, ...).

    Raises grpc.RpcError when the server cannot be reached or does not know the service.
    """
    with client_channel(target, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _health_failure(addr: str, service: str, code: grpc.StatusCode, details: str) -> str:
    """What went wrong, in words: grpcio's NOT_FOUND comes with no details at all."""
    if code == grpc.StatusCode.NOT_FOUND:
        known = ", ".join(SERVICE_NAMES[name] for name in DAEMONS)
        return (f"the server at {addr} reports no health for service {service!r}; a daemon "
                f'reports "" (the whole server, the default) and its own service: {known}')
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"nothing answers at {addr} ({details or 'no details'})"
    return details or "(no details)"


def run(namespace: argparse.Namespace) -> int:
    """Runs ``health`` with the parsed arguments; returns the exit code."""
    try:
        tls = TlsConfig.from_env(os.environ)
    except ConfigError as error:
        print(f"hami-accounting health: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        status = check_health(namespace.addr, namespace.service,
                              timeout_s=namespace.timeout_s, tls=tls)
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = (error.details() if hasattr(error, "details") else str(error)) or ""
        reason = None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            reason = unreachable_reason(namespace.addr, tls, namespace.timeout_s)
        if reason is None:
            reason = _health_failure(namespace.addr, namespace.service, code, details)
        print(f"{code.name}: {reason}")
        return EXIT_FAILED
    print(status)
    return EXIT_OK if status == "SERVING" else EXIT_FAILED
