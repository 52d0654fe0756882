"""Every vendor of the vendor table as HAMi writes it: one node and one pod per case.

Test support. Each ``VendorCase`` holds a node registered the way HAMi's device plugin (or the
node's capacity) describes it, a pod's init and app container limits written with the vendor's
own resource names, and the annotations HAMi's scheduler writes for that pod, each from HAMi's
tests and examples as the case names (``source``). ``tests/services/test_every_vendor_grpc.py``
runs each through the three daemons; the fuzzers of ``tests/reliability`` and
``tests/accounting`` start from them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]
Charge = tuple[str, int, int, int]
"""(device UUID, memory MiB, cores, slots) stored on one device."""


def node(name: str, annotations: Mapping[str, str] = {},
         capacity: Mapping[str, str] = {}, labels: Mapping[str, str] = {}) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": dict(annotations), "labels": dict(labels)},
        "status": {"capacity": dict(capacity)},
    }


def register(key: str, *devices: Json) -> dict[str, str]:
    return {key: json.dumps(list(devices), separators=(",", ":"))}


A100_PROFILES = [
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
     "placements": [{"start": s, "size": 1} for s in range(7)]},
    {"name": "2g.10gb", "memoryMB": 10240, "core": 28, "sliceCount": 2,
     "placements": [{"start": s, "size": 2} for s in (0, 2, 4)]},
    {"name": "3g.20gb", "memoryMB": 20480, "core": 42, "sliceCount": 3,
     "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]},
]
"""pkg/device/nvidia/mig_capability_test.go:27, in the device plugin's wire format."""


@dataclass(frozen=True)
class VendorCase:
    vendor: str
    source: str
    node: Json
    init: dict[str, str]
    app: dict[str, str]
    quota: dict[str, int]
    requested: dict[str, int]
    """CheckQuota's requested amount per quota resource."""
    annotations: dict[str, str]
    """Annotations Filter must write, exactly (a subset of all it writes)."""
    effective: tuple[Charge, ...]
    steady: tuple[Charge, ...]
    pod_annotations: dict[str, str] = field(default_factory=dict)
    mig_in_use: tuple[tuple[int, int], ...] = ()
    """(start, size) MIG placements held on the card while the pod lives."""


