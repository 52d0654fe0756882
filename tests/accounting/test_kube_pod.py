"""The Kubernetes Pod parser: classes, HAMi's request reading, grants by position, status."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidInputError
from accounting.fit import NodeState, fit_node
from accounting.kube import pod_json
from accounting.kube.quantity import parse_quantity
from accounting.model import (
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceState,
    PodPhase,
)
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.support.vendors import ACME_SPEC, registered

NVIDIA_ONLY = (NVIDIA_RESOURCES,)
"""The vendors a test means when it reads NVIDIA's resources only."""
ALLOCATED_KEY = "hami.io/vgpu-devices-allocated"
ALLOCATED_PATH = 'metadata.annotations["hami.io/vgpu-devices-allocated"]'


# -- fixtures: what json.Marshal(pod) writes ---------------------------------------------------


def container(
    name: str,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    obj: dict[str, Any] = {
        "name": name,
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "command": ["sh", "-c", "nvidia-smi && sleep 5"],
        "resources": resources,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if restart_policy is not None:
        obj["restartPolicy"] = restart_policy
    return obj


def terminated(name: str, exit_code: int, restart_count: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "state": {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": "2026-09-01T10:00:00Z",
                "finishedAt": "2026-09-01T10:00:05Z",
                "containerID": f"containerd://{name}",
            }
        },
        "lastState": {},
        "ready": exit_code == 0,
        "restartCount": restart_count,
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "imageID": "",
        "started": False,
    }


def running(name: str, restart_count: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "state": {"running": {"startedAt": "2026-09-01T10:00:06Z"}},
        "lastState": {},
        "ready": True,
        "restartCount": restart_count,
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "imageID": "",
        "started": True,
    }


def waiting(name: str, reason: str = "PodInitializing") -> dict[str, Any]:
    return {
        "name": name,
        "state": {"waiting": {"reason": reason}},
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "imageID": "",
    }


def pod_obj(
    *,
    init: list[dict[str, Any]] | None = None,
    apps: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": apps if apps is not None else [container("main")],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "hami-scheduler",
        "securityContext": {},
        "priority": 0,
    }
    if init:
        spec["initContainers"] = init
    if node_name is not None:
        spec["nodeName"] = node_name
    metadata: dict[str, Any] = {
        "name": "trainer-0",
        "namespace": "team-a",
        "uid": "6d0a4c1e-2b7f-4f4e-9a53-0f1f0b6c1a11",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-09-01T10:00:00Z",
        "labels": {"app": "trainer"},
    }
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "metadata": metadata,
        "spec": spec,
        "status": status if status is not None else {"phase": "Pending", "qosClass": "BestEffort"},
    }


def nvidia(
    count: int = 1, memory_mib: int = 0, memory_percent: int = 0, core_percent: int = 0
) -> tuple[DeviceRequest, ...]:
    return (DeviceRequest("NVIDIA", count, memory_mib, memory_percent, core_percent),)


# -- classes and order -------------------------------------------------------------------------


def test_classes_follow_restart_policy_and_declaration_order() -> None:
    pod = pod_json.parse_pod(
        pod_obj(
            init=[
                container("fetch"),
                container("proxy", restart_policy="Always"),
                container("migrate", restart_policy="OnFailure"),
            ],
            apps=[container("main"), container("metrics")],
        ), NVIDIA_ONLY
    )
    assert [(c.name, c.container_class) for c in pod.containers] == [
        ("fetch", ContainerClass.INIT),
        ("proxy", ContainerClass.SIDECAR),
        ("migrate", ContainerClass.INIT),
        ("main", ContainerClass.APP),
        ("metrics", ContainerClass.APP),
    ]


def test_metadata_is_read_and_a_missing_namespace_is_default() -> None:
    obj = pod_obj(annotations={"hami.io/traceparent": "00-abc-def-01", "team": "a"})
    del obj["metadata"]["namespace"]
    pod = pod_json.parse_pod(obj, NVIDIA_ONLY)
    assert (pod.uid, pod.namespace, pod.name) == (
        "6d0a4c1e-2b7f-4f4e-9a53-0f1f0b6c1a11",
        "default",
        "trainer-0",
    )
    assert dict(pod.annotations) == {"hami.io/traceparent": "00-abc-def-01", "team": "a"}


