"""Numbers and device ids of every vendor's annotations, through the gRPC contract.

Every number read from text goes through one bounded reader (``accounting.numbers``): ASCII
digits only, at most 32 significant digits, the field's documented range; a device id has at
most 320 characters. Each case below was an ``INTERNAL`` (Python's ``int()`` refusing 4,301
digits or a ``"²"``), a path that named our internals (``devices[0].uuid``) or a value stored
and sent in every watch event; each is now ``INVALID_ARGUMENT`` naming the field as the request
spells it, on every RPC that reads the pod or node, and nothing is stored.

The stack (every vendor of the table turned on) is the one ``test_every_vendor_grpc.py`` runs.
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
)
from tests.services.test_every_vendor_grpc import Stack, stack
from tests.support.pods import to_json
from tests.support.vendor_cases import CASES, Json, node

__all__ = ["stack"]  # the fixture, imported for the tests below

TIMEOUT_S = 10.0
ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
NINES = "9" * 4301
LONG_ID = "G" * 100_000
PLACEHOLDER = 918_273_645
"""An integer written into a pod's JSON where a huge one goes (json.dumps cannot write it)."""


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, list[str]]:
    """(code, details, BadRequest field paths) of a call that must fail."""
    try:
        call()
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        fields: list[str] = []
        for detail in status.details if status is not None else ():
            bad_request = error_details_pb2.BadRequest()
            if detail.Unpack(bad_request):
                fields.extend(v.field for v in bad_request.field_violations)
        return error.code(), error.details() or "", fields
    raise AssertionError("the call was accepted")


# -- pods --------------------------------------------------------------------------------------


def _nvidia_pod(uid: str, annotations: dict[str, str], limits: dict[str, str] | None = None,
                ) -> Json:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": "bounded", "uid": uid,
                     "annotations": {"hami.io/vgpu-node": "nvidia-node", **annotations}},
        "spec": {"nodeName": "nvidia-node", "containers": [{"name": "main", "resources": {
            "limits": limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "main", "restartCount": 0, "state": {"running": {}}}]},
    }


@dataclass(frozen=True)
class PodCase:
    name: str
    annotations: dict[str, str]
    field: str
    """The BadRequest field every RPC names."""
    limits: dict[str, str] | None = None
    raw: tuple[str, str] | None = None
    """(placeholder, replacement) in the pod's JSON text: numbers json.dumps cannot write."""


