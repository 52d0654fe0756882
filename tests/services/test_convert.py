"""protobuf <-> domain conversion: round trips, and bad typed input named field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidInputError
from accounting.kube.node_json import NodeRegistration
from accounting.limits import MAX_DEVICES_PER_CONTAINER, MAX_GRANT_SLOTS
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceState,
    DeviceUsage,
    Pod,
    PodPhase,
    QuotaItem,
)
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import admission_pb2, scheduler_pb2, types_pb2, usage_pb2
from services.common.convert import grant_messages, node_messages, pod_messages, quota_messages

NVIDIA_ONLY = (NVIDIA_RESOURCES,)
"""The vendors a test means when it reads NVIDIA's resources only."""

INT32_MAX = 2**31 - 1


def sample_pod() -> Pod:
    return Pod(
        uid="uid-1",
        namespace="team-a",
        name="trainer-0",
        containers=(
            Container(
                "fetch",
                ContainerClass.INIT,
                (DeviceRequest("NVIDIA", 1, 20480, 0, 10),),
                (DeviceGrant("GPU-0", "NVIDIA", 20480, 10),),
            ),
            Container("proxy", ContainerClass.SIDECAR, (DeviceRequest("NVIDIA", 1, 2048, 0, 5),)),
            Container(
                "main",
                ContainerClass.APP,
                (DeviceRequest("NVIDIA", 2, 0, 40, 100),),
                (DeviceGrant("GPU-0", "NVIDIA", 9830, 100, 2), DeviceGrant("GPU-1", "X", 1, 1)),
            ),
        ),
        phase=PodPhase.RUNNING,
        init_container_statuses=(
            ContainerStatus("fetch", ContainerState.TERMINATED, 0),
            ContainerStatus("proxy", ContainerState.RUNNING, restart_count=3),
        ),
        container_statuses=(ContainerStatus("main", ContainerState.WAITING),),
        node_name="gpu-node-1",
        annotations={
            "hami.io/traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        },
        terminating=True,
    )


def test_pod_round_trips() -> None:
    pod = sample_pod()
    assert pod_messages.pod_from_pb(pod_messages.pod_to_pb(pod)) == pod


def test_pod_round_trips_through_the_wire_bytes() -> None:
    wire = pod_messages.pod_to_pb(sample_pod()).SerializeToString()
    assert pod_messages.pod_from_pb(types_pb2.Pod.FromString(wire)) == sample_pod()


def test_a_request_reads_each_wire_field_into_its_own() -> None:
    # Distinct values: two fields swapped by the reader would show. The reader is spelled out
    # for speed; it must agree with the conversion's field table.
    pb = types_pb2.DeviceRequest(
        vendor="X", count=2, memory_mib=3, memory_percent=4, core_percent=5, slices=6
    )
    request = pod_messages.request_from_pb(pb)
    assert request == DeviceRequest(
        vendor="X", count=2, memory_mib=3, memory_percent=4, core_percent=5, slices=6
    )
    assert not request.memory_unscaled
    table = pod_messages._REQUEST_FIELDS
    assert {domain: getattr(request, domain) for domain, _ in table} == {
        domain: getattr(pb, wire) for domain, wire in table
    }


_NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
_REQUESTS = st.builds(
    DeviceRequest,
    vendor=st.just("NVIDIA"),
    count=st.integers(0, MAX_DEVICES_PER_CONTAINER),
    memory_mib=st.integers(0, INT32_MAX),
    memory_percent=st.integers(0, 100),
    core_percent=st.integers(0, 100),
)
_GRANTS = st.builds(
    DeviceGrant,
    uuid=st.from_regex(r"GPU-[0-9a-f]{1,6}", fullmatch=True),
    vendor=st.sampled_from(["NVIDIA", ""]),
    memory_mib=st.integers(0, INT32_MAX),
    core_percent=st.integers(0, 100),
    slots=st.integers(0, MAX_GRANT_SLOTS),
)
_STATUSES = st.builds(
    ContainerStatus,
    name=_NAMES,
    state=st.sampled_from(ContainerState),
    exit_code=st.integers(-(2**31), INT32_MAX),
    restart_count=st.integers(0, INT32_MAX),
)


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    names = draw(st.lists(_NAMES, min_size=1, max_size=6, unique=True))
    containers = tuple(
        Container(
            name,
            draw(st.sampled_from(ContainerClass)),
            tuple(draw(st.lists(_REQUESTS, max_size=1))),
            tuple(draw(st.lists(_GRANTS, max_size=3))),
        )
        for name in names
    )
    return Pod(
        uid=draw(st.uuids()).hex,
        namespace=draw(_NAMES),
        name=draw(st.text(max_size=10)),
        containers=containers,
        phase=draw(st.sampled_from(PodPhase)),
        init_container_statuses=tuple(draw(st.lists(_STATUSES, max_size=3))),
        container_statuses=tuple(draw(st.lists(_STATUSES, max_size=3))),
        node_name=draw(st.text(max_size=10)),
        annotations=draw(st.dictionaries(_NAMES, st.text(max_size=20), max_size=3)),
        terminating=draw(st.booleans()),
    )


@settings(max_examples=300)
@given(pods())
def test_every_valid_pod_round_trips(pod: Pod) -> None:
    assert pod_messages.pod_from_pb(pod_messages.pod_to_pb(pod)) == pod


def test_an_unreported_phase_reads_as_pending() -> None:
    pb = pod_messages.pod_to_pb(sample_pod())
    pb.status.phase = types_pb2.POD_PHASE_UNSPECIFIED
    assert pod_messages.pod_from_pb(pb).phase is PodPhase.PENDING


def test_bad_typed_pods_name_every_offending_field() -> None:
    pb = pod_messages.pod_to_pb(sample_pod())
    pb.uid = ""
    pb.containers[0].container_class = types_pb2.CONTAINER_CLASS_UNSPECIFIED
    pb.containers[1].container_class = 9  # type: ignore[assignment]  # a newer client's value
    pb.containers[2].grants[0].memory_mib = -5
    pb.containers[2].requests[0].memory_mib = INT32_MAX + 1
    pb.status.container_statuses[0].state = 7  # type: ignore[assignment]
    with pytest.raises(InvalidInputError) as raised:
        pod_messages.pod_from_pb(pb)
    assert [str(violation) for violation in raised.value.violations] == [
        "pod.containers[0].container_class: must be set",
        "pod.containers[1].container_class: must be INIT, SIDECAR or APP, got unknown value 9",
        "pod.status.container_statuses[0].state: unknown value 7",
        "pod.uid: must not be empty",
        f"pod.containers[2].requests[0].memory_mib: must be between 0 and {INT32_MAX}, "
        f"got {INT32_MAX + 1}",
        f"pod.containers[2].grants[0].memory_mib: must be between 0 and {INT32_MAX}, got -5",
    ]


def test_a_huge_repeated_field_is_refused_before_conversion() -> None:
    pb = types_pb2.Pod(uid="u", namespace="n")
    pb.containers.add(name="main", container_class=types_pb2.CONTAINER_CLASS_APP)
    pb.containers[0].grants.extend([types_pb2.DeviceGrant(uuid="GPU-0")] * 5000)
    pb.status.init_container_statuses.extend([types_pb2.ContainerStatus(name="x")] * 300)
    with pytest.raises(InvalidInputError) as raised:
        pod_messages.pod_from_pb(pb)
    assert [str(violation) for violation in raised.value.violations] == [
        "pod.containers[0].grants: at most 64 grants, got 5000",
        "pod.status.init_container_statuses: at most 256 statuses, got 300",
    ]


# -- pod_source ----------------------------------------------------------------------------------


def kubernetes_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "uid-7", **metadata},
        "spec": {
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {}},
            ],
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"},
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    "request_type",
    [admission_pb2.CheckQuotaRequest, scheduler_pb2.FilterRequest, usage_pb2.RecordPodRequest],
    ids=["CheckQuota", "Filter", "RecordPod"],
)
def test_pod_from_source_reads_kubernetes_json(request_type: Any) -> None:
    request = request_type(kubernetes_pod_json=json.dumps(kubernetes_pod()).encode())
    pod = pod_messages.pod_from_source(request, NVIDIA_ONLY)
    assert [(c.name, c.container_class) for c in pod.containers] == [
        ("proxy", ContainerClass.SIDECAR),
        ("main", ContainerClass.APP),
    ]
    assert pod.containers[1].requests == (DeviceRequest("NVIDIA", 1, 4096, 0, 0),)


