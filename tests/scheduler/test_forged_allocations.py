"""Forged allocation annotations reach the recorder anyway (no webhook, a pod in an unguarded
namespace, an update by an annotation writer gone wrong): the recorder never charges less than
a pod asks, never on a device of another node, charges a pod that carries only what the device
plugin hands out, and keeps what it reserved whatever a later update says. Each attack of
docs/security.md, "Who may write what", through the real recorder and scheduler over gRPC."""

from __future__ import annotations

import copy
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import usage_pb2
from tests.scheduler.conftest import NS, RPC_TIMEOUT_S, Recorder, Scheduler
from tests.support.pods import (
    ALLOCATED,
    VGPU_NODE,
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_pod,
    running,
    terminated,
    to_json,
)

TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
CARD_MIB = 24000


def two_nodes(recorder: Recorder) -> None:
    recorder.register_node("node-a", [gpu_device("GPU-a-0", memory_mib=CARD_MIB)])
    recorder.register_node("node-b", [gpu_device("GPU-b-0", memory_mib=CARD_MIB)])


def record_raw(recorder: Recorder, pod: dict[str, Any]) -> usage_pb2.RecordPodResponse:
    response: usage_pb2.RecordPodResponse = recorder.stub.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)), timeout=RPC_TIMEOUT_S
    )
    return response


def stored(response: usage_pb2.RecordPodResponse) -> list[tuple[str, int, int]]:
    return [(u.uuid, u.memory_mib, u.core_percent) for u in response.stored]


def test_a_pod_asking_20000_mib_with_a_forged_1_mib_grant_is_charged_20000(
    recorder: Recorder,
) -> None:
    two_nodes(recorder)
    pod = kube_pod("forged", namespace=NS, apps=[app_container("main", gpumem=20000)],
                   allocation=allocation([("GPU-a-0", 1, 0)]), node="node-a", phase="Running")

    response = record_raw(recorder, pod)

    assert response.decision == "Recorded"
    assert stored(response) == [("GPU-a-0", 20000, 0)]
    assert recorder.namespace_used(NS) == 20000
    assert recorder.node_memory("node-a") == 20000


def test_a_grant_on_another_nodes_gpu_is_refused_and_charges_nothing(
    recorder: Recorder,
) -> None:
    two_nodes(recorder)
    pod = kube_pod("elsewhere", namespace=NS, apps=[app_container("main", gpumem=20000)],
                   allocation=allocation([("GPU-b-0", 20000, 0)]), phase="Running")
    # Bound to node-a; the writable annotation names node-b, whose GPU the grant names.
    pod["spec"]["nodeName"] = "node-a"
    pod["metadata"]["annotations"][VGPU_NODE] = "node-b"

    with pytest.raises(grpc.RpcError) as raised:
        record_raw(recorder, pod)

    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "node node-a has no device GPU-b-0" in (raised.value.details() or "")
    assert recorder.node_memory("node-b") == 0
    assert recorder.node_memory("node-a") == 0
    assert not recorder.stored("uid-team-a-elsewhere").found


def test_the_node_is_the_one_the_pod_is_bound_to(recorder: Recorder) -> None:
    two_nodes(recorder)
    pod = kube_pod("bound", namespace=NS, apps=[app_container("main", gpumem=20000)],
                   allocation=allocation([("GPU-a-0", 20000, 0)]), node="node-a",
                   phase="Running")
    pod["metadata"]["annotations"][VGPU_NODE] = "node-b"

    record_raw(recorder, pod)

    assert recorder.stored("uid-team-a-bound").node_name == "node-a"
    assert (recorder.node_memory("node-a"), recorder.node_memory("node-b")) == (20000, 0)


def test_pods_carrying_only_to_allocate_are_charged_and_the_quota_holds(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node-a", [gpu_device(f"GPU-a-{i}", memory_mib=CARD_MIB, index=i)
                                      for i in range(5)])
    recorder.set_quota(NS, {"limits.nvidia.com/gpumem": 10000})

    decisions = []
    for i in range(5):
        pod = kube_pod(f"plugin-{i}", namespace=NS, apps=[app_container("main", gpumem=8000)],
                       phase="Running",
                       annotations={TO_ALLOCATE: f"GPU-a-{i},NVIDIA,8000,0:;",
                                    VGPU_NODE: "node-a", "hami.io/bind-phase": "allocating"})
        pod["spec"]["nodeName"] = "node-a"
        decisions.append(record_raw(recorder, pod).decision)

    assert decisions == ["Recorded"] * 5
    # What runs is charged, over the quota it was never checked against; nothing more fits.
    assert recorder.namespace_used(NS) == 40000
    response = scheduler.filter(
        kube_pod("next", namespace=NS, apps=[app_container("main", gpumem=1000)]), ["node-a"]
    )
    assert response.reason == "NoNodeFits"
    assert "ResourceQuotaNotFit" in response.failed_nodes["node-a"]