ANNOTATION = 'kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"][0][0]'
POD_CASES = [
    PodCase("4301 nines as a grant's memory (the issue's pod)",
            {ALLOCATED: f"GPU-node-b-0,NVIDIA,{NINES},0:;"}, f"{ANNOTATION}.memory_mib"),
    PodCase("superscript digits as a grant's cores",
            {ALLOCATED: "GPU-0,NVIDIA,1024,\u00b2:;"}, f"{ANNOTATION}.core_percent"),
    PodCase("Arabic-Indic digits as a grant's memory (int() reads them as 1024)",
            {ALLOCATED: "GPU-0,NVIDIA,\u0661\u0660\u0662\u0664,0:;"}, f"{ANNOTATION}.memory_mib"),
    PodCase("an underscore in a grant's slots (int() reads 1_0 as 10)",
            {ALLOCATED: "GPU-0,NVIDIA,1024,0,1_0:;"}, f"{ANNOTATION}.slots"),
    PodCase("a grant's device id of 100,000 characters",
            {ALLOCATED: f"{LONG_ID},NVIDIA,1024,0:;"}, f"{ANNOTATION}.uuid"),
    PodCase("a MIG allocation's GPU UUID of 100,000 characters",
            {ALLOCATED: "GPU-0,NVIDIA,1024,0:;", MIG_ALLOCATIONS: json.dumps([{
                "containerIndex": 0, "deviceIndex": 0, "gpuUUID": LONG_ID, "profile": "1g.5gb",
                "placement": {"start": 0, "size": 1}}])},
            f'kubernetes_pod_json.metadata.annotations["{MIG_ALLOCATIONS}"][0].gpuUUID'),
    PodCase("a MIG allocation's container index of 5000 digits",
            {ALLOCATED: "GPU-0,NVIDIA,1024,0:;", MIG_ALLOCATIONS:
             '[{"containerIndex":' + "9" * 5000 + ',"deviceIndex":0,"gpuUUID":"GPU-0",'
             '"profile":"1g.5gb","placement":{"start":0,"size":1}}]'},
            f'kubernetes_pod_json.metadata.annotations["{MIG_ALLOCATIONS}"][0].containerIndex'),
    PodCase("a GPU memory quantity of a million digits' magnitude (1e1000000)",
            {}, 'kubernetes_pod_json.spec.containers[0].resources.limits["nvidia.com/gpumem"]',
            limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1e1000000"}),
    PodCase("a restartCount of 5000 digits",
            {}, "kubernetes_pod_json.status.containerStatuses[0].restartCount",
            raw=('"restartCount": 0', '"restartCount": ' + "9" * 5000)),
]


def _pod_json(case: PodCase, uid: str) -> bytes:
    text = json.dumps(_nvidia_pod(uid, case.annotations, case.limits))
    if case.raw is not None:
        assert case.raw[0] in text
        text = text.replace(*case.raw)
    return text.encode()


def _node_usage(stack: Stack) -> bytes:
    return stack.recorder.GetNodeUsage(usage_pb2.GetNodeUsageRequest(),
                                       timeout=TIMEOUT_S).SerializeToString(deterministic=True)


@pytest.fixture(scope="module")
def nvidia_node(stack: Stack) -> Stack:
    [case] = [c for c in CASES if c.vendor == "NVIDIA" and not c.mig_in_use]
    stack.recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(case.node)), timeout=TIMEOUT_S)
    return stack


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case.name)
def test_a_pod_annotation_that_does_not_read_is_invalid_argument_on_every_rpc(
    nvidia_node: Stack, case: PodCase
) -> None:
    stack = nvidia_node
    uid = f"uid-{POD_CASES.index(case)}"
    raw = _pod_json(case, uid)
    before = _node_usage(stack)
    admission = admission_pb2_grpc.AdmissionStub(stack.admission)
    scheduler = scheduler_pb2_grpc.SchedulerStub(stack.scheduler)
    calls = {
        "CheckQuota": lambda: admission.CheckQuota(
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw), timeout=TIMEOUT_S),
        "Filter": lambda: scheduler.Filter(scheduler_pb2.FilterRequest(
            kubernetes_pod_json=raw, node_names=["nvidia-node"]), timeout=TIMEOUT_S),
        "RecordPod": lambda: stack.recorder.RecordPod(
            usage_pb2.RecordPodRequest(kubernetes_pod_json=raw), timeout=TIMEOUT_S),
        "Reserve": lambda: stack.recorder.Reserve(usage_pb2.ReserveRequest(
            kubernetes_pod_json=raw, node_name="nvidia-node"), timeout=TIMEOUT_S),
    }
    for method, call in calls.items():
        code, details, fields = refusal(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details[:300])
        assert case.field in fields, (method, fields)
        assert len(details) < 4000, (method, len(details))
    # Nothing stored.
    found = stack.recorder.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                       timeout=TIMEOUT_S)
    assert not found.found
    assert _node_usage(stack) == before


# -- node register annotations of every vendor --------------------------------------------------


def _case_node(vendor: str) -> Json:
    [case] = [c for c in CASES if c.vendor == vendor and not c.mig_in_use]
    return copy.deepcopy(case.node)


def _annotated(vendor: str, name: str, key: str, value: str) -> Json:
    obj = _case_node(vendor)
    obj["metadata"]["name"] = name
    obj["metadata"]["annotations"][key] = value
    return obj


DCU = "hami.io/node-dcu-register"
DRS = "enflame.com/gcu-drs-capacity"
METAX = "metax-tech.com/node-gpu-devices"
REGISTER = "hami.io/node-nvidia-register"


def _drs(devices: list[Json], profiles: Json | None = None) -> str:
    return json.dumps({"devices": devices, "profiles": profiles or {"1g.6gb": "0", "6g.40gb": "2"}})


