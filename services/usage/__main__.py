"""Entry point of the usage recorder: ``python -m services.usage`` or
``hami-accounting serve usage``.

Layer: services/usage (runtime). Config -> journal -> recovery -> store -> server (grpc.aio:
WatchUsage streams and health on its event loop, unary calls on a thread pool;
``services.common.server.event_loop``), then the optional Kubernetes source and leader election.
Health: the ``liveness`` service (set by the server builder) is SERVING from start to stop;
the overall status ("" and the UsageRecorder service) is SERVING once this replica may be
trusted with writes — at once when running stand-alone, after the first Kubernetes sync with a
source, and only while leading with leader election. The ``readiness`` service, which the
readiness probe asks, is the overall status, and with leader election also SERVING on a
standby in contact with the Lease: both replicas count as healthy for a PodDisruptionBudget,
so a drain may evict the leader (the standby takes over), while the recorder's Service sends
calls to the pod carrying the leader label, set while this replica leads and is synced
(services/usage/leader_label.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import TracerProvider

from accounting.ledger import Ledger
from services.common import metrics, telemetry
from services.common.daemon import DaemonSpec, Flag, run
from services.common.kube_api import KUBERNETES_MODES, api_client_from_mode
from services.common.server import ServerHandle, UnaryCalls, build_aio_server
from services.usage import metrics as usage_metrics
from services.usage.config import UsageConfig
from services.usage.journal import (
    EXIT_JOURNAL_DAMAGED,
    ON_DAMAGE_ACCEPT_LOSS,
    ON_DAMAGE_REBUILD,
    Journal,
    JournalDamagedError,
    JournalError,
)
from services.usage.scrape import RecorderScrape
from services.usage.servicer import (
    INLINE_METHODS,
    SERVICE_NAME,
    UsageRecorderServicer,
    add_to_server,
)
from services.usage.store import UsageStore
from services.usage.store_metrics import SERVICE
from services.usage.watch_hub import DEFAULT_MAX_LAG_EVENTS, WatchHub

if TYPE_CHECKING:
    from services.usage.k8s import ApiClient, KubernetesSource
    from services.usage.leader import LeaderElector
    from services.usage.leader_label import LeaderLabel

_LOG = logging.getLogger("services.usage")

READINESS_SERVICE = "readiness"
"""The health service the recorder's readiness probe asks (see the module's docstring)."""


class _Readiness:
    """Overall health = synced with Kubernetes (when a source runs) and leading (when electing);
    readiness = that, or a standby in contact with the Lease; the leader label follows the
    overall health."""

    def __init__(self, handle: ServerHandle, *, needs_sync: bool, needs_leader: bool) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._synced = not needs_sync
        self._leading = not needs_leader
        self._standby = needs_leader
        self._in_contact = False
        self._label: LeaderLabel | None = None
        with self._lock:
            self._apply()

    def bind_label(self, label: LeaderLabel) -> None:
        with self._lock:
            self._label = label
            self._apply()

    def set_in_contact(self, in_contact: bool) -> None:
        with self._lock:
            self._in_contact = in_contact
            self._apply()

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._synced and self._leading

    def set_synced(self, synced: bool) -> None:
        with self._lock:
            self._synced = synced
            self._apply()

    def set_leading(self, leading: bool) -> None:
        with self._lock:
            self._leading = leading
            self._apply()

    def _apply(self) -> None:
        serving = self._synced and self._leading
        if not self._handle.stopped:
            self._handle.set_serving(serving)
            # A leader still listing the cluster is not ready (the standby it was is): should
            # the Service select it early, it sends it nothing until it is synced.
            standing_by = self._standby and not self._leading and self._in_contact
            self._handle.set_health(READINESS_SERVICE, serving or standing_by)
        if self._label is not None:
            self._label.want(serving)


class LeaderView:
    """The servicer's view of the leader elector, bound once the elector exists (the elector
    needs the recorder's callbacks, and the recorder needs the server the servicer lives in).

    ``leader_identity`` reads the Lease's holder when a write reaches a standby, cached briefly
    so a burst of misdirected writes costs one API call.
    """

    HOLDER_CACHE_S = 2.0

    def __init__(self, holder_lookup: Callable[[], str | None]) -> None:
        self._elector: LeaderElector | None = None
        self._holder_lookup = holder_lookup
        self._lock = threading.Lock()
        self._holder: tuple[float, str | None] = (float("-inf"), None)

    def bind(self, elector: LeaderElector) -> None:
        self._elector = elector

    @property
    def is_leader(self) -> bool:
        return self._elector is not None and self._elector.is_leader

    @property
    def identity(self) -> str:
        return self._elector.identity if self._elector is not None else ""

    @property
    def leader_identity(self) -> str | None:
        with self._lock:
            read_at, holder = self._holder
            if time.monotonic() - read_at < self.HOLDER_CACHE_S:
                return holder
        try:
            holder = self._holder_lookup() or None
        except Exception as error:
            # Refusing the write is what matters; naming the leader is a courtesy.
            _LOG.warning("cannot read the leader Lease: %s", error)
            holder = None
        with self._lock:
            self._holder = (time.monotonic(), holder)
        return holder


def _lease_holder_lookup(client: ApiClient, namespace: str, name: str) -> Callable[[], str | None]:
    from services.usage.k8s import LeaseClient

    leases = LeaseClient(client, request_timeout_s=2.0)

    def lookup() -> str | None:
        record = leases.get(namespace, name)
        return record.holder_identity if record is not None else None

    return lookup


@dataclass
class UsageRecorder:
    """A started recorder: its server, store and background parts; ``stop`` ends them all."""

    config: UsageConfig
    handle: ServerHandle
    store: UsageStore
    journal: Journal
    tracer_provider: TracerProvider | None
    readiness: _Readiness
    servicer: UsageRecorderServicer
    elector: LeaderElector | None = None
    label: LeaderLabel | None = None
    source_factory: Callable[[], KubernetesSource] | None = None
    _source: KubernetesSource | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _shutting_down: bool = False

    @property
    def target(self) -> str:
        """The address a local client dials, e.g. ``127.0.0.1:50053``."""
        return self.handle.target

    def start_source(self) -> None:
        """Starts a fresh Kubernetes source (at start, or when this replica becomes leader)."""
        if self.source_factory is None:
            return
        with self._lock:
            if self._source is not None:
                return
            # A new source each time: its first list reconciles the store against the cluster
            # and reports the sync again.
            source = self._source = self.source_factory()
        source.start()

    def stop_source(self) -> None:
        with self._lock:
            source, self._source = self._source, None
        if source is not None:
            source.stop()

    def on_started_leading(self) -> None:
        _LOG.info("became leader; listing the cluster", extra={"identity": self.config.identity})
        self.readiness.set_leading(True)
        # The elector's callback must return quickly; listing happens on the source's threads.
        self.start_source()

    def on_stopped_leading(self) -> None:
        _LOG.warning("lost leadership; standing by", extra={"identity": self.config.identity})
        self.readiness.set_leading(False)
        self.readiness.set_synced(False)
        if self._shutting_down:
            # Called from elector.stop() at shutdown: the journal closes right after, so the
            # source must be fully stopped first.
            self.stop_source()
        else:
            threading.Thread(target=self.stop_source, name="stop-k8s-source", daemon=True).start()

    def shutdown_background(self) -> None:
        """Stops election and source, ends watch streams, closes the journal, flushes traces
        (after the gRPC server has stopped)."""
        self._shutting_down = True
        if self.label is not None:
            # Off the Service before the Lease goes: no call reaches a recorder that stops.
            self.label.stop()
        if self.elector is not None:
            self.elector.stop()
        self.stop_source()
        self.store.close_watchers()
        self.servicer.close()
        self.journal.close()
        telemetry.shutdown(self.tracer_provider)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stops everything (tests; ``main`` stops through ``run_until_signalled``)."""
        self.store.close_watchers()
        self.handle.stop(grace_s)
        self.shutdown_background()


