"""HAMi's scheduler metrics, written from the recorder's ledger: the names, labels and units of
HAMi v2.10.0's ``cmd/scheduler/metrics.go``, so HAMi's Grafana dashboard and HAMi-WebUI read
the recorder as they read HAMi's scheduler.

Layer: services/usage (runtime). HAMi builds these at every scrape from its node usage (each
registered node's devices, with every tracked pod's stored devices added on), its quota manager
and its pod manager; so does the recorder, from one reading of its store
(``services.usage.scrape``). The values are the ledger's, so they are init-aware: a card with a
20 GiB init container and a 10 GiB app shows 20 GiB while the init container runs and 10 GiB
once it has exited 0.

What is copied from HAMi, exactly:

* every series carries ``zone="vGPU"`` (HAMi registers its collector with that constant label);
* memory in bytes (MiB × 1024²); ``device_cores`` and ``device_memory_limit`` are the device's
  totals as HAMi holds them (cores, percent; memory, MiB), as label values;
* ``hami_gpu_shared_count`` is the sum of the slots stored on the card;
* an AMD card (its type starts with "AMD", in any case) has its cores in compute units: the core
  ratios are normalized to percent (limit 100, allocated ceil(allocated / total × 100));
* ``hami_node_gpu_memory_allocated_ratio`` is a fraction (0..1), written only for a card with
  memory;
* the per-container series carry ``container_index="0"``: HAMi stores a pod's devices collapsed
  into one entry per vendor, each device once with the pod's effective value, and so does the
  ledger;
* ``hami_resource_quota_used`` covers the resources HAMi's quota manager tracks (each vendor's
  memory and core resource), with the limit as a label ("0" when none is set), and
  ``hami_resource_quota_limit`` only where a limit is set;
* with the legacy switch, HAMi's pre-2.8 names are written beside the new ones, with their own
  labels (``--legacy-metrics`` in HAMi; raw core values there, as HAMi writes them).

* ``hami_node_gpu_mig_instance_info`` is 1 for each instance the device plugin has created on
  a card in MIG mode for a stored pod (its ``hami.io/vgpu-mig-allocations`` entry carries the
  MIG UUID and the GPU and compute instance ids: HAMi's ``RuntimeReady``).

Where the recorder differs: a resource a namespace neither uses nor limits any more has no
quota series (HAMi keeps a zero for it until it restarts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from accounting.lifecycle import StoredPod
from accounting.mig import MIG_MODE, MigAllocation
from accounting.model import Device, QuotaItem
from services.usage.exposition import label_set, number

ZONE = ("zone", "vGPU")
"""The constant label of every series HAMi's scheduler collector writes."""
MIB = 1024 * 1024
NORMALIZED_CORE_LIMIT = 100
CONTAINER_INDEX = "0"

# -- the device families (HAMi's collectNodeMetrics), in the order HAMi writes them -------------

GPU_MEMORY_LIMIT = "hami_gpu_memory_limit_bytes"
GPU_CORE_LIMIT = "hami_gpu_core_limit_ratio"
GPU_MEMORY_ALLOCATED = "hami_gpu_memory_allocated_bytes"
GPU_SHARED_COUNT = "hami_gpu_shared_count"
GPU_CORE_ALLOCATED = "hami_gpu_core_allocated_ratio"
NODE_GPU_OVERVIEW = "hami_node_gpu_overview"
NODE_GPU_MEMORY_RATIO = "hami_node_gpu_memory_allocated_ratio"
NODE_GPU_MIG_INSTANCE = "hami_node_gpu_mig_instance_info"