CASES = [
    VendorCase(
        "NVIDIA", "nvidia/device_test.go:675 register; examples/nvidia/default_use.yaml",
        node("nvidia-node", register("hami.io/node-nvidia-register", {
            "id": "GPU-0", "count": 5, "devmem": 8192, "devcore": 100, "type": "NVIDIA-Tesla P4",
            "numa": 0, "health": True, "index": 0})),
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"},
        {"limits.nvidia.com/gpumem": 8192, "limits.nvidia.com/gpucores": 100},
        {"nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
        {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;GPU-0,NVIDIA,2000,20:;",
         "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,3000,30:;GPU-0,NVIDIA,2000,20:;"},
        (("GPU-0", 3000, 30, 1),), (("GPU-0", 2000, 20, 1),),
    ),
    VendorCase(
        "NVIDIA", "MIG: mig_capability_test.go:27 profiles; examples/nvidia/dynamic_mig_example",
        node("mig-node", register("hami.io/node-nvidia-register", {
            "id": "GPU-a", "count": 7, "devmem": 40960, "devcore": 100,
            "type": "NVIDIA-A100-SXM4-40GB", "health": True, "mode": "mig",
            "migProfiles": A100_PROFILES})),
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
        {"limits.nvidia.com/gpumem": 20480},
        {"nvidia.com/gpumem": 8000},
        {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,10240,28:;GPU-a,NVIDIA,5120,14:;",
         "hami.io/vgpu-mig-allocations": (
             '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
             '"placement":{"start":0,"size":2}},{"containerIndex":1,"deviceIndex":0,'
             '"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}}]')},
        (("GPU-a", 10240, 28, 1),), (("GPU-a", 5120, 14, 1),),
        pod_annotations={"nvidia.com/vgpu-mode": "mig"},
        mig_in_use=((0, 2), (6, 1)),
    ),
    VendorCase(
        "Ascend910B3", "ascend-device-plugin register; examples/ascend/job-910B3.yaml",
        node("ascend-node", register("hami.io/node-register-Ascend910B3", {
            "id": "npu-0", "count": 4, "devmem": 65536, "devcore": 20, "type": "Ascend910B3",
            "health": True})),
        {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "20000"},
        {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "2000"},
        {"limits.huawei.com/Ascend910B3-memory": 65536},
        {"huawei.com/Ascend910B3-memory": 32768},
        {"hami.io/Ascend910B3-devices-allocated": "npu-0,Ascend910B3,32768,0:;"
                                                  "npu-0,Ascend910B3,16384,0:;",
         "huawei.com/Ascend910B3": '[{"UUID":"npu-0","temp":"vir10_3c_32g","memory":32768},'
                                   '{"UUID":"npu-0","temp":"vir05_1c_16g","memory":16384}]'},
        (("npu-0", 32768, 0, 1),), (("npu-0", 16384, 0, 1),),
    ),
    VendorCase(
        "DCU", "hygon/device_test.go:265 register; examples/hygon/default_use.yaml",
        node("dcu-node", {"hami.io/node-dcu-register": "test-0,4,16384,100,DCU,0,true,0,test:"}),
        {"hygon.com/dcunum": "1", "hygon.com/dcumem": "4000", "hygon.com/dcucores": "40"},
        {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "60"},
        {"limits.hygon.com/dcumem": 8000, "limits.hygon.com/dcucores": 100},
        {"hygon.com/dcumem": 4000, "hygon.com/dcucores": 60},
        {"hami.io/dcu-devices-allocated": "test-0,DCU,4000,40:;test-0,DCU,2000,60:;",
         "hami.io/dcu-devices-to-allocate": "test-0,DCU,4000,40:;test-0,DCU,2000,60:;"},
        (("test-0", 4000, 60, 1),), (("test-0", 2000, 60, 1),),
    ),
    VendorCase(
        "MLU", "cambricon/device_test.go:40 (capacity); examples/mlu/default_use.yaml",
        node("mlu-node", capacity={"cambricon.com/mlu.smlu.vcore": "200",
                                    "cambricon.com/mlu.smlu.vmemory": "400"}),
        {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "80",
         "cambricon.com/mlu.smlu.vcore": "20"},
        {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "20",
         "cambricon.com/mlu.smlu.vcore": "10"},
        {"limits.cambricon.com/mlu.smlu.vmemory": 100},
        {"cambricon.com/mlu.smlu.vmemory": 20480, "cambricon.com/mlu.smlu.vcore": 20},
        {"hami.io/cambricon-mlu-devices-allocated":
             "mlu-node-cambricon-mlu-1,MLU,20480,20:;mlu-node-cambricon-mlu-1,MLU,5120,10:;",
         "CAMBRICON_DSMLU_PROFILE": "1_20_80", "CAMBRICON_DSMLU_ASSIGNED": "false"},
        (("mlu-node-cambricon-mlu-1", 20480, 20, 1),), (("mlu-node-cambricon-mlu-1", 5120, 10, 1),),
    ),
    VendorCase(
        "MR-V100", "iluvatar/device_test.go:57 register; examples/iluvatar/default_use_MR-V100",
        node("iluvatar-node", {"hami.io/node-MR-V100-register":
                                "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,10,32768,100,MR-V100,0,true:"}),
        {"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "64",
         "iluvatar.ai/MR-V100.vCore": "50"},
        {"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "16",
         "iluvatar.ai/MR-V100.vCore": "20"},
        {"limits.iluvatar.ai/MR-V100.vMem": 100},
        {"iluvatar.ai/MR-V100.vMem": 16384, "iluvatar.ai/MR-V100.vCore": 50},
        {"hami.io/MR-V100-devices-allocated":
             "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,MR-V100,16384,50:;"
             "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,MR-V100,4096,20:;"},
        (("GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae", 16384, 50, 1),),
        (("GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae", 4096, 20, 1),),
    ),
    VendorCase(
        "Metax-GPU", "metax/device.go GetNodeDevices (capacity); examples/metax/gpu",
        node("metax-node", capacity={"metax-tech.com/gpu": "2"}),
        {"metax-tech.com/gpu": "1"}, {"metax-tech.com/gpu": "1"},
        {"limits.metax-tech.com/gpu": 2}, {"metax-tech.com/gpu": 1},
        {"hami.io/metax-gpu-devices-allocated":
             "metax-node-metax-1,Metax-GPU,65536,100:;metax-node-metax-1,Metax-GPU,65536,100:;"},
        (("metax-node-metax-1", 65536, 100, 1),), (("metax-node-metax-1", 65536, 100, 1),),
    ),
    VendorCase(
        "Mthreads", "mthreads/device_test.go:319 (capacity); examples/mthreads/default_use.yaml",
        node("mthreads-node", capacity={"mthreads.com/sgpu-core": "32",
                                         "mthreads.com/sgpu-memory": "192"}),
        {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "64", "mthreads.com/sgpu-core": "8"},
        {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "4"},
        {"limits.mthreads.com/sgpu-memory": 128},
        {"mthreads.com/sgpu-memory": 32768, "mthreads.com/sgpu-core": 8},
        {"hami.io/mthreads-vgpu-devices-allocated":
             "mthreads-node-mthreads-1,Mthreads,32768,8:;mthreads-node-mthreads-1,Mthreads,16384,4:;",
         "mthreads.com/gpu-index": "1", "mthreads.com/predicate-node": "mthreads-node"},
        (("mthreads-node-mthreads-1", 32768, 8, 1),), (("mthreads-node-mthreads-1", 16384, 4, 1),),
    ),
    VendorCase(
        "GCU", "enflame/gcu.go (capacity); examples/enflame/gcu_use.yaml",
        node("gcu-node", capacity={"enflame.com/gcu": "2"}),
        {"enflame.com/gcu": "1"}, {"enflame.com/gcu": "1"},
        {"limits.enflame.com/gcu": 1}, {"enflame.com/gcu": 1},
        {"hami.io/enflame-gcu-devices-allocated":
             "gcu-node-GCU-1,GCU,100,100:;gcu-node-GCU-1,GCU,100,100:;"},
        (("gcu-node-GCU-1", 100, 100, 1),), (("gcu-node-GCU-1", 100, 100, 1),),
    ),
    VendorCase(
        "AMD", "amd/device_test.go:150 register; amd/device.go Fit",
        node("amd-node", register("hami.io/node-amd-register", {
            "id": "GPU-0", "index": 0, "count": 4, "devmem": 8192, "devcore": 100,
            "type": "AMD_Instinct_MI300X_VF", "numa": 0, "health": True})),
        {"amd.com/gpu": "1", "amd.com/gpumem": "4000", "amd.com/gpucores": "50"},
        {"amd.com/gpu": "1", "amd.com/gpumem": "1000", "amd.com/gpucores": "20"},
        {"limits.amd.com/gpumem": 8192},
        {"amd.com/gpumem": 4000, "amd.com/gpucores": 50},
        {"hami.io/amd-devices-allocated":
             "GPU-0,AMD_Instinct_MI300X_VF,4000,50:;GPU-0,AMD_Instinct_MI300X_VF,1000,20:;"},
        (("GPU-0", 4000, 50, 1),), (("GPU-0", 1000, 20, 1),),
    ),
    VendorCase(
        "Vastai", "vastai/device_test.go:106 register; examples/vastai/default_use.yaml",
        node("vastai-node", register("hami.io/node-va-register", {
            "id": "7-0", "count": 4, "devmem": 32768, "type": "Vastai", "health": True})),
        {"vastaitech.com/va": "1"}, {"vastaitech.com/va": "1"},
        {"limits.vastaitech.com/va": 1}, {"vastaitech.com/va": 1},
        {"hami.io/Vastai-devices-allocated": "7-0,Vastai,0,0:;7-0,Vastai,0,0:;"},
        (("7-0", 0, 0, 1),), (("7-0", 0, 0, 1),),
    ),
    VendorCase(
        "Biren", "biren/device_test.go:106 register; examples/biren/default_use.yaml",
        node("biren-node", register("hami.io/node-biren-register", {
            "id": "7-0", "count": 4, "devmem": 32768, "type": "Biren", "health": True})),
        {"birentech.com/gpu": "1"}, {"birentech.com/gpu": "1"},
        {"limits.birentech.com/gpu": 1}, {"birentech.com/gpu": 1},
        {"hami.io/Biren-devices-allocated": "7-0,Biren,0,0:;7-0,Biren,0,0:;"},
        (("7-0", 0, 0, 1),), (("7-0", 0, 0, 1),),
    ),
    *(
        VendorCase(
            word, f"ascend-device-plugin register; examples/ascend/job-{word[6:]}.yaml",
            node(f"{word.lower()}-node", register(f"hami.io/node-register-{word}", *(
                {"id": f"npu-{i}", "index": i, "count": 4, "devmem": devmem, "devcore": 20,
                 "type": word, "health": True} for i in range(npus)))),
            {f"huawei.com/{word}": "1", f"huawei.com/{word}-memory": str(init_ask)},
            {f"huawei.com/{word}": "1", f"huawei.com/{word}-memory": "2000"},
            {f"limits.huawei.com/{word}-memory": 4 * devmem},
            {f"huawei.com/{word}-memory": init_mib * npus},
            {f"hami.io/{word}-devices-allocated": "".join(
                "".join(f"npu-{i},{word},{mib},0:" for i in range(npus)) + ";"
                for mib in (init_mib, app_mib)),
             f"huawei.com/{word}": json.dumps(
                 [{"UUID": f"npu-{i}", "temp": temp, "memory": mib}
                  for mib, temp in ((init_mib, init_temp), (app_mib, app_temp))
                  for i in range(npus)], separators=(",", ":"))},
            tuple((f"npu-{i}", init_mib, 0, 1) for i in range(npus)),
            tuple((f"npu-{i}", app_mib, 0, 1) for i in range(npus)),
        )
        for word, devmem, init_ask, init_mib, init_temp, app_mib, app_temp, npus in (
            ("Ascend910A", 32768, 8000, 8738, "vir08", 2184, "vir02", 1),
            ("Ascend910B2", 65536, 20000, 32768, "vir12_3c_32g", 8192, "vir03_1c_8g", 1),
            ("Ascend910B4", 32768, 10000, 16384, "vir10_3c_16g", 8192, "vir05_1c_8g", 1),
            ("Ascend910B4-1", 65536, 20000, 32768, "vir10_3c_32g", 16384, "vir05_1c_16g", 1),
            ("Ascend310P", 24576, 8000, 12288, "vir04", 3072, "vir01", 1),
            # One 910C NPU is a module of two: both NPUs of module 0, each charged the vNPU.
            ("Ascend910C", 65536, 20000, 32768, "vir10_3c_32g", 16384, "vir05_1c_16g", 2),
        )
    ),
    *(
        VendorCase(
            chip, f"iluvatar/device_test.go:57 register; examples/iluvatar/default_use_{chip}",
            node(f"{chip.lower()}-node", {f"hami.io/node-{chip}-register":
                                           f"GPU-{chip},10,32768,100,{chip},0,true:"}),
            {f"iluvatar.ai/{chip}-vgpu": "1", f"iluvatar.ai/{chip}.vMem": "64",
             f"iluvatar.ai/{chip}.vCore": "50"},
            {f"iluvatar.ai/{chip}-vgpu": "1", f"iluvatar.ai/{chip}.vMem": "16",
             f"iluvatar.ai/{chip}.vCore": "20"},
            {f"limits.iluvatar.ai/{chip}.vMem": 100},
            {f"iluvatar.ai/{chip}.vMem": 16384, f"iluvatar.ai/{chip}.vCore": 50},
            {f"hami.io/{chip}-devices-allocated":
                 f"GPU-{chip},{chip},16384,50:;GPU-{chip},{chip},4096,20:;"},
            ((f"GPU-{chip}", 16384, 50, 1),), ((f"GPU-{chip}", 4096, 20, 1),),
        )
        for chip in ("MR-V50", "BI-V150", "BI-V100")
    ),
    VendorCase(
        "Metax-SGPU", "metax/sdevice_test.go:520 register; examples/metax/sgpu/*.yaml",
        node("sgpu-node", {"metax-tech.com/node-gpu-devices": json.dumps([{
            "uuid": "GPU-123", "model": "sgpu", "totalDevCount": 16, "totalCompute": 100,
            "bdf": "0000:44:00.0", "totalVRam": 32768, "numa": 1, "healthy": True,
            "qosPolicy": "fixed-share"}])}),
        {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8", "metax-tech.com/vcore": "60"},
        {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2048Mi",
         "metax-tech.com/vcore": "30"},
        {"limits.metax-tech.com/vmemory": 16},
        {"metax-tech.com/vmemory": 8192, "metax-tech.com/vcore": 60},
        {"hami.io/metax-sgpu-devices-allocated": "GPU-123,Metax-SGPU,8192,60:;"
                                                 "GPU-123,Metax-SGPU,2048,30:;",
         "metax-tech.com/gpu-devices-allocated":
             '[[{"uuid":"GPU-123","compute":60,"vRam":8192}],'
             '[{"uuid":"GPU-123","compute":30,"vRam":2048}]]'},
        (("GPU-123", 8192, 60, 1),), (("GPU-123", 2048, 30, 1),),
    ),
    VendorCase(
        "Enflame", "enflame/device_test.go:40 register; examples/enflame/vgcu_use.yaml",
        node("drs-node", {"enflame.com/gcu-drs-capacity": (
            '{"devices":[{"index":"0","minor":"0","capacity":6}],'
            '"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}')}),
        {"enflame.com/drs-gcu": "3"},
        {"enflame.com/gcu-memory": "6"},
        {"limits.enflame.com/gcu-memory": 30000},
        {"enflame.com/gcu-memory": 6},
        {"hami.io/enflame-vgpu-devices-allocated":
             "drs-node-enflame-drs-0,Enflame,20480,50,3:;drs-node-enflame-drs-0,Enflame,6144,17:;",
         "enflame.com/gcu-request-size": "3"},
        (("drs-node-enflame-drs-0", 20480, 50, 3),), (("drs-node-enflame-drs-0", 6144, 17, 1),),
    ),
    VendorCase(
        "kunlun", "kunlun/device.go GetNodeDevices (capacity); kunlun/device_test.go:83 topology",
        node("kunlun-node", capacity={"kunlunxin.com/xpu": "8"}),
        {"kunlunxin.com/xpu": "2"}, {"kunlunxin.com/xpu": "1"},
        {"limits.kunlunxin.com/xpu": 2}, {"kunlunxin.com/xpu": 2},
        {"hami.io/kunlun-allocated":
             "kunlun-node-kunlun-0,kunlun,98304,100:kunlun-node-kunlun-1,kunlun,98304,100:;"
             "kunlun-node-kunlun-0,kunlun,98304,100:;",
         "BAIDU_COM_DEVICE_IDX": "0"},
        (("kunlun-node-kunlun-0", 98304, 100, 1), ("kunlun-node-kunlun-1", 98304, 100, 1)),
        (("kunlun-node-kunlun-0", 98304, 100, 1),),
    ),
    VendorCase(
        "XPU", "kunlun/vdevice_test.go:255 register; examples/kunlun/default_use.yaml",
        node("xpu-node", register("hami.io/node-register-xpu", *(
            {"id": f"xpu-{i}", "index": i, "count": 4, "devmem": 98304, "devcore": 100,
             "type": "XPU", "health": True} for i in range(8)))),
        {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "40000"},
        {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24576"},
        {"limits.kunlunxin.com/vxpu-memory": 98304},
        {"kunlunxin.com/vxpu-memory": 49152},
        {"hami.io/xpu-devices-allocated": "xpu-0,XPU,49152,50:;xpu-0,XPU,24576,25:;"},
        (("xpu-0", 49152, 50, 1),), (("xpu-0", 24576, 25, 1),),
    ),
    VendorCase(
        "AWSNeuron", "awsneuron/device_test.go:250 (capacity); examples/awsneuron/*.yaml",
        node("aws-node", capacity={"aws.amazon.com/neuron": "2",
                                    "aws.amazon.com/neuroncore": "4"},
              labels={"node.kubernetes.io/instance-type": "inf2.xlarge"}),
        {"aws.amazon.com/neuroncore": "2"}, {"aws.amazon.com/neuroncore": "1"},
        {"limits.aws.amazon.com/neuroncore": 4}, {"aws.amazon.com/neuroncore": 2},
        {"hami.io/aws-neuron-devices-allocated":
             "aws-node-AWSNeuron-1,AWSNeuron,0,3:;aws-node-AWSNeuron-1,AWSNeuron,0,1:;",
         "AWS_NEURON_IDS": "1,2", "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuroncore"},
        (("aws-node-AWSNeuron-1", 0, 3, 1),), (("aws-node-AWSNeuron-1", 0, 1, 1),),
    ),
    VendorCase(
        "Acme", "not HAMi's: a vendor added as one table entry (tests/support/vendors.py)",
        node("acme-node", register("hami.io/node-acme-register", {
            "id": "NPU-0", "count": 10, "devmem": 16384, "devcore": 100, "type": "Acme NPU",
            "health": True})),
        {"acme.com/npu": "1", "acme.com/npumem": "3000", "acme.com/npucores": "30"},
        {"acme.com/npu": "1", "acme.com/npumem": "1000", "acme.com/npucores": "10"},
        {"limits.acme.com/npumem": 4000},
        {"acme.com/npumem": 3000, "acme.com/npucores": 30},
        {"hami.io/acme-devices-allocated": "NPU-0,Acme,3000,30:;NPU-0,Acme,1000,10:;",
         "hami.io/acme-devices-to-allocate": "NPU-0,Acme,3000,30:;NPU-0,Acme,1000,10:;"},
        (("NPU-0", 3000, 30, 1),), (("NPU-0", 1000, 10, 1),),
    ),
]
