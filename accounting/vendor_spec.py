"""What describes one device vendor HAMi schedules: the types of the vendor table.

Layer: accounting (pure, standard library only). A ``VendorSpec`` says, as data, everything the
accounting needs to know about one of HAMi's device backends (one ``CommonWord`` of
``pkg/device/*``): how its requests are named and sized, where its node devices and pod
allocations are written, and which rules its fit follows. The entries themselves are in
``accounting.vendors``; admission, the fit, the recorder, ``explain`` and the Kubernetes source
all read them from there, through the accounting policy, which names the vendors in force and
carries their configurable part (``VendorResources``).

A vendor whose devices follow the generic memory/cores/slots path needs only data here. Rules
that differ are named by ``rule`` (implemented in ``accounting.vendor_fit``) or by the flags
below, each with HAMi's behaviour spelled out where it is read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

NVIDIA = "NVIDIA"
"""Vendor keyword HAMi writes into hami.io/vgpu-devices-allocated for NVIDIA devices."""


@dataclass(frozen=True, slots=True)
class VendorResources:
    """How one vendor's requests are named and sized (HAMi's ResourceNames plus defaults): the
    part of a vendor table entry the accounting policy may configure.

    A vendor without a memory, memory-percentage or core resource has "" there.
    """

    vendor: str = NVIDIA
    """HAMi's CommonWord for the vendor: the TYPE of its grants, e.g. NVIDIA, DCU, MLU."""
    count_resource: str = "nvidia.com/gpu"
    memory_resource: str = "nvidia.com/gpumem"
    memory_percentage_resource: str = "nvidia.com/gpumem-percentage"
    core_resource: str = "nvidia.com/gpucores"
    memory_factor: int = 1
    """Memory requests are multiplied by this (HAMi's memoryFactor; chart default 1): the size
    of one unit of the memory resource in MiB (Cambricon and Iluvatar 256, Moore Threads 512,
    Metax sGPU 1024)."""
    default_memory_mib: int = 0
    """Memory given to a container that asks for neither MiB nor a percentage (0: whole card)."""
    default_core_percent: int = 0
    default_gpu_count: int = 1


SOFT_SPLIT_MODE = "hami-core"
"""The value of a vendor's soft-split annotation asking for HAMi's soft split (Ascend)."""


class DeviceSource(enum.Enum):
    """Where a node says which of the vendor's devices it has."""

    REGISTER_JSON = "register-json"
    """A node annotation holding HAMi's ``DeviceInfo`` JSON array (keys in any case, as Go)."""
    REGISTER_LEGACY = "register-legacy"
    """A node annotation in HAMi's older form: ``id,count,devmem,devcore,type,numa,health[,index,
    mode]:`` per device."""
    CAPACITY = "capacity"
    """No annotation: devices are made up from ``status.capacity`` (see ``CapacityDevices``)."""
    METAX_SGPU = "metax-sgpu"
    """Metax's own JSON schema in ``metax-tech.com/node-gpu-devices``."""
    ENFLAME_DRS = "enflame-drs"
    """Enflame's DRS JSON in ``enflame.com/gcu-drs-capacity``: devices plus their profiles."""


class Charge(enum.Enum):
    """What one grant charges on its device."""

    REQUEST = "request"
    """What the container asked per device: its memory (MiB, or a share of the card) and
    cores."""
    WHOLE_DEVICE = "whole-device"
    """The device's whole memory and compute, whatever the request (Kunlun's whole cards)."""
    SLOTS_ONLY = "slots-only"
    """Only a sharing slot: the grant carries no memory and no cores (Vastai, Biren)."""
    COMPUTE_UNITS = "compute-units"
    """Memory as asked (no memory: the whole card); cores asked in percent, charged in the
    card's compute units (AMD)."""
    CORE_MASK = "core-mask"
    """No memory; the cores field is a bit mask of the device's cores (AWS Neuron)."""
    PROFILE = "profile"
    """The instance or profile the request is fitted to (NVIDIA MIG, Enflame DRS)."""


