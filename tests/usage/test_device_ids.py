"""A device id belongs to one node: registering it on a second node is refused.

A device id is a card's hardware identity (NVIDIA's GPU UUID, the Ascend device plugin's
UUID), or one HAMi makes unique per node for cards it derives from a node's capacity
(``<node>-cambricon-mlu-0``). The same id on two nodes is a misconfigured or forged
registration; it was accepted, and charges to either node's card then named the same device.
"""

from __future__ import annotations

import grpc
import pytest

from hami.accounting.v1 import types_pb2, usage_pb2
from tests.support.pods import gpu_device, kube_node, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder


def register(stub: object, name: str, *uuids: str) -> usage_pb2.RegisterNodeResponse:
    gpus = [gpu_device(uuid, index=i) for i, uuid in enumerate(uuids)]
    return stub.RegisterNode(  # type: ignore[attr-defined, no-any-return]
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(kube_node(name, gpus))),
        timeout=RPC_TIMEOUT_S,
    )


def nodes(stub: object) -> dict[str, list[str]]:
    response = stub.GetNodeUsage(  # type: ignore[attr-defined]
        usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    return {n.node_name: [d.uuid for d in n.devices] for n in response.nodes}


def test_a_device_registered_on_another_node_is_refused_until_that_node_lets_it_go(
    start_recorder: StartRecorder,
) -> None:
    stub = start_recorder().stub
    register(stub, "node-a", "GPU-0", "GPU-1")
    with pytest.raises(grpc.RpcError) as refused:
        register(stub, "node-b", "GPU-9", "GPU-1")
    error = refused.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Named where the request wrote it: the register annotation's entry.
    assert ('kubernetes_node_json.metadata.annotations["hami.io/node-nvidia-register"][1].id: '
            'device "GPU-1" is registered on node "node-a"') in error.details()
    assert nodes(stub) == {"node-a": ["GPU-0", "GPU-1"]}
    # The typed inventory is refused the same way.
    with pytest.raises(grpc.RpcError) as typed:
        stub.RegisterNode(usage_pb2.RegisterNodeRequest(
            node_name="node-c", inventory=types_pb2.NodeInventory(devices=[
                types_pb2.Device(uuid="GPU-0", memory_total_mib=1, vendor="NVIDIA")])),
            timeout=RPC_TIMEOUT_S)
    assert typed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'inventory.devices[0].uuid: device "GPU-0"' in typed.value.details()
    # Its own node may register it again, with others or alone.
    register(stub, "node-a", "GPU-1")
    assert nodes(stub) == {"node-a": ["GPU-1"]}
    # GPU-0 is free now; GPU-1 is not, also after a restart.
    register(stub, "node-b", "GPU-0")
    with pytest.raises(grpc.RpcError):
        register(stub, "node-b", "GPU-0", "GPU-1")
    assert nodes(stub) == {"node-a": ["GPU-1"], "node-b": ["GPU-0"]}


def test_the_ids_held_are_known_again_after_a_restart(start_recorder: StartRecorder) -> None:
    first = start_recorder()
    register(first.stub, "node-a", "GPU-0")
    first.stop()
    stub = start_recorder().stub
    with pytest.raises(grpc.RpcError) as refused:
        register(stub, "node-b", "GPU-0")
    assert "registered on node" in refused.value.details()
