"""The vendor table, held to HAMi's own per-vendor tests and examples (v2.10.0, 4707fb02).

Each case names its source in HAMi (``pkg/device/<vendor>/...``, ``examples/...``): how a
container's resources become a request (after HAMi's webhook), how a node's devices are read,
what a grant charges and the annotations a placement writes. The end-to-end path per vendor
over the real servers is tests/services/test_every_vendor_grpc.py.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from accounting import kunlun, vendor_fit, vendors
from accounting.allocation import allocation_annotations
from accounting.errors import InvalidInputError
from accounting.fit import NodeState, fit_node
from accounting.kube import node_json, pod_json
from accounting.model import Device, DeviceRequest, DeviceState, Pod
from accounting.pod import size_request
from accounting.policy import AccountingPolicy, policy_for
from accounting.quota import quota_keys
from accounting.vendor_spec import VendorSpec
from accounting.vendors import NVIDIA_RESOURCES, VENDORS, spec_for
from tests.builders import PodBuilder
from tests.support.vendors import ACME_SPEC, registered

ALL = policy_for([spec.vendor for spec in VENDORS])
"""Every vendor of the table, as a policy."""

# -- the table itself ----------------------------------------------------------------------------


def test_every_vendor_is_described_once() -> None:
    keywords = [spec.vendor for spec in VENDORS]
    assert len(set(keywords)) == len(keywords) == 25
    resources = Counter(
        name
        for spec in VENDORS
        for name in (
            spec.resources.count_resource,
            spec.resources.memory_resource,
            spec.resources.memory_percentage_resource,
            spec.resources.core_resource,
        )
        if name
    )
    assert [name for name, n in resources.items() if n > 1] == []
    keys = Counter(key for spec in VENDORS for key in spec.annotation_keys)
    assert [key for key, n in keys.items() if n > 1] == []
    assert all(spec.title and spec.source.startswith("pkg/device/") for spec in VENDORS)
    # Every entry states what it charges, for docs/design.md.
    assert all(spec.notes for spec in VENDORS)


def test_the_default_vendors_are_hamis_chart_defaults() -> None:
    """charts/hami/templates/scheduler/deployment.yaml: Ascend and Iluvatar need a flag."""
    defaults = {v.vendor for v in vendors.DEFAULT_VENDORS}
    off = {spec.vendor for spec in VENDORS} - defaults
    assert off == {
        "Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B4-1",
        "Ascend310P", "Ascend910C", "MR-V100", "MR-V50", "BI-V150", "BI-V100",
    }


def test_quota_keys_are_hamis_per_vendor() -> None:
    """pkg/device/quota.go managedQuotaName: limits.<memory or core resource> of a vendor
    (the count is our extension)."""
    keys = quota_keys(ALL.vendors)
    for key in (
        "limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores", "limits.hygon.com/dcumem",
        "limits.cambricon.com/mlu.smlu.vmemory", "limits.huawei.com/Ascend910B3-memory",
        "limits.metax-tech.com/vmemory", "limits.mthreads.com/sgpu-memory",
        "limits.kunlunxin.com/vxpu-memory", "limits.aws.amazon.com/neuroncore",
        "limits.amd.com/gpumem", "limits.iluvatar.ai/MR-V100.vMem",
    ):
        assert key in keys, key
    # A vendor without a memory resource has no memory quota key.
    assert not any(key.startswith("limits.metax-tech.com/gpu") and "mem" in key for key in keys)


def test_a_fixed_memory_unit_cannot_be_configured_away() -> None:
    from dataclasses import replace

    with pytest.raises(InvalidInputError, match="fixed at 256 MiB"):
        AccountingPolicy((replace(spec_for("MLU").resources, memory_factor=1),))


def test_an_unknown_vendor_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidInputError, match="not a vendor HAMi schedules; known: NVIDIA"):
        AccountingPolicy((ACME_SPEC.resources,))
    with registered():
        assert AccountingPolicy((ACME_SPEC.resources,)).spec("Acme") == ACME_SPEC


def test_the_policy_fingerprint_covers_the_table_entry() -> None:
    """Two builds whose table entries differ publish different ids for the same names."""
    from dataclasses import replace

    with registered():
        one = AccountingPolicy((ACME_SPEC.resources,)).policy_id
    with registered(replace(ACME_SPEC, one_device_per_pod=True)):
        other = AccountingPolicy((ACME_SPEC.resources,)).policy_id
    assert one != other


# -- requests: HAMi's webhook, then GenerateResourceRequests ------------------------------------


@dataclass(frozen=True)
class RequestCase:
    name: str
    source: str
    limits: dict[str, str]
    want: tuple[int, int | None, int, int] | str | None
    """(count, memory MiB per device or None for a share, memory percent, cores), an error
    fragment, or None for no request."""
    requests: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


REQUEST_CASES = [
    # Hygon
    RequestCase("DCU: no cores asked is 100", "hygon/device.go:168",
                {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000"}, (1, 2000, 0, 100)),
    RequestCase("DCU: a bare count is whole devices", "examples/hygon/use_exclusive_card.yaml",
                {"hygon.com/dcunum": "2"}, (2, None, 100, 100)),
    RequestCase("DCU: cores as asked", "examples/hygon/default_use.yaml",
                {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "60"},
                (1, 2000, 0, 60)),
    # Cambricon
    RequestCase("MLU: memory in 256 MiB units", "cambricon/device_test.go:220",
                {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "1000",
                 "cambricon.com/mlu.smlu.vcore": "2"}, (1, 256000, 0, 2)),
    RequestCase("MLU: no cores asked is 100", "cambricon/device_test.go:240",
                {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "1000"},
                (1, 256000, 0, 100)),
    RequestCase("MLU: cores only is the whole memory", "cambricon/device_test.go:260",
                {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "2"},
                (1, None, 100, 2)),
    RequestCase("MLU: 16Gi of 256 MiB units is refused, not dropped",
                "cambricon/device_test.go:280",
                {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "16Gi"},
                "more than any device"),
    # Iluvatar
    RequestCase("Iluvatar: vMem in 256 MiB units", "iluvatar/device_test.go:324",
                {"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "1000",
                 "iluvatar.ai/MR-V100.vCore": "100"}, (1, 256000, 0, 100)),
    RequestCase("Iluvatar: a bare count is the whole memory, no cores",
                "iluvatar/device_test.go:340",
                {"iluvatar.ai/MR-V100-vgpu": "1"}, (1, None, 100, 0)),
    RequestCase("Iluvatar: two devices take every core of each (webhook count x 100)",
                "examples/iluvatar/multi-devices_MR-V100.yaml",
                {"iluvatar.ai/MR-V100-vgpu": "2"}, (2, None, 100, 100)),
    # Metax
    RequestCase("Metax GPU: whole cards only", "metax/device.go:134",
                {"metax-tech.com/gpu": "1"}, (1, None, 100, 100)),
    RequestCase("Metax sGPU: a bare count", "metax/sdevice_test.go:315",
                {"metax-tech.com/sgpu": "1"}, (1, None, 100, 100)),
    RequestCase("Metax sGPU: a bare vmemory is GiB", "metax/sdevice_test.go:380",
                {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "16"}, (1, 16384, 0, 100)),
    RequestCase("Metax sGPU: vmemory with a unit is bytes",
                "examples/metax/sgpu/allocate_vmemory_MiB.yaml",
                {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2048Mi",
                 "metax-tech.com/vcore": "60"}, (1, 2048, 0, 60)),
    RequestCase("Metax sGPU: 16Gi is 16384 MiB", "metax/sdevice_test.go:420",
                {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "16Gi"}, (1, 16384, 0, 100)),
    RequestCase("Metax sGPU: requests are not read (limits only)", "metax/sdevice.go:221",
                {}, None, requests={"metax-tech.com/sgpu": "1"}),
    # Moore Threads
    RequestCase("Moore Threads: 32 units of 512 MiB and 8 sixteenths",
                "examples/mthreads/default_use.yaml",
                {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                 "mthreads.com/sgpu-core": "8"}, (1, 16384, 0, 8)),
    RequestCase("Moore Threads: two devices are two whole GPUs",
                "examples/mthreads/multi_cards.yaml",
                {"mthreads.com/vgpu": "2"}, (2, 49152, 0, 16)),
    RequestCase("Moore Threads: one device without memory is a whole GPU",
                "examples/mthreads/use_exclusive.yaml",
                {"mthreads.com/vgpu": "1"}, (1, 49152, 0, 16)),
    RequestCase("Moore Threads: a memory size the webhook refuses", "mthreads/device.go:94",
                {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "3"},
                "must be one of 2, 4, 8, 16, 32, 64, 96"),
    # Enflame, Kunlun whole, Vastai, Biren
    RequestCase("Enflame GCU: whole cards", "examples/enflame/gcu_use.yaml",
                {"enflame.com/gcu": "2"}, (2, None, 100, 100)),
    RequestCase("Kunlun: whole cards", "kunlun/device.go", {"kunlunxin.com/xpu": "2"},
                (2, None, 100, 100)),
    RequestCase("Vastai: a slot per device", "examples/vastai/default_use.yaml",
                {"vastaitech.com/va": "1"}, (1, None, 100, 0)),
    RequestCase("Biren: a slot per device", "examples/biren/default_use.yaml",
                {"birentech.com/gpu": "1"}, (1, None, 100, 0)),
    # Kunlun vXPU templates
    RequestCase("vXPU: a bare count is a whole card", "kunlun/vdevice_test.go:412",
                {"kunlunxin.com/vxpu": "1"}, (1, 98304, 0, 100)),
    RequestCase("vXPU: 24576 MiB is a quarter card, 25 cores", "kunlun/vdevice_test.go:440",
                {"kunlunxin.com/vxpu": "2"}, (2, 24576, 0, 25),
                requests={"kunlunxin.com/vxpu-memory": "24576"}),
    RequestCase("vXPU: 30000 MiB rounds up to half a card", "kunlun/vdevice_test.go:60",
                {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "30000"},
                (1, 49152, 0, 50)),
    RequestCase("vXPU: 200000 MiB is a whole card, no error", "kunlun/vdevice_test.go:76",
                {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "200000"},
                (1, 98304, 0, 100)),
    # Ascend
    RequestCase("910A: 2000 MiB is the vir02 template, 2184 MiB", "examples/ascend/job-910A.yaml",
                {"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2000"},
                (1, 2184, 0, 0)),
    RequestCase("910A: no memory is the whole NPU", "ascend/device_test.go:710",
                {"huawei.com/Ascend910A": "1"}, (1, 32768, 0, 0)),
    RequestCase("910A: above every template is the whole NPU", "ascend/device_test.go:690",
                {"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "20000"},
                (1, 32768, 0, 0)),
    RequestCase("910A: above the NPU's capacity is refused", "ascend/device_test.go:640",
                {"huawei.com/Ascend910A": "2", "huawei.com/Ascend910A-memory": "40000"},
                "more than a Huawei Ascend 910A holds"),
    RequestCase("910A: a vNPU for two devices is refused", "ascend/device_test.go:589",
                {"huawei.com/Ascend910A": "2", "huawei.com/Ascend910A-memory": "8738"},
                "vNPUs are not supported for more than one device"),
    RequestCase("910A: cores outside hami-core mode are refused", "ascend/device.go:140",
                {"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-core": "4"},
                "only supported in hami-core"),
    RequestCase("910A hami-core: memory and cores as asked", "ascend/device_test.go:980",
                {"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "15360",
                 "huawei.com/Ascend910A-core": "20"}, (1, 15360, 0, 20),
                annotations={"huawei.com/vnpu-mode": "hami-core"}),
    RequestCase("910C: one NPU is a module of two", "ascend/device.go:125",
                {"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "16384"},
                (2, 16384, 0, 0)),
    RequestCase("910C: an odd count is refused", "ascend/device.go:135",
                {"huawei.com/Ascend910C": "3"}, "must be 1 or a multiple of 2"),
    RequestCase("310P: 2000 MiB is vir01, 3072 MiB", "examples/ascend/job-310P.yaml",
                {"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "2000"},
                (1, 3072, 0, 0)),
    RequestCase("310P: above vir04 is memoryAllocatable, 21527 (HAMi's own quirk)",
                "charts/hami/templates/scheduler/device-configmap.yaml (310P3)",
                {"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "13000"},
                (1, 21527, 0, 0)),
    # AMD
    RequestCase("AMD: limits only, cores default 100", "amd/device.go GenerateResourceRequests",
                {"amd.com/gpu": "1", "amd.com/gpumem": "1000"}, (1, 1000, 0, 100),
                requests={"amd.com/gpucores": "20"}),
]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=lambda c: c.name)
def test_a_containers_resources_become_hamis_request(case: RequestCase) -> None:
    obj = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "annotations": case.annotations},
        "spec": {"containers": [{"name": "main", "resources": {
            "limits": case.limits, "requests": case.requests}}]},
    }
    if isinstance(case.want, str):
        with pytest.raises(InvalidInputError) as caught:
            pod_json.parse_pod(obj, ALL.vendors)
        assert case.want in str(caught.value)
        assert "spec.containers[0].resources" in caught.value.violations[0].path
        return
    pod = pod_json.parse_pod(obj, ALL.vendors)
    if case.want is None:
        assert pod.containers[0].requests == ()
        return
    [request] = pod.containers[0].requests
    spec = ALL.spec(request.vendor)
    assert spec is not None
    demand = size_request(request, spec.resources)
    assert (demand.count, demand.memory_mib, demand.memory_percent, demand.core_percent) == (
        case.want
    )


# -- node devices --------------------------------------------------------------------------------


def _node(annotations: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "test", "annotations": annotations or {}, "labels": labels or {}},
        "status": {"capacity": capacity or {}},
    }


@dataclass(frozen=True)
class NodeCase:
    name: str
    source: str
    node: dict[str, Any]
    want: tuple[tuple[str, str, int, int, int], ...] | str
    """(uuid, vendor, slots, memory MiB, cores) per device, or an error fragment."""


NODE_CASES = [
    NodeCase("Hygon: the 9-field legacy form", "hygon/device_test.go:265",
             _node({"hami.io/node-dcu-register": "test-0,1,1024,100,DCU,0,true,0,test:"}),
             (("test-0", "DCU", 1, 1024, 100),)),
    NodeCase("Hygon: 5 fields are refused", "hygon/device_test.go:280",
             _node({"hami.io/node-dcu-register": "test-0,1,1024,100,DCU:"}),
             "expected id,count,devmem,devcore,type,numa,health[,index,mode]"),
    NodeCase("Iluvatar: the 7-field legacy form", "iluvatar/device_test.go:57",
             _node({"hami.io/node-MR-V100-register":
                    "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,10,8192,100,MR-V100,0,true:"}),
             (("GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae", "MR-V100", 10, 8192, 100),)),
    NodeCase("Cambricon: one device per 100 vcores from the capacity",
             "cambricon/device_test.go:40",
             _node(capacity={"cambricon.com/mlu.smlu.vcore": "1",
                             "cambricon.com/mlu.smlu.vmemory": "1"}),
             (("test-cambricon-mlu-0", "MLU", 100, 25600, 100),)),
    NodeCase("Moore Threads: one GPU per 16 cores from the capacity", "mthreads/device_test.go:319",
             _node(capacity={"mthreads.com/sgpu-core": "1", "mthreads.com/sgpu-memory": "1"}),
             (("test-mthreads-0", "Mthreads", 100, 8192, 16),)),
    NodeCase("Metax GPU: whole cards from the capacity", "metax/device.go GetNodeDevices",
             _node(capacity={"metax-tech.com/gpu": "2"}),
             (("test-metax-0", "Metax-GPU", 1, 65536, 100),
              ("test-metax-1", "Metax-GPU", 1, 65536, 100))),
    NodeCase("Metax sGPU: Metax's own schema", "metax/sdevice_test.go:520",
             _node({"metax-tech.com/node-gpu-devices": '[{"uuid": "GPU-123", "model": "sgpu", '
                    '"totalDevCount": 16, "totalCompute": 100, "bdf": "0000:44:00.0", '
                    '"totalVRam" : 32768, "numa": 1, "healthy": true, '
                    '"qosPolicy": "fixed-share"}]'}),
             (("GPU-123", "Metax-SGPU", 16, 32768, 100),)),
    NodeCase("Enflame DRS: slices and the largest profile", "enflame/device_test.go:40",
             _node({"enflame.com/gcu-drs-capacity": '{"devices":[{"index":"0","minor":"0",'
                    '"capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}'}),
             (("test-enflame-drs-0", "Enflame", 6, 40960, 100),)),
    NodeCase("Enflame GCU: whole cards from the capacity", "enflame/gcu.go",
             _node(capacity={"enflame.com/gcu": "1"}), (("test-GCU-0", "GCU", 1, 100, 100),)),
    NodeCase("Kunlun: eight cards from the capacity", "kunlun/device.go GetNodeDevices",
             _node(capacity={"kunlunxin.com/xpu": "8"}),
             tuple((f"test-kunlun-{i}", "kunlun", 100, 98304, 100) for i in range(8))),
    NodeCase("Kunlun vXPU: HAMi's JSON", "kunlun/vdevice_test.go:255",
             _node({"hami.io/node-register-xpu": '[{"id":"xpu-0","index":0,"count":1,'
                    '"devmem":98304,"devcore":100,"type":"XPU","health":true}]'}),
             (("xpu-0", "XPU", 1, 98304, 100),)),
    NodeCase("AWS Neuron: cores per device from the capacity, compute as a core mask",
             "awsneuron/device_test.go:250",
             _node(capacity={"aws.amazon.com/neuron": "1", "aws.amazon.com/neuroncore": "2"},
                   labels={"node.kubernetes.io/instance-type": "inf2"}),
             (("test-AWSNeuron-0", "AWSNeuron", 2, 0, 3),)),
    NodeCase("AMD: HAMi's JSON", "amd/device_test.go:150",
             _node({"hami.io/node-amd-register": '[{"id":"GPU-0","index":0,"count":1,"devmem":8192,'
                    '"devcore":100,"type":"amd","numa":0,"health":true}]'}),
             (("GPU-0", "AMD", 1, 8192, 100),)),
    NodeCase("Vastai: HAMi's JSON", "vastai/device_test.go:106",
             _node({"hami.io/node-va-register": '[{"id":"7-0","count":1,"devmem":32768,'
                    '"type":"Vastai","health":true,"devicepairscore":{}}]'}),
             (("7-0", "Vastai", 1, 32768, 0),)),
    NodeCase("Ascend: Go field names match in any case", "ascend/device_test.go:182",
             _node({"hami.io/node-register-Ascend910A": '[{"ID":"GPU-0","Count":4,"Devmem":8738,'
                    '"Devcore":8,"Type":"huawei.com/Ascend910","Numa":0,"Health":true}]'}),
             (("GPU-0", "Ascend910A", 4, 8738, 8),)),
]


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_a_nodes_devices_are_read_as_hami_reads_them(case: NodeCase) -> None:
    if isinstance(case.want, str):
        with pytest.raises(InvalidInputError) as caught:
            node_json.parse_node(case.node, ALL.vendors)
        assert case.want in str(caught.value)
        return
    registration = node_json.parse_node(case.node, ALL.vendors)
    assert tuple(
        (d.uuid, d.vendor, d.slots_total, d.memory_total_mib, d.core_percent_total)
        for d in registration.devices
    ) == case.want
    assert node_json.has_devices(case.node, ALL.vendors)


def test_a_vendor_the_policy_leaves_out_is_not_read() -> None:
    node = _node({"hami.io/node-dcu-register": "test-0,1,1024,100,DCU,0,true,0,test:"})
    assert node_json.parse_node(node, (NVIDIA_RESOURCES,)).devices == ()
    assert not node_json.has_devices(node, (NVIDIA_RESOURCES,))


# -- what a placement charges and writes ---------------------------------------------------------


def _placed(spec: VendorSpec, devices: tuple[Device, ...], pod: Pod) -> tuple[Any, dict[str, str]]:
    fit = fit_node(pod, NodeState("n", tuple(DeviceState(d) for d in devices)),
                   vendors=(spec.resources,))
    assert fit.fits, fit.reason
    written = allocation_annotations(
        fit.grants, [spec], {d.uuid: d for d in devices}, node_name="n", unix_s=1700000000,
        annotations=dict(pod.annotations),
    )
    return fit, written


def _one(vendor: str, count: int = 1, mib: int = 0, percent: int = 0, cores: int = 0) -> Pod:
    return PodBuilder("p").app("main", DeviceRequest(vendor, count, mib, percent, cores)).build()


def test_hygon_writes_its_own_annotation() -> None:
    """hygon/device_test.go:487: both keys, HAMi's format."""
    device = Device("test1", "DCU", 0, 1, 4096, 100, vendor="DCU")
    _, written = _placed(spec_for("DCU"), (device,), _one("DCU", mib=2048, cores=1))
    assert written == {"hami.io/dcu-devices-allocated": "test1,DCU,2048,1:;",
                       "hami.io/dcu-devices-to-allocate": "test1,DCU,2048,1:;"}