def test_pod_from_source_reads_the_typed_pod() -> None:
    request = usage_pb2.ReserveRequest(pod=pod_messages.pod_to_pb(sample_pod()), node_name="n")
    assert pod_messages.pod_from_source(request, NVIDIA_ONLY) == sample_pod()


def test_pod_from_source_needs_a_pod() -> None:
    with pytest.raises(InvalidInputError) as raised:
        pod_messages.pod_from_source(admission_pb2.CheckQuotaRequest(), NVIDIA_ONLY)
    assert str(raised.value) == "pod_source: one of pod or kubernetes_pod_json is required"


def test_pod_from_source_prefixes_json_paths() -> None:
    raw = json.dumps(kubernetes_pod(uid="", annotations={"hami.io/vgpu-devices-allocated": "x"}))
    with pytest.raises(InvalidInputError) as raised:
        pod_messages.pod_from_source(
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw.encode()), NVIDIA_ONLY
        )
    assert [v.path for v in raised.value.violations] == [
        "kubernetes_pod_json.metadata.uid",
        'kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"][0][0]',
    ]


def test_pod_from_source_refuses_invalid_json() -> None:
    with pytest.raises(InvalidInputError) as raised:
        pod_messages.pod_from_source(
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=b"{"), NVIDIA_ONLY
        )
    assert [v.path for v in raised.value.violations] == ["kubernetes_pod_json"]


