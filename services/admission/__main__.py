"""Entry point of the admission daemon: ``python -m services.admission`` or
``hami-accounting serve admission``.

Layer: services/admission (runtime). Config -> usage source -> quota checker -> gRPC server
(``hami.accounting.v1.Admission`` with health and reflection) -> optional AdmissionReview
endpoint, then serve until SIGTERM/SIGINT. Health: the ``liveness`` service and the overall
status are SERVING from start to stop. The daemon is stateless; an unreachable recorder makes
each check UNAVAILABLE rather than the daemon unready, so callers see why they were refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import TracerProvider

from hami.accounting.v1 import admission_pb2_grpc
from services.admission.config import USAGE_CACHE_MODES, USAGE_CACHE_WATCH, AdmissionConfig
from services.admission.servicer import (
    METRICS_SERVICE,
    SERVICE_NAME,
    AdmissionServicer,
    QuotaChecker,
)
from services.admission.usage_source import (
    RecorderUsageSource,
    UsageSource,
    WatchedUsageSource,
)
from services.admission.webhook import WebhookServer, WebhookStartError
from services.common import metrics, telemetry
from services.common.config import env_name
from services.common.daemon import (
    RECORDER_SETTING_FLAGS,
    USAGE_ADDR_FLAG,
    DaemonSpec,
    Flag,
    run,
)
from services.common.policy import RecorderPolicy
from services.common.server import ServerHandle, build_service_server, client_channel

_LOG = logging.getLogger("services.admission")



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
) -> tuple[UsageSource, RecorderPolicy]:
    """The recorder client the config asks for (direct reads, or the watch cache), and the
    recorder's accounting policy as every read of it keeps it."""
    channel = client_channel(
        config.usage_addr, tls=config.common.tls, tracer_provider=tracer_provider
    )
    policy = RecorderPolicy(channel, config.usage_addr, service=METRICS_SERVICE)
    direct = RecorderUsageSource(channel, config.usage_addr, policy=policy)
    if config.usage_cache != USAGE_CACHE_WATCH:
        return direct, policy
    # Untraced: one long-lived stream per minute would only add noise to the traces.
    watch_channel = client_channel(config.usage_addr, tls=config.common.tls)
    watched = WatchedUsageSource(direct, watch_channel, policy=policy).start()
    metrics.bind_cache_synced(METRICS_SERVICE, lambda: watched.complete)
    return watched, policy


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
    usage, policy = make_usage_source(config, tracer_provider)
    checker = QuotaChecker(
        usage, policy=policy, tracer=telemetry.tracer_for(tracer_provider, "services.admission")
    )
    servicer = AdmissionServicer(checker)
    try:
        handle = build_service_server(
            config.common,
            SERVICE_NAME,
            lambda server: admission_pb2_grpc.add_AdmissionServicer_to_server(servicer, server),
            tracer_provider=tracer_provider,
            max_workers=max_workers,
        )
    except BaseException:
        usage.close()
        raise
    webhook: WebhookServer | None = None
    if config.webhook_addr is not None:
        assert config.webhook_cert_file is not None and config.webhook_key_file is not None
        try:
            webhook = WebhookServer(
                config.webhook_addr,
                config.webhook_cert_file,
                config.webhook_key_file,
                checker,
                annotation_writers=config.annotation_writers,
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

SPEC: DaemonSpec[AdmissionConfig, AdmissionDaemon] = DaemonSpec(
    name="admission",
    description="The admission daemon: init- and sidecar-aware namespace GPU quota check "
    "(gRPC CheckQuota, optionally a Kubernetes AdmissionReview endpoint), under the usage "
    "recorder's accounting policy.",
    flags=(
        USAGE_ADDR_FLAG,
        Flag("--usage-cache", "USAGE_CACHE", "read usage from a WatchUsage cache (watch) or "
             "directly for every check (off); default watch", {"choices": USAGE_CACHE_MODES}),
        Flag("--webhook-addr", "WEBHOOK_ADDR",
             "AdmissionReview HTTPS address; default 0.0.0.0:8443 when a certificate is given",
             {"metavar": "HOST:PORT"}),
        Flag("--webhook-cert-file", "WEBHOOK_CERT_FILE", "PEM serving certificate of the webhook",
             {"metavar": "FILE"}),
        Flag("--webhook-key-file", "WEBHOOK_KEY_FILE", "PEM private key of the webhook",
             {"metavar": "FILE"}),
        Flag("--annotation-writers", "ANNOTATION_WRITERS",
             "comma-separated user names whose pod updates may change the scheduler-owned "
             "annotations; default HAMi's scheduler and device plugin and our scheduler",
             {"metavar": "USERS"}),
        *RECORDER_SETTING_FLAGS,
    ),
    read_config=AdmissionConfig.from_env,
    start=lambda config, tracer_provider: start(config, tracer_provider=tracer_provider),
    serving_fields=lambda config, daemon: {
        "usage_addr": config.usage_addr,
        "usage_cache": config.usage_cache,
        "webhook_url": daemon.webhook.url if daemon.webhook else None,
    },
    start_errors=(WebhookStartError,),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the daemon until SIGTERM/SIGINT; returns the process exit code."""
    return run(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