def test_cambricon_writes_the_dsmlu_profile() -> None:
    """cambricon/device_test.go:364: index_cores_memory/256 of the first device."""
    device = Device("device-0", "MLU", 0, 100, 512000, 100, vendor="MLU")
    _, written = _placed(spec_for("MLU"), (device,), _one("MLU", mib=1000, cores=1))
    assert written["hami.io/cambricon-mlu-devices-allocated"] == "device-0,MLU,256000,1:;"
    assert written["CAMBRICON_DSMLU_PROFILE"] == "0_1_1000"
    assert written["CAMBRICON_DSMLU_ASSIGNED"] == "false"


def test_moore_threads_writes_only_the_allocated_key_and_the_gpu_index() -> None:
    """mthreads/device_test.go:396."""
    device = Device("test1", "Mthreads", 0, 100, 49152, 16, vendor="Mthreads")
    _, written = _placed(spec_for("Mthreads"), (device,), _one("Mthreads", mib=2, cores=1))
    assert written["hami.io/mthreads-vgpu-devices-allocated"] == "test1,Mthreads,1024,1:;"
    assert "hami.io/mthreads-vgpu-devices-to-allocate" not in written
    assert (written["mthreads.com/gpu-index"], written["mthreads.com/predicate-node"]) == ("0", "n")