@dataclass(frozen=True, slots=True)
class CapacityDevices:
    """How HAMi makes up a vendor's devices from a node's ``status.capacity``.

    Device ``i`` is ``<node>-<id_word>-<i>``; there are ``ceil(capacity(count_resource) /
    units_per_device)`` of them.
    """

    count_resource: str
    """The capacity that counts devices (or their units)."""
    id_word: str
    units_per_device: int = 1
    """Capacity units per device (Cambricon: 100 vcores, Moore Threads: 16 cores)."""
    slots: int = 1
    """Sharing slots per device (HAMi's ``Count``)."""
    memory_mib: int = 0
    """Memory per device, MiB, when fixed."""
    memory_resource: str = ""
    """A capacity shared out as memory instead: capacity × memory unit × units per device /
    capacity(count_resource) per device."""
    core_total: int = 100
    """Compute per device in the vendor's core unit."""
    second_half_numa: bool = False
    """Devices from the second half of the index range are NUMA node 1 (Kunlun)."""
    cores_per_device_resource: str = ""
    """AWS Neuron: each device has capacity(this) / devices cores; its slots are that count and
    its compute is the bit mask of every core."""


@dataclass(frozen=True, slots=True)
class MemoryTemplate:
    """A fixed memory size a request is rounded up to (Ascend vNPU templates, Kunlun vXPU)."""

    name: str
    memory_mib: int
    core_percent: int = 0
    """Cores a request rounded to this template is charged (Kunlun vXPU); 0 charges the cores
    asked (Ascend: a template's AI cores are not charged by HAMi)."""


@dataclass(frozen=True, slots=True)
class Selection:
    """The pod annotations that narrow which of the vendor's devices a pod may use."""

    use_type: str = ""
    """Comma-separated models the pod may use (upper-case substring match)."""
    nouse_type: str = ""
    use_uuid: str = ""
    """Comma-separated device ids the pod may use."""
    nouse_uuid: str = ""
    extra_use_uuid: str = ""
    """A second pair of id annotations read as well (Kunlun reads both of its pairs)."""
    extra_nouse_uuid: str = ""
    mode: str = ""
    """The annotation listing the sharing modes the pod accepts: a device's mode must be a
    substring of its value (NVIDIA's ``nvidia.com/vgpu-mode``)."""

    def annotation_keys(self) -> tuple[str, ...]:
        """Every annotation key the selection reads."""
        return tuple(
            key
            for key in (
                self.use_type,
                self.nouse_type,
                self.use_uuid,
                self.nouse_uuid,
                self.extra_use_uuid,
                self.extra_nouse_uuid,
                self.mode,
            )
            if key
        )


