"""Burst: 50 pods checked, filtered and reserved against one small node pool by 8 callers.

Layer: benchmark. Each caller takes the next pod and runs HAMi's path for it: CheckQuota, then
(when allowed) Filter, which reserves the chosen GPUs in the recorder. The pool (4 nodes × 8
GPUs) and the namespace quota are both smaller than 50 pods need, so capacity and quota run
out during the burst and concurrent Filters race for the same cards (binpack sends them all to
the busiest node). Afterwards the recorder must show no double allocation: every device's usage
equals the sum of what the pods placed there hold, no device is over capacity, and the
namespace's usage equals the sum over its pods and stays within its limit. A "no" (quota
exceeded, no node fits, reservation conflict) is an answer; an error is a non-OK status.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures

import grpc

from bench import workload
from bench.rpc import RPC_TIMEOUT_S, Stack
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
)
from services.common.server import client_channel

NAMESPACE = "burst"
POOL_NODES = 4
PODS = 50
CALLERS = 8
QUOTA_PODS = 40
"""The memory quota admits about this many benchmark pods (10,000 MiB each)."""


def add_stored(held: dict[str, list[int]], stored: Iterable[types_pb2.DeviceUsage]) -> None:
    """Adds a pod's stored usage to ``held`` (per device: memory MiB, core percent, slots)."""
    for usage in stored:
        entry = held.setdefault(usage.uuid, [0, 0, 0])
        entry[0] += usage.memory_mib
        entry[1] += usage.core_percent
        entry[2] += usage.slots


def device_problems(
    nodes: Iterable[types_pb2.NodeUsage], held: Mapping[str, Sequence[int]]
) -> tuple[list[str], list[str]]:
    """The devices whose recorded use differs from ``held`` (memory MiB, core percent and slots
    summed over the stored pods), and those used past their capacity: double booking shows in
    one or the other."""
    mismatched: list[str] = []
    over_capacity: list[str] = []
    for node in nodes:
        for device in node.devices:
            used = [device.memory_used_mib, device.cores_used, device.slots_used]
            if used != list(held.get(device.uuid, (0, 0, 0))):
                mismatched.append(device.uuid)
            if (device.memory_used_mib > device.memory_total_mib
                    or device.cores_used > device.cores_total
                    or device.slots_used > device.slots_total):
                over_capacity.append(device.uuid)
    return mismatched, over_capacity


def run(stack: Stack) -> dict[str, object]:
    if stack.scheduler is None:
        raise RuntimeError("the burst needs the scheduler")
    pool = [f"burst-{i}" for i in range(POOL_NODES)]
    stack.register(pool)
    memory_limit = QUOTA_PODS * 10_000
    stack.usage_stub.SetQuota(usage_pb2.SetQuotaRequest(
        namespace=NAMESPACE, limits={"limits.nvidia.com/gpumem": memory_limit}),
        timeout=RPC_TIMEOUT_S)
    pods = [workload.pod_pb(f"burst-pod-{i:03d}", NAMESPACE) for i in range(PODS)]
    queue = iter(range(PODS))
    queue_lock = threading.Lock()
    outcomes: dict[str, str] = {}
    errors: list[str] = []
    latencies_ms: list[float] = []
    lock = threading.Lock()
    admission_target, scheduler_target = stack.admission.address, stack.scheduler.address

    def caller() -> None:
        with client_channel(admission_target) as a_channel, \
                client_channel(scheduler_target) as s_channel:
            admission = admission_pb2_grpc.AdmissionStub(a_channel)
            scheduler = scheduler_pb2_grpc.SchedulerStub(s_channel)
            while True:
                with queue_lock:
                    index = next(queue, None)
                if index is None:
                    return
                pod = pods[index]
                started = time.perf_counter()
                try:
                    checked = admission.CheckQuota(admission_pb2.CheckQuotaRequest(pod=pod),
                                                   timeout=RPC_TIMEOUT_S)
                    if not checked.allowed:
                        outcome = f"denied:{checked.reason}"
                    else:
                        filtered = scheduler.Filter(
                            scheduler_pb2.FilterRequest(pod=pod, node_names=pool),
                            timeout=RPC_TIMEOUT_S)
                        outcome = filtered.reason
                except grpc.RpcError as error:
                    with lock:
                        errors.append(f"{pod.uid}: {error.code().name}: {error.details()}")
                    continue
                with lock:
                    outcomes[pod.uid] = outcome
                    latencies_ms.append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(CALLERS) as executor:
        for running in [executor.submit(caller) for _ in range(CALLERS)]:
            running.result()
    wall_s = time.perf_counter() - started

    # The recorder's view afterwards.
    nodes = stack.usage_stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=pool),
                                          timeout=RPC_TIMEOUT_S).nodes
    held: dict[str, list[int]] = {}
    namespace_memory = 0
    placed = 0
    for pod in pods:
        stored = stack.usage_stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=pod.uid),
                                              timeout=RPC_TIMEOUT_S)
        if not stored.found:
            continue
        placed += 1
        add_stored(held, stored.stored)
        namespace_memory += sum(usage.memory_mib for usage in stored.stored)
    mismatched, over_capacity = device_problems(nodes, held)
    items = stack.usage_stub.GetNamespaceUsage(
        usage_pb2.GetNamespaceUsageRequest(namespace=NAMESPACE), timeout=RPC_TIMEOUT_S).items
    recorded_memory = next((i.used for i in items if i.resource == "nvidia.com/gpumem"), 0)
    scheduled = sum(1 for outcome in outcomes.values() if outcome == "Scheduled")
    latencies_ms.sort()
    return {
        "pods": PODS,
        "callers": CALLERS,
        "pool": f"{POOL_NODES} nodes × {workload.GPUS_PER_NODE} GPUs",
        "quota_memory_mib": memory_limit,
        "wall_s": round(wall_s, 3),
        "pods_per_s": round(PODS / wall_s, 1),
        "p50_ms": round(latencies_ms[len(latencies_ms) // 2], 2) if latencies_ms else 0.0,
        "max_ms": round(latencies_ms[-1], 2) if latencies_ms else 0.0,
        "outcomes": dict(Counter(outcomes.values())),
        "errors": len(errors),
        "error_samples": errors[:3],
        "scheduled": scheduled,
        "stored_pods": placed,
        "devices_mismatched": mismatched,
        "devices_over_capacity": over_capacity,
        "namespace_memory_used": recorded_memory,
        "namespace_memory_sum_of_pods": namespace_memory,
        "no_double_allocation": (not mismatched and not over_capacity
                                 and placed == scheduled
                                 and recorded_memory == namespace_memory <= memory_limit),
    }
