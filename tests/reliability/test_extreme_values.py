"""Extreme values through the real gRPC servers: no arithmetic path leaves int64 (or int32) on
the wire, every stored quantity is bounded at the door.

Issue 15 found SetQuota accepting ``limits.nvidia.com/gpumem`` up to 2^63 − 1; with a memory
factor of 2 every CheckQuota in that namespace then failed with INTERNAL (``ValueError: Value out
of range`` when limit × factor passed int64). Here a recorder, an admission daemon and a
scheduler run on 127.0.0.1:0 with the largest memory factor, and Hypothesis drives them with the
largest and just-too-large values of every quantity (quota limits, counts, MiB, cores, slots,
many containers, many pods on one device). Every answer is OK or INVALID_ARGUMENT naming a field
— never INTERNAL — and an OK answer carries the exact numbers (or, for a total over pods, the
field's maximum: see ``accounting.limits.MAX_QUOTA_LIMIT``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.limits import (
    INT32_MAX,
    INT64_MAX,
    MAX_DEVICES_PER_CONTAINER,
    MAX_GRANT_SLOTS,
    MAX_MEMORY_FACTOR,
    MAX_QUOTA_LIMIT,
)
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.admission.__main__ import start as start_admission
from services.admission.config import AdmissionConfig
from services.common.server import client_channel
from services.scheduler.__main__ import start as start_scheduler
from services.scheduler.config import SchedulerConfig
from services.usage.__main__ import start as start_usage
from services.usage.config import UsageConfig
from tests.reliability.sizes import sized

FACTOR = MAX_MEMORY_FACTOR
MEMORY_CEILING_MIB = INT32_MAX // FACTOR
"""The largest gpumem a container may ask for with this factor (HAMi's rule)."""
KEYS = {
    "memory": "limits.nvidia.com/gpumem",
    "cores": "limits.nvidia.com/gpucores",
    "count": "limits.nvidia.com/gpu",
}
NODE = "extreme-node"
UUID = "GPU-extreme-0"
_unique = itertools.count()


@dataclass
class Stack:
    usage: usage_pb2_grpc.UsageRecorderStub
    admission: admission_pb2_grpc.AdmissionStub
    scheduler: scheduler_pb2_grpc.SchedulerStub


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    common = {"HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0", "HAMI_ACCOUNTING_METRICS_ADDR": "off"}
    data_dir: Path = tmp_path_factory.mktemp("extreme")
    # The memory factor is the recorder's policy; admission and scheduler take it from there.
    recorder = start_usage(UsageConfig.from_env(
        {**common, "HAMI_ACCOUNTING_DATA_DIR": str(data_dir),
         "HAMI_ACCOUNTING_MEMORY_FACTOR": str(FACTOR)}), max_workers=4)
    peers = {**common, "HAMI_ACCOUNTING_USAGE_ADDR": recorder.target}
    admission = start_admission(AdmissionConfig.from_env(peers), max_workers=4)
    scheduler = start_scheduler(SchedulerConfig.from_env(peers), max_workers=4)
    channels = [client_channel(d.target) for d in (recorder, admission, scheduler)]
    try:
        usage = usage_pb2_grpc.UsageRecorderStub(channels[0])
        # One device as large as an inventory allows: sums over pods on it grow past int32.
        usage.RegisterNode(usage_pb2.RegisterNodeRequest(
            node_name=NODE, inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
                uuid=UUID, device_type="NVIDIA A100", slots_total=INT32_MAX,
                memory_total_mib=INT32_MAX, cores_total=INT32_MAX, vendor="NVIDIA")])),
            timeout=10)
        yield Stack(usage, admission_pb2_grpc.AdmissionStub(channels[1]),
                    scheduler_pb2_grpc.SchedulerStub(channels[2]))
    finally:
        for channel in channels:
            channel.close()
        scheduler.stop(grace_s=0)
        admission.stop(grace_s=0)
        recorder.stop(grace_s=0)


def _call(method: Any, request: Any) -> Any:
    """The answer, or the INVALID_ARGUMENT error (anything else fails the test)."""
    try:
        return method(request, timeout=30)
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
        return error


# -- values at and just past every bound ----------------------------------------------------

_LIMITS = st.sampled_from([None, 0, 1, 24576, MAX_QUOTA_LIMIT, MAX_QUOTA_LIMIT + 1, INT64_MAX])
_COUNTS = st.sampled_from(["1", "8", str(MAX_DEVICES_PER_CONTAINER),
                           str(MAX_DEVICES_PER_CONTAINER + 1), "1e400"])
_MEMORY = st.sampled_from(["0", "1", str(MEMORY_CEILING_MIB), str(MEMORY_CEILING_MIB + 1),
                           "2Gi", "9999999999999Gi", str(INT32_MAX)])