def test_ascend_writes_each_npus_template() -> None:
    """ascend/device_test.go:318: the runtime info names the template of the charged memory."""
    device = Device("device-0", "Ascend910A", 0, 4, 32768, 30, vendor="Ascend910A")
    _, written = _placed(spec_for("Ascend910A"), (device,), _one("Ascend910A", mib=8738))
    assert written["hami.io/Ascend910A-devices-allocated"] == "device-0,Ascend910A,8738,0:;"
    assert json.loads(written["huawei.com/Ascend910A"]) == [
        {"UUID": "device-0", "temp": "vir08", "memory": 8738}
    ]
    assert written["predicate-time"] == "1700000000"


def test_amd_charges_compute_units_and_writes_the_model() -> None:
    """amd/device_test.go:300-480: 50 % of 100 CUs is 50; the TYPE is the registered model."""
    device = Device("GPU-0", "AMD_Instinct_MI300X_VF", 0, 1, 8192, 100, vendor="AMD")
    fit, written = _placed(spec_for("AMD"), (device,), _one("AMD", mib=1000, cores=50))
    assert [(g.memory_mib, g.core_percent) for g in fit.grants[0]] == [(1000, 50)]
    assert written["hami.io/amd-devices-allocated"] == "GPU-0,AMD_Instinct_MI300X_VF,1000,50:;"


