"""What one container asks of each vendor's devices, read from its limits and requests:
HAMi's ``GenerateResourceRequests`` after its webhook defaults (docs/design.md §2.3), per
vendor with the rules of its table entry (``accounting.vendors``: units, defaults, memory
templates, whole devices, NeuronCores, DRS slices, shares written for all devices).

Layer: accounting (pure). ``accounting.kube.pod_json`` walks the pod and hands each
container's resources here; every refusal is added to its violations at the resource's JSON
path, naming the container, the resource and the reading.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from accounting import numbers
from accounting.errors import Violations
from accounting.kube import quantity
from accounting.limits import (
    INT32_MAX,
    INT64_MAX,
    MAX_DEVICES_PER_CONTAINER,
    MAX_REQUESTS_PER_CONTAINER,
)
from accounting.model import DeviceRequest
from accounting.pod import EXCLUSIVE_CORE_PERCENT, MAX_CORE_PERCENT, WHOLE_CARD_PERCENT
from accounting.quoting import quote
from accounting.vendor_data import NEURON_CORES_PER_DEVICE
from accounting.vendor_spec import SOFT_SPLIT_MODE, Charge, VendorSpec


def read_device_requests(
    found: Violations,
    *,
    container: str,
    limits: Mapping[str, Any],
    requests: Mapping[str, Any],
    path: str,
    specs: Sequence[VendorSpec],
    annotations: Mapping[str, str],
) -> tuple[DeviceRequest, ...]:
    """The container's request for each vendor of ``specs`` one of whose resources it names,
    in policy order; a refused request is left out and reported to ``found``.

    Args:
        found: where refusals go.
        container: the container's name, for messages.
        limits: its ``resources.limits`` (read first), as decoded JSON.
        requests: its ``resources.requests``.
        path: where its ``resources`` are, as errors name it, e.g.
            ``kubernetes_pod_json.spec.containers[0].resources``.
        specs: the policy's vendors.
        annotations: the pod's, for the modes they choose (Ascend's soft split).
    """
    reading = _ContainerReading(found, container, limits, requests, path)
    asked: list[DeviceRequest] = []
    for spec in _vendors_named(specs, limits, requests):
        request = reading.read(spec, annotations)
        if request is not None:
            asked.append(request)
    if len(asked) > MAX_REQUESTS_PER_CONTAINER:
        found.add(path, f"asks for the devices of {len(asked)} vendors, at "
                        f"most {MAX_REQUESTS_PER_CONTAINER}")
    return tuple(asked)


@dataclass(frozen=True, slots=True)
class _Resource:
    """One resource of one container, read from limits first, then requests."""

    name: str = ""
    value: Decimal | None = None
    """The exact reading; None when absent, or malformed (already reported)."""
    written: object = None
    """The value as the pod wrote it, for messages."""
    path: str = ""
    """Where it was read, e.g. ``spec.containers[0].resources.limits["nvidia.com/gpu"]``."""
    present: bool = False


_ABSENT = _Resource()


@dataclass(frozen=True, slots=True)
class _ContainerReading:
    """Reads one container's request for one vendor: HAMi's GenerateResourceRequests after its
    webhook defaults (docs/design.md §2.3), with every quantity read exactly.

    A container that asks for a device is charged what it asks for or refused, naming the
    container, the resource and the reading: a quantity is never read as 0 or as "no GPU"
    because it is fractional, negative or too large. The exceptions are HAMi's own readings,
    kept so a pod HAMi runs runs here: cores and memory percentages above 100 (however large)
    read as 100, a percentage of 0 reads as unset.
    """

    found: Violations
    container: str
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    path: str
    """Where the container's ``resources`` are, as errors name it."""

    def resource(self, name: str, limits_only: bool = False) -> _Resource:
        """The resource ``name`` from limits, else requests (unless ``limits_only``)."""
        if not name:
            return _ABSENT
        if name in self.limits:
            written, path = self.limits[name], f"{self.path}.limits[{quote(name)}]"
        elif name in self.requests and not limits_only:
            written, path = self.requests[name], f"{self.path}.requests[{quote(name)}]"
        else:
            return _ABSENT
        try:
            value: Decimal | None = quantity.parse_quantity(written)
        except quantity.QuantityError as error:
            self.found.add(path, str(error))
            value = None
        return _Resource(name, value, written, path, present=True)

    def refuse(self, resource: _Resource, problem: str) -> None:
        """Reports a reading that cannot be charged, e.g. ``container "main": nvidia.com/gpumem
        is in MiB: 2Gi reads as 2147483648 MiB, more than any device (at most 2147483647)``."""
        self.found.add(resource.path, f"container {quote(self.container)}: {problem}")

    @staticmethod
    def reading(resource: _Resource, unit: str = "") -> str:
        """"2Gi reads as 2147483648 MiB": what was written (a quantity, so short and plain)
        and its exact value."""
        assert resource.value is not None
        return f"{str(resource.written).strip()} reads as {quantity.describe(resource.value)}{unit}"

    def whole(self, resource: _Resource, what: str, unit: str = "") -> int | None:
        """The reading as a non-negative integer, or None (refused) when it is fractional or
        negative."""
        value = resource.value
        if value is None:
            return None
        if not quantity.is_whole(value):
            self.refuse(resource, f"{resource.name} {what}: {self.reading(resource, unit)}, "
                                  "not a whole number")
            return None
        if value < 0:
            self.refuse(resource, f"{resource.name} {what}: {self.reading(resource, unit)}, "
                                  "below 0")
            return None
        # Every caller bounds the reading further (devices, MiB, percent; messages quote the
        # reading itself), so saturating at int64 changes no answer, and a reading such as
        # "1e1000000" (64 characters) is never converted to its million digits.
        return numbers.saturated_whole(value, INT64_MAX)

    def read(self, spec: VendorSpec, annotations: Mapping[str, str]) -> DeviceRequest | None:
        """The container's request for one vendor, or None when it asks for none of its
        devices (or the request is refused, reported under the resource's path)."""
        names = spec.resources
        count = self.resource(names.count_resource, spec.limits_only)
        memory = self.resource(names.memory_resource, spec.limits_only)
        percentage = self.resource(names.memory_percentage_resource, spec.limits_only)
        cores = self.resource(names.core_resource, spec.limits_only)
        if spec.charge is Charge.CORE_MASK:
            return self.read_neuron(spec, count, cores)
        if spec.rule == "enflame-drs":
            return self.read_drs(spec, count, memory, cores)

        # The webhook writes the default count when a container sizes a GPU but does not count.
        asks_for_device = memory.present or percentage.present or cores.present
        if count.present:
            devices = self.whole(count, "counts whole devices")
        elif asks_for_device and names.default_gpu_count > 0:
            devices = names.default_gpu_count
        else:
            return None
        if devices is None or devices == 0:
            return None
        if devices > MAX_DEVICES_PER_CONTAINER:
            self.refuse(count, f"{count.name} counts whole devices: {self.reading(count)}, more "
                               f"than any node can hold (at most {MAX_DEVICES_PER_CONTAINER})")
            return None
        # HAMi's webhook checks vNPUs against the count as written, before raising it.
        written_count = devices
        devices = self.module_count(spec, count, devices)
        if devices is None:
            return None
        if spec.whole_device:
            # Only the count is read: each device is taken whole.
            whole_cores = 0 if spec.charge is Charge.SLOTS_ONLY else EXCLUSIVE_CORE_PERCENT
            return DeviceRequest(
                vendor=spec.vendor,
                count=devices,
                memory_mib=0,
                memory_percent=WHOLE_CARD_PERCENT,
                core_percent=whole_cores,
            )
        if spec.totals_divided_by_count:
            return self.read_per_device_share(spec, devices, memory, cores)

        memory_unscaled = False
        memory_mib = 0
        if memory.present:
            read = self.memory_mib(spec, memory, annotations, written_count)
            if read is None:
                return None
            memory_mib, memory_unscaled = read
        elif spec.memory_templates:
            # No memory asked on a templated vendor: the whole device (HAMi's webhook writes it).
            memory_mib = spec.template_whole_memory_mib

        memory_percent = 0
        raw_percent = None
        if percentage.present:
            raw_percent = self.whole(percentage, "is a percentage of a card", " percent")
            if raw_percent is None:
                return None
            memory_percent = min(raw_percent, WHOLE_CARD_PERCENT)
        if memory_percent == 0 and memory_mib == 0:
            # HAMi's GenerateResourceRequests: nothing sizes the card, so the vendor's default
            # memory, else the whole card (size_request reads the request the same way).
            if names.default_memory_mib:
                memory_mib = names.default_memory_mib
                memory_unscaled = True
            else:
                memory_percent = WHOLE_CARD_PERCENT

        core_percent = self.core_percent(spec, cores, memory, raw_percent, annotations, devices)
        if core_percent is None:
            return None
        template_cores = _template_cores(spec, memory_mib)
        if template_cores is not None:
            core_percent = template_cores
        return DeviceRequest(
            vendor=spec.vendor,
            count=devices,
            memory_mib=memory_mib,
            memory_percent=memory_percent,
            core_percent=core_percent,
            memory_unscaled=memory_unscaled,
        )

    def read_neuron(
        self, spec: VendorSpec, count: _Resource, cores: _Resource
    ) -> DeviceRequest | None:
        """AWS Neuron: whole devices (``aws.amazon.com/neuron``, each with every NeuronCore), or
        NeuronCores (``aws.amazon.com/neuroncore``): up to a device's worth on one device, more
        in whole devices (HAMi's ``splitCoreRequest``)."""
        per_device = NEURON_CORES_PER_DEVICE
        if count.present:
            devices = self.whole(count, "counts whole devices")
            if not devices:
                return None
            return DeviceRequest(
                vendor=spec.vendor,
                count=devices,
                memory_mib=0,
                memory_percent=0,
                core_percent=per_device,
            )
        if not cores.present:
            return None
        wanted = self.whole(cores, "counts NeuronCores")
        if not wanted:
            return None
        if wanted <= per_device:
            return DeviceRequest(
                vendor=spec.vendor,
                count=1,
                memory_mib=0,
                memory_percent=0,
                core_percent=wanted,
            )
        if wanted % per_device:
            self.refuse(cores, f"{cores.name} counts NeuronCores: {self.reading(cores)}, must be "
                               f"1 or a multiple of {per_device}")
            return None
        if wanted // per_device > MAX_DEVICES_PER_CONTAINER:
            self.refuse(cores, f"{cores.name} counts NeuronCores: {self.reading(cores)}, more "
                               f"than any node can hold")
            return None
        return DeviceRequest(
            vendor=spec.vendor,
            count=wanted // per_device,
            memory_mib=0,
            memory_percent=0,
            core_percent=per_device,
        )

    def read_drs(
        self, spec: VendorSpec, count: _Resource, memory: _Resource, cores: _Resource
    ) -> DeviceRequest | None:
        """Enflame DRS: one partition per container, asked by its size in slices
        (``enflame.com/drs-gcu``) or by memory and cores (the profile is chosen at scheduling,
        so the memory is then known only there)."""
        if count.present:
            slices = self.whole(count, "counts DRS slices")
            if not slices:
                return None
            if slices > MAX_DRS_SLICES:
                self.refuse(count, f"{count.name} counts DRS slices: {self.reading(count)}, "
                                   f"more than any GCU has (at most {MAX_DRS_SLICES})")
                return None
            return DeviceRequest(
                vendor=spec.vendor,
                count=1,
                memory_mib=0,
                memory_percent=WHOLE_CARD_PERCENT,
                core_percent=0,
                slices=slices,
            )
        if not memory.present and not cores.present:
            return None
        memory_raw = self.whole(memory, "is in GB or MiB", "") if memory.present else 0
        core_raw = self.whole(cores, "is in percent of a card", " percent") if cores.present else 0
        if memory_raw is None or core_raw is None:
            return None
        if memory.present and memory_raw == 0:
            self.refuse(memory, f"{memory.name} must be above 0, got {self.reading(memory)}")
            return None
        if cores.present and not 0 < core_raw <= MAX_CORE_PERCENT:
            self.refuse(cores, f"{cores.name} must be in (0, 100], got {self.reading(cores)}")
            return None
        if memory_raw > INT32_MAX:
            self.refuse(memory, f"{memory.name}: {self.reading(memory)}, more than any device")
            return None
        return DeviceRequest(
            vendor=spec.vendor,
            count=1,
            memory_mib=memory_raw,
            memory_percent=0 if memory_raw else WHOLE_CARD_PERCENT,
            core_percent=core_raw,
        )

    def module_count(self, spec: VendorSpec, count: _Resource, devices: int) -> int | None:
        """Ascend 910C's webhook: NPUs come in modules of two, so 1 is raised to 2 and any
        other odd count is refused."""
        if devices < spec.count_minimum:
            return spec.count_minimum
        if devices % spec.count_multiple:
            self.refuse(count, f"{count.name} counts {spec.title} NPUs, which come in modules "
                               f"of {spec.count_multiple}: {self.reading(count)}, must be 1 or "
                               f"a multiple of {spec.count_multiple}")
            return None
        return devices

    def memory_mib(
        self,
        spec: VendorSpec,
        memory: _Resource,
        annotations: Mapping[str, str],
        devices: int,
    ) -> tuple[int, bool] | None:
        """The memory per device as the request carries it, and whether it is MiB already
        (not to be multiplied by the vendor's memory unit)."""
        factor = max(spec.resources.memory_factor, 1)
        if spec.memory_quantity_units_are_bytes and _has_unit(memory.written):
            # Metax sGPU: a quantity with a unit is bytes, a bare number GiB.
            value = memory.value
            if value is None:
                return None
            if value < 0:
                self.refuse(memory, f"{memory.name}: {self.reading(memory, ' bytes')}, below 0")
                return None
            mib = numbers.saturated_whole(value, INT64_MAX) // (1024 * 1024)
            if mib > INT32_MAX:
                self.refuse(memory, f"{memory.name}: {self.reading(memory, ' bytes')}, more than "
                                    f"any device (at most {INT32_MAX} MiB)")
                return None
            return mib, True
        # A unit HAMi fixes (Cambricon's 256 MiB) is the resource's unit; a configured
        # factor multiplies MiB.
        unit = f"units of {factor} MiB" if spec.memory_factor_fixed and factor > 1 else "MiB"
        # HAMi drops the whole request when the memory is not a whole MiB count that fits
        # int32 after the factor: "24Gi" reads as 25769803776 MiB and the container gets no
        # GPU, then fails on the node. Refused here instead, with the reading.
        read = self.whole(memory, f"is in {unit}", f" {unit}")
        if read is None:
            return None
        ceiling = INT32_MAX // factor
        if read > ceiling:
            with_factor = f" with memory factor {factor}" if factor > 1 else ""
            self.refuse(memory, f"{memory.name} is in {unit}: {self.reading(memory, ' ' + unit)}"
                                f", more than any device (at most {ceiling}{with_factor})")
            return None
        if not spec.memory_templates:
            return read, False
        return self.template_memory(spec, memory, read, annotations, devices)

    def template_memory(
        self,
        spec: VendorSpec,
        memory: _Resource,
        read: int,
        annotations: Mapping[str, str],
        devices: int,
    ) -> tuple[int, bool] | None:
        """HAMi's webhook rounds templated memory up (Ascend vNPU templates, Kunlun vXPU
        sizes): the first template at least as large, else the whole device."""
        if spec.soft_split(annotations):
            return read, False  # Ascend hami-core mode: memory as asked
        rounded = next((t.memory_mib for t in spec.memory_templates if read <= t.memory_mib), None)
        if rounded is None:
            if spec.template_capacity_mib and read > spec.template_capacity_mib:
                self.refuse(memory, f"{memory.name} is in MiB: {self.reading(memory, ' MiB')}, "
                                    f"more than a {spec.title} holds "
                                    f"({spec.template_capacity_mib} MiB)")
                return None
            rounded = spec.template_whole_memory_mib
        if spec.template_single_device and devices > 1 and rounded != (
            spec.template_whole_memory_mib
        ):
            self.refuse(memory, f"{memory.name}: {self.reading(memory, ' MiB')} is a "
                                f"{spec.title} vNPU of {rounded} MiB, and vNPUs are not "
                                "supported for more than one device (ask whole devices)")
            return None
        return rounded, False

    def core_percent(
        self,
        spec: VendorSpec,
        cores: _Resource,
        memory: _Resource,
        raw_percent: int | None,
        annotations: Mapping[str, str],
        devices: int,
    ) -> int | None:
        """The cores per device, in the vendor's core unit."""
        if (
            spec.memory_templates
            and spec.resources.core_resource
            and cores.present
            and not spec.soft_split(annotations)
        ):
            read = self.whole(cores, "counts AI cores", "")
            if read:
                self.refuse(cores, f"{cores.name} is only supported in hami-core (soft split) "
                                   f"mode (pod annotation {spec.soft_split_annotation}: "
                                   f"{SOFT_SPLIT_MODE}); the vNPU template fixes the compute")
                return None
        if spec.multi_device_core_percent and devices > 1:
            # Iluvatar's webhook writes count x 100 cores; its fit reads 100 per device.
            return spec.multi_device_core_percent
        if not cores.present:
            if not spec.exclusive_default:
                return spec.resources.default_core_percent
            # NVIDIA's webhook: a bare count, or a whole card by percentage, is the whole
            # device, so it also takes every core (no other pod may share it). A percentage
            # decides alone when present: 50 % shares the card even with no MiB asked.
            if raw_percent is not None:
                exclusive = raw_percent == WHOLE_CARD_PERCENT
            else:
                exclusive = not memory.present
            return EXCLUSIVE_CORE_PERCENT if exclusive else spec.resources.default_core_percent
        read = self.whole(cores, f"is in {_core_unit(spec)}", _core_suffix(spec))
        if read is None:
            return None
        # HAMi's Fit reads any core request above 100 as 100, the whole card's compute.
        return min(read, MAX_CORE_PERCENT)

    def read_per_device_share(
        self, spec: VendorSpec, devices: int, memory: _Resource, cores: _Resource
    ) -> DeviceRequest | None:
        """Moore Threads: memory and cores are written for all of the container's devices;
        more than one device, or no memory, is whole devices (HAMi's webhook writes them)."""
        whole_units, whole_cores = spec.whole_memory_units, spec.core_max
        if devices > 1 or not memory.present:
            return DeviceRequest(
                vendor=spec.vendor,
                count=devices,
                memory_mib=whole_units * spec.resources.memory_factor,
                memory_percent=0,
                core_percent=whole_cores,
                memory_unscaled=True,
            )
        units = self.whole(memory, f"is in units of {spec.resources.memory_factor} MiB", "")
        if units is None:
            return None
        if spec.allowed_memory_units and units not in spec.allowed_memory_units:
            allowed = ", ".join(map(str, spec.allowed_memory_units))
            self.refuse(memory, f"{memory.name}: {self.reading(memory)}, must be one of "
                                f"{allowed} (units of {spec.resources.memory_factor} MiB)")
            return None
        core_units = 0
        if cores.present:
            read = self.whole(cores, f"is in {_core_unit(spec)}", "")
            if read is None:
                return None
            core_units = min(read, MAX_CORE_PERCENT)
        return DeviceRequest(
            vendor=spec.vendor,
            count=devices,
            memory_mib=units,
            memory_percent=0,
            core_percent=core_units,
        )


