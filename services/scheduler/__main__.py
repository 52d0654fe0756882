"""Entry point of the scheduler daemon: ``python -m services.scheduler`` or
``hami-accounting serve scheduler``.

Layer: services/scheduler (runtime). Config -> traced channel to the usage recorder -> pod
placer -> gRPC server (``hami.accounting.v1.Scheduler`` with health and reflection) and, with
``HAMI_ACCOUNTING_EXTENDER_ADDR``, kube-scheduler's extender endpoint over the same placer
(services.scheduler.extender), then serve until SIGTERM/SIGINT. With
``HAMI_ACCOUNTING_NODE_CACHE=watch`` (the default) a node cache fed by WatchUsage, on its own
untraced channel, starts with it. Health: the ``liveness`` service and the overall status are
SERVING from start to stop. The daemon holds no state of its own (the cache is a copy, dropped
whenever its stream ends); an unreachable recorder makes each Filter UNAVAILABLE rather than the
daemon unready, so the extender sees why it was refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import TracerProvider

from accounting.fit import POLICIES
from services.common import metrics, telemetry
from services.common.daemon import (
    RECORDER_SETTING_FLAGS,
    USAGE_ADDR_FLAG,
    DaemonSpec,
    Flag,
    run,
)
from services.common.json_endpoint import EndpointSpec, EndpointStartError, JsonEndpoint
from services.common.kube_api import KUBERNETES_MODES, KubernetesConfigError
from services.common.policy import RecorderPolicy
from services.common.server import ServerHandle, build_service_server, client_channel
from services.scheduler import allocator
from services.scheduler.config import (
    NODE_CACHE_MODES,
    NODE_CACHE_WATCH,
    ExtenderConfig,
    SchedulerConfig,
)
from services.scheduler.extender import FILTER_PATH, MAX_BODY_BYTES, ExtenderFilter
from services.scheduler.extender_args import filter_result
from services.scheduler.metrics import METRICS_SERVICE
from services.scheduler.node_cache import NodeCache
from services.scheduler.placer import PodPlacer
from services.scheduler.recorder_client import RecorderClient
from services.scheduler.servicer import SERVICE_NAME, SchedulerServicer, add_to_server

_LOG = logging.getLogger("services.scheduler")



@dataclass(frozen=True, kw_only=True)
class SchedulerDaemon:
    """A started scheduler daemon; ``stop`` ends its server and its recorder channel."""

    config: SchedulerConfig
    handle: ServerHandle
    placer: PodPlacer
    recorder: RecorderClient
    tracer_provider: TracerProvider | None
    node_cache: NodeCache | None = None
    extender: JsonEndpoint | None = None
    """The kube-scheduler extender endpoint, when configured."""

    @property
    def target(self) -> str:
        """The address a local client dials, e.g. ``127.0.0.1:50052``."""
        return self.handle.target

    def shutdown_background(self) -> None:
        """Stops the node cache, closes the recorder channel and flushes traces (after the gRPC
        server stopped)."""
        if self.extender is not None:
            self.extender.stop()
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
        EndpointStartError: the extender's address cannot be bound or its certificate read.
        KubernetesConfigError: the extender's Kubernetes configuration cannot be loaded.
    """
    allocator.keep_large_blocks_on_the_heap()
    channel = client_channel(
        config.usage_addr, tls=config.common.tls, tracer_provider=tracer_provider
    )
    # The recorder's accounting policy, kept by every read of the recorder and each watch stream.
    policy = RecorderPolicy(channel, config.usage_addr, service=METRICS_SERVICE)
    recorder = RecorderClient(channel, config.usage_addr, policy=policy)
    node_cache: NodeCache | None = None
    if config.node_cache == NODE_CACHE_WATCH:
        # Untraced: one span for a stream that lives for minutes would say nothing.
        watch_channel = client_channel(config.usage_addr, tls=config.common.tls)
        node_cache = NodeCache(recorder, watch_channel)
    placer = PodPlacer(
        recorder,
        node_policy=config.node_policy,
        gpu_policy=config.gpu_policy,
        reserve_attempts=config.reserve_attempts,
        usage_timeout_s=config.usage_timeout_s,
        tracer=telemetry.tracer_for(tracer_provider, "services.scheduler"),
        clock=clock,
        node_cache=node_cache,
    )
    servicer = SchedulerServicer(placer)
    extender: JsonEndpoint | None = None
    try:
        if config.extender is not None:
            extender = _start_extender(config, config.extender, placer, recorder,
                                       tracer_provider)
        handle = build_service_server(
            config.common,
            SERVICE_NAME,
            lambda server: add_to_server(servicer, server),
            tracer_provider=tracer_provider,
            max_workers=max_workers,
        )
    except BaseException:
        if extender is not None:
            extender.stop()
        if node_cache is not None:
            node_cache.close()
        recorder.close()
        raise
    if node_cache is not None:
        node_cache.start()
        cache = node_cache
        metrics.bind_cache_synced(METRICS_SERVICE, lambda: cache.complete)
    return SchedulerDaemon(
        config=config,
        handle=handle,
        placer=placer,
        recorder=recorder,
        tracer_provider=tracer_provider,
        node_cache=node_cache,
        extender=extender,
    )


