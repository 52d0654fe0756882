"""Domain model of the accounting: pure values, standard library only.

Layer: accounting (pure). Every type here is a frozen dataclass or an enum; quantities are
integers with their unit in the name (memory in MiB, cores in percent of one device, slots in
concurrent tasks). Adapters (services/, the Kubernetes pod parser, the HAMi wire codec) build
these values; the rules in pod.py, lifecycle.py, quota.py, fit/ and ledger/ consume them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType

from accounting.amount import Amount

# Re-exported: the annotation is read from pods everywhere the model is.
from accounting.annotations import TRACEPARENT_ANNOTATION as TRACEPARENT_ANNOTATION
from accounting.vendors import NVIDIA

DEFAULT_DEVICE_MODE = "hami-core"
CORDONED_INFO = "hami.io/device-cordon"
"""The ``custom_info`` key a cordoned NVIDIA device carries (``"true"``): its node's
``hami.io/device-cordon`` annotation names it, so the fit places nothing new on it while what
is charged there stays charged. Set by the node reader (``accounting.kube.node_json``), which
drops the key from anything a register wrote, so it travels with the inventory as the vendors'
facts do."""
"""A device's sharing mode when its registration names none (HAMi's default)."""


class ContainerClass(enum.Enum):
    """Which of the three Kubernetes container kinds a container is."""

    INIT = "init"
    """A regular init container: runs to completion, one at a time, before the apps."""
    SIDECAR = "sidecar"
    """A native sidecar (an init container with restartPolicy Always): runs for the pod's life."""
    APP = "app"
    """An entry of spec.containers."""


class ContainerState(enum.Enum):
    """The state of one container as the kubelet reports it."""

    UNKNOWN = "unknown"
    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"


class PodPhase(enum.Enum):
    """status.phase; Succeeded and Failed are terminal."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @property
    def is_terminal(self) -> bool:
        """Succeeded and Failed never transition again: nothing in the pod uses a GPU."""
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)




@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One container's request for devices of one vendor (HAMi's ContainerDeviceRequest)."""

    vendor: str
    count: int
    """Number of physical devices; 0 means no request."""
    memory_mib: int = 0
    """Memory per device in MiB as written, before the memory factor; 0 for a percentage."""
    memory_percent: int = 0
    """Memory per device as a percentage of the chosen card, 1..100; 0 means not set."""
    core_percent: int = 0
    """Compute per device, percent."""
    slices: int = 0
    """A device partition asked by its size in slices (Enflame DRS's ``enflame.com/drs-gcu``);
    0 otherwise."""
    memory_unscaled: bool = field(default=False, compare=False)
    """``memory_mib`` is MiB already, not in the vendor's memory unit, so the memory factor is
    not applied: the vendor's default memory, filled in by the pod parser because nothing in
    the container sized the card (HAMi does not multiply a default by the factor), or a
    quantity Metax sGPU reads as bytes. Left out of equality: the request is the same request
    either way."""

    @property
    def memory_sized_at_scheduling(self) -> bool:
        """True when the memory is a share of a card, known only once a card is chosen."""
        return self.memory_mib == 0 and self.memory_percent > 0


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """A range of a MIG card's memory slices an instance occupies: ``[start, start + size)``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """The first slice after the range."""
        return self.start + self.size

    def overlaps(self, other: MigPlacement) -> bool:
        """True when the two ranges share a slice."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One instance shape a MIG-mode card offers (an entry of its registered ``migProfiles``)."""

    name: str
    """NVIDIA's name, e.g. ``1g.5gb``."""
    memory_mib: int
    """The instance's memory (NVML's, a little below the name's round figure on real cards)."""
    core_percent: int
    """The instance's share of the card's compute, percent (its SMs over the card's, rounded
    up)."""
    slice_count: int
    """Memory slices the instance takes."""
    placements: tuple[MigPlacement, ...] = ()
    """Where the hardware can put it, as registered."""


