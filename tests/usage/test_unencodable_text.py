"""Text UTF-8 cannot carry is refused where it arrives, through gRPC and the Kubernetes source.

JSON may write a lone UTF-16 surrogate (``"\\ud800"``), which Python decodes into a string no
encoder after it accepts: stored, it once made RegisterNode answer INTERNAL while keeping the
node (across restarts), then every GetNodeUsage, every new WatchUsage stream and every read of
that node INTERNAL; in a pod's MIG profile name, the charge was applied and could not be read
or forgotten. Each case here sends one such string where a node, a pod or an annotation holds
text, and checks the answer (INVALID_ARGUMENT naming the string's field, in the message and in
the BadRequest detail), that nothing changed (the figures read before, a watcher that sees no
event), and that a restarted recorder reads everything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from tests.reliability.test_bad_input import Watcher
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    NODE_REGISTER,
    allocation,
    app_container,
    gpu_device,
    kube_node,
    kube_pod,
    to_json,
)
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder
from tests.usage.test_store_k8s import health_status, wait_for, write_kubeconfig

LONE = "\ud800"
"""A lone high surrogate; ``json.dumps`` writes it as the six characters ``\\ud800``."""
NODE = "node-1"
NS = "team-a"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
A100_PROFILES = [
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
     "placements": [{"start": s, "size": 1} for s in range(7)]},
    {"name": "2g.10gb", "memoryMB": 10240, "core": 28, "sliceCount": 2,
     "placements": [{"start": s, "size": 2} for s in (0, 2, 4)]},
]
"""Two profiles of HAMi's pkg/device/nvidia/mig_capability_test.go (A100 40GB)."""
Json = dict[str, Any]


def mig_node(name: str = "mig-node", *, profile: str = "2g.10gb", card_type: str = "A100",
             uuid: str = "GPU-a") -> Json:
    profiles = [dict(A100_PROFILES[0]), dict(A100_PROFILES[1], name=profile)]
    device = {"id": uuid, "index": 0, "count": 7, "devmem": 40960, "devcore": 100,
              "type": card_type, "health": True, "mode": "mig", "migProfiles": profiles}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {NODE_REGISTER: json.dumps([device])}}}


def mig_pod(name: str = "mig-pod", *, profile: str = "2g.10gb", **overrides: Any) -> Json:
    instance = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-a", "profile": profile,
                 "placement": {"start": 0, "size": 2}}]
    pod = kube_pod(name, uid=f"uid-{name}", namespace=NS, node="mig-node",
                   apps=[app_container("main", gpumem=8000)],
                   allocation=allocation([("GPU-a", 10240, 28)]),
                   annotations={MIG_ALLOCATIONS: json.dumps(instance),
                                "nvidia.com/vgpu-mode": "mig"})
    pod["status"] = {"phase": "Running"}
    for dotted, value in overrides.items():
        *parents, key = dotted.split("__")
        target = pod
        for parent in parents:
            target = target[parent] if not isinstance(target, list) else target[int(parent)]
        target[key if not isinstance(target, list) else int(key)] = value
    return pod


def with_annotation(obj: Json, key: str, value: str) -> Json:
    obj["metadata"]["annotations"][key] = value
    return obj


def _node_with_device_field(field: str, value: str) -> Json:
    node = kube_node(NODE, [gpu_device("GPU-0")])
    devices = json.loads(node["metadata"]["annotations"][NODE_REGISTER])
    devices[0][field] = value
    node["metadata"]["annotations"][NODE_REGISTER] = json.dumps(devices)
    return node


REGISTER_PATH = f'kubernetes_node_json.metadata.annotations["{NODE_REGISTER}"]'
MIG_PATH = f'kubernetes_pod_json.metadata.annotations["{MIG_ALLOCATIONS}"]'


@dataclass(frozen=True)
class Case:
    what: str
    body: Callable[[], Json]
    field: str
    """The field the error must name first."""


