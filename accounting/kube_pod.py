"""Reads a Kubernetes Pod (what Go's ``json.Marshal(pod)`` writes) into an accounting ``Pod``.

Layer: accounting (pure); the input is plain JSON data, never a Kubernetes client object.

* Classes: ``spec.initContainers`` with ``restartPolicy: Always`` are sidecars, the other init
  containers are init, ``spec.containers`` are apps; declaration order, init list first.
* Requests follow HAMi's ``GenerateResourceRequests`` after its webhook defaults (docs/design.md
  §2.3), so a pod sent here before or after the webhook reads the same.
* Grants come from ``hami.io/vgpu-devices-allocated``, aligned to the containers by position.

Every problem is collected and raised as one ``InvalidInputError`` with JSON paths such as
``spec.initContainers[1].name`` or ``metadata.annotations["hami.io/vgpu-devices-allocated"][0][0]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from accounting import hami_codec, quantity
from accounting.annotations import DEVICES_ALLOCATED_ANNOTATION, VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError, Violations
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
from accounting.pod import EXCLUSIVE_CORE_PERCENT, WHOLE_CARD_PERCENT, classify_init_container
from accounting.validate import (
    INT32_MAX,
    INT32_MIN,
    MAX_CONTAINERS,
    MAX_DEVICES_PER_CONTAINER,
    MAX_STATUSES,
    json_kind,
    json_object,
    quote,
    shown,
)
from accounting.vendors import NVIDIA_RESOURCES, VendorResources

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
    pod = reader.pod(obj, vendors)
    reader.found.raise_if_any()
    return pod


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
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.add(path, f"must be an integer between {low} and {high}, got {shown(value)}")
            return 0
        return value

    # -- the pod ------------------------------------------------------------------------------

    def pod(self, obj: Mapping[str, Any], vendors: Sequence[VendorResources]) -> Pod:
        metadata = self.mapping(obj, "metadata", "metadata")
        spec = self.mapping(obj, "spec", "spec")
        status = self.mapping(obj, "status", "status")

        uid = self.required_string(metadata, "uid", "metadata.uid")
        annotations = self.annotations(metadata)
        containers = self.containers(spec, vendors, annotations)

        node_name = annotations.get(VGPU_NODE_ANNOTATION) or self.string(
            spec, "nodeName", "spec.nodeName"
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
        vendors: Sequence[VendorResources],
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

        grants = self.grants(annotations, len(located))
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
                    requests=self.requests(item, path, name, vendors),
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
        self, annotations: Mapping[str, str], container_count: int
    ) -> tuple[tuple[DeviceGrant, ...], ...]:
        value = annotations.get(DEVICES_ALLOCATED_ANNOTATION)
        if value is None:
            return ((),) * container_count
        path = f"metadata.annotations[{quote(DEVICES_ALLOCATED_ANNOTATION)}]"
        try:
            return hami_codec.decode_container_grants(value, container_count, path=self.at(path))
        except InvalidInputError as error:
            self.found.extend(error)
            return ((),) * container_count

    # -- requests (HAMi GenerateResourceRequests after the webhook defaults) ------------------

    def requests(
        self, item: Mapping[str, Any], path: str, name: str, vendors: Sequence[VendorResources]
    ) -> tuple[DeviceRequest, ...]:
        resources = self.mapping(item, "resources", f"{path}.resources")
        limits = self.mapping(resources, "limits", f"{path}.resources.limits")
        requests = self.mapping(resources, "requests", f"{path}.resources.requests")
        found: list[DeviceRequest] = []
        for vendor in vendors:
            request = _ContainerReading(self, name, limits, requests, f"{path}.resources").read(
                vendor
            )
            if request is not None:
                found.append(request)
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

    def resource(self, name: str) -> _Resource:
        if name in self.limits:
            written, path = self.limits[name], f"{self.path}.limits[{quote(name)}]"
        elif name in self.requests:
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
        return int(value)

    def read(self, vendor: VendorResources) -> DeviceRequest | None:
        count = self.resource(vendor.count_resource)
        memory = self.resource(vendor.memory_resource)
        percentage = self.resource(vendor.memory_percentage_resource)
        cores = self.resource(vendor.core_resource)

        # The webhook writes the default count when a container sizes a GPU but does not count.
        asks_for_device = memory.present or percentage.present or cores.present
        if count.present:
            devices = self.whole(count, "counts whole devices")
        elif asks_for_device and vendor.default_gpu_count > 0:
            devices = vendor.default_gpu_count
        else:
            return None
        if devices is None or devices == 0:
            return None
        if devices > MAX_DEVICES_PER_CONTAINER:
            self.refuse(count, f"{count.name} counts whole devices: {self.reading(count)}, more "
                               f"than any node can hold (at most {MAX_DEVICES_PER_CONTAINER})")
            return None

        memory_mib = 0
        if memory.present:
            # HAMi drops the whole request when the memory is not a whole MiB count that fits
            # int32 after the factor: "24Gi" reads as 25769803776 MiB and the container gets no
            # GPU, then fails on the node. Refused here instead, with the reading.
            factor = max(vendor.memory_factor, 1)
            read = self.whole(memory, "is in MiB", " MiB")
            if read is None:
                return None
            ceiling = INT32_MAX // factor
            if read > ceiling:
                with_factor = f" with memory factor {factor}" if factor > 1 else ""
                self.refuse(memory, f"{memory.name} is in MiB: {self.reading(memory, ' MiB')}, "
                                    f"more than any device (at most {ceiling}{with_factor})")
                return None
            memory_mib = read

        memory_percent = 0
        raw_percent = None
        if percentage.present:
            raw_percent = self.whole(percentage, "is a percentage of a card", " percent")
            if raw_percent is None:
                return None
            memory_percent = min(raw_percent, WHOLE_CARD_PERCENT)
        memory_from_default = False
        if memory_percent == 0 and memory_mib == 0:
            # HAMi's GenerateResourceRequests: nothing sizes the card, so the vendor's default
            # memory, else the whole card (size_request reads the request the same way).
            if vendor.default_memory_mib:
                memory_mib = vendor.default_memory_mib
                memory_from_default = True
            else:
                memory_percent = WHOLE_CARD_PERCENT

        # The webhook's exclusive default: a bare count, or a whole card by percentage, is the
        # whole device, so it also takes every core (no other pod may share it).
        if not cores.present:
            exclusive = raw_percent == WHOLE_CARD_PERCENT or not memory.present
            core_percent = EXCLUSIVE_CORE_PERCENT if exclusive else vendor.default_core_percent
        else:
            read = self.whole(cores, "is in percent of a card", " percent")
            if read is None:
                return None
            # HAMi's Fit reads any core request above 100 as 100, the whole card's compute.
            core_percent = min(read, WHOLE_CARD_PERCENT)
        return DeviceRequest(
            vendor=vendor.vendor,
            count=devices,
            memory_mib=memory_mib,
            memory_percent=memory_percent,
            core_percent=core_percent,
            memory_from_default=memory_from_default,
        )


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
