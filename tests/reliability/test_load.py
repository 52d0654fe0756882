"""Load: 8 concurrent clients of mixed traffic against the three daemons as processes.

Each client runs pod lifecycles the way HAMi drives them: CheckQuota (admission, which reads the
namespace's usage from the recorder), Filter (scheduler: node usage and quota from the recorder,
then Reserve), RecordPod as the pod's statuses advance (init running, init done: shrink, app
running), reads (GetPodUsage, GetNodeUsage, GetNamespaceUsage), ForgetPod. Pods carry a regular
init container, a sidecar and an app, all asking for GPU memory.

Asserted: zero errors; no pod left charged at the end; the RSS of each daemon at the end is
within ``RSS_GROWTH_LIMIT`` of its RSS after warm-up (a leak check, not a timing assertion).
Printed, not asserted: requests served, throughput, p50/p99 latency per RPC and overall.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from tests.reliability.daemons import Daemon, running_stack
from tests.reliability.model import device_message
from tests.reliability.sizes import report, sized, sized_s

pytestmark = [pytest.mark.slow, pytest.mark.timeout(sized(300, 900))]

CLIENTS = 8
DURATION_S = sized_s(6.0, 60.0)
WARM_UP_S = sized_s(2.0, 10.0)
RSS_GROWTH_LIMIT = 50 * 1024 * 1024
RPC_TIMEOUT_S = 30.0
NODES = [f"load-node-{n}" for n in range(8)]
NAMESPACES = [f"load-ns-{n}" for n in range(4)]
STATUS_KEYS = ("init running", "init done", "app running")


def _limits(gpumem: int, cores: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(gpumem),
                       "nvidia.com/gpucores": str(cores)}}


def pod_object(uid: str, namespace: str, rng: random.Random) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": namespace, "uid": uid,
                     "annotations": {}},
        "spec": {
            "initContainers": [
                {"name": "warmup", "image": "w", "resources": _limits(rng.choice((8192, 16384)),
                                                                      20)},
                {"name": "proxy", "image": "p", "restartPolicy": "Always",
                 "resources": _limits(1024, 5)},
            ],
            "containers": [{"name": "server", "image": "s",
                            "resources": _limits(rng.choice((2048, 4096)), 10)}],
        },
        "status": {"phase": "Pending"},
    }


def with_status(obj: dict[str, Any], step: str, filtered: scheduler_pb2.FilterResponse) -> bytes:
    """The pod as the informer sees it after binding, in one of its statuses."""
    pod = json.loads(json.dumps(obj))
    pod["metadata"]["annotations"].update(filtered.annotations)
    pod["spec"]["nodeName"] = filtered.node_name
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    waiting = {"waiting": {"reason": "PodInitializing"}}
    warmup, proxy, server = {
        "init running": (running, waiting, waiting),
        "init done": (done, running, waiting),
        "app running": (done, running, running),
    }[step]
    pod["status"] = {
        "phase": "Running" if step == "app running" else "Pending",
        "initContainerStatuses": [{"name": "warmup", "state": warmup, "restartCount": 0},
                                  {"name": "proxy", "state": proxy, "restartCount": 0}],
        "containerStatuses": [{"name": "server", "state": server, "restartCount": 0}],
    }
    return json.dumps(pod).encode()


class Client(threading.Thread):
    def __init__(self, number: int, daemons: dict[str, Daemon], stop: threading.Event) -> None:
        super().__init__(name=f"load-client-{number}", daemon=True)
        self.number = number
        self.rng = random.Random(number)
        self.stop_event = stop
        self.channels = [daemons[name].channel() for name in ("usage", "admission", "scheduler")]
        self.usage = usage_pb2_grpc.UsageRecorderStub(self.channels[0])
        self.admission = admission_pb2_grpc.AdmissionStub(self.channels[1])
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channels[2])
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []
        self.outcomes: dict[str, int] = defaultdict(int)
        self.lifecycles = 0

    def call(self, name: str, method: Callable[..., Any], request: Any) -> Any:
        started = time.perf_counter()
        response = method(request, timeout=RPC_TIMEOUT_S)
        self.latencies[name].append(time.perf_counter() - started)
        return response

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.lifecycle()
        except grpc.RpcError as error:
            self.errors.append(f"{error.code().name}: {error.details()}")
        except Exception as error:  # a failed check in the client itself
            self.errors.append(repr(error))
        finally:
            for channel in self.channels:
                channel.close()

    def lifecycle(self) -> None:
        rng = self.rng
        self.lifecycles += 1
        uid = f"load-{self.number}-{self.lifecycles}"
        namespace = rng.choice(NAMESPACES)
        obj = pod_object(uid, namespace, rng)
        raw = json.dumps(obj).encode()
        checked = self.call("CheckQuota", self.admission.CheckQuota,
                            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw))
        self.outcomes[f"CheckQuota {checked.reason}"] += 1
        if not checked.allowed:
            return
        filtered = self.call("Filter", self.scheduler.Filter, scheduler_pb2.FilterRequest(
            kubernetes_pod_json=raw, node_names=rng.sample(NODES, 4)))
        self.outcomes[f"Filter {filtered.reason}"] += 1
        if filtered.node_name:
            for step in STATUS_KEYS:
                recorded = self.call("RecordPod", self.usage.RecordPod, usage_pb2.RecordPodRequest(
                    kubernetes_pod_json=with_status(obj, step, filtered)))
                self.outcomes[f"RecordPod {recorded.decision}"] += 1
                stored = self.call("GetPodUsage", self.usage.GetPodUsage,
                                   usage_pb2.GetPodUsageRequest(pod_uid=uid))
                assert stored.found, uid
            self.call("GetNodeUsage", self.usage.GetNodeUsage,
                      usage_pb2.GetNodeUsageRequest(node_names=[filtered.node_name]))
        self.call("GetNamespaceUsage", self.usage.GetNamespaceUsage,
                  usage_pb2.GetNamespaceUsageRequest(namespace=namespace))
        forgotten = self.call("ForgetPod", self.usage.ForgetPod,
                              usage_pb2.ForgetPodRequest(pod_uid=uid))
        assert forgotten.found == bool(filtered.node_name), (uid, forgotten)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Daemon]]:
    quiet = {name: {"HAMI_ACCOUNTING_LOG_LEVEL": "WARNING"}
             for name in ("usage", "admission", "scheduler")}
    with running_stack(tmp_path, extra_env=quiet) as daemons:
        yield daemons


def test_mixed_load_has_no_errors_and_flat_memory(stack: dict[str, Daemon]) -> None:
    with stack["usage"].channel() as channel:
        usage = usage_pb2_grpc.UsageRecorderStub(channel)
        for node in NODES:
            usage.RegisterNode(usage_pb2.RegisterNodeRequest(
                node_name=node, inventory=types_pb2.NodeInventory(devices=[
                    device_message(f"GPU-{node}-{i}", i) for i in range(4)])),
                timeout=RPC_TIMEOUT_S)
        for namespace in NAMESPACES:
            usage.SetQuota(usage_pb2.SetQuotaRequest(namespace=namespace, limits={
                "limits.nvidia.com/gpumem": 10_000_000}), timeout=RPC_TIMEOUT_S)

    stop = threading.Event()
    clients = [Client(n, stack, stop) for n in range(CLIENTS)]
    started = time.perf_counter()
    for client in clients:
        client.start()
    time.sleep(WARM_UP_S)
    rss_warm = {name: daemon.rss_bytes() for name, daemon in stack.items()}
    served_warm = sum(len(v) for c in clients for v in c.latencies.values())
    time.sleep(max(0.0, DURATION_S - WARM_UP_S))
    rss_end = {name: daemon.rss_bytes() for name, daemon in stack.items()}
    stop.set()
    for client in clients:
        client.join(RPC_TIMEOUT_S * 3)
    elapsed = time.perf_counter() - started

    errors = [f"{c.name}: {e}" for c in clients for e in c.errors]
    assert not errors, errors
    assert all(not c.is_alive() for c in clients)
    for name, daemon in stack.items():
        assert daemon.alive and daemon.healthy(), f"{name}:\n{daemon.log_tail()}"

    latencies: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, int] = defaultdict(int)
    for client in clients:
        for method, values in client.latencies.items():
            latencies[method].extend(values)
        for outcome, count in client.outcomes.items():
            outcomes[outcome] += count
    every = [v for values in latencies.values() for v in values]
    served = len(every)
    with stack["usage"].channel() as channel:
        usage = usage_pb2_grpc.UsageRecorderStub(channel)
        for namespace in NAMESPACES:
            items = usage.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(
                namespace=namespace), timeout=RPC_TIMEOUT_S).items
            assert all(item.used == 0 for item in items), (namespace, items)

    growth = {name: rss_end[name] - rss_warm[name] for name in stack}
    report(
        "load",
        clients=CLIENTS,
        seconds=round(elapsed, 1),
        requests_served=served,
        per_second=round((served - served_warm) / max(DURATION_S - WARM_UP_S, 0.1)),
        lifecycles=sum(c.lifecycles for c in clients),
        errors=0,
        p50_ms=round(percentile(every, 0.50) * 1000, 1),
        p99_ms=round(percentile(every, 0.99) * 1000, 1),
        p99_ms_per_rpc={m: round(percentile(v, 0.99) * 1000, 1)
                        for m, v in sorted(latencies.items())},
        rss_mib_after_warm_up={n: round(v / 2**20, 1) for n, v in rss_warm.items()},
        rss_growth_mib={n: round(v / 2**20, 1) for n, v in growth.items()},
        outcomes=dict(sorted(outcomes.items())),
    )
    for name, grown in growth.items():
        assert grown < RSS_GROWTH_LIMIT, f"{name} grew {grown / 2**20:.1f} MiB under load"