@dataclass(frozen=True, slots=True)
class VendorSpec:
    """One of HAMi's device vendors, as data (an entry of ``accounting.vendors.VENDORS``)."""

    resources: VendorResources
    """Its keyword (HAMi's CommonWord, the TYPE of its grants), resource names, memory unit and
    defaults, as HAMi's chart configures them. The accounting policy may change the names and
    defaults; the rest of this entry is fixed."""
    title: str
    """How people call it, e.g. ``Hygon DCU``."""
    source: str
    """Where HAMi implements it, e.g. ``pkg/device/hygon``."""
    allocated_annotation: str
    """The pod annotation HAMi's scheduler writes the grants to and reads usage back from."""
    to_allocate_annotation: str = ""
    """The copy the device plugin consumes; "" when HAMi writes none for this vendor."""
    devices: DeviceSource = DeviceSource.REGISTER_JSON
    register_annotation: str = ""
    """The node annotation listing the devices (every source but ``CAPACITY``)."""
    capacity: CapacityDevices | None = None
    selection: Selection = Selection()
    enabled_by_default: bool = True
    """On in HAMi's chart without a flag (Ascend and Iluvatar need ``--enable-ascend`` /
    ``--enable-iluvatar``)."""
    memory_factor_fixed: bool = False
    """The memory unit is a constant of HAMi's code, not configuration: a policy may not change
    it."""
    core_unit: str = "percent"
    """What the vendor's core figures count: percent of a device, or another unit it names."""
    core_max: int = 100
    """The most one device's cores come to in that unit (a larger request reads as this);
    0: no bound (compute units, core masks)."""

    # -- requests (HAMi's webhook, then GenerateResourceRequests) -------------------------------
    limits_only: bool = False
    """Requests are read from ``resources.limits`` only."""
    exclusive_default: bool = False
    """NVIDIA's webhook: a bare count, or 100 % memory, also asks every core of the card."""
    whole_device: bool = False
    """Only a count is read: each device is taken whole (memory 100 %, every core)."""
    totals_divided_by_count: bool = False
    """Memory and cores are written for all of a container's devices together; each device
    gets its share (Moore Threads)."""
    multi_device_core_percent: int = 0
    """Cores per device when a container asks for more than one device (Iluvatar's webhook
    writes 100 per device then); 0: no such rule."""
    count_minimum: int = 1
    """A smaller count is raised to this (Ascend 910C: one module is two NPUs)."""
    count_multiple: int = 1
    """Counts above the minimum must be a multiple of this (Ascend 910C: whole modules)."""
    memory_templates: tuple[MemoryTemplate, ...] = ()
    """Memory asked is rounded up to the first template at least as large."""
    template_whole_memory_mib: int = 0
    """With templates: what a request above every template (up to
    ``template_capacity_mib``), or without memory, is given — the whole device."""
    template_capacity_mib: int = 0
    """With templates: more than this is refused."""
    template_single_device: bool = False
    """With templates: a container asking for more than one device must take whole devices
    (Ascend: ``vNPU not supported for multiple devices``)."""
    allowed_memory_units: tuple[int, ...] = ()
    """The only memory values (in the vendor's unit) one device may ask (Moore Threads)."""
    whole_memory_units: int = 0
    """Moore Threads' webhook: the memory written for a whole device, in the vendor's unit."""
    soft_split_annotation: str = ""
    """The pod annotation asking for HAMi's soft split (``huawei.com/vnpu-mode: hami-core``):
    memory as asked instead of a template, cores allowed, and only nodes that support it."""
    memory_quantity_units_are_bytes: bool = False
    """A memory quantity written with a suffix (``2Gi``) is bytes; a bare number is in the
    vendor's unit (Metax sGPU)."""

    # -- fit and charge ---------------------------------------------------------------------
    charge: Charge = Charge.REQUEST
    checks_capacity: bool = True
    """Memory and cores are compared with what the device has left; False: only health, type,
    ids and slots (Vastai, Biren, Enflame GCU)."""
    used_device_refused: bool = False
    """A device with any task on it is refused (``ExclusiveDeviceAllocateConflict``)."""
    one_device_per_pod: bool = False
    """Every container of the pod must use the same device (``CardNotFoundCustomFilterRule``):
    Metax GPU, Moore Threads."""
    rule: str = ""
    """A fit rule beyond the generic path, implemented in ``accounting.vendor_fit`` under this
    name; "" for none."""
    notes: tuple[str, ...] = ()
    """What this vendor charges and where we follow which side of HAMi, for the docs."""

    @property
    def vendor(self) -> str:
        """The vendor keyword (HAMi's CommonWord)."""
        return self.resources.vendor

    def soft_split(self, annotations: Mapping[str, str]) -> bool:
        """Whether a pod with ``annotations`` asks this vendor's soft split (Ascend's
        ``huawei.com/vnpu-mode: hami-core``)."""
        key = self.soft_split_annotation
        return bool(key) and annotations.get(key) == SOFT_SPLIT_MODE

    @property
    def annotation_keys(self) -> tuple[str, ...]:
        """The pod annotations the scheduler writes for this vendor's grants."""
        return tuple(
            key for key in (self.allocated_annotation, self.to_allocate_annotation) if key
        )
