"""Entry point of the admission daemon: ``python -m services.admission`` or
``hami-accounting serve admission``.

Layer: services/admission (runtime). Config -> usage source -> quota checker -> gRPC server
(``hami.accounting.v1.Admission`` with health and reflection) -> optional AdmissionReview
endpoint, then serve until SIGTERM/SIGINT. Health: the ``liveness`` service and the overall
status are SERVING from start to stop. The daemon is stateless; an unreachable recorder makes
each check UNAVAILABLE rather than the daemon unready, so callers see why they were refused.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from grpc_health.v1 import health_pb2
from opentelemetry.sdk.trace import TracerProvider

from accounting.model import VendorResources
from hami.accounting.v1 import admission_pb2_grpc
from services.admission.config import USAGE_CACHE_MODES, USAGE_CACHE_WATCH, AdmissionConfig
from services.admission.servicer import SERVICE_NAME, AdmissionServicer, QuotaChecker
from services.admission.usage_source import (
    RecorderUsageSource,
    UsageSource,
    WatchedUsageSource,
)
from services.admission.webhook import WebhookServer, WebhookStartError
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

_LOG = logging.getLogger("services.admission")

LIVENESS_SERVICE = "liveness"
"""Health service name of the liveness probe: SERVING while the process runs."""


@dataclass
class AdmissionDaemon:
    """A started admission daemon; ``stop`` ends its server, webhook and usage source."""

    config: AdmissionConfig
    handle: ServerHandle
    checker: QuotaChecker
    usage: UsageSource
    webhook: WebhookServer | None
    tracer_provider: TracerProvider | None

    @property
    def target(self) -> str:
        """The address a local client dials, e.g. ``127.0.0.1:50051``."""
        return self.handle.target

    def shutdown_background(self) -> None:
        """Stops the webhook and the usage source, flushes traces (after the gRPC server)."""
        if self.webhook is not None:
            self.webhook.stop()
        self.usage.close()
        telemetry.shutdown(self.tracer_provider)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stops everything (tests; ``main`` stops through ``run_until_signalled``)."""
        self.handle.stop(grace_s)
        self.shutdown_background()


def make_usage_source(
    config: AdmissionConfig, tracer_provider: TracerProvider | None = None
) -> UsageSource:
    """The recorder client the config asks for (direct reads, or the watch cache)."""
    channel = client_channel(
        config.usage_addr, tls=config.common.tls, tracer_provider=tracer_provider
    )
    direct = RecorderUsageSource(channel, config.usage_addr)
    if config.usage_cache != USAGE_CACHE_WATCH:
        return direct
    # Untraced: one long-lived stream per minute would only add noise to the traces.
    watch_channel = client_channel(config.usage_addr, tls=config.common.tls)
    return WatchedUsageSource(direct, watch_channel).start()


def start(
    config: AdmissionConfig,
    *,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
) -> AdmissionDaemon:
    """Starts the gRPC server and, when configured, the AdmissionReview endpoint.

    Raises:
        ServerStartError: the gRPC address cannot be bound.
        WebhookStartError: the webhook address cannot be bound or its certificate read.
    """
    usage = make_usage_source(config, tracer_provider)
    checker = QuotaChecker(
        usage,
        vendor=VendorResources(memory_factor=config.memory_factor),
        enforce_gpu_count=config.enforce_gpu_count,
        tracer=telemetry.tracer_for(tracer_provider, "services.admission"),
    )
    servicer = AdmissionServicer(checker)
    try:
        handle = build_server(
            service_names=[SERVICE_NAME],
            register=lambda server: admission_pb2_grpc.add_AdmissionServicer_to_server(
                servicer, server
            ),
            listen_addr=config.common.listen_addr,
            tls=config.common.tls,
            tracer_provider=tracer_provider,
            max_workers=max_workers,
        )
    except BaseException:
        usage.close()
        raise
    handle.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    webhook: WebhookServer | None = None
    if config.webhook_addr is not None:
        assert config.webhook_cert_file is not None and config.webhook_key_file is not None
        try:
            webhook = WebhookServer(
                config.webhook_addr, config.webhook_cert_file, config.webhook_key_file, checker
            )
        except BaseException:
            handle.stop(0)
            usage.close()
            raise
    else:
        _LOG.info(
            "AdmissionReview endpoint disabled: set %s and %s to serve it",
            env_name("WEBHOOK_CERT_FILE"),
            env_name("WEBHOOK_KEY_FILE"),
        )
    return AdmissionDaemon(config, handle, checker, usage, webhook, tracer_provider)