@pytest.mark.parametrize(
    ("percent", "units", "want"),
    [(1, 64, 1), (100, 64, 64), (50, 100, 50), (0, 64, 64)],
    ids=["1 % of 64 CUs is 1", "100 % of 64 is 64", "50 % of 100 is 50",
         "no cores with the whole memory is every CU"],
)
def test_amd_compute_units(percent: int, units: int, want: int) -> None:
    """amd/device_test.go:300-480."""
    device = Device("GPU-0", "AMD", 0, 1, 8192, units, vendor="AMD")
    fit, _ = _placed(spec_for("AMD"), (device,), _one("AMD", percent=100, cores=percent))
    assert fit.grants[0][0].core_percent == want


GRAPH_SELECT_CASES = [
    ("00000000", 8, (0, 1, 2, 3, 4, 5, 6, 7)),
    ("00000100", 8, ()),
    ("00000100", 2, (4, 6)),
    ("00000100", 1, (4,)),
    ("00000011", 1, (4,)),
    ("11101110", 2, (3, 7)),
    ("00110001", 4, (0, 1, 4, 5)),
    ("00010010", 4, (0, 1, 4, 5)),
    ("00100010", 4, (0, 1, 4, 5)),
    ("00000000", 3, ()),
]
"""pkg/device/kunlun/device_test.go:83 Test_graphSelect: cards used (1) by index 0..7, the count
asked, the cards HAMi picks (the last row: 3 is no count HAMi places)."""