NODE_CASES = [
    Case("the card type in the register annotation",
         lambda: _node_with_device_field("type", f"NVIDIA{LONE}"), f"{REGISTER_PATH}[0].type"),
    Case("a device id in the register annotation",
         lambda: _node_with_device_field("id", f"GPU-{LONE}"), f"{REGISTER_PATH}[0].id"),
    Case("a MIG profile name a card registers", lambda: mig_node(profile=f"2g.10gb{LONE}"),
         f'kubernetes_node_json.metadata.annotations["{NODE_REGISTER}"][0].migProfiles[1].name'),
    Case("the node's name", lambda: kube_node(f"node{LONE}", [gpu_device("GPU-0")]),
         "kubernetes_node_json.metadata.name"),
    Case("an annotation key", lambda: with_annotation(
        kube_node(NODE, [gpu_device("GPU-0")]), f"x{LONE}", "y"),
        'kubernetes_node_json.metadata.annotations["x\\ud800"]'),
    Case("a lone low surrogate in a label", lambda: {
        **kube_node(NODE, [gpu_device("GPU-0")]),
        "metadata": {**kube_node(NODE, [gpu_device("GPU-0")])["metadata"],
                     "labels": {"zone": "\udc00"}}}, "kubernetes_node_json.metadata.labels.zone"),
]

POD_CASES = [
    Case("a MIG profile name a tenant writes", lambda: mig_pod(profile=f"2g.10gb{LONE}"),
         f"{MIG_PATH}[0].profile"),
    Case("the pod's name", lambda: mig_pod(metadata__name=f"p{LONE}"),
         "kubernetes_pod_json.metadata.name"),
    Case("a container's name", lambda: mig_pod(spec__containers__0__name=f"main{LONE}"),
         "kubernetes_pod_json.spec.containers[0].name"),
    Case("the traceparent annotation", lambda: with_annotation(
        mig_pod(), "hami.io/traceparent", f"00-{LONE}"),
        'kubernetes_pod_json.metadata.annotations["hami.io/traceparent"]'),
    Case("a device uuid in the allocation annotation", lambda: with_annotation(
        mig_pod(), "hami.io/vgpu-devices-allocated", f"GPU-a{LONE},NVIDIA,10240,28:;"),
        'kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"]'),
]


def figures(stub: usage_pb2_grpc.UsageRecorderStub) -> list[bytes]:
    """Everything the recorder reports, as bytes (raises if any read fails)."""
    return [
        stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
        .SerializeToString(deterministic=True),
        stub.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(namespace=NS),
                               timeout=RPC_TIMEOUT_S).SerializeToString(deterministic=True),
        stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-mig-pod"),
                         timeout=RPC_TIMEOUT_S).SerializeToString(deterministic=True),
    ]


def refused_field(call: Callable[..., Any], request: Any) -> str:
    """Sends ``request``; asserts INVALID_ARGUMENT with a BadRequest detail naming the same
    field as the message, and returns that field."""
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=RPC_TIMEOUT_S)
    error = refused.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    status = rpc_status.from_call(error)
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    field = bad_request.field_violations[0].field
    assert field in error.details()
    assert "UTF-8" in bad_request.field_violations[0].description
    assert error.details().isascii()  # the surrogate is quoted as its escape
    return str(field)


def seeded(recorder: RunningRecorder) -> None:
    stub = recorder.stub
    stub.RegisterNode(usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(mig_node())),
                      timeout=RPC_TIMEOUT_S)
    stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(kube_node(NODE, [gpu_device("GPU-0")]))),
        timeout=RPC_TIMEOUT_S)
    stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=NS,
                                            limits={"limits.nvidia.com/gpumem": 40960}),
                  timeout=RPC_TIMEOUT_S)


