"""The vendor table: every device vendor HAMi v2.10 schedules, one entry each, as data.

Layer: accounting (pure, standard library only). ``VendorResources`` is the part of an entry
the accounting policy (``accounting.policy``) carries and may configure: how a vendor's devices
are asked for (resource names, defaults, memory factor). Each entry is a ``VendorSpec``
(``accounting.vendor_spec``) read from HAMi's ``pkg/device/<vendor>`` and the chart's device
configuration (``charts/hami/templates/scheduler/device-configmap.yaml``, which production
reads; where it and HAMi's code defaults differ, the chart wins). Adding a vendor whose devices
follow the generic memory/cores/slots path is adding an entry here: the policy then names it,
and the pod reader, the quota check, the fit, the recorder and ``explain`` follow.

``DEFAULT_VENDORS`` are the vendors HAMi's chart turns on without a flag (all but Ascend and
Iluvatar); the recorder accounts them unless configured otherwise (``HAMI_ACCOUNTING_VENDORS``).

Why one piece past 600 lines: all but the last ninety are the table itself, one entry of data
per vendor; the lookups below it (``spec_for``, ``find``, ``register``, ``specs_for``) are the
table's one face, and adding a vendor stays adding one entry here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import replace

from accounting.annotations import (
    DEVICES_ALLOCATED_ANNOTATION,
    DEVICES_TO_ALLOCATE_ANNOTATION,
    NODE_REGISTER_ANNOTATION,
    NOUSE_GPU_TYPE_ANNOTATION,
    NOUSE_GPU_UUID_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
    USE_GPU_UUID_ANNOTATION,
    VGPU_MODE_ANNOTATION,
)
from accounting.errors import InvalidInputError

# NVIDIA and VendorResources are defined beside VendorSpec, which holds one; they are read
# from here, with the table (the `as` marks them as this module's too).
from accounting.vendor_spec import NVIDIA as NVIDIA
from accounting.vendor_spec import (
    CapacityDevices,
    Charge,
    DeviceSource,
    MemoryTemplate,
    Selection,
    VendorSpec,
)
from accounting.vendor_spec import VendorResources as VendorResources

NVIDIA_RESOURCES = VendorResources()


def _ids(use: str, nouse: str) -> Selection:
    """A vendor whose pods narrow its devices by id only."""
    return Selection(use_uuid=use, nouse_uuid=nouse)


# -- NVIDIA ------------------------------------------------------------------------------------

NVIDIA_SPEC = VendorSpec(
    resources=NVIDIA_RESOURCES,
    title="NVIDIA GPU",
    source="pkg/device/nvidia",
    allocated_annotation=DEVICES_ALLOCATED_ANNOTATION,
    to_allocate_annotation=DEVICES_TO_ALLOCATE_ANNOTATION,
    register_annotation=NODE_REGISTER_ANNOTATION,
    selection=Selection(
        use_type=USE_GPU_TYPE_ANNOTATION,
        nouse_type=NOUSE_GPU_TYPE_ANNOTATION,
        use_uuid=USE_GPU_UUID_ANNOTATION,
        nouse_uuid=NOUSE_GPU_UUID_ANNOTATION,
        mode=VGPU_MODE_ANNOTATION,
    ),
    exclusive_default=True,
    rule="nvidia",
    notes=(
        "hami-core and mps cards: memory (MiB, or a share of the card) and cores as asked, one "
        "slot per grant (mps has no scheduling rule of its own in HAMi).",
        "mig cards: the request is fitted to an instance of the card's registered profiles and "
        "the instance's memory and cores are charged, one slot each.",
    ),
)

# -- Huawei Ascend (one backend per chip; --enable-ascend) -------------------------------------


def _ascend(
    chip: str,
    word: str,
    allocatable_mib: int,
    capacity_mib: int,
    templates: Iterable[tuple[str, int]],
    *,
    module_pairs: bool = False,
) -> VendorSpec:
    return VendorSpec(
        resources=VendorResources(
            vendor=word,
            count_resource=f"huawei.com/{word}",
            memory_resource=f"huawei.com/{word}-memory",
            memory_percentage_resource="",
            core_resource=f"huawei.com/{word}-core",
            default_gpu_count=0,
        ),
        title=f"Huawei Ascend {chip}",
        source="pkg/device/ascend",
        allocated_annotation=f"hami.io/{word}-devices-allocated",
        to_allocate_annotation=f"hami.io/{word}-devices-to-allocate",
        register_annotation=f"hami.io/node-register-{word}",
        selection=_ids(f"hami.io/use-{word}-uuid", f"hami.io/no-use-{word}-uuid"),
        soft_split_annotation="huawei.com/vnpu-mode",
        enabled_by_default=False,
        memory_templates=tuple(MemoryTemplate(name, mib) for name, mib in templates),
        template_whole_memory_mib=allocatable_mib,
        template_capacity_mib=capacity_mib,
        template_single_device=True,
        count_minimum=2 if module_pairs else 1,
        count_multiple=2 if module_pairs else 1,
        rule="ascend",
        notes=(
            "Memory is rounded up to the chip's vNPU template (above every template, or none "
            f"asked: the whole NPU, {allocatable_mib} MiB) and charged as rounded; cores only in "
            "hami-core mode (huawei.com/vnpu-mode: hami-core), which needs a node annotated "
            "hami-vnpu-core: \"true\".",
        )
        + (
            (
                "910C: NPUs come in modules of two; a count of 1 is taken as 2, other odd "
                "counts are refused, and only modules with both NPUs free are used.",
            )
            if module_pairs
            else ()
        ),
    )


ASCEND_SPECS = (
    _ascend("910A", "Ascend910A", 32768, 32768,
            (("vir02", 2184), ("vir04", 4369), ("vir08", 8738), ("vir16", 17476))),
    _ascend("910B2", "Ascend910B2", 65536, 65536,
            (("vir03_1c_8g", 8192), ("vir06_1c_16g", 16384), ("vir12_3c_32g", 32768))),
    _ascend("910B3", "Ascend910B3", 65536, 65536,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768))),
    _ascend("910B4-1", "Ascend910B4-1", 65536, 65536,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768))),
    _ascend("910B4", "Ascend910B4", 32768, 32768,
            (("vir05_1c_8g", 8192), ("vir10_3c_16g", 16384))),
    _ascend("310P3", "Ascend310P", 21527, 24576,
            (("vir01", 3072), ("vir02", 6144), ("vir04", 12288))),
    _ascend("910C", "Ascend910C", 65536, 65536,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)), module_pairs=True),
)

# -- Hygon, Cambricon, Iluvatar: the generic path with other units and defaults ---------------

HYGON_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="DCU",
        count_resource="hygon.com/dcunum",
        memory_resource="hygon.com/dcumem",
        memory_percentage_resource="",
        core_resource="hygon.com/dcucores",
        default_core_percent=100,
        default_gpu_count=0,
    ),
    title="Hygon DCU",
    source="pkg/device/hygon",
    allocated_annotation="hami.io/dcu-devices-allocated",
    to_allocate_annotation="hami.io/dcu-devices-to-allocate",
    devices=DeviceSource.REGISTER_LEGACY,
    register_annotation="hami.io/node-dcu-register",
    selection=Selection(
        use_type="hygon.com/use-dcutype",
        nouse_type="hygon.com/nouse-dcutype",
        use_uuid="hygon.com/use-gpuuuid",
        nouse_uuid="hygon.com/nouse-gpuuuid",
    ),
    notes=("Memory and cores as asked; no cores asked is 100 (the whole DCU's compute).",),
)

CAMBRICON_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="MLU",
        count_resource="cambricon.com/vmlu",
        memory_resource="cambricon.com/mlu.smlu.vmemory",
        memory_percentage_resource="",
        core_resource="cambricon.com/mlu.smlu.vcore",
        memory_factor=256,
        default_core_percent=100,
        default_gpu_count=0,
    ),
    title="Cambricon MLU",
    source="pkg/device/cambricon",
    allocated_annotation="hami.io/cambricon-mlu-devices-allocated",
    to_allocate_annotation="hami.io/cambricon-mlu-devices-to-allocate",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="cambricon.com/mlu.smlu.vcore",
        id_word="cambricon-mlu",
        units_per_device=100,
        slots=100,
        memory_resource="cambricon.com/mlu.smlu.vmemory",
    ),
    selection=_ids("cambricon.com/use-gpuuuid", "cambricon.com/nouse-gpuuuid"),
    memory_factor_fixed=True,
    notes=(
        "Memory is asked in units of 256 MiB and charged in MiB; the quota limit on "
        "cambricon.com/mlu.smlu.vmemory is in the same 256 MiB units. No cores asked is 100.",
        "Devices come from the node's capacity: one per 100 cambricon.com/mlu.smlu.vcore.",
    ),
)


def _iluvatar(chip: str) -> VendorSpec:
    return VendorSpec(
        resources=VendorResources(
            vendor=chip,
            count_resource=f"iluvatar.ai/{chip}-vgpu",
            memory_resource=f"iluvatar.ai/{chip}.vMem",
            memory_percentage_resource="",
            core_resource=f"iluvatar.ai/{chip}.vCore",
            memory_factor=256,
            default_gpu_count=0,
        ),
        title=f"Iluvatar {chip}",
        source="pkg/device/iluvatar",
        allocated_annotation=f"hami.io/{chip}-devices-allocated",
        to_allocate_annotation=f"hami.io/{chip}-devices-to-allocate",
        devices=DeviceSource.REGISTER_LEGACY,
        register_annotation=f"hami.io/node-{chip}-register",
        selection=_ids(f"hami.io/use-{chip}-uuid", f"hami.io/no-use-{chip}-uuid"),
        enabled_by_default=False,
        memory_factor_fixed=True,
        multi_device_core_percent=100,
        notes=(
            "Memory is asked in units of 256 MiB and charged in MiB. A container asking for "
            "more than one device takes every core of each (HAMi's webhook writes count × 100 "
            "cores, its fit reads 100 per device).",
        ),
    )


ILUVATAR_SPECS = tuple(_iluvatar(chip) for chip in ("MR-V100", "MR-V50", "BI-V150", "BI-V100"))

# -- whole devices --------------------------------------------------------------------------------

METAX_GPU_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Metax-GPU",
        count_resource="metax-tech.com/gpu",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Metax GPU",
    source="pkg/device/metax/device.go",
    allocated_annotation="hami.io/metax-gpu-devices-allocated",
    to_allocate_annotation="hami.io/metax-gpu-devices-to-allocate",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="metax-tech.com/gpu", id_word="metax", slots=1, memory_mib=65536
    ),
    whole_device=True,
    one_device_per_pod=True,
    notes=(
        "Whole GPUs only: each device is charged its nominal 65536 MiB and 100 % cores. Every "
        "container of a pod must use the same device.",
    ),
)

ENFLAME_GCU_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="GCU",
        count_resource="enflame.com/gcu",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Enflame GCU",
    source="pkg/device/enflame/gcu.go",
    allocated_annotation="hami.io/enflame-gcu-devices-allocated",
    to_allocate_annotation="hami.io/enflame-gcu-devices-to-allocate",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="enflame.com/gcu", id_word="GCU", slots=1, memory_mib=100
    ),
    whole_device=True,
    # HAMi's GCU Fit compares no capacity, but a GCU is refused as soon as it is used, and an
    # unused one always has its whole capacity: the comparison cannot refuse anything.
    used_device_refused=True,
    notes=(
        "Whole GCUs, exclusive: a GCU with any task is refused. HAMi charges the nominal "
        "100/100 it registers, not MiB.",
    ),
)

KUNLUN_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="kunlun",
        count_resource="kunlunxin.com/xpu",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Kunlunxin XPU (whole card)",
    source="pkg/device/kunlun/device.go",
    allocated_annotation="hami.io/kunlun-allocated",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="kunlunxin.com/xpu",
        id_word="kunlun",
        slots=100,
        memory_mib=98304,
        second_half_numa=True,
    ),
    selection=Selection(
        use_uuid="hami.io/use-xpu-uuid",
        nouse_uuid="hami.io/no-use-xpu-uuid",
        extra_use_uuid="baidu.com/use-gpuuuid",
        extra_nouse_uuid="baidu.com/nouse-gpuuuid",
    ),
    whole_device=True,
    charge=Charge.WHOLE_DEVICE,
    rule="kunlun",
    notes=(
        "Whole cards, 1, 2, 4 or 8 per container, chosen by the 8-card interconnect topology; "
        "each is charged 98304 MiB and 100 % cores (the allocation annotation's figures).",
    ),
)

# -- the others ------------------------------------------------------------------------------

KUNLUN_VXPU_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="XPU",
        count_resource="kunlunxin.com/vxpu",
        memory_resource="kunlunxin.com/vxpu-memory",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Kunlunxin vXPU",
    source="pkg/device/kunlun/vdevice.go",
    allocated_annotation="hami.io/xpu-devices-allocated",
    to_allocate_annotation="hami.io/xpu-devices-to-allocate",
    register_annotation="hami.io/node-register-xpu",
    selection=KUNLUN_SPEC.selection,
    memory_templates=(
        MemoryTemplate("quarter", 24576, 25),
        MemoryTemplate("half", 49152, 50),
        MemoryTemplate("whole", 98304, 100),
    ),
    template_whole_memory_mib=98304,
    rule="kunlun-vxpu",
    notes=(
        "Memory is rounded up to 24576, 49152 or 98304 MiB (larger: 98304) and charged with "
        "the matching 25, 50 or 100 % cores; a card is shared only by partitions of one size, "
        "placed by the 8-card topology.",
    ),
)

MTHREADS_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Mthreads",
        count_resource="mthreads.com/vgpu",
        memory_resource="mthreads.com/sgpu-memory",
        memory_percentage_resource="",
        core_resource="mthreads.com/sgpu-core",
        memory_factor=512,
        default_gpu_count=0,
    ),
    title="Moore Threads GPU",
    source="pkg/device/mthreads",
    allocated_annotation="hami.io/mthreads-vgpu-devices-allocated",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="mthreads.com/sgpu-core",
        id_word="mthreads",
        units_per_device=16,
        slots=100,
        memory_resource="mthreads.com/sgpu-memory",
        core_total=16,
    ),
    selection=_ids("mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid"),
    memory_factor_fixed=True,
    core_unit="sixteenths of a GPU",
    core_max=16,
    totals_divided_by_count=True,
    allowed_memory_units=(2, 4, 8, 16, 32, 64, 96),
    whole_memory_units=96,
    one_device_per_pod=True,
    notes=(
        "Memory is asked in units of 512 MiB (2, 4, 8, 16, 32, 64 or 96 for one device) and "
        "cores in sixteenths of a GPU, both for all of a container's devices together; each "
        "device is charged its share. No memory asked, or more than one device, is the whole "
        "GPU (96 units, 16 cores). Every container of a pod must use the same device.",
    ),
)

METAX_SGPU_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Metax-SGPU",
        count_resource="metax-tech.com/sgpu",
        memory_resource="metax-tech.com/vmemory",
        memory_percentage_resource="",
        core_resource="metax-tech.com/vcore",
        memory_factor=1024,
        default_core_percent=100,
        default_gpu_count=0,
    ),
    title="Metax sGPU",
    source="pkg/device/metax/sdevice.go",
    allocated_annotation="hami.io/metax-sgpu-devices-allocated",
    to_allocate_annotation="hami.io/metax-sgpu-devices-to-allocate",
    devices=DeviceSource.METAX_SGPU,
    register_annotation="metax-tech.com/node-gpu-devices",
    selection=_ids("metax-tech.com/use-gpuuuid", "metax-tech.com/nouse-gpuuuid"),
    memory_factor_fixed=True,
    limits_only=True,
    memory_quantity_units_are_bytes=True,
    rule="metax-sgpu",
    notes=(
        "Memory is a number of GiB, or a quantity with a unit read as bytes; the quota limit on "
        "metax-tech.com/vmemory is in GiB. No cores asked is 100. Pods of app class online are "
        "charged no cores; a used sGPU takes only tasks of its QoS policy.",
    ),
)

ENFLAME_DRS_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Enflame",
        count_resource="enflame.com/drs-gcu",
        memory_resource="enflame.com/gcu-memory",
        memory_percentage_resource="",
        core_resource="enflame.com/gcu-core",
        default_gpu_count=0,
    ),
    title="Enflame GCU (DRS)",
    source="pkg/device/enflame/device.go",
    allocated_annotation="hami.io/enflame-vgpu-devices-allocated",
    devices=DeviceSource.ENFLAME_DRS,
    register_annotation="enflame.com/gcu-drs-capacity",
    selection=_ids("enflame.com/use-gpuuuid", "enflame.com/nouse-gpuuuid"),
    charge=Charge.PROFILE,
    rule="enflame-drs",
    notes=(
        "A request (slices with enflame.com/drs-gcu, or memory and cores) is fitted to a DRS "
        "profile <slices>g.<GB>gb and the profile's memory and cores are charged, taking as "
        "many slots as the profile has slices.",
    ),
)

AWS_NEURON_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="AWSNeuron",
        count_resource="aws.amazon.com/neuron",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="aws.amazon.com/neuroncore",
        default_gpu_count=0,
    ),
    title="AWS Neuron",
    source="pkg/device/awsneuron",
    allocated_annotation="hami.io/aws-neuron-devices-allocated",
    devices=DeviceSource.CAPACITY,
    capacity=CapacityDevices(
        count_resource="aws.amazon.com/neuron",
        id_word="AWSNeuron",
        cores_per_device_resource="aws.amazon.com/neuroncore",
    ),
    selection=_ids("aws.amazon.com/use-neuron-uuid", "aws.amazon.com/nouse-neuron-uuid"),
    core_unit="bit mask of NeuronCores",
    core_max=0,
    charge=Charge.CORE_MASK,
    rule="aws-neuron",
    notes=(
        "Devices (aws.amazon.com/neuron) or NeuronCores (aws.amazon.com/neuroncore); no memory. "
        "A grant's cores are the bit mask of the NeuronCores it holds; the quota on "
        "aws.amazon.com/neuroncore counts NeuronCores.",
    ),
)

AMD_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="AMD",
        count_resource="amd.com/gpu",
        memory_resource="amd.com/gpumem",
        memory_percentage_resource="",
        core_resource="amd.com/gpucores",
        default_core_percent=100,
        default_gpu_count=0,
    ),
    title="AMD GPU",
    source="pkg/device/amd",
    allocated_annotation="hami.io/amd-devices-allocated",
    to_allocate_annotation="hami.io/amd-devices-to-allocate",
    register_annotation="hami.io/node-amd-register",
    selection=Selection(
        use_type="amd.com/use-gputype",
        nouse_type="amd.com/nouse-gputype",
        use_uuid="amd.com/use-gpu-uuid",
        nouse_uuid="amd.com/nouse-gpu-uuid",
    ),
    limits_only=True,
    core_unit="compute units",
    core_max=0,
    charge=Charge.COMPUTE_UNITS,
    rule="amd",
    notes=(
        "Memory as asked (none: the whole GPU); cores are asked in percent (default 100) and "
        "charged in the GPU's compute units, at least one. The annotation's TYPE is the GPU "
        "model, as HAMi writes it.",
    ),
)

VASTAI_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Vastai",
        count_resource="vastaitech.com/va",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Vastai",
    source="pkg/device/vastai",
    allocated_annotation="hami.io/Vastai-devices-allocated",
    to_allocate_annotation="hami.io/Vastai-devices-to-allocate",
    register_annotation="hami.io/node-va-register",
    selection=_ids("vastaitech.com/use-gpuuuid", "vastaitech.com/nouse-gpuuuid"),
    whole_device=True,
    checks_capacity=False,
    charge=Charge.SLOTS_ONLY,
    rule="vastai",
    notes=(
        "A sharing slot per device, no memory or cores charged (HAMi's grants carry none). "
        "Die mode (a node registering DeviceStrategy die) is refused: not modelled.",
    ),
)

BIREN_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Biren",
        count_resource="birentech.com/gpu",
        memory_resource="",
        memory_percentage_resource="",
        core_resource="",
    ),
    title="Biren GPU",
    source="pkg/device/biren",
    allocated_annotation="hami.io/Biren-devices-allocated",
    to_allocate_annotation="hami.io/Biren-devices-to-allocate",
    register_annotation="hami.io/node-biren-register",
    selection=_ids("birentech.com/use-gpuuuid", "birentech.com/nouse-gpuuuid"),
    whole_device=True,
    checks_capacity=False,
    charge=Charge.SLOTS_ONLY,
    notes=("A sharing slot per device, no memory or cores charged (HAMi's grants carry none).",),
)

VENDORS: tuple[VendorSpec, ...] = (
    NVIDIA_SPEC,
    *ASCEND_SPECS,
    HYGON_SPEC,
    CAMBRICON_SPEC,
    *ILUVATAR_SPECS,
    METAX_GPU_SPEC,
    METAX_SGPU_SPEC,
    MTHREADS_SPEC,
    ENFLAME_GCU_SPEC,
    ENFLAME_DRS_SPEC,
    KUNLUN_SPEC,
    KUNLUN_VXPU_SPEC,
    AWS_NEURON_SPEC,
    AMD_SPEC,
    VASTAI_SPEC,
    BIREN_SPEC,
)
"""Every vendor, in HAMi's registration order (NVIDIA first)."""