@pytest.mark.parametrize(("used", "count", "want"), GRAPH_SELECT_CASES,
                         ids=[f"{u} for {n}" for u, n, _ in GRAPH_SELECT_CASES])
def test_kunlun_topology_picks_hamis_cards(used: str, count: int, want: tuple[int, ...]) -> None:
    cards = [(index, flag == "0") for index, flag in enumerate(used)]
    assert kunlun.select(cards, count) == want


def _kunlun_node(used: str) -> NodeState:
    return NodeState("n", tuple(
        DeviceState(Device(f"k{i}", "kunlun", i, 100, 98304, 100, vendor="kunlun"),
                    *((98304, 100, 1) if flag == "1" else ()))
        for i, flag in enumerate(used)
    ))


def test_kunlun_whole_cards_are_placed_by_topology_and_charged_whole() -> None:
    """kunlun/device.go Fit on HAMi's Test_graphSelect node: a pair across the wings; the card
    is charged its 98304 MiB and 100 % as the annotation says."""
    fit = fit_node(_one("kunlun", count=2, percent=100, cores=100), _kunlun_node("11101110"),
                   vendors=(spec_for("kunlun").resources,))
    assert fit.fits
    assert sorted((g.uuid, g.memory_mib, g.core_percent) for g in fit.grants[0]) == [
        ("k3", 98304, 100), ("k7", 98304, 100)
    ]
    refused = fit_node(_one("kunlun", count=3, percent=100, cores=100), _kunlun_node("00000000"),
                       vendors=(spec_for("kunlun").resources,))
    assert (refused.fits, refused.reason) == (False, "1/8 NumaNotFit")