MAX_DRS_SLICES = 64
"""The most DRS slices a request may name (a GCU has a handful)."""


def _template_cores(spec: VendorSpec, memory_mib: int) -> int | None:
    """The cores a templated request is charged when its template fixes them (Kunlun vXPU:
    25, 50 or 100 for a quarter, half or whole card); None when the template does not."""
    for template in spec.memory_templates:
        if template.memory_mib == memory_mib and template.core_percent:
            return template.core_percent
    return None


def _vendors_named(
    specs: Sequence[VendorSpec], limits: Mapping[str, Any], requests: Mapping[str, Any]
) -> list[VendorSpec]:
    """The vendors (in policy order) one of whose resources the container names: a container
    is read only for those, so a policy with many vendors costs a lookup per resource."""
    index = _resource_index(tuple(specs))
    positions: set[int] = set()
    for section in (limits, requests):
        for name in section:
            found = index.get(name)
            if found is not None:
                positions.update(found)
    return [specs[p] for p in sorted(positions)]


@functools.lru_cache(maxsize=64)
def _resource_index(specs: tuple[VendorSpec, ...]) -> dict[str, tuple[int, ...]]:
    index: dict[str, list[int]] = {}
    for position, spec in enumerate(specs):
        names = spec.resources
        for name in (
            names.count_resource,
            names.memory_resource,
            names.memory_percentage_resource,
            names.core_resource,
        ):
            if name:
                index.setdefault(name, []).append(position)
    return {name: tuple(p) for name, p in index.items()}


def _core_suffix(spec: VendorSpec) -> str:
    return " percent" if spec.core_unit == "percent" else ""


def _core_unit(spec: VendorSpec) -> str:
    return "percent of a card" if spec.core_unit == "percent" else spec.core_unit


def _has_unit(written: object) -> bool:
    """Whether a quantity was written with a unit suffix (``2Gi``, ``512M``), as Metax tells a
    byte count from a number of GiB."""
    return isinstance(written, str) and any(c.isalpha() for c in written.strip())