def _placed(scheduler: Scheduler, pod: dict[str, Any], node: str = "node-a") -> dict[str, Any]:
    """The pod as HAMi's extender and Bind leave it after our Filter: annotated and bound."""
    response = scheduler.filter(pod, [node])
    assert response.reason == "Scheduled", response.message
    placed = copy.deepcopy(pod)
    placed["metadata"]["annotations"].update(dict(response.annotations))
    placed["spec"]["nodeName"] = response.node_name
    placed["status"]["phase"] = "Running"
    return placed


def test_an_update_patching_a_reserved_allocation_down_changes_nothing(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node-a", [gpu_device("GPU-a-0", memory_mib=CARD_MIB)])
    placed = _placed(
        scheduler, kube_pod("victim", namespace=NS, apps=[app_container("main", gpumem=20000)])
    )
    assert record_raw(recorder, placed).decision == "Unchanged"

    patched = copy.deepcopy(placed)
    patched["metadata"]["annotations"][ALLOCATED] = "GPU-a-0,NVIDIA,1,0:;"
    response = record_raw(recorder, patched)

    assert response.decision == "Unchanged"
    assert stored(response) == [("GPU-a-0", 20000, 0)]
    # The next 20,000 MiB pod does not fit the same 24,000 MiB card.
    second = scheduler.filter(
        kube_pod("second", namespace="team-b", apps=[app_container("main", gpumem=20000)]),
        ["node-a"],
    )
    assert second.reason == "NoNodeFits"
    assert second.failed_nodes["node-a"] == "1/1 CardInsufficientMemory"
    assert recorder.node_memory("node-a") == 20000


def test_an_update_moving_a_reserved_allocation_to_another_card_changes_nothing(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node-a", [gpu_device("GPU-a-0", memory_mib=CARD_MIB),
                                      gpu_device("GPU-a-1", memory_mib=CARD_MIB, index=1)])
    placed = _placed(
        scheduler, kube_pod("victim", namespace=NS, apps=[app_container("main", gpumem=20000)])
    )
    card = placed["metadata"]["annotations"][ALLOCATED].split(",")[0]
    other = "GPU-a-1" if card == "GPU-a-0" else "GPU-a-0"
    moved = copy.deepcopy(placed)
    moved["metadata"]["annotations"][ALLOCATED] = f"{other},NVIDIA,20000,0:;"
    moved["metadata"]["annotations"][TO_ALLOCATE] = f"{other},NVIDIA,20000,0:;"

    response = record_raw(recorder, moved)

    assert stored(response) == [(card, 20000, 0)]
    devices = recorder.devices("node-a")
    assert (devices[card].memory_used_mib, devices[other].memory_used_mib) == (20000, 0)


def test_a_reserved_pod_shrinks_by_the_reserved_grants_not_a_forged_app_grant(
    recorder: Recorder, scheduler: Scheduler
) -> None:
    recorder.register_node("node-a", [gpu_device("GPU-a-0", memory_mib=CARD_MIB)])
    pod = kube_pod("trainer", namespace=NS, init=[init_container("convert", gpumem=20000)],
                   apps=[app_container("server", gpumem=10000)])
    placed = _placed(scheduler, pod)
    forged = copy.deepcopy(placed)
    # All the memory moved onto the init container: the shrink would leave 1 MiB.
    forged["metadata"]["annotations"][ALLOCATED] = "GPU-a-0,NVIDIA,20000,0:;GPU-a-0,NVIDIA,1,0:;"
    forged["status"]["initContainerStatuses"] = [running("convert")]
    assert stored(record_raw(recorder, forged)) == [("GPU-a-0", 20000, 0)]

    forged["status"]["initContainerStatuses"] = [terminated("convert")]
    response = record_raw(recorder, forged)

    assert response.decision == "Shrunk"
    assert stored(response) == [("GPU-a-0", 10000, 0)]
