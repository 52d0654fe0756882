"""Entry point of the scheduler daemon: ``python -m services.scheduler`` or
``hami-accounting serve scheduler``.

Layer: services/scheduler (runtime). Config -> traced channel to the usage recorder -> pod
placer -> gRPC server (``hami.accounting.v1.Scheduler`` with health and reflection), then serve
until SIGTERM/SIGINT. With ``HAMI_ACCOUNTING_NODE_CACHE=watch`` (the default) a node cache fed by
WatchUsage, on its own untraced channel, starts with it. Health: the ``liveness`` service and
the overall status are SERVING from start to stop. The daemon holds no state of its own (the
cache is a copy, dropped whenever its stream ends); an unreachable recorder makes each Filter
UNAVAILABLE rather than the daemon unready, so the extender sees why it was refused.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpc_health.v1 import health_pb2
from opentelemetry.sdk.trace import TracerProvider

from accounting.fit import POLICIES
from accounting.model import VendorResources
from hami.accounting.v1 import scheduler_pb2_grpc
from services.common import telemetry
from services.common.config import ConfigError, env_name, environment_with_flags
from services.common.logging import configure_logging
from services.common.metrics import MetricsError, start_metrics_server
from services.common.server import (
    ServerHandle,
    ServerStartError,
    build_server,
    client_channel,
    run_until_signalled,
)
from services.scheduler.config import NODE_CACHE_MODES, NODE_CACHE_WATCH, SchedulerConfig
from services.scheduler.node_cache import NodeCache
from services.scheduler.servicer import (
    SERVICE_NAME,
    PodPlacer,
    RecorderClient,
    SchedulerServicer,
)

_LOG = logging.getLogger("services.scheduler")

LIVENESS_SERVICE = "liveness"
"""Health service name of the liveness probe: SERVING while the process runs."""


@dataclass
class SchedulerDaemon:
    """A started scheduler daemon; ``stop`` ends its server and its recorder channel."""

    config: SchedulerConfig
    handle: ServerHandle
    placer: PodPlacer
    recorder: RecorderClient
    tracer_provider: TracerProvider | None
    node_cache: NodeCache | None = None

    @property
    def target(self) -> str:
        """The address a local client dials, e.g. ``127.0.0.1:50052``."""
        return self.handle.target

    def shutdown_background(self) -> None:
        """Stops the node cache, closes the recorder channel and flushes traces (after the gRPC
        server stopped)."""
        if self.node_cache is not None:
            self.node_cache.close()
        self.recorder.close()
        telemetry.shutdown(self.tracer_provider)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stops everything (tests; ``main`` stops through ``run_until_signalled``)."""
        self.handle.stop(grace_s)
        self.shutdown_background()


def start(
    config: SchedulerConfig,
    *,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
    clock: Callable[[], float] = time.time,
) -> SchedulerDaemon:
    """Starts the gRPC server; the recorder is dialled lazily, on the first Filter.

    Raises:
        ServerStartError: the gRPC address cannot be bound.
    """
    channel = client_channel(
        config.usage_addr, tls=config.common.tls, tracer_provider=tracer_provider
    )
    recorder = RecorderClient(channel, config.usage_addr)
    node_cache: NodeCache | None = None
    if config.node_cache == NODE_CACHE_WATCH:
        # Untraced: one span for a stream that lives for minutes would say nothing.
        watch_channel = client_channel(config.usage_addr, tls=config.common.tls)
        node_cache = NodeCache(recorder, watch_channel)
    placer = PodPlacer(
        recorder,
        vendor=VendorResources(memory_factor=config.memory_factor),
        node_policy=config.node_policy,
        gpu_policy=config.gpu_policy,
        reserve_attempts=config.reserve_attempts,
        usage_timeout_s=config.usage_timeout_s,
        tracer=telemetry.tracer_for(tracer_provider, "services.scheduler"),
        clock=clock,
        node_cache=node_cache,
    )
    servicer = SchedulerServicer(placer)
    try:
        handle = build_server(
            service_names=[SERVICE_NAME],
            register=lambda server: scheduler_pb2_grpc.add_SchedulerServicer_to_server(
                servicer, server
            ),
            listen_addr=config.common.listen_addr,
            tls=config.common.tls,
            tracer_provider=tracer_provider,
            max_workers=max_workers,
        )
    except BaseException:
        if node_cache is not None:
            node_cache.close()
        recorder.close()
        raise
    if node_cache is not None:
        node_cache.start()
    handle.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    return SchedulerDaemon(config, handle, placer, recorder, tracer_provider, node_cache)