# -- command line ------------------------------------------------------------------------------

# Flag -> environment key it overrides (one to one with AdmissionConfig fields).
_FLAG_ENV = {
    "listen": "LISTEN_ADDR",
    "metrics": "METRICS_ADDR",
    "log_level": "LOG_LEVEL",
    "usage_addr": "USAGE_ADDR",
    "memory_factor": "MEMORY_FACTOR",
    "enforce_gpu_count": "ENFORCE_GPU_COUNT",
    "usage_cache": "USAGE_CACHE",
    "webhook_addr": "WEBHOOK_ADDR",
    "webhook_cert_file": "WEBHOOK_CERT_FILE",
    "webhook_key_file": "WEBHOOK_KEY_FILE",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami-accounting serve admission",
        description="The admission daemon: init- and sidecar-aware namespace GPU quota check "
        "(gRPC CheckQuota, optionally a Kubernetes AdmissionReview endpoint). Flags override "
        "the HAMI_ACCOUNTING_* variables.",
    )

    def flag(name: str, key: str, help_text: str, **options: object) -> None:
        parser.add_argument(name, help=f"{help_text} ({env_name(key)})", **options)  # type: ignore[arg-type]

    flag("--listen", "LISTEN_ADDR", "gRPC address; default 127.0.0.1:50051",
         metavar="HOST:PORT")
    flag("--metrics", "METRICS_ADDR", "Prometheus address; default 127.0.0.1:9101",
         metavar="HOST:PORT|off")
    flag("--log-level", "LOG_LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL; default INFO",
         metavar="LEVEL")
    flag("--usage-addr", "USAGE_ADDR", "usage recorder address; default 127.0.0.1:50053",
         metavar="HOST:PORT")
    flag("--memory-factor", "MEMORY_FACTOR", "HAMi's memoryFactor; default 1", metavar="N")
    flag("--enforce-gpu-count", "ENFORCE_GPU_COUNT",
         "enforce limits.nvidia.com/gpu where set; default true", metavar="true|false")
    flag("--usage-cache", "USAGE_CACHE", "read usage from a WatchUsage cache (watch) or "
         "directly for every check (off); default watch", choices=USAGE_CACHE_MODES)
    flag("--webhook-addr", "WEBHOOK_ADDR",
         "AdmissionReview HTTPS address; default 0.0.0.0:8443 when a certificate is given",
         metavar="HOST:PORT")
    flag("--webhook-cert-file", "WEBHOOK_CERT_FILE", "PEM serving certificate of the webhook",
         metavar="FILE")
    flag("--webhook-key-file", "WEBHOOK_KEY_FILE", "PEM private key of the webhook",
         metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the daemon until SIGTERM/SIGINT; returns the process exit code."""
    args = _parser().parse_args(argv)
    env = environment_with_flags(args, _FLAG_ENV, os.environ)
    try:
        config = AdmissionConfig.from_env(env)
    except ConfigError as error:
        print(f"hami-accounting serve admission: {error}", file=sys.stderr)
        return 2
    configure_logging("admission", config.common.log_level)
    tracer_provider = telemetry.tracer_provider_from_env("admission")
    try:
        start_metrics_server(config.common.metrics_addr)
        daemon = start(config, tracer_provider=tracer_provider)
    except (MetricsError, ServerStartError, WebhookStartError) as error:
        _LOG.error("cannot start the admission daemon: %s", error)
        telemetry.shutdown(tracer_provider)
        return 1
    _LOG.info(
        "admission daemon serving",
        extra={
            "target": daemon.target,
            "usage_addr": config.usage_addr,
            "usage_cache": config.usage_cache,
            "memory_factor": config.memory_factor,
            "enforce_gpu_count": config.enforce_gpu_count,
            "webhook_url": daemon.webhook.url if daemon.webhook else None,
        },
    )
    run_until_signalled(daemon.handle, on_stop=daemon.shutdown_background)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