def start(
    config: UsageConfig,
    *,
    tracer_provider: TracerProvider | None = None,
    max_workers: int = 16,
    max_watch_events: int = DEFAULT_MAX_LAG_EVENTS,
) -> UsageRecorder:
    """Opens the journal, recovers the state, and starts the server and background parts.

    Raises:
        JournalDamagedError: the journal is damaged or incomplete and the config says refuse.
        JournalError: the journal cannot be opened or read (schema version included).
        ServerStartError: the listen address cannot be bound.
        KubernetesConfigError: the Kubernetes configuration cannot be loaded.
    """
    policy = config.policy
    # The WatchUsage fan-out gives way to the unary calls in flight (services.usage.watch_hub).
    unary_calls = UnaryCalls()
    journal = Journal.in_data_dir(config.data_dir, synchronous=config.journal_sync, lock=True)
    try:
        store = UsageStore(
            Ledger(policy),
            journal,
            tracer=telemetry.tracer_for(tracer_provider, "services.usage"),
            hub=WatchHub(
                max_streams=config.max_watch_streams,
                max_lag_events=max_watch_events,
                unary_calls=unary_calls,
            ),
        )
        summary = store.recover(config.journal_on_damage)
        _LOG.info(
            "recovered %d pods, %d nodes and %d namespaces from %s in %.3f s",
            summary.pods,
            summary.nodes,
            summary.namespaces,
            journal.path,
            summary.seconds,
            extra={
                "pods": summary.pods,
                "nodes": summary.nodes,
                "namespaces": summary.namespaces,
                "revision": summary.revision,
                "recovery_s": round(summary.seconds, 3),
            },
        )
        api_client = None
        if config.kubernetes_enabled:
            kubeconfig = str(config.kubeconfig) if config.kubeconfig else None
            api_client = api_client_from_mode(config.kubernetes, kubeconfig)
        leader_view = (
            LeaderView(_lease_holder_lookup(api_client, config.lease_namespace, config.lease_name))
            if config.leader_election and api_client is not None
            else None
        )
        servicer = UsageRecorderServicer(store, leader=leader_view)
        handle = build_aio_server(
            service_names=[SERVICE_NAME],
            register=lambda server: add_to_server(servicer, server),
            listen_addr=config.common.listen_addr,
            tls=config.common.tls,
            tracer_provider=tracer_provider,
            max_workers=max_workers,
            serving=api_client is None,
            unary_calls=unary_calls,
            inline_methods=INLINE_METHODS,
            inline_unless=servicer.must_not_run_inline,
        )
    except BaseException:
        journal.close()
        raise
    metrics.publish_policy(SERVICE, policy)
    readiness = _Readiness(
        handle, needs_sync=api_client is not None, needs_leader=leader_view is not None
    )
    store.set_synced_callback(readiness.set_synced)
    _serve_metrics(store, leader_view, needs_sync=api_client is not None,
                   legacy_hami_metrics=config.hami_legacy_metrics)
    recorder = UsageRecorder(
        config=config,
        handle=handle,
        store=store,
        journal=journal,
        tracer_provider=tracer_provider,
        readiness=readiness,
        servicer=servicer,
    )
    if api_client is not None:
        try:
            _start_kubernetes(recorder, api_client, leader_view)
        except BaseException:
            recorder.stop(grace_s=0)
            raise
    return recorder