def test_kunlun_vxpu_shares_a_card_only_between_partitions_of_one_size() -> None:
    """kunlun/vdevice.go FitVXPU: a card holding quarter partitions takes another quarter, not
    a half; with every card holding halves, a quarter fits nowhere (device_test.go:32-80)."""
    def node(used_mib: int) -> NodeState:
        return NodeState("n", tuple(
            DeviceState(Device(f"x{i}", "XPU", i, 4, 98304, 100, vendor="XPU"), used_mib, 50, 1)
            for i in range(8)
        ))

    vendor = (spec_for("XPU").resources,)
    quarter = _one("XPU", mib=24576, cores=25)
    assert fit_node(quarter, node(24576), vendors=vendor).fits
    refused = fit_node(quarter, node(49152), vendors=vendor)
    assert (refused.fits, refused.reason) == (False, "1/8 NumaNotFit")


def _neuron_node(devices: int, instance: str = "inf2.xlarge", used: dict[int, int] | None = None,
                 ) -> NodeState:
    used = used or {}
    return NodeState("n", tuple(
        DeviceState(
            Device(f"aws-{i}", "AWSNeuron", i, 2, 0, 3, vendor="AWSNeuron",
                   custom_info=(("AWSNodeType", instance),)),
            0, used.get(i, 0), 1 if i in used else 0,
        )
        for i in range(devices)
    ))


def test_aws_neuron_cores_are_bit_masks() -> None:
    """awsneuron/device.go addCoreUsage: one core of a free device is mask 1, its other core
    mask 2, a whole device mask 3 (examples/awsneuron/multi_containers.yaml, derived)."""
    vendor = (spec_for("AWSNeuron").resources,)
    pod = (PodBuilder("p").app("a", DeviceRequest("AWSNeuron", 1, 0, 0, 1))
           .app("b", DeviceRequest("AWSNeuron", 1, 0, 0, 1)).build())
    fit = fit_node(pod, _neuron_node(1), vendors=vendor)
    assert [[(g.uuid, g.core_percent) for g in grants] for grants in fit.grants] == [
        [("aws-0", 1)], [("aws-0", 2)]
    ]
    whole = fit_node(_one("AWSNeuron", count=1, cores=2), _neuron_node(1, used={0: 1}),
                     vendors=vendor)
    assert (whole.fits, whole.reason) == (False, "1/1 CardInsufficientCore")


