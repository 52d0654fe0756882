"""The pod annotations a placement writes, vendor by vendor, as HAMi's scheduler writes them.

Layer: accounting (pure). HAMi's ``Filter`` asks every vendor backend to patch the pod
(``PatchAnnotations``): each writes its grants to its own allocation annotation(s) in the shared
``UUID,TYPE,MEM,CORES:`` / ``;`` format (``accounting.hami_codec``), and some add what their
device plugin reads besides:

* NVIDIA: ``hami.io/vgpu-mig-allocations`` for grants on MIG-mode cards (``accounting.mig``);
* Ascend: ``huawei.com/<chip>`` (each NPU's template, memory and cores) and ``predicate-time``;
* Cambricon: ``CAMBRICON_DSMLU_ASSIGNED`` and ``CAMBRICON_DSMLU_PROFILE``;
* Moore Threads: ``mthreads.com/gpu-index``, ``mthreads.com/predicate-time`` and
  ``mthreads.com/predicate-node``;
* Kunlun: ``BAIDU_COM_DEVICE_IDX``;
* Metax sGPU: ``metax-tech.com/gpu-devices-allocated`` and ``metax-tech.com/predicate-time``;
* AWS Neuron: ``AWS_NEURON_IDS`` (device indexes, or NeuronCore indexes for a device shared by
  cores, with ``NEURON_RESOURCE_TYPE``), ``NEURON_ALLOC_TIME``, ``NEURON_ALLOCATED`` and
  ``aws.amazon.com/predicate-node``;
* Enflame DRS: ``enflame.com/gcu-assigned*``, ``enflame.com/gcu-request-size`` and
  ``assigned-containers`` (each container's profile);
* AMD writes the GPU model as the TYPE of its grants.

Positions are the pod's containers, init containers first; a container without a device of the
vendor keeps its ``;``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from accounting import hami_codec, mig
from accounting.model import Device, DeviceGrant
from accounting.vendor_data import NEURON_CORES_PER_DEVICE
from accounting.vendor_spec import Charge, VendorSpec

ASCEND_PREDICATE_TIME = "predicate-time"
CAMBRICON_ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
CAMBRICON_PROFILE = "CAMBRICON_DSMLU_PROFILE"
CAMBRICON_MEMORY_UNIT_MIB = 256
MTHREADS_GPU_INDEX = "mthreads.com/gpu-index"
MTHREADS_PREDICATE_TIME = "mthreads.com/predicate-time"
MTHREADS_PREDICATE_NODE = "mthreads.com/predicate-node"
KUNLUN_DEVICE_INDEX = "BAIDU_COM_DEVICE_IDX"
METAX_ALLOCATED = "metax-tech.com/gpu-devices-allocated"
METAX_PREDICATE_TIME = "metax-tech.com/predicate-time"
NEURON_IDS = "AWS_NEURON_IDS"
NEURON_ALLOC_TIME = "NEURON_ALLOC_TIME"
NEURON_ALLOCATED = "NEURON_ALLOCATED"
NEURON_RESOURCE_TYPE = "NEURON_RESOURCE_TYPE"
NEURON_PREDICATE_NODE = "aws.amazon.com/predicate-node"
ENFLAME_ASSIGNED = "enflame.com/gcu-assigned"
ENFLAME_ASSIGNED_TIME = "enflame.com/gcu-assigned-time"
ENFLAME_ASSIGNED_INDEX = "enflame.com/gcu-assigned-index"
ENFLAME_ASSIGNED_ID = "enflame.com/gcu-assigned-id"
ENFLAME_ASSIGNED_MINOR = "enflame.com/gcu-assigned-minor"
ENFLAME_REQUEST_SIZE = "enflame.com/gcu-request-size"
ENFLAME_ASSIGNED_CONTAINERS = "assigned-containers"

PodGrants = Sequence[Sequence[DeviceGrant]]
"""Grants per container position."""


def allocation_annotations(
    grants: PodGrants,
    specs: Sequence[VendorSpec],
    devices: Mapping[str, Device],
    *,
    node_name: str,
    unix_s: int,
    annotations: Mapping[str, str],
    container_names: Sequence[str] = (),
) -> dict[str, str]:
    """Every vendor's annotations for a placement.

    Args:
        grants: grants per container position, every vendor's.
        specs: the policy's vendors (only those with a grant write anything).
        devices: the chosen node's devices by UUID (indexes, models, profiles).
        node_name: the chosen node (Moore Threads repeats it).
        unix_s: the placement's time, Unix seconds.
        annotations: the pod's own annotations (Ascend reads its mode there).
        container_names: the pod's containers by position (Enflame names them).
    """
    written: dict[str, str] = {}
    for spec in specs:
        mine = [tuple(g for g in container if g.vendor == spec.vendor) for container in grants]
        if not any(mine):
            continue
        if spec.charge is Charge.COMPUTE_UNITS:
            # AMD: the TYPE field carries the registered GPU model, as HAMi writes it.
            mine = [
                tuple(replace(g, vendor=devices[g.uuid].model or g.vendor) for g in container)
                for container in mine
            ]
        value = hami_codec.encode_pod_devices(mine)
        for key in spec.annotation_keys:
            written[key] = value
        written.update(
            _extras(spec, mine, devices, node_name, unix_s, annotations, container_names)
        )
    return written


def _extras(
    spec: VendorSpec,
    grants: PodGrants,
    devices: Mapping[str, Device],
    node_name: str,
    unix_s: int,
    annotations: Mapping[str, str],
    container_names: Sequence[str],
) -> dict[str, str]:
    extras: dict[str, str] = {}
    if spec.rule == "nvidia":
        value = mig.encode_allocations(mig_allocations(grants))
        if value:
            extras[mig.MIG_ALLOCATIONS_ANNOTATION] = value
    elif spec.rule == "ascend":
        soft_split = spec.soft_split(annotations)
        runtime = []
        for container in grants:
            for grant in container:
                entry: dict[str, object] = {"UUID": grant.uuid}
                if not soft_split:
                    template = _template_name(spec, grant.memory_mib)
                    if template:
                        entry["temp"] = template
                if grant.memory_mib:
                    entry["memory"] = grant.memory_mib
                if grant.core_percent:
                    entry["core"] = grant.core_percent
                runtime.append(entry)
        extras[f"huawei.com/{spec.vendor}"] = json.dumps(runtime, separators=(",", ":"))
        extras[ASCEND_PREDICATE_TIME] = str(unix_s)
    elif spec.vendor == "MLU":
        extras[CAMBRICON_ASSIGNED] = "false"
        first = next(container[0] for container in grants if container)
        extras[CAMBRICON_PROFILE] = (
            f"{devices[first.uuid].index}_{first.core_percent}_"
            f"{first.memory_mib // CAMBRICON_MEMORY_UNIT_MIB}"
        )
    elif spec.vendor == "Mthreads":
        last = [container for container in grants if container][-1]
        extras[MTHREADS_GPU_INDEX] = ",".join(str(devices[g.uuid].index) for g in last)
        extras[MTHREADS_PREDICATE_TIME] = str(unix_s * 1_000_000_000)
        extras[MTHREADS_PREDICATE_NODE] = node_name
    elif spec.rule == "kunlun":
        last = [container for container in grants if container][-1]
        extras[KUNLUN_DEVICE_INDEX] = ",".join(str(devices[g.uuid].index) for g in last)
    elif spec.rule == "metax-sgpu":
        extras[METAX_ALLOCATED] = json.dumps(
            [
                [
                    {"uuid": g.uuid, **({"compute": g.core_percent} if g.core_percent else {}),
                     **({"vRam": g.memory_mib} if g.memory_mib else {})}
                    for g in container
                ]
                for container in grants
            ],
            separators=(",", ":"),
        )
        extras[METAX_PREDICATE_TIME] = str(unix_s * 1_000_000_000)
    elif spec.rule == "aws-neuron":
        extras.update(_neuron(grants, devices, node_name, unix_s))
    elif spec.rule == "enflame-drs":
        extras.update(_enflame(grants, devices, unix_s, container_names))
    return extras


def _neuron(
    grants: PodGrants, devices: Mapping[str, Device], node_name: str, unix_s: int
) -> dict[str, str]:
    """HAMi's AWS Neuron annotations: a grant holding every core of its device names the
    device's index; one holding some of its cores names those NeuronCores (2 × index, + 1)."""
    extras: dict[str, str] = {}
    indexes: list[str] = []
    for grant in (g for container in grants for g in container):
        device = devices[grant.uuid]
        if grant.core_percent == device.core_percent_total:
            indexes.append(str(device.index))
            continue
        extras[NEURON_RESOURCE_TYPE] = "aws.amazon.com/neuroncore"
        for bit in range(NEURON_CORES_PER_DEVICE):
            if grant.core_percent & (1 << bit):
                indexes.append(str(NEURON_CORES_PER_DEVICE * device.index + bit))
    extras[NEURON_IDS] = ",".join(indexes)
    extras[NEURON_ALLOC_TIME] = str(unix_s * 1_000_000_000)
    extras[NEURON_ALLOCATED] = "false"
    extras[NEURON_PREDICATE_NODE] = node_name
    return extras