def _serve_metrics(
    store: UsageStore,
    leader_view: LeaderView | None,
    *,
    needs_sync: bool,
    legacy_hami_metrics: bool,
) -> None:
    """Points this process's /metrics at this recorder: its scrape-time families (while it
    leads), its leadership, sync and WatchUsage gauges (the last recorder started in a process
    wins)."""
    is_leader = (lambda: leader_view.is_leader) if leader_view is not None else (lambda: True)
    metrics.set_scrape_text(
        RecorderScrape(store, legacy_hami_metrics=legacy_hami_metrics, leading=is_leader).render
    )
    usage_metrics.bind_recorder(
        is_leader=is_leader,
        open_streams=lambda: store.hub.open_streams,
        lag_events=lambda: store.hub.furthest_behind_events,
    )
    metrics.bind_cache_synced(SERVICE, (lambda: store.synced) if needs_sync else (lambda: True))


def _start_kubernetes(
    recorder: UsageRecorder, client: ApiClient, leader_view: LeaderView | None
) -> None:
    from services.usage.k8s import KubernetesSource

    config = recorder.config
    store = recorder.store
    recorder.source_factory = lambda: KubernetesSource(client, store, policy=store.policy)
    if leader_view is None:
        recorder.start_source()
        return
    from services.usage.k8s_pod_label import PodLabelClient
    from services.usage.leader import LeaderElector
    from services.usage.leader_label import LeaderLabel

    # The identity is the pod's name (HAMI_ACCOUNTING_POD_NAME), in the Lease's namespace.
    label = LeaderLabel(
        PodLabelClient(client, config.lease_namespace),
        config.identity,
        holder=lambda: recorder.elector.holder if recorder.elector is not None else None,
    )
    recorder.label = label
    label.start()
    recorder.readiness.bind_label(label)
    elector = LeaderElector(
        client,
        config.lease_namespace,
        config.lease_name,
        config.identity,
        on_started_leading=recorder.on_started_leading,
        on_stopped_leading=recorder.on_stopped_leading,
        on_contact_changed=recorder.readiness.set_in_contact,
    )
    leader_view.bind(elector)
    recorder.elector = elector
    elector.start()