_BY_KEYWORD: dict[str, VendorSpec] = {spec.vendor: spec for spec in VENDORS}


def register(spec: VendorSpec) -> None:
    """Adds an entry to the table (what a new vendor's line in ``VENDORS`` does; tests use it
    to show that a vendor on the generic path needs nothing else).

    Raises:
        ValueError: the keyword is taken.
    """
    if spec.vendor in _BY_KEYWORD:
        raise ValueError(f"vendor {spec.vendor!r} is already in the table")
    _BY_KEYWORD[spec.vendor] = spec
    _specs_for.cache_clear()


def unregister(vendor: str) -> None:
    """Removes an entry ``register`` added (built-in entries stay)."""
    if any(spec.vendor == vendor for spec in VENDORS):
        raise ValueError(f"vendor {vendor!r} is built in")
    _BY_KEYWORD.pop(vendor, None)
    _specs_for.cache_clear()


def spec_for(vendor: str) -> VendorSpec:
    """The table entry of a vendor keyword.

    Raises:
        InvalidInputError: no such vendor, naming the known ones.
    """
    spec = _BY_KEYWORD.get(vendor)
    if spec is None:
        raise InvalidInputError.single(
            "vendor", f"{vendor!r} is not a vendor HAMi schedules; known: {', '.join(known())}"
        )
    return spec