# -- requests (HAMi GenerateResourceRequests after its webhook) --------------------------------


@dataclass(frozen=True)
class RequestCase:
    name: str
    limits: dict[str, Any] | None
    requests: dict[str, Any] | None = None
    want: tuple[DeviceRequest, ...] = ()
    vendor: VendorResources = NVIDIA_RESOURCES


REQUEST_CASES = [
    RequestCase(
        "memory and cores as written",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
        want=nvidia(1, memory_mib=3000, core_percent=30),
    ),
    RequestCase(
        "limits win over requests, resource by resource",
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2000"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "20"},
        want=nvidia(2, memory_mib=2000, core_percent=20),
    ),
    RequestCase(
        "a resource only in requests is read from requests",
        None,
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"},
        want=nvidia(1, memory_mib=1000, core_percent=10),
    ),
    RequestCase(
        "no count and no sizing means no GPU",
        {"cpu": "500m", "memory": "1Gi"},
    ),
    RequestCase(
        "memory without a count gets the webhook's default count of one",
        {"nvidia.com/gpumem": "3000"},
        want=nvidia(1, memory_mib=3000),
    ),
    RequestCase(
        "a bare count is an exclusive card: all memory and all cores",
        {"nvidia.com/gpu": "1"},
        want=nvidia(1, memory_percent=100, core_percent=100),
    ),
    RequestCase(
        "a whole card by percentage is exclusive even with memory written",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpumem": "0"},
        want=nvidia(1, memory_percent=100, core_percent=100),
    ),
    RequestCase(
        "memory with a count but no cores is shared, not exclusive",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
        want=nvidia(1, memory_mib=1000),
    ),
    RequestCase(
        "a percentage above 100 is clamped to 100",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150", "nvidia.com/gpucores": "30"},
        want=nvidia(1, memory_percent=100, core_percent=30),
    ),
    RequestCase(
        "a percentage of zero is unset, so the whole card is the default",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0", "nvidia.com/gpucores": "30"},
        want=nvidia(1, memory_percent=100, core_percent=30),
    ),
    RequestCase(
        "a percentage is kept as the memory size",
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "40", "nvidia.com/gpucores": "25"},
        want=nvidia(2, memory_percent=40, core_percent=25),
    ),
    RequestCase(
        "a count of 2000m is the whole number 2",
        {"nvidia.com/gpu": "2000m", "nvidia.com/gpumem": "1000"},
        want=nvidia(2, memory_mib=1000),
    ),
    RequestCase("a count of zero means no GPU", {"nvidia.com/gpu": "0"}),
    RequestCase(
        "cores above 100 read as 100, the whole card's compute (HAMi's Fit)",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "512", "nvidia.com/gpucores": "120"},
        want=nvidia(1, memory_mib=512, core_percent=100),
    ),
    RequestCase(
        "cores however large read as 100: an exponent beyond int64",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "1e400"},
        want=nvidia(1, memory_mib=1000, core_percent=100),
    ),
    RequestCase(
        "cores however large read as 100: an integer the API server accepts, capped at int64",
        {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "1000",
            "nvidia.com/gpucores": "9999999999999Gi",
        },
        want=nvidia(1, memory_mib=1000, core_percent=100),
    ),
    RequestCase(
        "cores written with an exponent are read exactly",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "0.3e2"},
        want=nvidia(1, memory_mib=1000, core_percent=30),
    ),
    RequestCase(
        "memory written with a binary suffix is the number of MiB it reads as",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1Ki"},
        want=nvidia(1, memory_mib=1024),
    ),
    RequestCase(
        "memory up to int32 divided by the memory factor",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "536870911"},
        want=nvidia(1, memory_mib=536870911),
        vendor=VendorResources(memory_factor=4),
    ),
    RequestCase(
        "a percentage however large reads as a whole card",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "1e30", "nvidia.com/gpucores": "5"},
        want=nvidia(1, memory_percent=100, core_percent=5),
    ),
    RequestCase(
        "as many devices as a node may register",
        {"nvidia.com/gpu": "256", "nvidia.com/gpumem": "1000"},
        want=nvidia(256, memory_mib=1000),
    ),
    RequestCase(
        "JSON numbers are quantities too",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 50},
        want=nvidia(1, memory_mib=4096, core_percent=50),
    ),
    RequestCase(
        "the vendor's default memory is used when nothing sizes the card",
        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20"},
        want=nvidia(1, memory_mib=2048, core_percent=20),
        vendor=VendorResources(default_memory_mib=2048),
    ),
    RequestCase(
        "the vendor's default cores apply when cores are not written",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
        want=nvidia(1, memory_mib=1000, core_percent=10),
        vendor=VendorResources(default_core_percent=10),
    ),
    RequestCase(
        "a default count of zero leaves a count-less container without GPU",
        {"nvidia.com/gpumem": "3000"},
        vendor=VendorResources(default_gpu_count=0),
    ),
    *(
        # HAMi's webhook gives every core to a container that sizes no share of the card:
        # pkg/device/nvidia/device_test.go TestMutateAdmissionDefaultsExclusiveCore (v2.10.0,
        # line 188), each case named as HAMi names it, then what follows from its code
        # (defaultExclusiveCoreIfNeeded: a percentage, when written, decides alone).
        RequestCase(f"HAMi exclusive core: {name}", limits, requests, want)
        for name, limits, requests, want in [
            ("exclusive via percentage",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}, None,
             nvidia(1, memory_percent=100, core_percent=100)),
            ("exclusive via percentage in requests only",
             None, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"},
             nvidia(1, memory_percent=100, core_percent=100)),
            ("non-exclusive percentage",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, None,
             nvidia(1, memory_percent=50)),
            ("no memory fields defaults to exclusive",
             {"nvidia.com/gpu": "1"}, None, nvidia(1, memory_percent=100, core_percent=100)),
            ("explicit cores remains unchanged",
             {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "70"}, None,
             nvidia(1, memory_percent=100, core_percent=70)),
            ("explicit cores in requests remains unchanged",
             None, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "55"},
             nvidia(1, memory_percent=100, core_percent=55)),
            ("memory size present treated as shareable",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}, None,
             nvidia(1, memory_mib=8192)),
            ("(derived) a percentage above 100 is not the whole card's 100, so shared",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}, None,
             nvidia(1, memory_percent=100)),
            ("(derived) a percentage of zero is written, so shared, sized as the whole card",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}, None,
             nvidia(1, memory_percent=100)),
            ("(derived) a percentage beside MiB decides alone",
             {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40",
              "nvidia.com/gpumem": "1000"}, None,
             nvidia(1, memory_mib=1000, memory_percent=40)),
        ]
    ),
]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=lambda case: case.name)
def test_requests_follow_hami(case: RequestCase) -> None:
    obj = pod_obj(apps=[container("main", limits=case.limits, requests=case.requests)])
    pod = pod_json.parse_pod(obj, vendors=(case.vendor,))
    assert pod.containers[0].requests == case.want