DEVICE_FAMILIES: tuple[tuple[str, str], ...] = (
    (GPU_MEMORY_LIMIT, "GPU memory of the device, bytes."),
    (GPU_CORE_LIMIT, "Compute of the device, percent (AMD: normalized to 100)."),
    (GPU_MEMORY_ALLOCATED, "GPU memory charged on the device by the usage ledger, bytes."),
    (GPU_SHARED_COUNT, "Sharing slots charged on the device (containers sharing it)."),
    (GPU_CORE_ALLOCATED, "Compute charged on the device, percent (AMD: normalized)."),
    (NODE_GPU_OVERVIEW, "GPU memory charged on the device, bytes, with its totals as labels."),
    (NODE_GPU_MEMORY_RATIO, "GPU memory charged on the device over its memory (0 to 1)."),
    (NODE_GPU_MIG_INSTANCE, "1 for each MIG instance created on the card for a stored pod, "
     "with its identity and placement."),
)
LEGACY_DEVICE_FAMILIES: tuple[tuple[str, str], ...] = (
    ("GPUDeviceMemoryLimit", "Legacy name of hami_gpu_memory_limit_bytes."),
    ("GPUDeviceCoreLimit", "Legacy name of hami_gpu_core_limit_ratio (cores as registered)."),
    ("GPUDeviceMemoryAllocated", "Legacy name of hami_gpu_memory_allocated_bytes."),
    ("GPUDeviceSharedNum", "Legacy name of hami_gpu_shared_count."),
    ("GPUDeviceCoreAllocated", "Legacy name of hami_gpu_core_allocated_ratio (cores as "
     "charged)."),
    ("nodeGPUOverview", "Legacy name of hami_node_gpu_overview."),
    ("nodeGPUMemoryPercentage", "Legacy name of hami_node_gpu_memory_allocated_ratio."),
    ("nodeGPUMigInstance", "Legacy name of hami_node_gpu_mig_instance_info (the instance as "
     "profile-GPU instance id)."),
)

# -- the per-container families (HAMi's collectContainerMetrics) -------------------------------

VGPU_MEMORY_ALLOCATED = "hami_vgpu_memory_allocated_bytes"
VGPU_CORE_ALLOCATED = "hami_vgpu_core_allocated_ratio"

POD_FAMILIES: tuple[tuple[str, str], ...] = (
    (VGPU_MEMORY_ALLOCATED, "GPU memory the usage ledger charges the pod on the device, bytes."),
    (VGPU_CORE_ALLOCATED, "Compute the usage ledger charges the pod on the device, percent."),
)
LEGACY_POD_FAMILIES: tuple[tuple[str, str], ...] = (
    ("vGPUMemoryAllocated", "Legacy name of hami_vgpu_memory_allocated_bytes."),
    ("vGPUCoreAllocated", "Legacy name of hami_vgpu_core_allocated_ratio (cores as charged)."),
)

# -- the quota families (HAMi's collectQuotaMetrics) -------------------------------------------

RESOURCE_QUOTA_USED = "hami_resource_quota_used"
RESOURCE_QUOTA_LIMIT = "hami_resource_quota_limit"

QUOTA_FAMILIES: tuple[tuple[str, str], ...] = (
    (RESOURCE_QUOTA_USED, "What the namespace uses of a quota resource (memory MiB, compute "
     "percent), with its limit as a label."),
    (RESOURCE_QUOTA_LIMIT, "The namespace's limit of a quota resource, where one is set."),
)
LEGACY_QUOTA_FAMILIES: tuple[tuple[str, str], ...] = (
    ("QuotaUsed", "Legacy name of hami_resource_quota_used."),
)

HAMI_FAMILY_NAMES: tuple[str, ...] = tuple(
    name for name, _help in (*DEVICE_FAMILIES, *POD_FAMILIES, *QUOTA_FAMILIES)
)
"""Every HAMi family the recorder writes (the legacy ones aside)."""
LEGACY_FAMILY_NAMES: tuple[str, ...] = tuple(
    name for name, _help in (*LEGACY_DEVICE_FAMILIES, *LEGACY_POD_FAMILIES,
                             *LEGACY_QUOTA_FAMILIES)
)


def families(legacy: bool) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The device, pod and quota family tables, with the legacy names when ``legacy``."""
    if not legacy:
        return DEVICE_FAMILIES, POD_FAMILIES, QUOTA_FAMILIES
    return (
        DEVICE_FAMILIES + LEGACY_DEVICE_FAMILIES,
        POD_FAMILIES + LEGACY_POD_FAMILIES,
        QUOTA_FAMILIES + LEGACY_QUOTA_FAMILIES,
    )


def is_amd(device_type: str) -> bool:
    """HAMi's test for a card whose cores are compute units."""
    return device_type.upper().startswith("AMD")