# -- command line ------------------------------------------------------------------------------

# Flag -> environment key it overrides (one to one with SchedulerConfig fields).
_FLAG_ENV = {
    "listen": "LISTEN_ADDR",
    "metrics": "METRICS_ADDR",
    "log_level": "LOG_LEVEL",
    "usage_addr": "USAGE_ADDR",
    "node_policy": "NODE_SCHEDULER_POLICY",
    "gpu_policy": "GPU_SCHEDULER_POLICY",
    "memory_factor": "MEMORY_FACTOR",
    "reserve_attempts": "RESERVE_ATTEMPTS",
    "usage_timeout_ms": "USAGE_TIMEOUT_MS",
    "node_cache": "NODE_CACHE",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami-accounting serve scheduler",
        description="The scheduler daemon: init- and sidecar-aware GPU fit for HAMi's scheduler "
        "extender (gRPC Filter), reserving each placement in the usage recorder. Flags override "
        "the HAMI_ACCOUNTING_* variables.",
    )

    def flag(name: str, key: str, help_text: str, **options: object) -> None:
        parser.add_argument(name, help=f"{help_text} ({env_name(key)})", **options)  # type: ignore[arg-type]

    flag("--listen", "LISTEN_ADDR", "gRPC address; default 127.0.0.1:50052",
         metavar="HOST:PORT")
    flag("--metrics", "METRICS_ADDR", "Prometheus address; default 127.0.0.1:9102",
         metavar="HOST:PORT|off")
    flag("--log-level", "LOG_LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL; default INFO",
         metavar="LEVEL")
    flag("--usage-addr", "USAGE_ADDR", "usage recorder address; default 127.0.0.1:50053",
         metavar="HOST:PORT")
    flag("--node-policy", "NODE_SCHEDULER_POLICY", "node choice; default binpack",
         choices=POLICIES)
    flag("--gpu-policy", "GPU_SCHEDULER_POLICY", "GPU choice within a node; default spread",
         choices=POLICIES)
    flag("--memory-factor", "MEMORY_FACTOR", "HAMi's memoryFactor; default 1", metavar="N")
    flag("--reserve-attempts", "RESERVE_ATTEMPTS",
         "placements tried when another scheduler reserves first; default 3", metavar="N")
    flag("--usage-timeout-ms", "USAGE_TIMEOUT_MS",
         "deadline of every recorder call, milliseconds; default 2000", metavar="MS")
    flag("--node-cache", "NODE_CACHE", "read node usage from a WatchUsage cache (watch) or "
         "directly on every Filter (off); default watch", choices=NODE_CACHE_MODES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the daemon until SIGTERM/SIGINT; returns the process exit code."""
    args = _parser().parse_args(argv)
    env = environment_with_flags(args, _FLAG_ENV, os.environ)
    try:
        config = SchedulerConfig.from_env(env)
    except ConfigError as error:
        print(f"hami-accounting serve scheduler: {error}", file=sys.stderr)
        return 2
    configure_logging("scheduler", config.common.log_level)
    tracer_provider = telemetry.tracer_provider_from_env("scheduler")
    try:
        start_metrics_server(config.common.metrics_addr)
        daemon = start(config, tracer_provider=tracer_provider)
    except (MetricsError, ServerStartError) as error:
        _LOG.error("cannot start the scheduler daemon: %s", error)
        telemetry.shutdown(tracer_provider)
        return 1
    _LOG.info(
        "scheduler daemon serving",
        extra={
            "target": daemon.target,
            "usage_addr": config.usage_addr,
            "node_policy": config.node_policy,
            "gpu_policy": config.gpu_policy,
            "memory_factor": config.memory_factor,
            "reserve_attempts": config.reserve_attempts,
            "node_cache": config.node_cache,
        },
    )
    run_until_signalled(daemon.handle, on_stop=daemon.shutdown_background)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
