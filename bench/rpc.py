"""The daemons over gRPC: a stack of child processes and the calls the benchmark times.

Layer: benchmark. A ``Stack`` is one usage recorder (journal on, in its own data directory),
the admission and scheduler daemons reading from it, and the no-op server, all started with
tracing on or off. Each ``*_caller`` returns a ``bench.load.ClientFactory``: requests are built
before the clock starts (a Filter's candidate list is serialized once and concatenated with the
pod, which protobuf defines as a merge), so the client's own Python work stays out of the
figures as far as it can.

State is kept steady across runs: RecordPod and Filter create pods with fresh uids, and every
pod a run created is forgotten after the run (untimed), so each run sees the same cluster.
RecordPod pods land on their own registered nodes (``rec-*``), rotated over the GPUs so that
no card is overcommitted, never on the Filter candidates.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import empty_pb2

from bench import procs, workload
from bench.load import Call, ClientFactory
from bench.noop_server import METHOD as NOOP_METHOD
from bench.recorder_scale import PODS_PER_NODE, rotated_pod
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.common.convert import pod_to_pb
from services.common.server import client_channel
from services.scheduler.recorder_client import NODE_BATCH

RPC_TIMEOUT_S = 30.0
REC_NODES = 500
"""Nodes that take RecordPod's pods: 8 pods each without overcommit, so 4,000 pods per run."""
FILTER_METHOD = "/hami.accounting.v1.Scheduler/Filter"
CHECK_QUOTA_METHOD = "/hami.accounting.v1.Admission/CheckQuota"
_RUN_IDS = itertools.count()


def rec_node(index: int) -> str:
    return f"rec-{index:04d}"


