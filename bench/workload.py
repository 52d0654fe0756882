"""What the benchmark sends: one pod shape, node inventories, and their protobuf messages.

Layer: benchmark. The pod is the one bench/naive_fit.py fits (2 init containers, 1 sidecar,
2 apps; 1–2 GPUs each) so that every figure, in process or over gRPC, is about the same work.
Nodes have 8 × NVIDIA A100 40 GB with HAMi's defaults (10 slots, 100 % cores).
"""

from __future__ import annotations

import dataclasses

from accounting import fit
from accounting.model import Device, DeviceState, Pod
from bench.naive_fit import _benchmark_pod
from hami.accounting.v1 import types_pb2
from services.common.convert import device_to_pb, pod_to_pb

GPUS_PER_NODE = 8
GPU_MODEL = "NVIDIA A100-SXM4-40GB"
GPU_MEMORY_MIB = 40960
NAMESPACE = "bench"
QUOTA_MEMORY_MIB = 10**12
"""A namespace limit no benchmark reaches: every check reads usage and compares, and allows."""


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def node_devices(name: str) -> tuple[Device, ...]:
    return tuple(
        Device(f"GPU-{name}-{i}", GPU_MODEL, i, 10, GPU_MEMORY_MIB, 100)
        for i in range(GPUS_PER_NODE)
    )


def node_inventory_pb(name: str) -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(devices=[device_to_pb(d) for d in node_devices(name)])


def pod(uid: str, namespace: str = NAMESPACE) -> Pod:
    """The benchmark pod as the webhook and the extender see it: requests, no grants."""
    template = _benchmark_pod()
    return dataclasses.replace(template, uid=uid, namespace=namespace, name=f"pod-{uid}")


def granted_pod(uid: str, node: str, namespace: str = NAMESPACE) -> Pod:
    """The benchmark pod placed on an empty ``node`` (grants from the real fit), as the
    informer reports it after binding."""
    requested = pod(uid, namespace)
    empty = fit.NodeState(node, tuple(DeviceState(d) for d in node_devices(node)))
    placement = fit.fit_node(requested, empty)
    if not placement.fits:
        raise RuntimeError(f"the benchmark pod does not fit an empty node: {placement.reason}")
    containers = tuple(
        dataclasses.replace(container, grants=grants)
        for container, grants in zip(requested.containers, placement.grants, strict=True)
    )
    return dataclasses.replace(requested, containers=containers, node_name=node)


def pod_pb(uid: str, namespace: str = NAMESPACE) -> types_pb2.Pod:
    return pod_to_pb(pod(uid, namespace))