def test_aws_neuron_devices_are_consecutive() -> None:
    """awsneuron/device.go graphSelect: on inf instances any run of free devices; elsewhere
    1, 4, 8 or 16 devices from a multiple of the count; none is NumaNotFit once."""
    vendor = (spec_for("AWSNeuron").resources,)
    fit = fit_node(_one("AWSNeuron", count=2, cores=2), _neuron_node(4, used={0: 3}),
                   vendors=vendor)
    assert [(g.uuid, g.core_percent) for g in fit.grants[0]] == [("aws-1", 3), ("aws-2", 3)]
    refused = fit_node(_one("AWSNeuron", count=2, cores=2),
                       _neuron_node(4, instance="trn1.32xlarge"), vendors=vendor)
    assert (refused.fits, refused.reason) == (False, "1/4 NumaNotFit")
    aligned = fit_node(_one("AWSNeuron", count=4, cores=2),
                       _neuron_node(8, instance="trn1.32xlarge", used={1: 3}), vendors=vendor)
    assert [g.uuid for g in aligned.grants[0]] == ["aws-4", "aws-5", "aws-6", "aws-7"]


DRS_CAPACITY = ('{"devices":[{"index":"0","minor":"0","capacity":6}],'
                '"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}')
"""pkg/device/enflame/device_test.go:40."""


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        ({"enflame.com/drs-gcu": "3"}, (20480, 50, 3, "")),
        ({"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"}, (20480, 50, 3, "")),
        ({"enflame.com/drs-gcu": "2"}, "1/1 ModeNotFit"),
    ],
    ids=["device_test.go:149 drs 3 is 3g.20gb, 20480 MiB / 50 %",
         "memory 20480 MiB and 40 % is 3g.20gb too", "no 2-slice profile: ModeNotFit"],
)
def test_enflame_drs_charges_the_profile(limits: dict[str, str],
                                         want: tuple[int, int, int, str] | str) -> None:
    node = node_json.parse_node(_node({"enflame.com/gcu-drs-capacity": DRS_CAPACITY}), ALL.vendors)
    pod = pod_json.parse_pod({"metadata": {"uid": "u", "name": "pod-gcu-example1",
                                           "namespace": "ns"},
                              "spec": {"containers": [{"name": "pod-gcu-example1",
                                                       "resources": {"limits": limits}}]}},
                             ALL.vendors)
    fit = fit_node(pod, NodeState("n", tuple(DeviceState(d) for d in node.devices)),
                   vendors=ALL.vendors)
    if isinstance(want, str):
        assert (fit.fits, fit.reason) == (False, want)
        return
    [grant] = fit.grants[0]
    assert (grant.memory_mib, grant.core_percent, grant.slots) == want[:3]
    written = allocation_annotations(
        fit.grants, [spec_for("Enflame")], {d.uuid: d for d in node.devices}, node_name="n",
        unix_s=1, annotations={}, container_names=["pod-gcu-example1"],
    )
    # device_test.go:350-395 (PatchAnnotations).
    allocated = written["hami.io/enflame-vgpu-devices-allocated"]
    assert allocated == "test-enflame-drs-0,Enflame,20480,50,3:;"
    assert (written["enflame.com/gcu-assigned"], written["enflame.com/gcu-assigned-index"],
            written["enflame.com/gcu-assigned-minor"], written["enflame.com/gcu-request-size"]) == (
        "false", "0", "0", "3")
    assert json.loads(written["assigned-containers"]) == {"pod-gcu-example1": {
        "allocated": False, "request": 3, "profileID": "1", "profileName": "3g.20gb"}}


def test_metax_sgpu_keeps_a_used_sgpu_to_its_qos_policy() -> None:
    """metax/sdevice.go checkDeviceQos: a used sGPU registered fixed-share takes a best-effort
    task only when it asks every core; a pod of an app class is refused, not guessed."""
    device = Device("GPU-123", "Metax-SGPU", 0, 16, 32768, 100, vendor="Metax-SGPU",
                    custom_info=(("QosPolicy", "fixed-share"),))
    vendor = (spec_for("Metax-SGPU").resources,)
    node = NodeState("n", (DeviceState(device, 4096, 30, 1),))
    shared = _one("Metax-SGPU", mib=4, cores=30)
    assert fit_node(shared, node, vendors=vendor).reason == "1/1 CardQosPolicyMismatch"
    fixed = PodBuilder("p").annotate("metax-tech.com/sgpu-qos-policy", "fixed-share").app(
        "main", DeviceRequest("Metax-SGPU", 1, 4, 0, 30)).build()
    assert fit_node(fixed, node, vendors=vendor).fits
    online = PodBuilder("p").annotate("metax-tech.com/sgpu-app-class", "online").app(
        "main", DeviceRequest("Metax-SGPU", 1, 4, 0, 30)).build()
    refused = fit_node(online, node, vendors=vendor)
    assert not refused.fits and "VendorRuleNotModelled" in refused.reason