@pytest.mark.parametrize("case", NODE_CASES + POD_CASES, ids=lambda c: c.what)
def test_a_lone_surrogate_is_refused_naming_its_field_and_changes_nothing(
    start_recorder: StartRecorder, case: Case
) -> None:
    recorder = start_recorder()
    seeded(recorder)
    stub = recorder.stub
    before = figures(stub)
    watcher = Watcher(stub)
    watcher.wait_ready()
    try:
        raw = to_json(case.body())
        if case in NODE_CASES:
            requests = [(stub.RegisterNode,
                         usage_pb2.RegisterNodeRequest(kubernetes_node_json=raw))]
        else:
            requests = [(stub.RecordPod, usage_pb2.RecordPodRequest(kubernetes_pod_json=raw)),
                        (stub.Reserve, usage_pb2.ReserveRequest(
                            kubernetes_pod_json=raw, node_name="mig-node"))]
        for call, request in requests:
            assert refused_field(call, request) == case.field
        assert figures(stub) == before
        # A new stream reads the whole state (it once failed with INTERNAL here).
        assert Watcher(stub).wait_ready() is None
    finally:
        watcher.close()
    assert not watcher.events, f"state changed: {watcher.events[:2]}"
    recorder.stop()
    assert figures(start_recorder().stub) == before


def test_the_same_pod_without_the_surrogate_is_recorded_read_and_forgotten(
    start_recorder: StartRecorder,
) -> None:
    """The control case: the MIG pod of POD_CASES, well formed, goes through every step."""
    recorder = start_recorder()
    seeded(recorder)
    stub = recorder.stub
    recorded = stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(mig_pod())),
                              timeout=RPC_TIMEOUT_S)
    assert recorded.decision == "Recorded"
    assert [m.profile for m in recorded.stored[0].mig] == ["2g.10gb"]
    recorder.stop()
    restarted = start_recorder().stub
    assert restarted.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-mig-pod"),
                                 timeout=RPC_TIMEOUT_S).found
    assert restarted.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-mig-pod"),
                               timeout=RPC_TIMEOUT_S).found


# -- the Kubernetes source -----------------------------------------------------------------------


def test_the_kubernetes_source_skips_objects_holding_a_lone_surrogate(
    start_recorder: StartRecorder, tmp_path: Path
) -> None:
    """A poisoned node and pod in the fake API server's list, and more arriving by watch: the
    recorder becomes ready, records every readable object, reads its whole state, and does so
    again after a restart."""
    with FakeApiServer() as apiserver:
        apiserver.add("nodes", mig_node())
        apiserver.add("nodes", _node_with_device_field("type", f"NVIDIA{LONE}"))
        apiserver.add("pods", mig_pod(profile=f"2g.10gb{LONE}"))
        apiserver.add("resourcequotas", {"apiVersion": "v1", "kind": "ResourceQuota",
                                         "metadata": {"name": "q", "namespace": f"ns{LONE}"},
                                         "spec": {"hard": {"limits.nvidia.com/gpumem": "1"}}})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        recorder = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
        wait_for(lambda: health_status(recorder) == 1, "the first sync")
        stub = recorder.stub

        def node_names() -> list[str]:
            nodes = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
            return sorted(n.node_name for n in nodes.nodes)

        assert node_names() == ["mig-node"]
        assert not stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-mig-pod"),
                                    timeout=RPC_TIMEOUT_S).found
        # By watch: another poisoned node and pod, then readable ones behind them.
        apiserver.add("nodes", with_annotation(kube_node(f"late{LONE}", [gpu_device("GPU-9")]),
                                               "x", "y"))
        apiserver.update("pods", mig_pod(profile=f"1g.5gb{LONE}"))
        apiserver.update("nodes", kube_node(NODE, [gpu_device("GPU-0")]))
        apiserver.add("pods", mig_pod("good"))
        wait_for(lambda: stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid="uid-good"),
                                          timeout=RPC_TIMEOUT_S).found, "the readable pod")
        # Nodes and pods are watched by separate threads: either may come first.
        wait_for(lambda: node_names() == ["mig-node", NODE], "the readable node")
        watcher = Watcher(stub)
        watcher.wait_ready()
        watcher.close()
        before = figures(stub)
        recorder.stop()
        restarted = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
        wait_for(lambda: health_status(restarted) == 1, "the sync after the restart")
        assert figures(restarted.stub) == before