_CORES = st.sampled_from(["0", "100", "120", "1e400", str(INT32_MAX), "1500m"])


_CONTAINER_LIMITS = st.fixed_dictionaries(
    {"nvidia.com/gpu": _COUNTS, "nvidia.com/gpumem": _MEMORY, "nvidia.com/gpucores": _CORES}
)
_COPIES = st.sampled_from([1, 2, 255, 256])
"""Up to 256 app containers, alike (cheap to draw, as large in sum as a pod may be)."""


def _expected_request(specs: list[dict[str, Any]]) -> tuple[int, int, int] | None:
    """(count, memory MiB × factor, cores) these app containers ask for, or None when the pod
    must be refused (a reading outside the bounds)."""
    count = memory = cores = 0
    for spec in specs:
        limits = spec["resources"]["limits"]
        devices = {"1e400": -1}.get(limits["nvidia.com/gpu"])
        devices = int(limits["nvidia.com/gpu"]) if devices is None else devices
        mib = {"2Gi": -1, "9999999999999Gi": -1}.get(limits["nvidia.com/gpumem"])
        mib = int(limits["nvidia.com/gpumem"]) if mib is None else mib
        percent = {"1500m": -1, "1e400": 100}.get(limits["nvidia.com/gpucores"])
        percent = int(limits["nvidia.com/gpucores"]) if percent is None else percent
        if not 0 < devices <= MAX_DEVICES_PER_CONTAINER or not 0 <= mib <= MEMORY_CEILING_MIB:
            return None
        if percent < 0:
            return None
        count += devices
        memory += devices * (mib or 0)
        cores += devices * min(percent, 100)
    return count, memory * FACTOR, cores


@pytest.mark.slow
@settings(max_examples=sized(60, 400), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(limits=st.fixed_dictionaries({key: _LIMITS for key in KEYS.values()}),
       container_limits=_CONTAINER_LIMITS, copies=_COPIES)
def test_quota_checks_never_leave_int64(
    stack: Stack, limits: dict[str, int | None], container_limits: dict[str, str], copies: int
) -> None:
    specs = [{"name": f"c{i}", "resources": {"limits": container_limits}} for i in range(copies)]
    namespace = f"extreme-{next(_unique)}"
    wanted = {key: value for key, value in limits.items() if value is not None}
    answer = _call(stack.usage.SetQuota,
                   usage_pb2.SetQuotaRequest(namespace=namespace, limits=wanted))
    too_large = sorted(key for key, value in wanted.items() if value > MAX_QUOTA_LIMIT)
    if too_large:
        assert isinstance(answer, grpc.RpcError)
        for key in too_large:
            assert f"limits[{key!r}]: must be between 0 and {MAX_QUOTA_LIMIT}" in answer.details()
        wanted = {}
    else:
        assert isinstance(answer, usage_pb2.SetQuotaResponse)

    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": namespace, "uid": f"uid-{namespace}"},
           "spec": {"containers": specs}}
    checked = _call(stack.admission.CheckQuota, admission_pb2.CheckQuotaRequest(
        kubernetes_pod_json=json.dumps(pod).encode()))
    expected = _expected_request(specs)
    if expected is None:
        assert isinstance(checked, grpc.RpcError)
        assert "kubernetes_pod_json.spec.containers[0].resources.limits[" in checked.details()
        return
    assert isinstance(checked, admission_pb2.CheckQuotaResponse), checked.details()
    (vendor,) = checked.effective
    assert (vendor.count, vendor.memory_mib, vendor.core_percent) == expected
    for item in checked.items:
        key = f"limits.{item.resource}"
        if key in wanted:
            factor = FACTOR if item.resource == "nvidia.com/gpumem" else 1
            assert item.limit == wanted[key] * factor  # exact: at most 10^12 × 65536


def _containers(memory_mib: int, core_percent: int, slots: int, per_container: int,
                copies: int) -> list[types_pb2.Container]:
    grant = types_pb2.DeviceGrant(uuid=UUID, device_type="NVIDIA", memory_mib=memory_mib,
                                  core_percent=core_percent, slots=slots)
    return [types_pb2.Container(name=f"c{i}", container_class=types_pb2.CONTAINER_CLASS_APP,
                                grants=[grant] * per_container) for i in range(copies)]


