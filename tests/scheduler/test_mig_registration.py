"""A MIG card registering profiles it cannot hold is refused at RegisterNode; MIG pods go on
being placed on the healthy MIG nodes among the candidates.

Once such a node was kept: Filter chose its impossible instance, the recorder's Reserve
refused it by the card's own capacity every time, and after three attempts the answer was
ReservationConflict blaming another scheduler, with a healthy MIG node among the candidates.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import usage_pb2
from tests.scheduler.conftest import RPC_TIMEOUT_S, Recorder, Scheduler
from tests.support.pods import to_json

REGISTER = "hami.io/node-nvidia-register"
ONE_G = {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
         "placements": [{"start": s, "size": 1} for s in range(7)]}
"""A100 40GB, pkg/device/nvidia/mig_capability_test.go."""


def mig_node(name: str, profile: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {REGISTER: json.dumps([{
        "id": f"GPU-{name}", "count": 7, "devmem": 40960, "devcore": 100, "type": "A100",
        "health": True, "mode": "mig", "migProfiles": [profile]}])}}}


BAD_PROFILES = {
    "more memory than the card": (dict(ONE_G, memoryMB=50000), "[0].memoryMB"),
    "more compute than the card": (dict(ONE_G, core=140), "[0].core"),
    "a placement beyond its slices": (dict(ONE_G, placements=[{"start": 60, "size": 4}]),
                                      "[0].placements[0]"),
}


@pytest.mark.parametrize("what", BAD_PROFILES)
def test_an_impossible_profile_is_refused_and_mig_pods_go_to_the_healthy_node(
    recorder: Recorder, scheduler: Scheduler, what: str
) -> None:
    profile, field = BAD_PROFILES[what]
    recorder.stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        kubernetes_node_json=to_json(mig_node("healthy", ONE_G))), timeout=RPC_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as refused:
        recorder.stub.RegisterNode(usage_pb2.RegisterNodeRequest(
            kubernetes_node_json=to_json(mig_node("impossible", profile))), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (f'kubernetes_node_json.metadata.annotations["{REGISTER}"][0].migProfiles{field}'
            in refused.value.details())
    nodes = recorder.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    assert [n.node_name for n in nodes.nodes] == ["healthy"]

    pod = {"metadata": {"name": "mig-pod", "namespace": "mig", "uid": "uid-mig-pod",
                        "annotations": {"nvidia.com/vgpu-mode": "mig"}},
           "spec": {"containers": [{"name": "main", "resources": {"limits": {
               "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}}}]}}
    response = scheduler.filter(pod, ["impossible", "healthy"])
    assert (response.reason, response.node_name) == ("Scheduled", "healthy"), response.message
    assert dict(response.failed_nodes) == {"impossible": "node unregistered"}
