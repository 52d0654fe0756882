"""One device id registered on two nodes is two cards, as in HAMi: each node's usage is its own.

HAMi accounts a pod's devices within the pod's own node (pkg/scheduler/scheduler.go,
``getNodesUsage``: the node of ``p.NodeID``, then ``d.Device.ID == udevice.UUID`` among that
node's devices), and so does the ledger (usage per node, then per device id). Ids are not
unique across a cluster for every vendor (HAMi's own tests give Vastai and Biren cards ``7-0``
and several Ascend chips ``npu-0``), so refusing the second node would leave a real node with
no devices at all; keyed by node, the same id on two nodes can never mix their usage.
"""

from __future__ import annotations

from hami.accounting.v1 import usage_pb2
from tests.support.pods import allocation, app_container, gpu_device, kube_node, kube_pod, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder


def used_mib(stub: object) -> dict[str, dict[str, int]]:
    response = stub.GetNodeUsage(  # type: ignore[attr-defined]
        usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    return {n.node_name: {d.uuid: d.memory_used_mib for d in n.devices} for n in response.nodes}


def test_the_same_id_on_two_nodes_is_two_cards_whose_usage_never_mixes(
    start_recorder: StartRecorder,
) -> None:
    recorder = start_recorder()
    stub = recorder.stub
    for node in ("node-a", "node-b"):
        stub.RegisterNode(usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(
            kube_node(node, [gpu_device("GPU-1")]))), timeout=RPC_TIMEOUT_S)
    pods = {
        node: kube_pod(f"p-{node}", uid=f"uid-{node}", namespace="ns", node=node,
                       apps=[app_container("main", gpumem=mib)],
                       allocation=allocation([("GPU-1", mib, 0)]))
        for node, mib in (("node-a", 8192), ("node-b", 2048))
    }
    for pod in pods.values():
        stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)),
                       timeout=RPC_TIMEOUT_S)
    assert used_mib(stub) == {"node-a": {"GPU-1": 8192}, "node-b": {"GPU-1": 2048}}

    recorder.stop()
    stub = start_recorder().stub
    assert used_mib(stub) == {"node-a": {"GPU-1": 8192}, "node-b": {"GPU-1": 2048}}
    released = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-node-a"),
                              timeout=RPC_TIMEOUT_S)
    assert [u.memory_mib for u in released.released] == [8192]
    assert used_mib(stub) == {"node-a": {"GPU-1": 0}, "node-b": {"GPU-1": 2048}}
