"""Reads a Kubernetes Pod (what Go's ``json.Marshal(pod)`` writes) into an accounting ``Pod``.

Layer: accounting (pure); the input is plain JSON data, never a Kubernetes client object.

* Classes: ``spec.initContainers`` with ``restartPolicy: Always`` are sidecars, the other init
  containers are init, ``spec.containers`` are apps; declaration order, init list first.
* Requests follow HAMi's ``GenerateResourceRequests`` after its webhook defaults (docs/design.md
  §2.3), per vendor of the policy with the rules of its table entry (``accounting.vendors``:
  units, defaults, memory templates, whole devices), so a pod sent here before or after the
  webhook reads the same.
* Grants come from each vendor's allocation annotation (``hami.io/vgpu-devices-allocated`` for
  NVIDIA), or, where a pod carries only its to-allocate annotation (what the device plugin hands
  out), from that, aligned to the containers by position; NVIDIA MIG grants get their instance
  from ``hami.io/vgpu-mig-allocations``. What the recorder believes of them is
  ``accounting.believed_grants``.
* The node is ``spec.nodeName`` (where the pod is bound), else ``hami.io/vgpu-node``.

Every problem is collected and raised as one ``InvalidInputError`` with JSON paths such as
``spec.initContainers[1].name`` or ``metadata.annotations["hami.io/vgpu-devices-allocated"][0][0]``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from accounting import hami_codec, mig, numbers, quantity
from accounting.annotations import VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError, Violations
from accounting.limits import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    MAX_CONTAINERS,
    MAX_DEVICES_PER_CONTAINER,
    MAX_GRANTS_PER_CONTAINER,
    MAX_REQUESTS_PER_CONTAINER,
    MAX_STATUSES,
)
from accounting.mig import MIG_ALLOCATIONS_ANNOTATION
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    DeviceRequest,
    Pod,
    PodPhase,
)
from accounting.pod import (
    EXCLUSIVE_CORE_PERCENT,
    MAX_CORE_PERCENT,
    WHOLE_CARD_PERCENT,
    classify_init_container,
)
from accounting.quoting import json_kind, quote
from accounting.received_json import json_object
from accounting.validate import check_annotations, check_json_integer
from accounting.vendor_spec import SOFT_SPLIT_MODE, Charge, VendorSpec
from accounting.vendors import NVIDIA_RESOURCES, VendorResources, specs_for

DEFAULT_NAMESPACE = "default"
"""What kubectl and the API server assume when a pod names no namespace."""
_PHASES = {phase.value: phase for phase in PodPhase}


def parse_pod_json(
    raw: bytes | str,
    vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,),
    *,
    path: str = "kubernetes_pod_json",
) -> Pod:
    """Parses ``json.Marshal(pod)`` output.

    Raises:
        InvalidInputError: not JSON or not an object (path ``kubernetes_pod_json``), or any
            problem ``parse_pod`` finds, under ``kubernetes_pod_json.``.
    """
    return parse_pod(json_object(raw, path), vendors, path=path)


def parse_pod(
    obj: Mapping[str, Any],
    vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,),
    *,
    path: str = "",
) -> Pod:
    """Builds a ``Pod`` from a Kubernetes Pod object as decoded JSON.

    Args:
        obj: the pod, e.g. ``json.loads`` of ``json.Marshal(pod)``.
        vendors: whose resources to read; each container gets one request per vendor it asks.
        path: prefix of every error path ("" gives ``metadata.uid``).

    Raises:
        InvalidInputError: every problem at once: missing uid, nameless or duplicate containers,
            malformed quantities or annotations, grants for containers the pod does not have.
    """
    reader = _Reader(Violations(), f"{path}." if path else "")
    pod = reader.pod(obj, specs_for(vendors))
    reader.found.raise_if_any()
    return pod


def grant_paths(
    pod: Pod, vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,), *, path: str = ""
) -> tuple[tuple[str, ...], ...]:
    """Where in the Kubernetes Pod each grant of ``pod`` (as ``parse_pod`` read it, under the
    same vendors) is written, per container and grant: e.g.
    ``metadata.annotations["hami.io/vgpu-devices-allocated"][1][0]``, under ``path``. An error
    about a grant found later (a device its node does not have) names it so."""
    prefix = f"{path}." if path else ""
    merged: list[list[str]] = [[] for _ in pod.containers]
    for spec in specs_for(vendors):
        value = pod.annotations.get(spec.allocated_annotation)
        if value is None:
            continue
        annotation = f"{prefix}metadata.annotations[{quote(spec.allocated_annotation)}]"
        for position, items in enumerate(hami_codec.grant_places(value)[: len(merged)]):
            merged[position] += [f"{annotation}[{position}][{item}]" for item in items]
    return tuple(tuple(paths) for paths in merged)


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
class _Reader:
    found: Violations
    prefix: str

    def at(self, path: str) -> str:
        return f"{self.prefix}{path}"

    def add(self, path: str, message: str) -> None:
        self.found.add(self.at(path), message)

    # -- generic JSON access ------------------------------------------------------------------

    def mapping(self, parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(path, f"must be an object, got {json_kind(value)}")
            return {}
        return value

    def items(self, parent: Mapping[str, Any], key: str, path: str, limit: int) -> list[Any]:
        value = parent.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"must be an array, got {json_kind(value)}")
            return []
        if len(value) > limit:
            self.add(path, f"at most {limit} entries, got {len(value)}")
            return []
        return value

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = parent.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            self.add(path, f"must be a string, got {json_kind(value)}")
            return ""
        return value

    def required_string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = self.string(parent, key, path)
        # A value of the wrong type was reported by string(); report only a missing one here.
        if not value and isinstance(parent.get(key, ""), str):
            self.add(path, "must not be empty")
        return value

    def integer(
        self, parent: Mapping[str, Any], key: str, path: str, low: int = 0, high: int = INT32_MAX
    ) -> int:
        value = parent.get(key)
        if value is None:
            return 0
        return check_json_integer(self.found, self.at(path), value, low, high) or 0

    # -- the pod ------------------------------------------------------------------------------

    def pod(self, obj: Mapping[str, Any], vendors: Sequence[VendorSpec]) -> Pod:
        metadata = self.mapping(obj, "metadata", "metadata")
        spec = self.mapping(obj, "spec", "spec")
        status = self.mapping(obj, "status", "status")

        uid = self.required_string(metadata, "uid", "metadata.uid")
        annotations = self.annotations(metadata)
        containers = self.containers(spec, vendors, annotations)

        # The node the pod is bound to: the kubelet of spec.nodeName runs it, whatever the
        # (writable) annotation says; before binding, the node the scheduler chose.
        node_name = self.string(spec, "nodeName", "spec.nodeName") or annotations.get(
            VGPU_NODE_ANNOTATION, ""
        )
        return Pod(
            uid=uid,
            namespace=self.string(metadata, "namespace", "metadata.namespace") or DEFAULT_NAMESPACE,
            name=self.string(metadata, "name", "metadata.name"),
            containers=containers,
            phase=self.phase(status),
            init_container_statuses=self.statuses(
                status, "initContainerStatuses", "status.initContainerStatuses"
            ),
            container_statuses=self.statuses(
                status, "containerStatuses", "status.containerStatuses"
            ),
            node_name=node_name,
            annotations=annotations,
            terminating=metadata.get("deletionTimestamp") is not None,
        )

    def annotations(self, metadata: Mapping[str, Any]) -> dict[str, str]:
        raw = self.mapping(metadata, "annotations", "metadata.annotations")
        annotations: dict[str, str] = {}
        for key, value in raw.items():
            if isinstance(value, str):
                annotations[key] = value
            else:
                self.add(
                    f"metadata.annotations[{quote(key)}]",
                    f"must be a string, got {json_kind(value)}",
                )
        check_annotations(self.found, annotations, self.at("metadata.annotations"))
        return annotations

    def phase(self, status: Mapping[str, Any]) -> PodPhase:
        text = self.string(status, "phase", "status.phase")
        if not text:
            return PodPhase.PENDING
        phase = _PHASES.get(text)
        if phase is None:
            allowed = ", ".join(_PHASES)
            self.add("status.phase", f"must be one of {allowed}, got {quote(text)}")
            return PodPhase.UNKNOWN
        return phase

    # -- containers ---------------------------------------------------------------------------

    def containers(
        self,
        spec: Mapping[str, Any],
        vendors: Sequence[VendorSpec],
        annotations: Mapping[str, str],
    ) -> tuple[Container, ...]:
        init_items = self.items(spec, "initContainers", "spec.initContainers", MAX_CONTAINERS)
        app_items = self.items(spec, "containers", "spec.containers", MAX_CONTAINERS)
        if len(init_items) + len(app_items) > MAX_CONTAINERS:
            total = len(init_items) + len(app_items)
            self.add("spec", f"at most {MAX_CONTAINERS} containers in all, got {total}")
            return ()
        located = [(f"spec.initContainers[{i}]", item, True) for i, item in enumerate(init_items)]
        located += [(f"spec.containers[{i}]", item, False) for i, item in enumerate(app_items)]

        grants = self.grants(annotations, len(located), vendors)
        containers: list[Container] = []
        first_path: dict[str, str] = {}
        for position, (path, item, is_init) in enumerate(located):
            if not isinstance(item, dict):
                self.add(path, f"must be an object, got {json_kind(item)}")
                item = {}
            name = self.required_string(item, "name", f"{path}.name")
            first = first_path.setdefault(name, f"{path}.name")
            if name and first != f"{path}.name":
                self.add(
                    f"{path}.name", f"duplicate container name {quote(name)}, also {self.at(first)}"
                )
            containers.append(
                Container(
                    name=name,
                    container_class=self.container_class(item, path, is_init),
                    requests=self.requests(item, path, name, vendors, annotations),
                    grants=grants[position],
                )
            )
        return tuple(containers)

    def container_class(self, item: Mapping[str, Any], path: str, is_init: bool) -> ContainerClass:
        if not is_init:
            return ContainerClass.APP
        return classify_init_container(
            self.string(item, "restartPolicy", f"{path}.restartPolicy") or None
        )

    def grants(
        self, annotations: Mapping[str, str], container_count: int, vendors: Sequence[VendorSpec]
    ) -> tuple[tuple[DeviceGrant, ...], ...]:
        """Every vendor's grants from its allocation annotation, merged position by position
        (in the policy's vendor order). A grant's vendor is the vendor whose annotation holds
        it, whatever its TYPE field says (HAMi writes the GPU model there for AMD)."""
        merged: list[tuple[DeviceGrant, ...]] = [()] * container_count
        for spec in vendors:
            key = spec.allocated_annotation
            value = annotations.get(key)
            if value is None and spec.to_allocate_annotation:
                # What the device plugin hands out: a pod that carries only this still holds
                # the devices it names.
                key = spec.to_allocate_annotation
                value = annotations.get(key)
            if value is None:
                continue
            path = f"metadata.annotations[{quote(key)}]"
            try:
                entries = hami_codec.decode_container_grants(
                    value, container_count, path=self.at(path), core_max=spec.core_max
                )
            except InvalidInputError as error:
                self.found.extend(error)
                continue
            if spec.rule == "nvidia":
                entries = self.mig_instances(annotations, entries)
            for position, grants in enumerate(entries):
                if grants:
                    mine = tuple(
                        g if g.vendor == spec.vendor else replace(g, vendor=spec.vendor)
                        for g in grants
                    )
                    merged[position] = merged[position] + mine
                    if len(merged[position]) > MAX_GRANTS_PER_CONTAINER:
                        self.add(f"{path}[{position}]",
                                 f"at most {MAX_GRANTS_PER_CONTAINER} devices per container, "
                                 f"got {len(merged[position])}")
        return tuple(merged)

    def mig_instances(
        self, annotations: Mapping[str, str], entries: tuple[tuple[DeviceGrant, ...], ...]
    ) -> tuple[tuple[DeviceGrant, ...], ...]:
        """Attaches the instances of ``hami.io/vgpu-mig-allocations`` to the NVIDIA grants they
        name (container position, index among its NVIDIA grants, same GPU). An entry naming
        no such grant is left out: HAMi's own positions can be shifted by GPU-less containers
        (#2899), and a grant on a MIG card without an instance is closed off whole by the
        recorder anyway."""
        value = annotations.get(MIG_ALLOCATIONS_ANNOTATION)
        if not value:
            return entries
        path = self.at(f"metadata.annotations[{quote(MIG_ALLOCATIONS_ANNOTATION)}]")
        try:
            allocations = mig.decode_allocations(value, path=path)
        except InvalidInputError as error:
            self.found.extend(error)
            return entries
        attached = [list(grants) for grants in entries]
        for allocation in allocations:
            if allocation.container_index >= len(attached):
                continue
            grants = attached[allocation.container_index]
            index = allocation.device_index
            if index < len(grants) and grants[index].uuid == allocation.gpu_uuid:
                grants[index] = replace(grants[index], mig=allocation.instance)
        return tuple(tuple(grants) for grants in attached)

    # -- requests (HAMi GenerateResourceRequests after the webhook defaults) ------------------

    def requests(
        self,
        item: Mapping[str, Any],
        path: str,
        name: str,
        specs: Sequence[VendorSpec],
        annotations: Mapping[str, str],
    ) -> tuple[DeviceRequest, ...]:
        resources = self.mapping(item, "resources", f"{path}.resources")
        limits = self.mapping(resources, "limits", f"{path}.resources.limits")
        requests = self.mapping(resources, "requests", f"{path}.resources.requests")
        if not limits and not requests:
            return ()
        reading = _ContainerReading(self, name, limits, requests, f"{path}.resources")
        found: list[DeviceRequest] = []
        for spec in _vendors_named(specs, limits, requests):
            request = reading.read(spec, annotations)
            if request is not None:
                found.append(request)
        if len(found) > MAX_REQUESTS_PER_CONTAINER:
            self.add(f"{path}.resources", f"asks for the devices of {len(found)} vendors, at "
                                          f"most {MAX_REQUESTS_PER_CONTAINER}")
        return tuple(found)

    # -- status -------------------------------------------------------------------------------

    def statuses(
        self, status: Mapping[str, Any], key: str, path: str
    ) -> tuple[ContainerStatus, ...]:
        parsed: list[ContainerStatus] = []
        for index, item in enumerate(self.items(status, key, path, MAX_STATUSES)):
            item_path = f"{path}[{index}]"
            if not isinstance(item, dict):
                self.add(item_path, f"must be an object, got {json_kind(item)}")
                continue
            name = self.required_string(item, "name", f"{item_path}.name")
            state, exit_code = self.state(item, item_path)
            parsed.append(
                ContainerStatus(
                    name=name,
                    state=state,
                    exit_code=exit_code,
                    restart_count=self.integer(item, "restartCount", f"{item_path}.restartCount"),
                )
            )
        return tuple(parsed)

    def state(self, item: Mapping[str, Any], path: str) -> tuple[ContainerState, int]:
        state = self.mapping(item, "state", f"{path}.state")
        # The kubelet sets exactly one of the three; if a writer set more, the furthest along
        # wins, so a terminated container is never read as still running.
        terminated = self.mapping(state, "terminated", f"{path}.state.terminated")
        if "terminated" in state and state["terminated"] is not None:
            exit_code = self.integer(
                terminated, "exitCode", f"{path}.state.terminated.exitCode", low=INT32_MIN
            )
            return ContainerState.TERMINATED, exit_code
        for key, value in (
            ("running", ContainerState.RUNNING),
            ("waiting", ContainerState.WAITING),
        ):
            if state.get(key) is not None:
                self.mapping(state, key, f"{path}.state.{key}")
                return value, 0
        return ContainerState.UNKNOWN, 0


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

    reader: _Reader
    container: str
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    path: str

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
            self.reader.add(path, str(error))
            value = None
        return _Resource(name, value, written, path, present=True)

    def refuse(self, resource: _Resource, problem: str) -> None:
        """Reports a reading that cannot be charged, e.g. ``container "main": nvidia.com/gpumem
        is in MiB: 2Gi reads as 2147483648 MiB, more than any device (at most 2147483647)``."""
        self.reader.add(resource.path, f"container {quote(self.container)}: {problem}")

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
            return DeviceRequest(spec.vendor, devices, 0, WHOLE_CARD_PERCENT, whole_cores)
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
            return DeviceRequest(spec.vendor, devices, 0, 0, per_device)
        if not cores.present:
            return None
        wanted = self.whole(cores, "counts NeuronCores")
        if not wanted:
            return None
        if wanted <= per_device:
            return DeviceRequest(spec.vendor, 1, 0, 0, wanted)
        if wanted % per_device:
            self.refuse(cores, f"{cores.name} counts NeuronCores: {self.reading(cores)}, must be "
                               f"1 or a multiple of {per_device}")
            return None
        if wanted // per_device > MAX_DEVICES_PER_CONTAINER:
            self.refuse(cores, f"{cores.name} counts NeuronCores: {self.reading(cores)}, more "
                               f"than any node can hold")
            return None
        return DeviceRequest(spec.vendor, wanted // per_device, 0, 0, per_device)

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
            return DeviceRequest(spec.vendor, 1, 0, WHOLE_CARD_PERCENT, 0, slices=slices)
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
            spec.vendor, 1, memory_raw, 0 if memory_raw else WHOLE_CARD_PERCENT, core_raw
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
            # device, so it also takes every core (no other pod may share it).
            exclusive = raw_percent == WHOLE_CARD_PERCENT or not memory.present
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
                spec.vendor,
                devices,
                whole_units * spec.resources.memory_factor,
                0,
                whole_cores,
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
        return DeviceRequest(spec.vendor, devices, units, 0, core_units)


NEURON_CORES_PER_DEVICE = 2
"""NeuronCores per AWS Neuron device as HAMi's requests see them: the first node's count,
capped at 2 (HAMi's core masks have two bits); 2 on every current Neuron device."""
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


def names_extended_resources(obj: Mapping[str, Any]) -> bool:
    """Whether a Kubernetes Pod (decoded JSON) names any extended resource in a container's
    limits or requests. Every vendor's device resources are domain-qualified (nvidia.com/gpu),
    Kubernetes' own are not (cpu, memory, hugepages-2Mi), so a pod that names none asks for no
    device under any policy. A part that is not shaped like a pod's names nothing here: the
    parser reports it, whatever the policy."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for section in (resources.get("limits"), resources.get("requests")):
                if isinstance(section, Mapping) and any(
                    isinstance(name, str) and "/" in name for name in section
                ):
                    return True
    return False