# -- grants, usage, devices, quota ----------------------------------------------------------------


def test_grants_round_trip_per_position() -> None:
    pod = sample_pod()
    per_container = [container.grants for container in pod.containers]
    pb = pod_messages.container_grants_to_pb(pod, per_container)
    assert [(entry.container_name, entry.container_class) for entry in pb] == [
        ("fetch", types_pb2.CONTAINER_CLASS_INIT),
        ("proxy", types_pb2.CONTAINER_CLASS_SIDECAR),
        ("main", types_pb2.CONTAINER_CLASS_APP),
    ]
    assert grant_messages.grants_from_pb(pb) == tuple(per_container)


def test_container_grants_must_cover_every_container() -> None:
    with pytest.raises(ValueError, match="2 grant positions for 3 containers"):
        pod_messages.container_grants_to_pb(sample_pod(), [(), ()])


def test_grants_from_pb_names_every_bad_grant() -> None:
    entries = [
        types_pb2.ContainerGrants(
            container_name="a", grants=[types_pb2.DeviceGrant(uuid="", memory_mib=-1)]
        ),
        types_pb2.ContainerGrants(
            container_name="b",
            grants=[types_pb2.DeviceGrant(uuid="GPU-0", core_percent=120, slots=-2)],
        ),
        types_pb2.ContainerGrants(
            container_name="c", grants=[types_pb2.DeviceGrant(uuid="GPU-0")] * 100
        ),
    ]
    with pytest.raises(InvalidInputError) as raised:
        grant_messages.grants_from_pb(entries)
    assert [v.path for v in raised.value.violations] == [
        "container_grants[0].grants[0].uuid",
        "container_grants[0].grants[0].memory_mib",
        "container_grants[1].grants[0].core_percent",
        "container_grants[1].grants[0].slots",
        "container_grants[2].grants",
    ]


