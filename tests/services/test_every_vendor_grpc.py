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

import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
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
from tests.support.vendors import ACME_SPEC, registered

TIMEOUT_S = 10.0
Json = dict[str, Any]
Charge = tuple[str, int, int, int]
"""(device UUID, memory MiB, cores, slots) stored on one device."""


def _node(name: str, annotations: Mapping[str, str] = {},
          capacity: Mapping[str, str] = {}, labels: Mapping[str, str] = {}) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": dict(annotations), "labels": dict(labels)},
        "status": {"capacity": dict(capacity)},
    }


def _register(key: str, *devices: Json) -> dict[str, str]:
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
        _node("nvidia-node", _register("hami.io/node-nvidia-register", {
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
        _node("mig-node", _register("hami.io/node-nvidia-register", {
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
        _node("ascend-node", _register("hami.io/node-register-Ascend910B3", {
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
        _node("dcu-node", {"hami.io/node-dcu-register": "test-0,4,16384,100,DCU,0,true,0,test:"}),
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
        _node("mlu-node", capacity={"cambricon.com/mlu.smlu.vcore": "200",
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
        _node("iluvatar-node", {"hami.io/node-MR-V100-register":
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
        _node("metax-node", capacity={"metax-tech.com/gpu": "2"}),
        {"metax-tech.com/gpu": "1"}, {"metax-tech.com/gpu": "1"},
        {"limits.metax-tech.com/gpu": 2}, {"metax-tech.com/gpu": 1},
        {"hami.io/metax-gpu-devices-allocated":
             "metax-node-metax-1,Metax-GPU,65536,100:;metax-node-metax-1,Metax-GPU,65536,100:;"},
        (("metax-node-metax-1", 65536, 100, 1),), (("metax-node-metax-1", 65536, 100, 1),),
    ),
    VendorCase(
        "Mthreads", "mthreads/device_test.go:319 (capacity); examples/mthreads/default_use.yaml",
        _node("mthreads-node", capacity={"mthreads.com/sgpu-core": "32",
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
        _node("gcu-node", capacity={"enflame.com/gcu": "2"}),
        {"enflame.com/gcu": "1"}, {"enflame.com/gcu": "1"},
        {"limits.enflame.com/gcu": 1}, {"enflame.com/gcu": 1},
        {"hami.io/enflame-gcu-devices-allocated":
             "gcu-node-GCU-1,GCU,100,100:;gcu-node-GCU-1,GCU,100,100:;"},
        (("gcu-node-GCU-1", 100, 100, 1),), (("gcu-node-GCU-1", 100, 100, 1),),
    ),
    VendorCase(
        "AMD", "amd/device_test.go:150 register; amd/device.go Fit",
        _node("amd-node", _register("hami.io/node-amd-register", {
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
        _node("vastai-node", _register("hami.io/node-va-register", {
            "id": "7-0", "count": 4, "devmem": 32768, "type": "Vastai", "health": True})),
        {"vastaitech.com/va": "1"}, {"vastaitech.com/va": "1"},
        {"limits.vastaitech.com/va": 1}, {"vastaitech.com/va": 1},
        {"hami.io/Vastai-devices-allocated": "7-0,Vastai,0,0:;7-0,Vastai,0,0:;"},
        (("7-0", 0, 0, 1),), (("7-0", 0, 0, 1),),
    ),
    VendorCase(
        "Biren", "biren/device_test.go:106 register; examples/biren/default_use.yaml",
        _node("biren-node", _register("hami.io/node-biren-register", {
            "id": "7-0", "count": 4, "devmem": 32768, "type": "Biren", "health": True})),
        {"birentech.com/gpu": "1"}, {"birentech.com/gpu": "1"},
        {"limits.birentech.com/gpu": 1}, {"birentech.com/gpu": 1},
        {"hami.io/Biren-devices-allocated": "7-0,Biren,0,0:;7-0,Biren,0,0:;"},
        (("7-0", 0, 0, 1),), (("7-0", 0, 0, 1),),
    ),
    *(
        VendorCase(
            word, f"ascend-device-plugin register; examples/ascend/job-{word[6:]}.yaml",
            _node(f"{word.lower()}-node", _register(f"hami.io/node-register-{word}", *(
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
            _node(f"{chip.lower()}-node", {f"hami.io/node-{chip}-register":
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
        _node("sgpu-node", {"metax-tech.com/node-gpu-devices": json.dumps([{
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
        _node("drs-node", {"enflame.com/gcu-drs-capacity": (
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
        _node("kunlun-node", capacity={"kunlunxin.com/xpu": "8"}),
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
        _node("xpu-node", _register("hami.io/node-register-xpu", *(
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
        _node("aws-node", capacity={"aws.amazon.com/neuron": "2",
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
        _node("acme-node", _register("hami.io/node-acme-register", {
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