@pytest.mark.slow
@settings(max_examples=sized(25, 150), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(memory_mib=st.sampled_from([0, INT32_MAX]), core_percent=st.sampled_from([0, 100]),
       slots=st.sampled_from([0, MAX_GRANT_SLOTS, MAX_GRANT_SLOTS + 1]),
       per_container=st.sampled_from([1, 64]), copies=st.sampled_from([1, 256]),
       pods=st.integers(1, 3))
def test_recorded_totals_never_leave_their_fields(
    stack: Stack, memory_mib: int, core_percent: int, slots: int, per_container: int,
    copies: int, pods: int,
) -> None:
    """Pods with the largest grants on one device: one pod's usage is exact, the device's and
    the namespace's totals over pods saturate at their field's maximum, nothing is INTERNAL."""
    containers_ = _containers(memory_mib, core_percent, slots, per_container, copies)
    namespace = f"extreme-rec-{next(_unique)}"
    slots_too_large = containers_[0].grants[0].slots > MAX_GRANT_SLOTS
    for number in range(pods):
        pod = types_pb2.Pod(uid=f"{namespace}-{number}", namespace=namespace, name="p",
                            node_name=NODE, containers=containers_,
                            status=types_pb2.PodStatus(phase=types_pb2.POD_PHASE_RUNNING))
        answer = _call(stack.usage.RecordPod, usage_pb2.RecordPodRequest(pod=pod))
        if slots_too_large:
            assert isinstance(answer, grpc.RpcError)
            assert "pod.containers[0].grants[0].slots: must be between 0 and 65536" in (
                answer.details())
            return
        grants = containers_[0].grants
        (stored,) = answer.stored
        assert stored.memory_mib == grants[0].memory_mib * len(grants) * len(containers_)
        assert stored.slots == max(grants[0].slots, 1) * len(grants) * len(containers_)

    nodes = _call(stack.usage.GetNodeUsage, usage_pb2.GetNodeUsageRequest(node_names=[NODE]))
    (device,) = nodes.nodes[0].devices
    assert 0 <= device.slots_used <= INT32_MAX and 0 <= device.cores_used <= INT32_MAX
    usage = _call(stack.usage.GetNamespaceUsage,
                  usage_pb2.GetNamespaceUsageRequest(namespace=namespace))
    assert all(0 <= item.used <= INT64_MAX for item in usage.items)
    # The scheduler reads the saturated totals and answers (the device is full, or not).
    filtered = _call(stack.scheduler.Filter, scheduler_pb2.FilterRequest(
        pod=types_pb2.Pod(uid=f"{namespace}-new", namespace=namespace, name="new",
                          containers=[types_pb2.Container(
                              name="a", container_class=types_pb2.CONTAINER_CLASS_APP,
                              requests=[types_pb2.DeviceRequest(vendor="NVIDIA", count=1,
                                                                memory_mib=1)])]),
        node_names=[NODE]))
    assert isinstance(filtered, scheduler_pb2.FilterResponse)


def test_the_issue_15_quota_no_longer_breaks_checks(stack: Stack) -> None:
    """The reported case: limit 2^63 − 1 is refused at the door, naming the key; the largest
    limit allowed times the largest factor is answered exactly."""
    refused = _call(stack.usage.SetQuota, usage_pb2.SetQuotaRequest(
        namespace="issue-15", limits={KEYS["memory"]: INT64_MAX}))
    assert isinstance(refused, grpc.RpcError)
    assert refused.details() == (
        f"invalid request: limits['{KEYS['memory']}']: must be between 0 and "
        f"{MAX_QUOTA_LIMIT}, got {INT64_MAX}"
    )
    _call(stack.usage.SetQuota, usage_pb2.SetQuotaRequest(
        namespace="issue-15", limits={KEYS["memory"]: MAX_QUOTA_LIMIT}))
    pod = types_pb2.Pod(uid="issue-15", namespace="issue-15", name="p", containers=[
        types_pb2.Container(name="a", container_class=types_pb2.CONTAINER_CLASS_APP,
                            requests=[types_pb2.DeviceRequest(vendor="NVIDIA", count=1,
                                                              memory_mib=1)])])
    checked = _call(stack.admission.CheckQuota, admission_pb2.CheckQuotaRequest(pod=pod))
    assert checked.allowed
    (memory,) = [item for item in checked.items if item.resource == "nvidia.com/gpumem"]
    assert memory.limit == MAX_QUOTA_LIMIT * FACTOR


def test_a_device_total_past_int32_is_reported_saturated(stack: Stack) -> None:
    """Three pods of 256 containers × 64 grants of the most slots on one device: each pod holds
    2^30 slots (exact), the device 3 × 2^30, reported as int32's maximum instead of INTERNAL."""
    containers_ = _containers(1, 0, MAX_GRANT_SLOTS, 64, 256)
    for number in range(3):
        pod = types_pb2.Pod(uid=f"saturate-{number}", namespace="saturate", name="p",
                            node_name=NODE, containers=containers_,
                            status=types_pb2.PodStatus(phase=types_pb2.POD_PHASE_RUNNING))
        (stored,) = stack.usage.RecordPod(usage_pb2.RecordPodRequest(pod=pod), timeout=30).stored
        assert stored.slots == 2**30
    nodes = stack.usage.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=[NODE]), timeout=30)
    assert nodes.nodes[0].devices[0].slots_used == INT32_MAX