@dataclass(frozen=True)
class RefusedCase:
    name: str
    limits: dict[str, Any]
    want: str
    """The one violation: path, then the message naming container, resource and reading."""
    vendor: VendorResources = NVIDIA_RESOURCES
    requests: dict[str, Any] | None = None


def _limit(resource: str) -> str:
    return f'spec.containers[0].resources.limits["{resource}"]: container "main": '


REFUSED_CASES = [
    # Issue 15: each of these used to read as 0 cores and pass the core quota.
    RefusedCase(
        "cores in milli-units are not a whole percent",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "1500m"},
        _limit("nvidia.com/gpucores")
        + "nvidia.com/gpucores is in percent of a card: 1500m reads as 1.5 percent, "
        "not a whole number",
    ),
    RefusedCase(
        "fractional cores",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "1.5"},
        _limit("nvidia.com/gpucores")
        + "nvidia.com/gpucores is in percent of a card: 1.5 reads as 1.5 percent, "
        "not a whole number",
    ),
    RefusedCase(
        "negative cores",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "-5"},
        _limit("nvidia.com/gpucores")
        + "nvidia.com/gpucores is in percent of a card: -5 reads as -5 percent, below 0",
    ),
    # Issue 15: each of these used to make the whole request vanish (NoGpuRequest).
    RefusedCase(
        "memory in Gi is read as that many MiB, more than any device",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2Gi"},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 2Gi reads as 2147483648 MiB, more than any device "
        "(at most 2147483647)",
    ),
    RefusedCase(
        "memory written with an exponent",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1e10"},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 1e10 reads as 10000000000 MiB, more than any device "
        "(at most 2147483647)",
    ),
    RefusedCase(
        "memory the API server caps at int64",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "9999999999999Gi"},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 9999999999999Gi reads as 9223372036854775807 MiB, "
        "more than any device (at most 2147483647)",
    ),
    RefusedCase(
        "memory above int32 divided by the memory factor",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "536870912"},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 536870912 reads as 536870912 MiB, more than any "
        "device (at most 536870911 with memory factor 4)",
        vendor=VendorResources(memory_factor=4),
    ),
    RefusedCase(
        "fractional memory",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 1.5 reads as 1.5 MiB, not a whole number",
    ),
    RefusedCase(
        "negative memory",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-1"},
        _limit("nvidia.com/gpumem") + "nvidia.com/gpumem is in MiB: -1 reads as -1 MiB, below 0",
    ),
    RefusedCase(
        "a fractional percentage",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50500m"},
        _limit("nvidia.com/gpumem-percentage")
        + "nvidia.com/gpumem-percentage is a percentage of a card: 50500m reads as "
        "50.5 percent, not a whole number",
    ),
    RefusedCase(
        "a count in milli-units that is not a whole device",
        {"nvidia.com/gpu": "500m", "nvidia.com/gpumem": "1000"},
        _limit("nvidia.com/gpu") + "nvidia.com/gpu counts whole devices: 500m reads as 0.5, "
        "not a whole number",
    ),
    RefusedCase(
        "a negative count",
        {"nvidia.com/gpu": "-1"},
        _limit("nvidia.com/gpu") + "nvidia.com/gpu counts whole devices: -1 reads as -1, below 0",
    ),
    RefusedCase(
        "more devices than a node may register",
        {"nvidia.com/gpu": "1e400", "nvidia.com/gpumem": "1000"},
        _limit("nvidia.com/gpu") + "nvidia.com/gpu counts whole devices: 1e400 reads as "
        "1e+400, more than any node can hold (at most 256)",
    ),
    RefusedCase(
        "a refusal read from requests names the requests",
        {},
        'spec.containers[0].resources.requests["nvidia.com/gpucores"]: container "main": '
        "nvidia.com/gpucores is in percent of a card: 1500m reads as 1.5 percent, "
        "not a whole number",
        requests={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1500m"},
    ),
    RefusedCase(
        "a JSON number is read like a string",
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2.5},
        _limit("nvidia.com/gpumem")
        + "nvidia.com/gpumem is in MiB: 2.5 reads as 2.5 MiB, not a whole number",
    ),
]