def core_ratios(device_type: str, total: int, allocated: int) -> tuple[int, int]:
    """(limit, allocated) as HAMi's ratio families write them: AMD compute units normalized to
    percent, any other card as it is."""
    if not is_amd(device_type) or total <= 0:
        return total, allocated
    return NORMALIZED_CORE_LIMIT, math.ceil(allocated / total * NORMALIZED_CORE_LIMIT)


def device_lines(
    node_name: str,
    device: Device,
    used: tuple[int, int, int],
    legacy: bool,
    instances: Sequence[MigAllocation] = (),
) -> tuple[str, ...]:
    """One chunk per device family (``families(legacy)[0]``, in order) for one device with
    ``used`` = (memory MiB, core percent, slots) charged on it and, on a card in MIG mode, the
    ``instances`` created on it for its pods; "" where a family writes none.
    """
    memory_used_mib, cores_used, slots_used = used
    index = str(device.index)
    cores = str(device.core_percent_total)
    device_type = device.model
    core_limit, core_allocated = core_ratios(device_type, device.core_percent_total, cores_used)
    labels = (("node", node_name), ("device_uuid", device.uuid), ("device_index", index),
              ("device_type", device_type), ZONE)
    common = label_set(labels)
    with_cores = label_set((*labels, ("device_cores", cores)))
    overview = label_set(
        (*labels, ("device_cores", cores), ("device_memory_limit", str(device.memory_total_mib)))
    )
    total_bytes = number(device.memory_total_mib * MIB)
    used_bytes = number(memory_used_mib * MIB)
    ratio = (
        f"{NODE_GPU_MEMORY_RATIO}{common} "
        f"{number(memory_used_mib / device.memory_total_mib)}\n"
        if device.memory_total_mib > 0
        else ""
    )
    created = instances if device.mode == MIG_MODE else ()
    lines = (
        f"{GPU_MEMORY_LIMIT}{common} {total_bytes}\n",
        f"{GPU_CORE_LIMIT}{common} {number(core_limit)}\n",
        f"{GPU_MEMORY_ALLOCATED}{with_cores} {used_bytes}\n",
        f"{GPU_SHARED_COUNT}{common} {slots_used}\n",
        f"{GPU_CORE_ALLOCATED}{common} {number(core_allocated)}\n",
        f"{NODE_GPU_OVERVIEW}{overview} {used_bytes}\n",
        ratio,
        "".join(_mig_line(node_name, device, instance) for instance in created),
    )
    if not legacy:
        return lines
    old = (("nodeid", node_name), ("deviceuuid", device.uuid), ("deviceidx", index), ZONE)
    old_common = label_set((*old, ("devicetype", device_type)))
    old_cores = label_set((*old, ("devicecores", cores), ("devicetype", device_type)))
    old_overview = label_set((*old, ("devicecores", cores), ("devicetype", device_type),
                              ("devicememorylimit", str(device.memory_total_mib))))
    old_ratio = (
        f"nodeGPUMemoryPercentage{label_set(old)} "
        f"{number(memory_used_mib / device.memory_total_mib)}\n"
        if device.memory_total_mib > 0
        else ""
    )
    return (
        *lines,
        f"GPUDeviceMemoryLimit{old_common} {total_bytes}\n",
        f"GPUDeviceCoreLimit{old_common} {device.core_percent_total}\n",
        f"GPUDeviceMemoryAllocated{old_cores} {used_bytes}\n",
        f"GPUDeviceSharedNum{old_common} {slots_used}\n",
        f"GPUDeviceCoreAllocated{old_common} {cores_used}\n",
        f"nodeGPUOverview{old_overview} {used_bytes}\n",
        old_ratio,
        "".join(_legacy_mig_line(node_name, device, instance) for instance in created),
    )