def _metax(*uuids: str) -> str:
    return json.dumps([{"uuid": uuid, "totalDevCount": 16, "totalCompute": 100,
                        "totalVRam": 32768, "healthy": True} for uuid in uuids])


def _path(key: str, rest: str) -> str:
    return f'kubernetes_node_json.metadata.annotations["{key}"]{rest}'


@dataclass(frozen=True)
class NodeCase:
    name: str
    node: Json
    field: str


NODE_CASES = [
    NodeCase("a 5000-digit devmem in a DCU register",
             _annotated("DCU", "dcu-bad", DCU, f"dcu-0,4,{'9' * 5000},100,DCU,0,true,0,x:"),
             _path(DCU, "[0].devmem")),
    NodeCase("an NVIDIA devmem whose exponent is past what Decimal holds",
             _annotated("NVIDIA", "nvidia-exp", REGISTER,
                        '[{"id": "GPU-exp", "count": 10, "devmem": 1e-999999999999999999999,'
                        ' "devcore": 100, "health": true}]'),
             _path(REGISTER, "")),
    NodeCase("a superscript two as an Enflame DRS capacity",
             _annotated("Enflame", "drs-bad", DRS, _drs([{"index": "0", "capacity": "\u00b2"}])),
             _path(DRS, ".devices[0].capacity")),
    NodeCase("an Enflame DRS index beyond int32",
             _annotated("Enflame", "drs-bad", DRS, _drs([{"index": "4294967296",
                                                          "capacity": 6}])),
             _path(DRS, ".devices[0].index")),
    NodeCase("two Enflame DRS devices of one index (they would share an id)",
             _annotated("Enflame", "drs-bad", DRS, _drs([{"index": "1", "capacity": 6},
                                                         {"index": "1", "capacity": 6}])),
             _path(DRS, ".devices[1].index")),
    NodeCase("an Enflame DRS profile of more GB than a device's int32 MiB",
             _annotated("Enflame", "drs-bad", DRS, _drs([{"index": "0", "capacity": 6}],
                                                        {"1g.9999999gb": "0"})),
             _path(DRS, ".profiles")),
    NodeCase("an NVIDIA device id of 100,000 characters",
             _annotated("NVIDIA", "nvidia-bad", REGISTER, json.dumps([{
                 "id": LONG_ID, "count": 10, "devmem": 24576, "devcore": 100,
                 "health": True}])),
             _path(REGISTER, "[0].id")),
    NodeCase("an NVIDIA devmem of 5000 digits",
             _annotated("NVIDIA", "nvidia-bad", REGISTER,
                        '[{"id":"GPU-x","count":10,"devmem":' + "9" * 5000 + "}]"),
             _path(REGISTER, "[0].devmem")),
    NodeCase("a Metax sGPU uuid holding a separator (was devices[0].uuid)",
             _annotated("Metax-SGPU", "sgpu-bad", METAX, _metax("GPU,1")),
             _path(METAX, "[0].uuid")),
    NodeCase("two Metax sGPU devices of one uuid (was devices[1].uuid)",
             _annotated("Metax-SGPU", "sgpu-bad", METAX, _metax("GPU-1", "GPU-1")),
             _path(METAX, "[1].uuid")),
    NodeCase("a Metax sGPU uuid of 100,000 characters",
             _annotated("Metax-SGPU", "sgpu-bad", METAX, _metax(LONG_ID)),
             _path(METAX, "[0].uuid")),
    NodeCase("a capacity vendor's node whose name holds a comma (device ids are made from it)",
             node("metax,bad", capacity={"metax-tech.com/gpu": "2"}),
             "kubernetes_node_json.metadata.name"),
    NodeCase("a node name of 300 characters",
             node("n" * 300, capacity={"metax-tech.com/gpu": "2"}),
             "kubernetes_node_json.metadata.name"),
]


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda case: case.name)
def test_a_node_register_annotation_that_does_not_read_is_invalid_argument(
    stack: Stack, case: NodeCase
) -> None:
    before = _node_usage(stack)
    code, details, fields = refusal(lambda: stack.recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(case.node)),
        timeout=TIMEOUT_S))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:300])
    assert case.field in fields, fields
    assert all(f.startswith("kubernetes_node_json") for f in fields), fields
    assert LONG_ID[:400] not in details and "9" * 400 not in details
    assert _node_usage(stack) == before


