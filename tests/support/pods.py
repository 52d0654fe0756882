"""Builders of Kubernetes Pod and Node objects as JSON dicts, the shape the API server sends and
Go's ``json.Marshal`` writes. Shared by the tests; nothing here knows the accounting rules.

    pod = kube_pod(
        "trainer", uid="u1", namespace="team-a",
        init=[init_container("convert-weights", gpumem=20480)],
        apps=[app_container("server", gpumem=10240)],
        allocation=allocation([("GPU-0", 20480, 0)], [("GPU-0", 10240, 0)]),
        node="node1", phase="Running", init_statuses=[terminated("convert-weights")],
    )
    to_json(pod)  # bytes for RecordPodRequest.kubernetes_pod_json

The allocation annotation is written here by hand, in HAMi's own format
(``UUID,NVIDIA,MEM,CORES:`` per device, ``;`` per container), not with the codec under test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

ALLOCATED = "hami.io/vgpu-devices-allocated"
VGPU_NODE = "hami.io/vgpu-node"
NODE_REGISTER = "hami.io/node-nvidia-register"

Json = dict[str, Any]
Grant = tuple[str, int, int]
"""(device UUID, memory MiB, core percent) of one device given to one container."""


# -- containers --------------------------------------------------------------------------------


def _container(
    name: str,
    gpumem: int | None,
    gpus: int,
    gpucores: int | None,
    restart_policy: str | None,
) -> Json:
    container: Json = {"name": name, "image": "busybox"}
    if gpumem is not None or gpucores is not None:
        limits = {"nvidia.com/gpu": str(gpus)}
        if gpumem is not None:
            limits["nvidia.com/gpumem"] = str(gpumem)
        if gpucores is not None:
            limits["nvidia.com/gpucores"] = str(gpucores)
        container["resources"] = {"limits": limits}
    if restart_policy is not None:
        container["restartPolicy"] = restart_policy
    return container


def init_container(
    name: str, *, gpumem: int | None = None, gpus: int = 1, gpucores: int | None = None
) -> Json:
    """A regular init container (no restartPolicy); ``gpumem`` in MiB, None = no GPU."""
    return _container(name, gpumem, gpus, gpucores, None)


def sidecar_container(
    name: str, *, gpumem: int | None = None, gpus: int = 1, gpucores: int | None = None
) -> Json:
    """A native sidecar: an init container with restartPolicy Always."""
    return _container(name, gpumem, gpus, gpucores, "Always")


def app_container(
    name: str, *, gpumem: int | None = None, gpus: int = 1, gpucores: int | None = None
) -> Json:
    """An entry of spec.containers."""
    return _container(name, gpumem, gpus, gpucores, None)


# -- statuses ----------------------------------------------------------------------------------


def terminated(name: str, exit_code: int = 0, *, restarts: int = 0) -> Json:
    """A container status with state.terminated (the kubelet's shape)."""
    return {
        "name": name,
        "state": {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
            }
        },
        "restartCount": restarts,
        "ready": False,
    }


def running(name: str, *, restarts: int = 0) -> Json:
    return {
        "name": name,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        "restartCount": restarts,
        "ready": True,
    }


def waiting(name: str, reason: str = "PodInitializing", *, restarts: int = 0) -> Json:
    return {
        "name": name,
        "state": {"waiting": {"reason": reason}},
        "restartCount": restarts,
        "ready": False,
    }


# -- the allocation annotation -----------------------------------------------------------------


def allocation(*per_container: Sequence[Grant]) -> str:
    """``hami.io/vgpu-devices-allocated`` for containers in declaration order (init list
    first); an empty sequence is a container without a GPU, which still takes its ``;``."""
    return "".join(
        "".join(
            f"{uuid},NVIDIA,{memory_mib},{core_percent}:"
            for uuid, memory_mib, core_percent in grants
        )
        + ";"
        for grants in per_container
    )


# -- pods and nodes ----------------------------------------------------------------------------


def kube_pod(
    name: str,
    *,
    uid: str | None = None,
    namespace: str = "default",
    init: Sequence[Json] = (),
    apps: Sequence[Json] = (),
    allocation: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    init_statuses: Sequence[Json] = (),
    app_statuses: Sequence[Json] = (),
    annotations: Mapping[str, str] | None = None,
    deleting: bool = False,
) -> Json:
    """A Pod. With ``allocation`` and ``node`` it is bound the way HAMi binds: the allocation
    annotation, ``hami.io/vgpu-node`` and spec.nodeName."""
    metadata: Json = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "annotations": dict(annotations or {}),
    }
    spec: Json = {"containers": [dict(c) for c in apps]}
    if init:
        spec["initContainers"] = [dict(c) for c in init]
    if allocation is not None:
        metadata["annotations"][ALLOCATED] = allocation
    if node is not None:
        metadata["annotations"][VGPU_NODE] = node
        spec["nodeName"] = node
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: Json = {"phase": phase}
    if init_statuses:
        status["initContainerStatuses"] = [dict(s) for s in init_statuses]
    if app_statuses:
        status["containerStatuses"] = [dict(s) for s in app_statuses]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def gpu_device(
    uuid: str,
    *,
    memory_mib: int = 24576,
    cores: int = 100,
    slots: int = 10,
    index: int = 0,
    model: str = "NVIDIA A10",
    healthy: bool = True,
) -> Json:
    """One element of ``hami.io/node-nvidia-register`` (HAMi's DeviceInfo JSON)."""
    return {
        "id": uuid,
        "index": index,
        "count": slots,
        "devmem": memory_mib,
        "devcore": cores,
        "type": model,
        "numa": 0,
        "mode": "hami-core",
        "health": healthy,
    }


def kube_node(name: str, gpus: Sequence[Json] = ()) -> Json:
    """A Node whose register annotation lists ``gpus`` (from ``gpu_device``)."""
    annotations = {NODE_REGISTER: json.dumps(list(gpus))} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {},
        "status": {},
    }


def kube_quota(name: str, namespace: str, hard: Mapping[str, str]) -> Json:
    """A ResourceQuota with ``spec.hard`` (e.g. ``{"limits.nvidia.com/gpumem": "24576"}``)."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": dict(hard)},
    }


def to_json(obj: Mapping[str, Any]) -> bytes:
    """The object as the bytes a Go client sends."""
    return json.dumps(obj, separators=(",", ":")).encode()