def _mig_line(node_name: str, device: Device, instance: MigAllocation) -> str:
    runtime = instance.runtime
    assert runtime is not None  # only created instances are kept for the metrics
    placement = instance.instance.placement
    labels = label_set((
        ("node", node_name), ("device_uuid", device.uuid), ("device_index", str(device.index)),
        ("mig_uuid", runtime.mig_uuid), ("profile", instance.instance.profile),
        ("gpu_instance_id", str(runtime.gpu_instance_id)),
        ("compute_instance_id", str(runtime.compute_instance_id)),
        ("placement_start", str(placement.start)), ("placement_size", str(placement.size)),
        ZONE,
    ))
    return f"{NODE_GPU_MIG_INSTANCE}{labels} 1\n"


def _legacy_mig_line(node_name: str, device: Device, instance: MigAllocation) -> str:
    runtime = instance.runtime
    assert runtime is not None
    labels = label_set((
        ("nodeid", node_name), ("deviceuuid", device.uuid), ("deviceidx", str(device.index)),
        ("migname", f"{instance.instance.profile}-{runtime.gpu_instance_id}"), ZONE,
    ))
    return f"nodeGPUMigInstance{labels} 1\n"


def pod_lines(
    stored: StoredPod, devices: Mapping[str, Device], legacy: bool
) -> tuple[str, ...]:
    """One chunk per pod family (``families(legacy)[1]``, in order): a line per device the pod
    is charged on. ``devices`` are the pod's node's devices by UUID (a device missing there
    has its cores written as they are)."""
    memory: list[str] = []
    cores: list[str] = []
    old_memory: list[str] = []
    old_cores: list[str] = []
    for entry in stored.usage:
        if not entry.uuid:
            continue  # HAMi skips a device without a UUID
        labels = label_set((("namespace", stored.namespace), ("node", stored.node_name),
                            ("pod", stored.name), ("container_index", CONTAINER_INDEX),
                            ("device_uuid", entry.uuid), ZONE))
        device = devices.get(entry.uuid)
        core_value = entry.core_percent
        if device is not None:
            _, core_value = core_ratios(device.model, device.core_percent_total, core_value)
        memory_bytes = number(entry.memory_mib * MIB)
        memory.append(f"{VGPU_MEMORY_ALLOCATED}{labels} {memory_bytes}\n")
        cores.append(f"{VGPU_CORE_ALLOCATED}{labels} {number(core_value)}\n")
        if legacy:
            old = label_set((("podnamespace", stored.namespace), ("nodename", stored.node_name),
                             ("podname", stored.name), ("containeridx", CONTAINER_INDEX),
                             ("deviceuuid", entry.uuid), ZONE))
            old_memory.append(f"vGPUMemoryAllocated{old} {memory_bytes}\n")
            old_cores.append(f"vGPUCoreAllocated{old} {entry.core_percent}\n")
    if not legacy:
        return "".join(memory), "".join(cores)
    return "".join(memory), "".join(cores), "".join(old_memory), "".join(old_cores)


def quota_lines(
    namespace: str, items: Iterable[QuotaItem], tracked: frozenset[str], legacy: bool
) -> tuple[str, ...]:
    """One chunk per quota family (``families(legacy)[2]``, in order) for one namespace; only
    the resources in ``tracked`` (each vendor's memory and core resource) are written."""
    used: list[str] = []
    limits: list[str] = []
    old_used: list[str] = []
    for item in items:
        if item.resource not in tracked:
            continue
        limit = str(item.limit)
        named = (("namespace", namespace), ("quota_name", item.resource), ZONE)
        used.append(f"{RESOURCE_QUOTA_USED}{label_set((*named, ('limit', limit)))} {item.used}\n")
        if item.limit_set:
            limits.append(f"{RESOURCE_QUOTA_LIMIT}{label_set(named)} {item.limit}\n")
        if legacy:
            old = (("quotanamespace", namespace), ("quotaName", item.resource), ("limit", limit),
                   ZONE)
            old_used.append(f"QuotaUsed{label_set(old)} {item.used}\n")
    if not legacy:
        return "".join(used), "".join(limits)
    return "".join(used), "".join(limits), "".join(old_used)
