"""A reservation outranks the pod's annotations across a restart (the grants are journaled with
it), and the Kubernetes source believes the cluster's pods as RecordPod does: a forged 1 MiB
grant is charged the request, and a pod carrying only what the device plugin hands out is
charged (docs/security.md, "Who may write what")."""

from __future__ import annotations

import json
from pathlib import Path

from hami.accounting.v1 import types_pb2, usage_pb2
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    ALLOCATED,
    allocation,
    app_container,
    gpu_device,
    kube_node,
    kube_pod,
    to_json,
)
from tests.support.vendor_cases import A100_PROFILES
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder
from tests.usage.test_store_k8s import stored_mib, wait_for, write_kubeconfig

NS = "team-a"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"


def test_a_reservation_survives_a_restart_and_still_outranks_the_annotations(
    start_recorder: StartRecorder,
) -> None:
    recorder = start_recorder()
    recorder.stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(kube_node("node-a", [gpu_device("GPU-a-0")]))),
        timeout=RPC_TIMEOUT_S)
    pod = kube_pod("victim", namespace=NS, apps=[app_container("main", gpumem=20000)])
    reserved = recorder.stub.Reserve(usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(pod), node_name="node-a",
        container_grants=[types_pb2.ContainerGrants(
            container_name="main", container_class=types_pb2.CONTAINER_CLASS_APP,
            grants=[types_pb2.DeviceGrant(uuid="GPU-a-0", device_type="NVIDIA",
                                          memory_mib=20000)])]),
        timeout=RPC_TIMEOUT_S)
    assert reserved.reserved
    recorder.stop()
    recorder = start_recorder()

    patched = kube_pod("victim", namespace=NS, apps=[app_container("main", gpumem=20000)],
                       allocation=allocation([("GPU-a-0", 1, 0)]), node="node-a",
                       phase="Running")
    response = recorder.stub.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(patched)), timeout=RPC_TIMEOUT_S)

    assert response.decision == "Unchanged"
    assert [(u.uuid, u.memory_mib) for u in response.stored] == [("GPU-a-0", 20000)]


def test_the_kubernetes_source_believes_no_more_than_record_pod(
    start_recorder: StartRecorder, tmp_path: Path
) -> None:
    apiserver = FakeApiServer()
    try:
        apiserver.add("nodes", kube_node("node-a", [gpu_device("GPU-a-0"),
                                                    gpu_device("GPU-a-1", index=1)]))
        apiserver.add("pods", kube_pod(
            "forged", uid="uid-forged", namespace=NS, apps=[app_container("main", gpumem=20000)],
            allocation=allocation([("GPU-a-0", 1, 0)]), node="node-a", phase="Running"))
        plugin_only = kube_pod(
            "plugin-only", uid="uid-plugin-only", namespace=NS,
            apps=[app_container("main", gpumem=8000)], phase="Running",
            # HAMi issue #3041's pod: what the device plugin serves it by, and no allocated key.
            annotations={TO_ALLOCATE: "GPU-a-1,NVIDIA,8000,0:;", "hami.io/vgpu-node": "node-a",
                         "hami.io/bind-phase": "allocating", "hami.io/bind-time": "1757923200"})
        plugin_only["spec"]["nodeName"] = "node-a"
        apiserver.add("pods", plugin_only)
        apiserver.start()
        recorder = start_recorder(kubernetes="kubeconfig",
                                  kubeconfig=write_kubeconfig(tmp_path / "kubeconfig",
                                                              apiserver.url))
        wait_for(lambda: stored_mib(recorder, "uid-plugin-only") == 8000,
                 "the pod carrying only to-allocate to be charged")
        assert stored_mib(recorder, "uid-forged") == 20000

        # A later watch event patching the grant down charges no less.
        patched = kube_pod(
            "forged", uid="uid-forged", namespace=NS, apps=[app_container("main", gpumem=20000)],
            allocation=allocation([("GPU-a-0", 0, 0)]), node="node-a", phase="Running",
            annotations={"example.com/note": "patched"})
        assert patched["metadata"]["annotations"][ALLOCATED] == "GPU-a-0,NVIDIA,0,0:;"
        apiserver.update("pods", patched)
        apiserver.add("pods", kube_pod(
            "marker", uid="uid-marker", namespace=NS, apps=[app_container("main", gpumem=100)],
            allocation=allocation([("GPU-a-1", 100, 0)]), node="node-a", phase="Running"))
        wait_for(lambda: stored_mib(recorder, "uid-marker") == 100, "the events after it")
        assert stored_mib(recorder, "uid-forged") == 20000
    finally:
        apiserver.stop()


def test_a_forged_mig_instance_is_charged_its_profile_not_the_annotated_memory(
    start_recorder: StartRecorder,
) -> None:
    """A pod created past the webhook with half an A100 (3g.20gb) written as 1 MiB holds the
    instance the device plugin creates: its namespace is charged the profile's memory."""
    recorder = start_recorder()
    card = {**gpu_device("GPU-mig-0", memory_mib=40960, slots=7), "mode": "mig",
            "type": "NVIDIA-A100-SXM4-40GB", "migProfiles": A100_PROFILES}
    recorder.stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(kube_node("node-mig", [card]))), timeout=RPC_TIMEOUT_S)
    instance = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-mig-0",
                 "profile": "3g.20gb", "placement": {"start": 4, "size": 4}}]
    forged = kube_pod("forger", namespace=NS, apps=[app_container("main", gpumem=1)],
                      allocation=allocation([("GPU-mig-0", 1, 0)]), node="node-mig",
                      phase="Running",
                      annotations={"nvidia.com/vgpu-mode": "mig",
                                   "hami.io/vgpu-mig-allocations": json.dumps(instance)})

    response = recorder.stub.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(forged)), timeout=RPC_TIMEOUT_S)
    used = recorder.stub.GetNamespaceUsage(
        usage_pb2.GetNamespaceUsageRequest(namespace=NS), timeout=RPC_TIMEOUT_S)

    assert [(u.uuid, u.memory_mib, u.core_percent) for u in response.stored] == [
        ("GPU-mig-0", 20480, 42)]
    assert {i.resource: i.used for i in used.items}["nvidia.com/gpumem"] == 20480