@pytest.mark.parametrize("case", REFUSED_CASES, ids=lambda case: case.name)
def test_a_request_is_charged_as_asked_or_refused(case: RefusedCase) -> None:
    obj = pod_obj(apps=[container("main", limits=case.limits, requests=case.requests)])
    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod(obj, vendors=(case.vendor,))
    assert [str(violation) for violation in raised.value.violations] == [case.want]


@settings(max_examples=300, deadline=None)
@given(
    resource=st.sampled_from(
        ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
         "nvidia.com/gpucores"]
    ),
    text=st.one_of(
        st.from_regex(
            r"[+-]?[0-9]{0,25}(\.[0-9]{0,12})?([eE][+-]?[0-9]{1,4}|[numkMGTPE]|[KMGTPE]i)?",
            fullmatch=True,
        ),
        st.integers(-(10**30), 10**30).map(str),
    ),
)
def test_no_quantity_reads_as_no_gpu_or_zero_cores(resource: str, text: str) -> None:
    """Whatever one GPU resource says, a container that counts a device is charged a device
    with what it asks, or the pod is refused naming that resource; never "no GPU", and cores
    are 0 only when written as a whole number 0."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    limits[resource] = text
    obj = pod_obj(apps=[container("main", limits=limits)])
    try:
        pod = pod_json.parse_pod(obj, NVIDIA_ONLY)
    except InvalidInputError as error:
        assert [v.path for v in error.violations] == [
            f'spec.containers[0].resources.limits["{resource}"]'
        ]
        return
    value = parse_quantity(text)
    if resource == "nvidia.com/gpu" and value == 0:
        assert pod.containers[0].requests == ()
        return
    (request,) = pod.containers[0].requests
    assert request.count >= 1
    if request.core_percent == 0:
        assert resource == "nvidia.com/gpucores" and value == 0


def test_each_vendor_gets_its_own_request() -> None:
    other = ACME_SPEC.resources
    obj = pod_obj(
        apps=[
            container(
                "main",
                limits={
                    "nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": "1000",
                    "acme.com/npu": "2",
                    "acme.com/npumem": "500",
                    "acme.com/npucores": "5",
                },
            )
        ]
    )
    with registered():
        pod = pod_json.parse_pod(obj, vendors=(NVIDIA_RESOURCES, other))
    assert pod.containers[0].requests == (
        DeviceRequest("NVIDIA", 1, 1000, 0, 0),
        DeviceRequest("Acme", 2, 500, 0, 5),
    )


# -- grants --------------------------------------------------------------------------------------


def test_a_gpu_less_init_container_keeps_its_position() -> None:
    obj = pod_obj(
        init=[container("fetch")],
        apps=[
            container("a", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40"}),
            container("b", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40"}),
        ],
        annotations={
            ALLOCATED_KEY: ";GPU-A,NVIDIA,16000,0:;GPU-A,NVIDIA,16000,0:;",
            "hami.io/vgpu-node": "gpu-node-1",
        },
    )
    pod = pod_json.parse_pod(obj, NVIDIA_ONLY)
    assert [c.grants for c in pod.containers] == [
        (),
        (DeviceGrant("GPU-A", "NVIDIA", 16000, 0),),
        (DeviceGrant("GPU-A", "NVIDIA", 16000, 0),),
    ]
    assert pod.has_grants


@pytest.mark.parametrize(
    ("annotations", "node_name", "want"),
    [
        ({"hami.io/vgpu-node": "gpu-node-1"}, "gpu-node-2", "gpu-node-2"),
        ({"hami.io/vgpu-node": "gpu-node-1"}, None, "gpu-node-1"),
        ({}, "gpu-node-2", "gpu-node-2"),
        ({}, None, ""),
    ],
    ids=[
        "the node the pod is bound to wins over the annotation (HAMi: the annotation)",
        "the node HAMi chose before the pod is bound",
        "spec.nodeName when HAMi has not placed the pod",
        "no node before scheduling",
    ],
)
def test_node_name(annotations: dict[str, str], node_name: str | None, want: str) -> None:
    pod = pod_json.parse_pod(pod_obj(annotations=annotations, node_name=node_name), NVIDIA_ONLY)
    assert pod.node_name == want


# -- status --------------------------------------------------------------------------------------


def test_statuses_phase_and_exit_codes() -> None:
    obj = pod_obj(
        init=[container("fetch"), container("proxy", restart_policy="Always")],
        apps=[container("main")],
        status={
            "phase": "Running",
            "initContainerStatuses": [terminated("fetch", 0), running("proxy", restart_count=2)],
            "containerStatuses": [waiting("main", "ContainerCreating")],
        },
    )
    pod = pod_json.parse_pod(obj, NVIDIA_ONLY)
    assert pod.phase is PodPhase.RUNNING
    assert pod.init_container_statuses == (
        ContainerStatus("fetch", ContainerState.TERMINATED, exit_code=0),
        ContainerStatus("proxy", ContainerState.RUNNING, restart_count=2),
    )
    assert pod.container_statuses == (ContainerStatus("main", ContainerState.WAITING),)
    assert not pod.terminating


def test_a_failed_init_container_keeps_its_exit_code() -> None:
    obj = pod_obj(
        init=[container("fetch")],
        status={"phase": "Pending", "initContainerStatuses": [terminated("fetch", 1, 3)]},
    )
    (status,) = pod_json.parse_pod(obj, NVIDIA_ONLY).init_container_statuses
    assert status == ContainerStatus("fetch", ContainerState.TERMINATED, 1, 3)


def test_a_status_without_a_state_is_unknown_and_no_phase_is_pending() -> None:
    obj = pod_obj(status={"containerStatuses": [{"name": "main", "state": {}}]})
    pod = pod_json.parse_pod(obj, NVIDIA_ONLY)
    assert pod.phase is PodPhase.PENDING
    assert pod.container_statuses == (ContainerStatus("main", ContainerState.UNKNOWN),)


def test_deletion_timestamp_marks_the_pod_terminating() -> None:
    obj = pod_obj()
    obj["metadata"]["deletionTimestamp"] = "2026-09-01T11:00:00Z"
    obj["metadata"]["deletionGracePeriodSeconds"] = 30
    assert pod_json.parse_pod(obj, NVIDIA_ONLY).terminating


def test_parse_pod_json_reads_go_output() -> None:
    obj = pod_obj(
        init=[container("proxy", limits={"nvidia.com/gpu": "1"}, restart_policy="Always")],
        annotations={ALLOCATED_KEY: "GPU-A,NVIDIA,24576,100:;;"},
    )
    pod = pod_json.parse_pod_json(json.dumps(obj).encode(), NVIDIA_ONLY)
    assert pod.containers[0].container_class is ContainerClass.SIDECAR
    assert pod.containers[0].grants == (DeviceGrant("GPU-A", "NVIDIA", 24576, 100),)
    assert pod.containers[1].grants == ()
    assert pod == pod_json.parse_pod(obj, NVIDIA_ONLY)


# -- bad input: every offending field at once -----------------------------------------------------


def _broken(mutate: Any) -> dict[str, Any]:
    obj = pod_obj(
        init=[container("fetch"), container("proxy", restart_policy="Always")],
        apps=[container("main", limits={"nvidia.com/gpu": "1"})],
    )
    obj = copy.deepcopy(obj)
    mutate(obj)
    return obj


@dataclass(frozen=True)
class BadPodCase:
    name: str
    obj: dict[str, Any]
    want: list[str] = field(default_factory=list)


def _set(path: list[str | int], value: Any) -> Any:
    def mutate(obj: Any) -> None:
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    return mutate


def _many(*mutations: Any) -> Any:
    def mutate(obj: Any) -> None:
        for mutation in mutations:
            mutation(obj)

    return mutate


BAD_POD_CASES = [
    BadPodCase(
        "a malformed annotation and a nameless container are reported together",
        _broken(
            _many(
                _set(["metadata", "annotations"], {ALLOCATED_KEY: "uuid,type,100:;"}),
                _set(["spec", "initContainers", 1, "name"], ""),
            )
        ),
        [
            f"{ALLOCATED_PATH}[0][0]: expected UUID,TYPE,MEMORY_MIB,CORE_PERCENT[,SLOTS], "
            'got "uuid,type,100"',
            "spec.initContainers[1].name: must not be empty",
        ],
    ),
    BadPodCase(
        "a missing uid",
        _broken(lambda obj: obj["metadata"].pop("uid")),
        ["metadata.uid: must not be empty"],
    ),
    BadPodCase(
        "a grant for a container position that does not exist",
        _broken(
            _set(
                ["metadata", "annotations"],
                {ALLOCATED_KEY: ";;GPU-A,NVIDIA,1000,10:;GPU-B,NVIDIA,1000,10:;"},
            )
        ),
        [f"{ALLOCATED_PATH}[3]: grant for container position 3 but the pod has 3 containers"],
    ),
    BadPodCase(
        "negative and int32-overflowing grant numbers",
        _broken(
            _set(
                ["metadata", "annotations"],
                {ALLOCATED_KEY: "GPU-A,NVIDIA,-5,10:;GPU-A,NVIDIA,2147483648,10:;;"},
            )
        ),
        [
            f"{ALLOCATED_PATH}[0][0].memory_mib: must be between 0 and 2147483647, got -5",
            f"{ALLOCATED_PATH}[1][0].memory_mib: must be between 0 and 2147483647, got 2147483648",
        ],
    ),
    BadPodCase(
        "duplicate container names across init and app containers",
        _broken(_set(["spec", "containers", 0, "name"], "fetch")),
        [
            'spec.containers[0].name: duplicate container name "fetch", '
            "also spec.initContainers[0].name"
        ],
    ),
    BadPodCase(
        "a quantity Kubernetes would not accept, and cores that are not a whole percent",
        _broken(
            _many(
                _set(["spec", "containers", 0, "resources", "limits", "nvidia.com/gpumem"], "lots"),
                _set(
                    ["spec", "initContainers", 0, "resources"],
                    {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150m"}},
                ),
            )
        ),
        [
            'spec.initContainers[0].resources.limits["nvidia.com/gpucores"]: container "fetch": '
            "nvidia.com/gpucores is in percent of a card: 150m reads as 0.15 percent, "
            "not a whole number",
            'spec.containers[0].resources.limits["nvidia.com/gpumem"]: '
            'must be a Kubernetes quantity such as 4096, 24Gi or 1500m, got "lots"',
        ],
    ),
    BadPodCase(
        "a count above what a node may register",
        _broken(
            _set(["spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"], "3000000000")
        ),
        [
            'spec.containers[0].resources.limits["nvidia.com/gpu"]: container "main": '
            "nvidia.com/gpu counts whole devices: 3000000000 reads as 3000000000, more than "
            "any node can hold (at most 256)"
        ],
    ),
    BadPodCase(
        "an unknown phase, a non-string annotation and a bad exit code",
        _broken(
            _many(
                _set(
                    ["status"],
                    {
                        "phase": "Exploded",
                        "initContainerStatuses": [
                            {"name": "fetch", "state": {"terminated": {"exitCode": "0"}}}
                        ],
                    },
                ),
                _set(["metadata", "annotations"], {"hami.io/vgpu-time": 1735689600}),
            )
        ),
        [
            'metadata.annotations["hami.io/vgpu-time"]: must be a string, got a number',
            "status.phase: must be one of Pending, Running, Succeeded, Failed, Unknown, "
            'got "Exploded"',
            "status.initContainerStatuses[0].state.terminated.exitCode: "
            'must be an integer between -2147483648 and 2147483647, got "0"',
        ],
    ),
    BadPodCase(
        "a huge container list is refused by its length",
        _broken(_set(["spec", "containers"], [container(f"c{i}") for i in range(5000)])),
        ["spec.containers: at most 256 entries, got 5000"],
    ),
    BadPodCase(
        "too many containers in all",
        _broken(
            _many(
                _set(["spec", "containers"], [container(f"a{i}") for i in range(200)]),
                _set(["spec", "initContainers"], [container(f"i{i}") for i in range(100)]),
            )
        ),
        ["spec: at most 256 containers in all, got 300"],
    ),
    BadPodCase(
        "wrong JSON types",
        _broken(
            _many(
                _set(["spec", "initContainers"], {"name": "fetch"}),
                _set(["spec", "containers", 0, "resources"], []),
            )
        ),
        [
            "spec.initContainers: must be an array, got an object",
            "spec.containers[0].resources: must be an object, got an array",
        ],
    ),
]


@pytest.mark.parametrize("case", BAD_POD_CASES, ids=lambda case: case.name)
def test_bad_pods_name_every_offending_field(case: BadPodCase) -> None:
    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod(case.obj, NVIDIA_ONLY)
    assert [str(violation) for violation in raised.value.violations] == case.want


def test_parse_pod_json_prefixes_paths_and_refuses_invalid_json() -> None:
    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod_json(b'{"metadata": {', NVIDIA_ONLY)
    assert [v.path for v in raised.value.violations] == ["kubernetes_pod_json"]

    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod_json(b"[" * 100_000, NVIDIA_ONLY)
    assert str(raised.value) == "kubernetes_pod_json: not valid JSON (nested too deeply)"

    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod_json(b"[]", NVIDIA_ONLY)
    assert str(raised.value) == "kubernetes_pod_json: must be a JSON object, got an array"

    obj = pod_obj()
    del obj["metadata"]["uid"]
    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod_json(json.dumps(obj), NVIDIA_ONLY)
    assert str(raised.value) == "kubernetes_pod_json.metadata.uid: must not be empty"


# -- HAMi's core cap, end to end ------------------------------------------------------------------


@dataclass(frozen=True)
class HamiFitCase:
    """A HAMi Fit test case, as data: one device (HAMi's DeviceUsage fields), one container's
    resources, and what HAMi answers."""

    source: str
    device: dict[str, int]
    limits: dict[str, str]
    want_reason: str
    """"" when it fits, else HAMi's reason for the device."""
    want_core_percent: int = 0
    """The cores HAMi grants on the device when it fits."""


HAMI_CORE_CAP_CASES = [
    HamiFitCase(
        # HAMi pkg/device/nvidia/device_test.go, TestDevices_Fit,
        # "fit success: but core limit can't exceed 100": Coresreq 120 fits, granted as 100.
        "TestDevices_Fit: fit success: but core limit can't exceed 100",
        {"Used": 0, "Count": 100, "Usedmem": 0, "Totalmem": 1280, "Totalcore": 100,
         "Usedcores": 0},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "512", "nvidia.com/gpucores": "120"},
        "",
        want_core_percent=100,
    ),
    HamiFitCase(
        # HAMi pkg/scheduler/score_test.go, Test_fitInCertainDevice, "core limit exceed 100":
        # Coresreq 200 is read as 100, more than the device's 4 - 1 free cores.
        "Test_fitInCertainDevice: core limit exceed 100",
        {"Used": 1, "Count": 4, "Usedmem": 2048, "Totalmem": 8192, "Totalcore": 4,
         "Usedcores": 1},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "200"},
        "1/1 CardInsufficientCore",
    ),
]


