"""Fixtures of the scheduler tests: a real usage recorder and real scheduler servers, all on
127.0.0.1:0 in this process, with the spans each of them finished."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from accounting.kube import pod_json as kube_pod_parser
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.common import convert as common_convert
from services.common.config import CommonConfig
from services.common.server import ServerHandle, build_server
from services.scheduler.__main__ import SchedulerDaemon
from services.scheduler.__main__ import start as start_scheduler_daemon
from services.scheduler.config import SchedulerConfig
from services.scheduler.node_cache import NodeCache
from services.scheduler.placer import PodPlacer
from services.scheduler.servicer import SERVICE_NAME, SchedulerServicer, add_to_server
from services.usage.__main__ import UsageRecorder
from services.usage.__main__ import start as start_usage_recorder
from services.usage.config import UsageConfig
from tests.support.pods import kube_node, kube_pod, to_json

RPC_TIMEOUT_S = 10.0
FIXED_UNIX_S = 1767225600
"""The scheduler's clock in these tests (2026-01-01T00:00:00Z): hami.io/vgpu-time."""
NS = "team-a"

Json = dict[str, Any]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def local_common() -> CommonConfig:
    return CommonConfig(listen_addr="127.0.0.1:0", metrics_addr=None, tls=None, log_level="INFO")


@dataclass
class Recorder:
    """A usage recorder started in this process, with a client."""

    app: UsageRecorder
    channel: grpc.Channel
    stub: usage_pb2_grpc.UsageRecorderStub
    spans: InMemorySpanExporter

    @property
    def target(self) -> str:
        return self.app.target

    def stop(self) -> None:
        self.channel.close()
        self.app.stop(grace_s=0)

    # -- seeding ---------------------------------------------------------------------------

    def register_node(self, name: str, gpus: Sequence[Json]) -> None:
        self.stub.RegisterNode(
            usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(kube_node(name, gpus))),
            timeout=RPC_TIMEOUT_S,
        )

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> None:
        self.stub.SetQuota(
            usage_pb2.SetQuotaRequest(namespace=namespace, limits=dict(limits)),
            timeout=RPC_TIMEOUT_S,
        )

    def record(self, pod: Json) -> usage_pb2.RecordPodResponse:
        """RecordPod, as HAMi's informer reports a bound pod (allocation + vgpu-node)."""
        response: usage_pb2.RecordPodResponse = self.stub.RecordPod(
            usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)), timeout=RPC_TIMEOUT_S
        )
        assert response.tracked, response
        return response

    # -- reading back ----------------------------------------------------------------------

    def devices(self, node: str) -> dict[str, types_pb2.DeviceState]:
        response = self.stub.GetNodeUsage(
            usage_pb2.GetNodeUsageRequest(node_names=[node]), timeout=RPC_TIMEOUT_S
        )
        return {d.uuid: d for n in response.nodes for d in n.devices}

    def node_memory(self, node: str) -> int:
        return sum(d.memory_used_mib for d in self.devices(node).values())

    def stored(self, uid: str) -> usage_pb2.GetPodUsageResponse:
        response: usage_pb2.GetPodUsageResponse = self.stub.GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S
        )
        return response

    def namespace_used(self, namespace: str, resource: str = "nvidia.com/gpumem") -> int:
        response = self.stub.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S
        )
        return next((item.used for item in response.items if item.resource == resource), 0)


@dataclass
class Scheduler:
    """A scheduler daemon started in this process, with a client."""

    app: SchedulerDaemon
    channel: grpc.Channel
    stub: scheduler_pb2_grpc.SchedulerStub
    spans: InMemorySpanExporter
    sync: Callable[[], None] = lambda: None
    """Waits until the scheduler's node cache has every change the recorder acknowledged, so
    that a test's Filter sees what the test just recorded (staleness is node_cache's own
    tests' subject, not every test's)."""

    @property
    def target(self) -> str:
        return self.app.target

    def stop(self) -> None:
        self.channel.close()
        self.app.stop(grace_s=0)

    def filter(
        self, pod: Json, node_names: Sequence[str], *, encoding: str = "kubernetes_pod_json"
    ) -> scheduler_pb2.FilterResponse:
        """Filter with the pod as Kubernetes JSON, or typed (converted once by the parser)."""
        self.sync()
        if encoding == "typed":
            typed = common_convert.pod_to_pb(kube_pod_parser.parse_pod(pod, (NVIDIA_RESOURCES,)))
            request = scheduler_pb2.FilterRequest(pod=typed, node_names=list(node_names))
        else:
            request = scheduler_pb2.FilterRequest(
                kubernetes_pod_json=to_json(pod), node_names=list(node_names)
            )
        response: scheduler_pb2.FilterResponse = self.stub.Filter(request, timeout=RPC_TIMEOUT_S)
        return response