@dataclass(frozen=True, slots=True, order=True)
class MigInstance:
    """The MIG instance a grant stands for: a profile at a placement on the granted card."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """One physical device given to one container (one entry of vgpu-devices-allocated)."""

    uuid: str
    vendor: str
    """Vendor keyword written in the annotation's TYPE field, e.g. NVIDIA (the wire's
    ``device_type``)."""
    memory_mib: int
    core_percent: int
    slots: int = 0
    """Sharing slots this grant stands for; 0 on a raw grant, which counts as one."""
    mig: MigInstance | None = None
    """On a MIG-mode card: the instance the grant is (its memory and cores are the
    instance's)."""

    @property
    def slot_weight(self) -> int:
        """How many slots the grant occupies: a raw grant (0) still takes one."""
        return max(self.slots, 1)

    @property
    def amount(self) -> Amount:
        """What the grant takes on its device."""
        return Amount(self.memory_mib, self.core_percent, self.slot_weight)


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """Usage charged on one physical device (per pod, node or namespace)."""

    uuid: str
    vendor: str
    """Vendor keyword, e.g. NVIDIA (the wire's ``device_type``)."""
    memory_mib: int
    core_percent: int
    slots: int
    mig: tuple[MigInstance, ...] = ()
    """The MIG instances the pod holds on the card, sorted: every container's, for the pod's
    whole life (HAMi keeps a finished init container's instance reserved until the pod goes)."""

    @property
    def amount(self) -> Amount:
        """What is charged on the device."""
        return Amount(self.memory_mib, self.core_percent, self.slots)


@dataclass(frozen=True, slots=True)
class Container:
    """One container of a pod, in declaration order."""

    name: str
    container_class: ContainerClass
    requests: tuple[DeviceRequest, ...] = ()
    grants: tuple[DeviceGrant, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """The reported status of one container, matched to the spec by name."""

    name: str
    state: ContainerState
    exit_code: int = 0
    restart_count: int = 0


def _frozen_mapping(values: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(values or {}))


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the accounting sees it.

    Containers are in declaration order: spec.initContainers (regular init containers and
    sidecars interleaved as declared), then spec.containers. That order is also the position
    order of hami.io/vgpu-devices-allocated.
    """

    uid: str
    namespace: str
    name: str
    containers: tuple[Container, ...]
    phase: PodPhase = PodPhase.PENDING
    init_container_statuses: tuple[ContainerStatus, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    node_name: str = ""
    annotations: Mapping[str, str] = field(default_factory=_frozen_mapping)
    terminating: bool = False
    """metadata.deletionTimestamp is set; the pod still holds its devices until it is gone."""

    def __post_init__(self) -> None:
        # A read-only view keeps the frozen promise for the one mapping field.
        if not isinstance(self.annotations, MappingProxyType):
            object.__setattr__(self, "annotations", _frozen_mapping(self.annotations))

    @property
    def has_grants(self) -> bool:
        """True once the pod carries a device allocation (it is tracked for accounting)."""
        return any(container.grants for container in self.containers)

    @property
    def key(self) -> str:
        """namespace/name, for messages."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Device:
    """One device installed on a node (an element of hami.io/node-nvidia-register)."""

    uuid: str
    model: str
    """Device model, e.g. NVIDIA A10 (the wire's ``device_type``; nvidia.com/use-gputype
    matches it)."""
    index: int
    slots_total: int
    """Sharing slots (deviceSplitCount)."""
    memory_total_mib: int
    core_percent_total: int
    """Compute, percent (100 unless deviceCoreScaling is set; the wire's ``cores_total``)."""
    numa: int = 0
    mode: str = DEFAULT_DEVICE_MODE
    healthy: bool = True
    vendor: str = NVIDIA
    mig_profiles: tuple[MigProfile, ...] = ()
    """The instance shapes a card in MIG mode offers (its registered ``migProfiles``)."""
    custom_info: tuple[tuple[str, str], ...] = ()
    """Vendor-specific facts a rule reads (HAMi's ``CustomInfo``), as sorted (key, value)
    pairs: Ascend's ``NetworkID``, Metax's ``QosPolicy``, AWS's instance type, ..."""

    @property
    def cordoned(self) -> bool:
        """New pods are not placed on the device (``CORDONED_INFO``)."""
        return bool(self.custom_info) and self.info(CORDONED_INFO) == "true"

    def info(self, key: str) -> str | None:
        """The ``custom_info`` value of ``key``, or None."""
        for name, value in self.custom_info:
            if name == key:
                return value
        return None

    @property
    def capacity(self) -> Amount:
        """Everything the device offers: its memory, compute and sharing slots."""
        return Amount(self.memory_total_mib, self.core_percent_total, self.slots_total)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device's capacity and what is charged on it now."""

    device: Device
    memory_used_mib: int = 0
    core_percent_used: int = 0
    slots_used: int = 0
    mig_in_use: tuple[MigPlacement, ...] = ()
    """On a MIG-mode card: the placements pods hold, sorted, each once."""

    @property
    def used(self) -> Amount:
        """What is charged on the device now."""
        return Amount(self.memory_used_mib, self.core_percent_used, self.slots_used)

    @property
    def memory_free_mib(self) -> int:
        """Device memory not charged to any pod (negative when overcommitted)."""
        return self.device.memory_total_mib - self.memory_used_mib


@dataclass(frozen=True, slots=True)
class QuotaItem:
    """One quota dimension of a namespace (HAMi's QuotaManager entry)."""

    resource: str
    """nvidia.com/gpumem (MiB), nvidia.com/gpucores (percent) or nvidia.com/gpu (devices)."""
    _: KW_ONLY  # three integers side by side: each is named where an item is made
    used: int = 0
    limit: int = 0
    limit_set: bool = False