def test_a_typed_device_uuid_of_100000_characters_is_invalid_argument(stack: Stack) -> None:
    before = _node_usage(stack)
    code, _, fields = refusal(lambda: stack.recorder.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name="typed-long", inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
            uuid=LONG_ID, slots_total=1, memory_total_mib=1024, cores_total=100,
            healthy=True)])), timeout=TIMEOUT_S))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == ["inventory.devices[0].uuid"]
    assert _node_usage(stack) == before


# -- what HAMi reads leniently is read leniently -----------------------------------------------


def test_an_enflame_drs_index_that_does_not_read_is_the_devices_position_as_in_hami(
    stack: Stack,
) -> None:
    """HAMi's GetNodeDevices (pkg/device/enflame/device.go): ``strconv.Atoi(index)`` failing
    falls back to the device's position."""
    obj = _annotated("Enflame", "drs-superscript", DRS,
                     _drs([{"index": "\u00b2", "capacity": 6}, {"index": "x", "capacity": 6}]))
    stack.recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(obj)), timeout=TIMEOUT_S)
    [registered] = stack.recorder.GetNodeUsage(
        usage_pb2.GetNodeUsageRequest(node_names=["drs-superscript"]), timeout=TIMEOUT_S).nodes
    assert [(d.uuid, d.index) for d in registered.devices] == [
        ("drs-superscript-enflame-drs-0", 0), ("drs-superscript-enflame-drs-1", 1)]


@dataclass(frozen=True)
class TypedInfoCase:
    """A typed inventory of one device whose custom info (what a fit rule reads) does not read,
    and a pod of that vendor Filtered onto it."""

    vendor: str
    custom_info: dict[str, str]
    limits: dict[str, str]
    answers: tuple[str, ...]


_SGPU = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8", "metax-tech.com/vcore": "60"}
_DRS = {"enflame.com/drs-gcu": "1"}
TYPED_INFO_CASES = [
    # HAMi's readCustomInfoInt: a custom-info number that does not read is 0 (no MetaLink zone).
    *(TypedInfoCase("Metax-SGPU", {"LinkZone": zone}, _SGPU, ("Scheduled",))
      for zone in ("\u00b2", "9" * 5000, " 1 ", "-1")),
    # parseProfilesFromCustomInfo and readCustomInfoInt: profiles that do not read are none.
    *(TypedInfoCase("Enflame", info, _DRS, ("Scheduled", "NoNodeFits")) for info in (
        {"maxSlice": "\u00b2", "profiles": '{"1g.6gb":"0"}'},
        {"maxSlice": "6", "profiles": "not json"},
        {"maxSlice": "6", "profiles": '["1g.6gb"]'},
        {"maxSlice": "6", "profiles": '{"' + "9" * 5000 + 'g.6gb":"0"}'},
    )),
]


@pytest.mark.parametrize("case", TYPED_INFO_CASES,
                         ids=lambda case: f"{case.vendor} {json.dumps(case.custom_info)[:50]}")
def test_typed_custom_info_that_does_not_read_is_read_as_hami_reads_it_not_internal(
    stack: Stack, case: TypedInfoCase
) -> None:
    name = f"typed-{case.vendor.lower()}-{zlib.crc32(json.dumps(case.custom_info).encode())}"
    stack.recorder.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name=name, inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
            uuid=f"{name}-0", vendor=case.vendor, slots_total=16, memory_total_mib=40960,
            cores_total=100, healthy=True, custom_info=case.custom_info)])), timeout=TIMEOUT_S)
    pod = {"metadata": {"name": name, "namespace": "bounded", "uid": f"uid-{name}"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": case.limits}}]}}
    answer = scheduler_pb2_grpc.SchedulerStub(stack.scheduler).Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=[name]),
        timeout=TIMEOUT_S)
    assert answer.reason in case.answers, answer.message
    stack.recorder.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=f"uid-{name}"), timeout=TIMEOUT_S)