def _start_extender(
    config: SchedulerConfig,
    settings: ExtenderConfig,
    placer: PodPlacer,
    recorder: RecorderClient,
    tracer_provider: TracerProvider | None,
) -> JsonEndpoint:
    # Imported here: the Kubernetes client is slow to import, and only the extender uses it.
    from services.scheduler.pod_annotations import PodAnnotationWriter

    api_client = config.kubernetes.api_client()
    assert api_client is not None  # the config refuses an extender without Kubernetes
    answer = ExtenderFilter(
        placer,
        recorder,
        PodAnnotationWriter(api_client),
        policy=recorder.policy,
        node_policy=config.node_policy,
        gpu_policy=config.gpu_policy,
        deadline_s=settings.deadline_ms / 1000,
        tracer=telemetry.tracer_for(tracer_provider, "services.scheduler"),
    )
    spec = EndpointSpec(
        name="extender",
        routes={FILTER_PATH: answer.answer},
        max_body_bytes=MAX_BODY_BYTES,
        error_body=lambda _status, message: filter_result(error=message),
        server_version="hami-accounting-scheduler",
    )
    endpoint = JsonEndpoint(settings.addr, spec, tls=settings.tls)
    _LOG.info("kube-scheduler extender listening",
              extra={"extender_url": endpoint.url(FILTER_PATH),
                     "mutual_tls": bool(settings.tls and settings.tls.client_ca_file),
                     "deadline_ms": settings.deadline_ms})
    return endpoint


# -- command line ------------------------------------------------------------------------------

SPEC: DaemonSpec[SchedulerConfig, SchedulerDaemon] = DaemonSpec(
    name="scheduler",
    description="The scheduler daemon: init- and sidecar-aware GPU fit for HAMi's scheduler "
    "extender (gRPC Filter) or, beside HAMi as released, for kube-scheduler itself (the "
    "extender protocol's POST /filter), reserving each placement in the usage recorder, under "
    "the recorder's accounting policy.",
    flags=(
        USAGE_ADDR_FLAG,
        Flag("--node-policy", "NODE_SCHEDULER_POLICY", "node choice; default binpack",
             {"choices": POLICIES}),
        Flag("--gpu-policy", "GPU_SCHEDULER_POLICY", "GPU choice within a node; default spread",
             {"choices": POLICIES}),
        Flag("--reserve-attempts", "RESERVE_ATTEMPTS",
             "placements tried when another scheduler reserves first; default 3",
             {"metavar": "N"}),
        Flag("--usage-timeout-ms", "USAGE_TIMEOUT_MS",
             "deadline of every recorder call, milliseconds; default 2000", {"metavar": "MS"}),
        Flag("--node-cache", "NODE_CACHE", "read node usage from a WatchUsage cache (watch) or "
             "directly on every Filter (off); default watch", {"choices": NODE_CACHE_MODES}),
        Flag("--extender-addr", "EXTENDER_ADDR", "serve kube-scheduler's extender protocol "
             "(POST /filter) on this address; default off", {"metavar": "HOST:PORT"}),
        Flag("--extender-cert-file", "EXTENDER_CERT_FILE", "PEM certificate of the extender "
             "(HTTPS); plain HTTP without", {"metavar": "FILE"}),
        Flag("--extender-key-file", "EXTENDER_KEY_FILE", "PEM private key of the extender",
             {"metavar": "FILE"}),
        Flag("--extender-client-ca-file", "EXTENDER_CLIENT_CA_FILE", "require client "
             "certificates signed by this CA (mutual TLS)", {"metavar": "FILE"}),
        Flag("--extender-deadline-ms", "EXTENDER_DEADLINE_MS", "answer every extender request "
             "within this; default 4000", {"metavar": "MS"}),
        Flag("--kubernetes", "KUBERNETES", "the Kubernetes API the extender annotates pods "
             "through; default off", {"choices": KUBERNETES_MODES}),
        Flag("--kubeconfig", "KUBECONFIG", "kubeconfig for --kubernetes kubeconfig (or "
             "KUBECONFIG)", {"metavar": "FILE"}),
        *RECORDER_SETTING_FLAGS,
    ),
    read_config=SchedulerConfig.from_env,
    start=lambda config, tracer_provider: start(config, tracer_provider=tracer_provider),
    serving_fields=lambda config, daemon: {
        "usage_addr": config.usage_addr,
        "node_policy": config.node_policy,
        "gpu_policy": config.gpu_policy,
        "reserve_attempts": config.reserve_attempts,
        "node_cache": config.node_cache,
        "extender_url": daemon.extender.url(FILTER_PATH) if daemon.extender else None,
    },
    start_errors=(EndpointStartError, KubernetesConfigError),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the daemon until SIGTERM/SIGINT; returns the process exit code."""
    return run(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
