"""Every vendor of the table, end to end over the real gRPC servers.

One recorder (every vendor of the table turned on, plus ``Acme``, a vendor added as one table
entry), one admission daemon and one scheduler daemon on 127.0.0.1. For each vendor, a node
registered the way HAMi's device plugin (or the node's capacity) describes it, and a pod with an
init container that asks more than its app container, written with the vendor's own resource
names, goes through:

1. ``CheckQuota``: admitted, the requested memory and cores as HAMi's admission counts them;
2. ``Filter``: placed, with the vendor's allocation annotation(s) byte for byte as HAMi writes
   them (and what its device plugin reads besides);
3. ``RecordPod`` bound with those annotations while its init container runs: the envelope of
   init and app is stored; then with the init container finished: shrunk to the app's share;
4. ``ForgetPod``: exactly the stored share is released, and the node and namespace are empty.

The nodes, resources and annotations come from HAMi's tests and examples, named per case.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)
from services.admission.__main__ import AdmissionDaemon
from services.admission.__main__ import start as start_admission
from services.admission.config import AdmissionConfig
from services.common.server import client_channel
from services.scheduler.__main__ import SchedulerDaemon
from services.scheduler.__main__ import start as start_scheduler
from services.scheduler.config import SchedulerConfig
from services.usage.__main__ import UsageRecorder
from services.usage.__main__ import start as start_usage
from services.usage.config import UsageConfig
from tests.support.pods import running, terminated, to_json
from tests.support.vendor_cases import CASES, Charge, Json, VendorCase
from tests.support.vendor_cases import node as _node
from tests.support.vendor_cases import register as _register
from tests.support.vendors import ACME_SPEC, registered

TIMEOUT_S = 10.0
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Stack:
    usage: grpc.Channel
    admission: grpc.Channel
    scheduler: grpc.Channel

    @property
    def recorder(self) -> usage_pb2_grpc.UsageRecorderStub:
        return usage_pb2_grpc.UsageRecorderStub(self.usage)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with registered(ACME_SPEC):
        data_dir: Path = tmp_path_factory.mktemp("every-vendor")
        usage_addr = f"127.0.0.1:{_free_port()}"
        recorder: UsageRecorder = start_usage(UsageConfig.from_env({
            "HAMI_ACCOUNTING_LISTEN_ADDR": usage_addr,
            "HAMI_ACCOUNTING_DATA_DIR": str(data_dir),
            "HAMI_ACCOUNTING_METRICS_ADDR": "off",
            "HAMI_ACCOUNTING_VENDORS": "all,Acme",
        }), max_workers=8)
        common = {
            "HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0",
            "HAMI_ACCOUNTING_METRICS_ADDR": "off",
            "HAMI_ACCOUNTING_USAGE_ADDR": usage_addr,
        }
        admission: AdmissionDaemon = start_admission(
            AdmissionConfig.from_env(common), max_workers=4
        )
        scheduler: SchedulerDaemon = start_scheduler(
            SchedulerConfig.from_env(common), max_workers=4
        )
        with (
            client_channel(usage_addr) as usage,
            client_channel(admission.target) as admission_channel,
            client_channel(scheduler.target) as scheduler_channel,
        ):
            yield Stack(usage, admission_channel, scheduler_channel)
        admission.stop(grace_s=0)
        scheduler.stop(grace_s=0)
        recorder.stop(grace_s=0)


def _pod(case: VendorCase, name: str, *, annotations: Mapping[str, str] = {},
         node: str | None = None, init_state: Json | None = None) -> Json:
    namespace = f"ns-{name}"
    metadata: Json = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                      "annotations": {**case.pod_annotations, **annotations}}
    spec: Json = {
        "initContainers": [{"name": "prepare", "resources": {"limits": case.init}}],
        "containers": [{"name": "main", "resources": {"limits": case.app}}],
    }
    status: Json = {"phase": "Pending"}
    if node is not None:
        spec["nodeName"] = node
        status = {"phase": "Running", "initContainerStatuses": [init_state],
                  "containerStatuses": [running("main")]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": status}


def _charges(stored: Any) -> tuple[Charge, ...]:
    return tuple((u.uuid, u.memory_mib, u.core_percent, u.slots) for u in stored)


def _node_used(stack: Stack, node_name: str) -> tuple[Charge, ...]:
    [node] = stack.recorder.GetNodeUsage(
        usage_pb2.GetNodeUsageRequest(node_names=[node_name]), timeout=TIMEOUT_S
    ).nodes
    return tuple(
        (d.uuid, d.memory_used_mib, d.cores_used, d.slots_used)
        for d in node.devices
        if d.memory_used_mib or d.cores_used or d.slots_used
    )


def _namespace_used(stack: Stack, namespace: str) -> dict[str, int]:
    response = stack.recorder.GetNamespaceUsage(
        usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=TIMEOUT_S
    )
    return {item.resource: item.used for item in response.items if item.used}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.vendor}: {c.source.split(';')[0]}")
def test_a_pod_of_every_vendor_is_admitted_placed_recorded_shrunk_and_released(
    stack: Stack, case: VendorCase
) -> None:
    name = f"{case.vendor.lower()}-{'mig' if case.mig_in_use else 'pod'}"
    node_name = case.node["metadata"]["name"]
    namespace = f"ns-{name}"
    recorder = stack.recorder
    recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(case.node)), timeout=TIMEOUT_S
    )
    recorder.SetQuota(usage_pb2.SetQuotaRequest(namespace=namespace, limits=case.quota),
                      timeout=TIMEOUT_S)
    pod = _pod(case, name)

    # 1. Admission: HAMi's count is the init container's peak.
    checked = admission_pb2_grpc.AdmissionStub(stack.admission).CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)), timeout=TIMEOUT_S
    )
    assert checked.allowed, checked.message
    requested = {item.resource: item.requested for item in checked.items if item.requested}
    assert {k: requested.get(k) for k in case.requested} == case.requested

    # 2. Filter: placed, written in the vendor's own annotations.
    placed = scheduler_pb2_grpc.SchedulerStub(stack.scheduler).Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=[node_name]),
        timeout=TIMEOUT_S,
    )
    assert (placed.reason, placed.node_name) == ("Scheduled", node_name), placed.message
    written = dict(placed.annotations)
    assert {k: written.get(k) for k in case.annotations} == case.annotations
    assert written["hami.io/vgpu-node"] == node_name
    assert _charges(placed.reserved) == case.effective

    # 3. Bound and running its init container: the envelope; init finished: the app's share.
    bound = _pod(case, name, annotations=written, node=node_name, init_state=running("prepare"))
    recorded = recorder.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(bound)), timeout=TIMEOUT_S
    )
    assert _charges(recorded.stored) == case.effective
    assert _node_used(stack, node_name) == case.effective
    finished = _pod(case, name, annotations=written, node=node_name,
                    init_state=terminated("prepare"))
    shrunk = recorder.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(finished)), timeout=TIMEOUT_S
    )
    assert (shrunk.decision, shrunk.init_released) == ("Shrunk", True) or (
        case.effective == case.steady and shrunk.init_released
    ), shrunk.message
    assert _charges(shrunk.stored) == case.steady
    assert _node_used(stack, node_name) == case.steady
    if case.mig_in_use:
        [node] = recorder.GetNodeUsage(
            usage_pb2.GetNodeUsageRequest(node_names=[node_name]), timeout=TIMEOUT_S
        ).nodes
        assert tuple((p.start, p.size) for p in node.devices[0].mig_in_use) == case.mig_in_use
    used = _namespace_used(stack, namespace)
    memory, cores = (sum(c[1] for c in case.steady), sum(c[2] for c in case.steady))
    for resource in case.requested:
        if resource.endswith(("mem", "memory", "vmemory", ".vMem", "-memory")):
            assert used.get(resource) == memory, (resource, used)
        elif resource.endswith(("cores", "core", "vcore", ".vCore")):
            assert used.get(resource) == cores, (resource, used)

    # 4. Forgotten: exactly what was stored is released; nothing is left anywhere.
    released = recorder.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=f"uid-{name}"),
                                  timeout=TIMEOUT_S)
    assert released.found and _charges(released.released) == case.steady
    assert _node_used(stack, node_name) == ()
    assert _namespace_used(stack, namespace) == {}
    if case.mig_in_use:
        [node] = recorder.GetNodeUsage(
            usage_pb2.GetNodeUsageRequest(node_names=[node_name]), timeout=TIMEOUT_S
        ).nodes
        assert not node.devices[0].mig_in_use


def test_a_mig_pod_no_instance_fits_is_refused_with_a_reason(stack: Stack) -> None:
    """HAMi's own MIG node registration (device_test.go:2472): one 1g.5gb placement. The first
    3000 MiB pod takes it; the second fits no instance and is refused naming why."""
    node = _node("mig-one", _register("hami.io/node-nvidia-register", {
        "id": "GPU-0", "count": 7, "devmem": 40960, "devcore": 100,
        "type": "NVIDIA-A100-SXM4-40GB", "numa": 0, "health": True, "mode": "mig",
        "migProfiles": [{"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
                         "instanceCount": 7, "multiprocessorCount": 14,
                         "placements": [{"start": 6, "size": 1}]}]}))
    stack.recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(node)), timeout=TIMEOUT_S
    )
    scheduler = scheduler_pb2_grpc.SchedulerStub(stack.scheduler)

    def pod(name: str) -> Json:
        return {"metadata": {"name": name, "namespace": "mig", "uid": f"uid-{name}"},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {
                    "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}}}]}}

    first = scheduler.Filter(scheduler_pb2.FilterRequest(
        kubernetes_pod_json=to_json(pod("first")), node_names=["mig-one"]), timeout=TIMEOUT_S)
    assert first.reason == "Scheduled"
    assert first.annotations["hami.io/vgpu-devices-allocated"] == "GPU-0,NVIDIA,5120,14:;"
    second = scheduler.Filter(scheduler_pb2.FilterRequest(
        kubernetes_pod_json=to_json(pod("second")), node_names=["mig-one"]), timeout=TIMEOUT_S)
    assert second.reason == "NoNodeFits"
    assert dict(second.failed_nodes) == {"mig-one": "1/1 CardMigTopologyInfeasible"}
    stack.recorder.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-first"), timeout=TIMEOUT_S)
    again = scheduler.Filter(scheduler_pb2.FilterRequest(
        kubernetes_pod_json=to_json(pod("second")), node_names=["mig-one"]), timeout=TIMEOUT_S)
    assert again.reason == "Scheduled"
    stack.recorder.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-second"), timeout=TIMEOUT_S)


def test_every_vendor_of_the_table_has_a_case() -> None:
    from accounting.vendors import VENDORS

    covered = {case.vendor for case in CASES}
    assert {spec.vendor for spec in VENDORS} - covered == set()