def test_usage_round_trips() -> None:
    usages = [DeviceUsage("GPU-0", "NVIDIA", 20480, 10, 2), DeviceUsage("GPU-1", "NVIDIA", 0, 0, 1)]
    wire = grant_messages.usages_to_pb(usages)
    assert [grant_messages.usage_from_pb(pb) for pb in wire] == usages


def test_grant_round_trips() -> None:
    grant = DeviceGrant("GPU-0", "NVIDIA", 3000, 30, 4)
    assert grant_messages.grant_from_pb(grant_messages.grant_to_pb(grant)) == grant


def test_device_and_state_round_trip() -> None:
    device = Device("GPU-0", "NVIDIA A10", 3, 10, 24576, 100, numa=1, mode="mig", healthy=False)
    assert node_messages.device_from_pb(node_messages.device_to_pb(device)) == device
    state = DeviceState(device, memory_used_mib=1000, core_percent_used=10, slots_used=2)
    assert node_messages.device_state_from_pb(node_messages.device_state_to_pb(state)) == state


def test_an_empty_mode_and_vendor_mean_hami_defaults() -> None:
    device = node_messages.device_from_pb(types_pb2.Device(uuid="GPU-0", healthy=True))
    assert (device.mode, device.vendor) == ("hami-core", "NVIDIA")


def test_node_usage_to_pb() -> None:
    device = Device("GPU-0", "NVIDIA A10", 0, 10, 24576, 100)
    pb = node_messages.node_usage_to_pb("gpu-node-1", [DeviceState(device, 1000, 10, 1)], ["uid-1"])
    assert pb.node_name == "gpu-node-1"
    assert list(pb.pod_uids) == ["uid-1"]
    assert (pb.devices[0].memory_total_mib, pb.devices[0].memory_used_mib) == (24576, 1000)


def test_quota_item_round_trips() -> None:
    item = QuotaItem("nvidia.com/gpumem", used=20480, limit=24576, limit_set=True)
    assert quota_messages.quota_item_from_pb(quota_messages.quota_item_to_pb(item)) == item


def test_devices_from_inventory_pb_validates() -> None:
    inventory = types_pb2.NodeInventory(
        devices=[
            types_pb2.Device(uuid="GPU-0", slots_total=10, memory_total_mib=24576),
            types_pb2.Device(uuid="GPU-0", memory_total_mib=-1),
        ]
    )
    with pytest.raises(InvalidInputError) as raised:
        node_messages.devices_from_inventory_pb(inventory)
    assert [v.path for v in raised.value.violations] == [
        "inventory.devices[1].uuid",
        "inventory.devices[1].memory_total_mib",
    ]


def test_node_from_source() -> None:
    register = '[{"id":"GPU-0","count":10,"devmem":24576,"devcore":100,"health":true}]'
    node_json = json.dumps(
        {
            "metadata": {
                "name": "gpu-node-1",
                "annotations": {"hami.io/node-nvidia-register": register},
            }
        }
    )
    from_json = node_messages.node_from_source(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=node_json.encode()), NVIDIA_ONLY
    )
    assert from_json == NodeRegistration(
        "gpu-node-1", (Device("GPU-0", "", 0, 10, 24576, 100, healthy=True),)
    )
    typed = usage_pb2.RegisterNodeRequest(
        node_name="gpu-node-1",
        inventory=types_pb2.NodeInventory(devices=[node_messages.device_to_pb(from_json.devices[0])]),
    )
    assert node_messages.node_from_source(typed, NVIDIA_ONLY) == from_json


def test_node_from_source_needs_a_source_and_a_name() -> None:
    with pytest.raises(InvalidInputError) as raised:
        node_messages.node_from_source(usage_pb2.RegisterNodeRequest(node_name="n"), NVIDIA_ONLY)
    assert [v.path for v in raised.value.violations] == ["node_source"]
    with pytest.raises(InvalidInputError) as raised:
        node_messages.node_from_source(
            usage_pb2.RegisterNodeRequest(inventory=types_pb2.NodeInventory()), NVIDIA_ONLY
        )
    assert [v.path for v in raised.value.violations] == ["node_name"]