def _enflame(
    grants: PodGrants, devices: Mapping[str, Device], unix_s: int, names: Sequence[str]
) -> dict[str, str]:
    """HAMi's Enflame DRS annotations: the first device's index and minor, the first profile's
    slices, and each container's profile."""
    extras = {ENFLAME_ASSIGNED: "false", ENFLAME_ASSIGNED_TIME: str(unix_s * 1_000_000_000)}
    assigned: dict[str, dict[str, object]] = {}
    for position, container in enumerate(grants):
        if not container:
            continue
        first = container[0]
        device = devices[first.uuid]
        slices = max(first.slots, 1)
        name = f"{slices}g.{first.memory_mib // 1024}gb"
        profiles = hami_codec.custom_info_profiles(device.info("profiles"))
        container_name = names[position] if position < len(names) else f"container-{position}"
        assigned[container_name] = {"allocated": False, "request": slices,
                                    "profileID": str(profiles.get(name, "")), "profileName": name}
        index = device.info("index") or str(device.index)
        extras.setdefault(ENFLAME_ASSIGNED_INDEX, index)
        extras.setdefault(ENFLAME_ASSIGNED_ID, index)
        extras.setdefault(ENFLAME_ASSIGNED_MINOR, device.info("minor") or index)
        extras.setdefault(ENFLAME_REQUEST_SIZE, str(slices))
    extras[ENFLAME_ASSIGNED_CONTAINERS] = json.dumps(assigned, separators=(",", ":"))
    return extras


def mig_allocations(grants: PodGrants) -> list[mig.MigAllocation]:
    """One entry per MIG grant: its container position (init containers first) and its index
    among that container's NVIDIA grants, which is what HAMi's device plugin looks up."""
    return [
        mig.MigAllocation(position, index, grant.uuid, grant.mig)
        for position, container in enumerate(grants)
        for index, grant in enumerate(container)
        if grant.mig is not None
    ]


def _template_name(spec: VendorSpec, memory_mib: int) -> str:
    """The Ascend template a charged memory is (HAMi's ``trimMemory`` of the grant)."""
    for template in spec.memory_templates:
        if memory_mib <= template.memory_mib:
            return template.name
    return ""