def find(vendor: str) -> VendorSpec | None:
    """The table entry of a vendor keyword, or None."""
    return _BY_KEYWORD.get(vendor)


def known() -> tuple[str, ...]:
    """Every vendor keyword in the table, built-in ones first."""
    return tuple(_BY_KEYWORD)


DEFAULT_VENDORS: tuple[VendorResources, ...] = tuple(
    spec.resources for spec in VENDORS if spec.enabled_by_default
)
"""The vendors HAMi's chart schedules without a flag, with its names and defaults."""
ALL_VENDORS: tuple[VendorResources, ...] = tuple(spec.resources for spec in VENDORS)
"""Every built-in vendor, Ascend and Iluvatar included."""


def specs_for(vendors: Sequence[VendorResources]) -> tuple[VendorSpec, ...]:
    """The table entries of ``vendors`` (a policy's) with their configured names and defaults.

    Raises:
        InvalidInputError: a vendor the table does not have.
    """
    return _specs_for(tuple(vendors))


@functools.lru_cache(maxsize=256)
def _specs_for(vendors: tuple[VendorResources, ...]) -> tuple[VendorSpec, ...]:
    specs = []
    for vendor in vendors:
        spec = spec_for(vendor.vendor)
        specs.append(spec if spec.resources == vendor else replace(spec, resources=vendor))
    return tuple(specs)