# -- command line ------------------------------------------------------------------------------

SPEC: DaemonSpec[UsageConfig, UsageRecorder] = DaemonSpec(
    name="usage",
    description="The usage recorder: stored GPU usage per pod, node and namespace, journaled to "
    "SQLite, and the accounting policy every daemon answers under.",
    flags=(
        Flag("--data-dir", "DATA_DIR", "journal directory; default ./data", {"metavar": "DIR"}),
        Flag("--kubernetes", "KUBERNETES", "Kubernetes source; default off",
             {"choices": KUBERNETES_MODES}),
        Flag("--kubeconfig", "KUBECONFIG", "kubeconfig for --kubernetes kubeconfig (or "
             "KUBECONFIG)", {"metavar": "FILE"}),
        Flag("--memory-factor", "MEMORY_FACTOR", "HAMi's memoryFactor, for every daemon; "
             "default 1", {"metavar": "N"}),
        Flag("--enforce-gpu-count", "ENFORCE_GPU_COUNT", "enforce limits.nvidia.com/gpu where "
             "set, in every daemon; default true", {"metavar": "true|false"}),
        Flag("--accept-journal-loss", "JOURNAL_ON_DAMAGE", "when the journal is damaged or "
             "incomplete, keep what is readable and log what was lost (=accept-loss); default: "
             "refuse to start, exit 3",
             {"action": "store_const", "const": ON_DAMAGE_ACCEPT_LOSS}),
        Flag("--rebuild-from-kubernetes", "JOURNAL_ON_DAMAGE", "when the journal is damaged or "
             "incomplete, set it aside and start empty for the Kubernetes re-list to rebuild "
             "(=rebuild-from-kubernetes)",
             {"action": "store_const", "const": ON_DAMAGE_REBUILD}),
        Flag("--hami-legacy-metrics", "HAMI_LEGACY_METRICS", "also serve HAMi's pre-2.8 metric "
             "names (HAMi's --legacy-metrics); default false", {"metavar": "true|false"}),
        Flag("--vendors", "VENDORS", "vendors accounted, for every daemon: keywords of the "
             "vendor table, default (HAMi's chart: all but Ascend and Iluvatar) or all; "
             "default default", {"metavar": "LIST"}),
    ),
    read_config=UsageConfig.from_env,
    start=lambda config, tracer_provider: start(config, tracer_provider=tracer_provider),
    serving_fields=lambda config, recorder: {
        "data_dir": str(config.data_dir),
        "kubernetes": config.kubernetes,
        "leader_election": config.leader_election,
        "policy_id": recorder.store.policy.policy_id,
        "policy": recorder.store.policy.describe(),
    },
    start_errors=(JournalError,),
    exit_codes=((JournalDamagedError, EXIT_JOURNAL_DAMAGED),),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the recorder until SIGTERM/SIGINT; returns the process exit code."""
    return run(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