class Stack:
    """usage + admission + scheduler + noop, tracing on (OTLP to ``otlp_endpoint``) or off."""

    def __init__(self, label: str, work_dir: Path, otlp_endpoint: str | None = None, *,
                 admission_env: dict[str, str] | None = None, scheduler: bool = True,
                 noop: bool = True, admission: bool = True, schedulers: int = 1) -> None:
        """``schedulers`` replicas of the scheduler read from the one recorder (with
        ``scheduler``); ``self.scheduler`` is the first."""
        self.label = label
        tracing = procs.tracing_env(otlp_endpoint)
        self.children: list[procs.Child] = []
        self.usage = self._start("usage", work_dir, {
            **tracing, "HAMI_ACCOUNTING_DATA_DIR": str(work_dir / f"data-{label}")})
        self.usage.wait_serving()
        reads = {**tracing, "HAMI_ACCOUNTING_USAGE_ADDR": self.usage.address}
        # A stack without admission is the recorder alone (and the no-op server, if asked).
        self.admission = self._start("admission", work_dir, {**reads, **(admission_env or {})}) \
            if admission else None
        self.schedulers = [
            self._start("scheduler", work_dir, reads, replica=k)
            for k in range(schedulers if scheduler else 0)
        ]
        self.scheduler = self.schedulers[0] if self.schedulers else None
        self.noop = self._start("noop", work_dir, tracing) if noop else None
        for child in self.children:
            child.wait_serving()
        self._channel = client_channel(self.usage.address)
        self.usage_stub = usage_pb2_grpc.UsageRecorderStub(self._channel)
        self.usage_stub.SetQuota(usage_pb2.SetQuotaRequest(
            namespace=workload.NAMESPACE,
            limits={"limits.nvidia.com/gpumem": workload.QUOTA_MEMORY_MIB,
                    "limits.nvidia.com/gpucores": workload.QUOTA_MEMORY_MIB}),
            timeout=RPC_TIMEOUT_S)
        self.node_count = 0
        self.record_templates: list[bytes] = []

    def _start(self, name: str, work_dir: Path, env: dict[str, str], *,
               replica: int = 0) -> procs.Child:
        label = f"{name}-{self.label}" + (f"-{replica + 1}" if replica else "")
        child = procs.start(name, work_dir, label=label, env=env)
        self.children.append(child)
        return child

    def register(self, names: Sequence[str]) -> None:
        def one(name: str) -> None:
            self.usage_stub.RegisterNode(usage_pb2.RegisterNodeRequest(
                node_name=name, inventory=workload.node_inventory_pb(name)),
                timeout=RPC_TIMEOUT_S)

        with futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, names))

    def grow(self, node_count: int) -> None:
        """Registers candidate nodes until there are ``node_count``."""
        self.register([workload.node_name(i) for i in range(self.node_count, node_count)])
        self.node_count = max(self.node_count, node_count)

    def forget(self, uids: Sequence[str]) -> None:
        def one(uid: str) -> None:
            self.usage_stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=uid),
                                      timeout=RPC_TIMEOUT_S)

        with futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, uids))

    def prepare_record_nodes(self) -> None:
        self.register([rec_node(i) for i in range(REC_NODES)])
        template = workload.granted_pod(UID_PLACEHOLDER, "rec-template")
        for index in range(REC_NODES * PODS_PER_NODE):
            pod = rotated_pod(template, UID_PLACEHOLDER, rec_node(index // PODS_PER_NODE),
                           index % PODS_PER_NODE)
            self.record_templates.append(
                usage_pb2.RecordPodRequest(pod=pod_to_pb(pod)).SerializeToString())

    def stop(self) -> None:
        self._channel.close()
        for child in reversed(self.children):
            child.stop()


class Tally:
    """Uids a run created (to forget afterwards) and the answers it got, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.uids: list[str] = []
        self.reasons: Counter[str] = Counter()

    def add(self, uid: str, reason: str) -> None:
        with self._lock:
            self.uids.append(uid)
            self.reasons[reason] += 1


def noop_caller() -> ClientFactory:
    def factory(channel: grpc.Channel, _k: int) -> Call:
        method = channel.unary_unary(NOOP_METHOD,
                                     request_serializer=empty_pb2.Empty.SerializeToString,
                                     response_deserializer=empty_pb2.Empty.FromString)
        request = empty_pb2.Empty()
        return lambda _i: method(request, timeout=RPC_TIMEOUT_S)
    return factory


def check_quota_request() -> admission_pb2.CheckQuotaRequest:
    return admission_pb2.CheckQuotaRequest(pod=workload.pod_pb("check-quota-pod"))


def check_quota_caller() -> ClientFactory:
    request = check_quota_request()

    def factory(channel: grpc.Channel, _k: int) -> Call:
        stub = admission_pb2_grpc.AdmissionStub(channel)
        return lambda _i: stub.CheckQuota(request, timeout=RPC_TIMEOUT_S)
    return factory


UID_PLACEHOLDER = "u" * 24


def fixed_uid(prefix: str, run: int, index: int) -> str:
    """A 24-character uid, the placeholder's length, so it can be swapped into request bytes."""
    return f"{prefix[:6]:<6}-{run:04d}-{index:012d}"


def _with_uid(template: bytes, uid: str) -> bytes:
    # Same length: every length prefix of the serialized message stays right.
    return template.replace(UID_PLACEHOLDER.encode(), uid.encode())


def record_pod_caller(stack: Stack, tally: Tally) -> ClientFactory:
    run = next(_RUN_IDS)
    templates = stack.record_templates

    def factory(channel: grpc.Channel, _k: int) -> Call:
        method = channel.unary_unary(
            "/hami.accounting.v1.UsageRecorder/RecordPod", request_serializer=None,
            response_deserializer=usage_pb2.RecordPodResponse.FromString)

        def call(i: int) -> None:
            uid = fixed_uid("record", run, i)
            response = method(_with_uid(templates[i % len(templates)], uid),
                              timeout=RPC_TIMEOUT_S)
            tally.add(uid, response.decision)
        return call
    return factory


def node_usage_caller(node_names: Sequence[str]) -> ClientFactory:
    """All of ``node_names`` read the way the scheduler reads them: batches in parallel."""
    requests = [usage_pb2.GetNodeUsageRequest(node_names=node_names[i:i + NODE_BATCH])
                for i in range(0, len(node_names), NODE_BATCH)]

    def factory(channel: grpc.Channel, _k: int) -> Call:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)

        def call(_i: int) -> None:
            pending = [stub.GetNodeUsage.future(r, timeout=RPC_TIMEOUT_S) for r in requests]
            for future in pending:
                future.result()
        return call
    return factory


def filter_caller(
    node_names: Sequence[str],
    tally: Tally,
    answers: Callable[[str, scheduler_pb2.FilterResponse], None] | None = None,
) -> ClientFactory:
    """Filter the benchmark pod (a fresh uid per call) over ``node_names``; each answer is
    tallied, and handed whole to ``answers`` when given."""
    run = next(_RUN_IDS)
    template = (
        scheduler_pb2.FilterRequest(pod=workload.pod_pb(UID_PLACEHOLDER)).SerializeToString()
        + scheduler_pb2.FilterRequest(node_names=node_names).SerializeToString()
    )

    def factory(channel: grpc.Channel, _k: int) -> Call:
        method = channel.unary_unary(FILTER_METHOD, request_serializer=None,
                                     response_deserializer=scheduler_pb2.FilterResponse.FromString)

        def call(i: int) -> None:
            uid = fixed_uid("filter", run, i)
            response = method(_with_uid(template, uid), timeout=RPC_TIMEOUT_S)
            tally.add(uid, response.reason)
            if answers is not None:
                answers(uid, response)
        return call
    return factory
