"""A seeded synthetic workload, written as the Kubernetes objects a cluster would hold.

Layer: the what-if simulator (accounting and the standard library only; all randomness from
one ``random.Random(seed)``, so a seed always gives the same objects). The objects go through
whatif.kube_input like any other input.

The mix is what GPU platforms run (memory per card, MiB; shares of the pods):

| shape | containers | share |
|---|---|---|
| inference | app 4-16 Gi | 30 % |
| warm-up | init 16-20 Gi (convert weights), app 8-10 Gi | 20 % |
| sidecar before init | sidecar 2 Gi (metrics), init 16 Gi, app 8 Gi | 10 % |
| sidecar after init | init 12 Gi, sidecar 2 Gi (proxy), app 10 Gi | 10 % |
| two-stage init | init 20 Gi (download + convert), init 8 Gi (warm-up), app 6 Gi | 10 % |
| trainer | 2-4 cards x 20 Gi app, sidecar 1 Gi (logger) before it | 10 % |
| mesh | sidecar 4 Gi, app 8 Gi | 10 % |

Pods arrive as a Poisson process over the first two thirds of the window; init containers run
20 s to 5 min, apps about 40 min (log-normal); a pod whose apps end inside the window carries
a ``deletionTimestamp`` there (the input is a history, as an audit log records it, not one
moment). Nodes have four 24 Gi cards (A10) or eight 40 Gi cards (A100), ten slots each. Every
namespace is called team-N; the first two have a ResourceQuota of 15 % of the pool's memory.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass
from typing import Any

from accounting.annotations import NODE_REGISTER_ANNOTATION
from accounting.hami_codec import encode_node_register
from accounting.model import Device
from accounting.quota import quota_key
from accounting.vendors import NVIDIA_RESOURCES

EPOCH = datetime.datetime(2025, 1, 6, 9, 0, 0, tzinfo=datetime.UTC)
"""When a generated window starts (a Monday morning)."""
PODS_PER_NODE = 20
"""Default pool size: one node per this many pods."""
WINDOW_S = 6 * 3600
NAMESPACES = 5
QUOTA_NAMESPACES = 2
QUOTA_SHARE_PERCENT = 15

_GI = 1024
_A10 = ("NVIDIA A10", 24 * _GI, 4)
_A100 = ("NVIDIA A100-SXM4-40GB", 40 * _GI, 8)
_SLOTS = 10

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GeneratedInput:
    """The objects (one ``List``) and the window they were generated for."""

    objects: Json
    window_s: int


@dataclass(frozen=True, slots=True)
class _Container:
    name: str
    kind: str
    """init, sidecar or app."""
    memory_mib: int
    cards: int = 1


def generate(pods: int, seed: int, *, nodes: int | None = None) -> GeneratedInput:
    """``pods`` pods on ``nodes`` nodes (default: one per ``PODS_PER_NODE`` pods).

    Raises:
        ValueError: pods < 0 or nodes < 1.
    """
    if pods < 0:
        raise ValueError(f"pods must be >= 0, got {pods}")
    node_count = max(1, -(-pods // PODS_PER_NODE)) if nodes is None else nodes
    if node_count < 1:
        raise ValueError(f"nodes must be >= 1, got {node_count}")
    rng = random.Random(seed)
    node_objects = [_node(index, rng) for index in range(node_count)]
    pool_mib = sum(device.memory_total_mib for node in node_objects for device in node[1])
    items: list[Json] = [document for document, _ in node_objects]
    quota_mib = pool_mib * QUOTA_SHARE_PERCENT // 100
    items += [_quota(f"team-{n}", quota_mib) for n in range(1, QUOTA_NAMESPACES + 1)]
    arrival_window_s = WINDOW_S * 2 // 3
    mean_gap_s = arrival_window_s / max(pods, 1)
    moment = 0.0
    for index in range(pods):
        moment += rng.expovariate(1 / mean_gap_s)
        items.append(_pod(index, int(moment), rng))
    return GeneratedInput({"apiVersion": "v1", "kind": "List", "items": items}, WINDOW_S)


def _node(index: int, rng: random.Random) -> tuple[Json, list[Device]]:
    model, memory_mib, cards = _A100 if rng.random() < 0.3 else _A10
    name = f"gpu-node-{index:04d}"
    devices = [
        Device(f"GPU-{name}-{card}", model, card, _SLOTS, memory_mib, 100) for card in range(cards)
    ]
    document = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_REGISTER_ANNOTATION: encode_node_register(devices)},
        },
    }
    return document, devices


def _quota(namespace: str, memory_mib: int) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": {quota_key(NVIDIA_RESOURCES.memory_resource): str(memory_mib)}},
    }


def _shape(rng: random.Random) -> tuple[str, list[_Container]]:
    pick = rng.random()
    if pick < 0.30:
        return "inference", [_Container("server", "app", rng.choice((4, 8, 12, 16)) * _GI)]
    if pick < 0.50:
        return "warmup", [
            _Container("convert-weights", "init", rng.choice((16, 20)) * _GI),
            _Container("server", "app", rng.choice((8, 10)) * _GI),
        ]
    if pick < 0.60:
        return "sidecar-first", [
            _Container("metrics", "sidecar", 2 * _GI),
            _Container("prepare", "init", 16 * _GI),
            _Container("server", "app", 8 * _GI),
        ]
    if pick < 0.70:
        return "sidecar-after", [
            _Container("prepare", "init", 12 * _GI),
            _Container("proxy", "sidecar", 2 * _GI),
            _Container("server", "app", 10 * _GI),
        ]
    if pick < 0.80:
        return "two-stage", [
            _Container("download", "init", 20 * _GI),
            _Container("warmup", "init", 8 * _GI),
            _Container("server", "app", 6 * _GI),
        ]
    if pick < 0.90:
        return "trainer", [
            _Container("logger", "sidecar", 1 * _GI),
            _Container("train", "app", 20 * _GI, cards=rng.choice((2, 2, 4))),
        ]
    return "mesh", [
        _Container("envoy", "sidecar", 4 * _GI),
        _Container("server", "app", 8 * _GI),
    ]


def _stamp(offset_s: int) -> str:
    return (EPOCH + datetime.timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_container(container: _Container) -> Json:
    document: Json = {
        "name": container.name,
        "image": "registry.example/gpu-workload:1",
        "resources": {
            "limits": {
                "nvidia.com/gpu": str(container.cards),
                "nvidia.com/gpumem": str(container.memory_mib),
            }
        },
    }
    if container.kind == "sidecar":
        document["restartPolicy"] = "Always"
    return document


def _pod(index: int, created_s: int, rng: random.Random) -> Json:
    shape, containers = _shape(rng)
    namespace = f"team-{rng.randint(1, NAMESPACES)}"
    name = f"{shape}-{index:05d}"
    init_list = [c for c in containers if c.kind != "app"]
    apps = [c for c in containers if c.kind == "app"]

    moment = created_s
    init_statuses: list[Json] = []
    for container in init_list:
        if container.kind == "sidecar":
            init_statuses.append(
                {"name": container.name, "state": {"running": {"startedAt": _stamp(moment)}}}
            )
            continue
        run_s = int(rng.uniform(20, 300))
        init_statuses.append(
            {
                "name": container.name,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "startedAt": _stamp(moment),
                        "finishedAt": _stamp(moment + run_s),
                    }
                },
            }
        )
        moment += run_s
    apps_started = moment
    app_run_s = int(rng.lognormvariate(8.6, 0.8))  # median about 90 minutes
    metadata: Json = {
        "name": name,
        "namespace": namespace,
        "uid": f"00000000-0000-4000-8000-{index:012d}",
        "creationTimestamp": _stamp(created_s),
    }
    if apps_started + app_run_s < WINDOW_S:
        metadata["deletionTimestamp"] = _stamp(apps_started + app_run_s)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "initContainers": [_spec_container(c) for c in init_list],
            "containers": [_spec_container(c) for c in apps],
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": init_statuses,
            "containerStatuses": [
                {"name": c.name, "state": {"running": {"startedAt": _stamp(apps_started)}}}
                for c in apps
            ],
        },
    }