def test_a_used_gcu_is_exclusive() -> None:
    """enflame/gcu.go Fit: Used > 0 is ExclusiveDeviceAllocateConflict."""
    device = Device("g0", "GCU", 0, 1, 100, 100, vendor="GCU")
    fit = fit_node(_one("GCU", percent=100, cores=100),
                   NodeState("n", (DeviceState(device, 100, 100, 1),)),
                   vendors=(spec_for("GCU").resources,))
    assert (fit.fits, fit.reason) == (False, "1/1 ExclusiveDeviceAllocateConflict")


def test_metax_puts_every_container_of_a_pod_on_one_device() -> None:
    """metax/device.go customFilterRule: "Metax needs all devices on a device"."""
    devices = (Device("m0", "Metax-GPU", 0, 2, 65536, 100, vendor="Metax-GPU"),
               Device("m1", "Metax-GPU", 1, 2, 65536, 100, vendor="Metax-GPU"))
    pod = (PodBuilder("p")
           .app("a", DeviceRequest("Metax-GPU", 1, 0, 10, 0))
           .app("b", DeviceRequest("Metax-GPU", 1, 0, 10, 0)).build())
    fit = fit_node(pod, NodeState("n", tuple(DeviceState(d) for d in devices)),
                   vendors=(spec_for("Metax-GPU").resources,))
    assert fit.fits
    assert {g.uuid for grants in fit.grants for g in grants} == {"m1"}


def test_ascend_hami_core_needs_a_node_that_supports_it() -> None:
    """ascend/device_test.go:2241-2349: ModeNotFit once for the node, unless it is annotated
    hami-vnpu-core: "true"."""
    register = json.dumps([{"id": "npu-0", "count": 100, "devmem": 32768, "devcore": 100,
                            "type": "Ascend910A", "health": True}])
    pod = PodBuilder("p").annotate("huawei.com/vnpu-mode", "hami-core").app(
        "main", DeviceRequest("Ascend910A", 1, 15360, 0, 20)).build()
    vendor = (spec_for("Ascend910A").resources,)
    for annotation, fits, reason in (("false", False, "1/1 ModeNotFit"), ("true", True, "")):
        node = node_json.parse_node(_node({"hami.io/node-register-Ascend910A": register,
                                           "hami-vnpu-core": annotation}), vendor)
        fit = fit_node(pod, NodeState("n", tuple(DeviceState(d) for d in node.devices)),
                       vendors=vendor)
        assert (fit.fits, fit.reason) == (fits, reason)


def test_ascend_takes_npus_from_one_network_group_first() -> None:
    """ascend/device_test.go:2186: NetworkIDs 0, 1, 1 and two NPUs: dev-2 and dev-1."""
    devices = tuple(
        Device(f"dev-{i}", "Ascend910B3", i, 100, 65536, 100, vendor="Ascend910B3",
               custom_info=(("NetworkID", str(net)),))
        for i, net in enumerate((0, 1, 1))
    )
    fit = fit_node(_one("Ascend910B3", count=2, mib=65536),
                   NodeState("n", tuple(DeviceState(d) for d in devices)),
                   vendors=(spec_for("Ascend910B3").resources,))
    assert fit.fits
    assert sorted(g.uuid for g in fit.grants[0]) == ["dev-1", "dev-2"]


@pytest.mark.parametrize(
    ("free", "count", "fits"),
    [((0, 1, 2, 4, 6), 4, False), ((0, 2), 2, False), ((0, 1), 2, True)],
    ids=["{0,1,2,4,6} for 4: only one whole module", "{0,2} for 2: no whole module",
         "{0,1} for 2: one module"],
)
def test_ascend_910c_takes_whole_modules(free: tuple[int, ...], count: int, fits: bool) -> None:
    """ascend/device_910c_pairing_test.go."""
    devices = tuple(
        Device(f"npu-{i}", "Ascend910C", i, 100, 65536, 100, vendor="Ascend910C")
        for i in free
    )
    fit = fit_node(_one("Ascend910C", count=count, mib=65536),
                   NodeState("n", tuple(DeviceState(d) for d in devices)),
                   vendors=(spec_for("Ascend910C").resources,))
    assert fit.fits is fits
    if fits:
        assert sorted(g.uuid for g in fit.grants[0]) == ["npu-0", "npu-1"]
    else:
        assert "AllocatedCardsInsufficientRequest" in fit.reason


def test_the_design_lists_every_vendor_with_what_it_charges() -> None:
    """docs/design.md §2.7 is the reader's vendor table: every keyword and resource is there."""
    from pathlib import Path

    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = design.split("### 2.7 Vendors and modes", 1)[1].split("\n## ", 1)[0]
    for spec in VENDORS:
        assert f"`{spec.vendor}`" in section, spec.vendor
    # A vendor whose rule is not modelled says so in its row, and no other row does.
    rows = {line for line in section.splitlines() if line.startswith("| ")}
    for spec in VENDORS:
        [row, *_] = [r for r in rows if f"(`{spec.vendor}`" in r or f"`{spec.vendor}`," in r
                     or f", `{spec.vendor}`" in r]
        refused = spec.rule in vendor_fit.NOT_MODELLED_RULES
        assert ("refused for now" in row) is refused, spec.vendor