@pytest.mark.parametrize("case", HAMI_CORE_CAP_CASES, ids=lambda case: case.source)
def test_cores_above_100_fit_as_hami_fits_them(case: HamiFitCase) -> None:
    pod = pod_json.parse_pod(pod_obj(apps=[container("main", limits=case.limits)]), NVIDIA_ONLY)
    d = case.device
    device = Device("dev-0", "NVIDIA A10", 0, d["Count"], d["Totalmem"], d["Totalcore"])
    node = NodeState("node1", (DeviceState(device, d["Usedmem"], d["Usedcores"], d["Used"]),))
    fitted = fit_node(pod, node)
    assert fitted.reason == case.want_reason
    if not case.want_reason:
        (grant,) = fitted.grants[0]
        assert (grant.uuid, grant.core_percent) == ("dev-0", case.want_core_percent)


def test_json_numbers_are_read_exactly_and_reported_short() -> None:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 1}
    obj = pod_obj(apps=[container("main", limits=limits)])
    obj["status"] = {"containerStatuses": [{"name": "main", "restartCount": 1.5}]}
    raw = json.dumps(obj).replace('"nvidia.com/gpucores": 1', '"nvidia.com/gpucores": 1e400')
    with pytest.raises(InvalidInputError) as raised:
        pod_json.parse_pod_json(raw, NVIDIA_ONLY)
    # 1e400 is not a float overflowing to inf: it is read exactly, as cores above 100.
    assert [str(v) for v in raised.value.violations] == [
        "kubernetes_pod_json.status.containerStatuses[0].restartCount: "
        "must be an integer between 0 and 2147483647, got 1.5"
    ]
    obj["status"] = {}
    raw = json.dumps(obj).replace('"nvidia.com/gpucores": 1', '"nvidia.com/gpucores": 1e400')
    pod = pod_json.parse_pod_json(raw, NVIDIA_ONLY)
    assert pod.containers[0].requests[0].core_percent == 100