StartScheduler = Callable[..., Scheduler]


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    """A fresh usage recorder with an empty journal."""
    provider, exporter = traced()
    config = UsageConfig(common=local_common(), data_dir=tmp_path / "usage", identity="test")
    app = start_usage_recorder(config, tracer_provider=provider, max_workers=8)
    channel = grpc.insecure_channel(app.target)
    started = Recorder(app, channel, usage_pb2_grpc.UsageRecorderStub(channel), exporter)
    yield started
    if not app.handle.stopped:
        started.stop()


@pytest.fixture
def start_scheduler(recorder: Recorder) -> Iterator[StartScheduler]:
    """Starts schedulers reading from ``recorder`` (or ``usage_addr``); stops them after."""
    running: list[Scheduler] = []

    def starter(*, usage_addr: str | None = None, **overrides: Any) -> Scheduler:
        provider, exporter = traced()
        options: dict[str, Any] = {
            "common": local_common(),
            "usage_addr": usage_addr or recorder.target,
            # The tests are about answers, not deadlines (those that are set their own): the
            # product's 2 s to the recorder was hit on a loaded 2-core machine.
            "usage_timeout_ms": int(RPC_TIMEOUT_S * 1000),
        }
        options.update(overrides)
        app = start_scheduler_daemon(
            SchedulerConfig(**options),
            tracer_provider=provider,
            max_workers=8,
            clock=lambda: FIXED_UNIX_S + 0.75,
        )
        channel = grpc.insecure_channel(app.target)

        def sync() -> None:
            cache = app.node_cache
            if cache is None or options["usage_addr"] != recorder.target:
                return
            if recorder.app.handle.stopped:
                return
            revision = recorder.app.store.revision
            # The initial state ends with INITIAL_STATE_COMPLETE, also on an empty recorder.
            assert cache.wait_for_revision(revision, RPC_TIMEOUT_S), (
                f"the node cache did not reach revision {revision}"
            )

        started = Scheduler(
            app, channel, scheduler_pb2_grpc.SchedulerStub(channel), exporter, sync
        )
        running.append(started)
        return started

    yield starter
    for started in running:
        if not started.app.handle.stopped:
            started.stop()


@pytest.fixture
def serve_placer() -> Iterator[Callable[[PodPlacer], scheduler_pb2_grpc.SchedulerStub]]:
    """Serves a hand-built ``PodPlacer`` (a test's own recorder client or node cache)."""
    handles: list[tuple[ServerHandle, grpc.Channel]] = []

    def serve(placer: PodPlacer) -> scheduler_pb2_grpc.SchedulerStub:
        servicer = SchedulerServicer(placer)
        handle = build_server(
            service_names=[SERVICE_NAME],
            register=lambda server: add_to_server(servicer, server),
            listen_addr="127.0.0.1:0",
        )
        channel = grpc.insecure_channel(handle.target)
        handles.append((handle, channel))
        return scheduler_pb2_grpc.SchedulerStub(channel)

    yield serve
    for handle, channel in handles:
        channel.close()
        handle.stop(0)


@pytest.fixture
def scheduler(start_scheduler: StartScheduler) -> Scheduler:
    """A scheduler with the default config (binpack nodes, spread GPUs)."""
    return start_scheduler()


def bound_pod(
    name: str,
    node: str,
    allocation: str,
    *,
    namespace: str = NS,
    apps: Sequence[Json] = (),
    init: Sequence[Json] = (),
) -> Json:
    """A pod HAMi already placed: what the informer hands RecordPod (usage on the node)."""
    return kube_pod(
        name,
        namespace=namespace,
        init=init,
        apps=apps,
        allocation=allocation,
        node=node,
        phase="Running",
    )


class GatedCache(NodeCache):
    """A node cache whose stream applies events only while ``gate`` is set: clearing it makes
    the copy stale on purpose."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()

    def _apply(self, event: usage_pb2.UsageEvent) -> None:
        self.gate.wait()
        super()._apply(event)
