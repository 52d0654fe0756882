"""Reads a Kubernetes Pod (what Go's ``json.Marshal(pod)`` writes) into an accounting ``Pod``.

Layer: accounting (pure); the input is plain JSON data, never a Kubernetes client object.

* Classes: ``spec.initContainers`` with ``restartPolicy: Always`` are sidecars, the other init
  containers are init, ``spec.containers`` are apps; declaration order, init list first.
* Requests follow HAMi's ``GenerateResourceRequests`` after its webhook defaults (hami-behaviour
  §3.2, §3.4), so a pod sent here before or after the webhook reads the same.
* Grants come from ``hami.io/vgpu-devices-allocated``, aligned to the containers by position.

Every problem is collected and raised as one ``InvalidInputError`` with JSON paths such as
``spec.initContainers[1].name`` or ``metadata.annotations["hami.io/vgpu-devices-allocated"][0][0]``.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting import hami_codec
from accounting.annotations import DEVICES_ALLOCATED_ANNOTATION, VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.model import (
    NVIDIA_RESOURCES,
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    DeviceRequest,
    Pod,
    PodPhase,
    VendorResources,
)
from accounting.pod import EXCLUSIVE_CORE_PERCENT, WHOLE_CARD_PERCENT, classify_init_container
from accounting.validate import (
    INT32_MAX,
    INT32_MIN,
    MAX_CONTAINERS,
    MAX_STATUSES,
    BoundedViolations,
    json_kind,
    json_object,
    quote,
)

DEFAULT_NAMESPACE = "default"
"""What kubectl and the API server assume when a pod names no namespace."""

_INT64_MAX = 2**63 - 1

# Kubernetes resource.Quantity: signed decimal number, then a binary-SI, decimal-SI or
# exponent suffix ("4096", "24Gi", "500m", "1e3", "1.5").
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# A quantity longer than this is not something the API server would have stored.
_MAX_QUANTITY_CHARS = 64

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
    reader = _Reader(BoundedViolations(), f"{path}." if path else "")
    pod = reader.pod(obj, vendors)
    reader.found.raise_if_any()
    return pod


@dataclass(frozen=True, slots=True)
class _Resource:
    """One resource of one container, read from limits first, then requests."""

    present: bool = False
    integer: int | None = None
    """The value when it is a whole number that fits int64 (HAMi's Quantity.AsInt64)."""


_ABSENT = _Resource()


@dataclass(frozen=True, slots=True)
class _Reader:
    found: BoundedViolations
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
            self.add(path, f"must be an integer between {low} and {high}, got {json.dumps(value)}")
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
                    requests=self.requests(item, path, vendors),
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
        self, item: Mapping[str, Any], path: str, vendors: Sequence[VendorResources]
    ) -> tuple[DeviceRequest, ...]:
        resources = self.mapping(item, "resources", f"{path}.resources")
        limits = self.mapping(resources, "limits", f"{path}.resources.limits")
        requests = self.mapping(resources, "requests", f"{path}.resources.requests")
        found: list[DeviceRequest] = []
        for vendor in vendors:
            request = self.request(vendor, limits, requests, f"{path}.resources")
            if request is not None:
                found.append(request)
        return tuple(found)

    def request(
        self,
        vendor: VendorResources,
        limits: Mapping[str, Any],
        requests: Mapping[str, Any],
        path: str,
    ) -> DeviceRequest | None:
        def read(name: str) -> _Resource:
            return self.resource(name, limits, requests, path)

        count = read(vendor.count_resource)
        memory = read(vendor.memory_resource)
        percentage = read(vendor.memory_percentage_resource)
        cores = read(vendor.core_resource)

        # The webhook writes the default count when a container sizes a GPU but does not count.
        asks_for_device = memory.present or percentage.present or cores.present
        if not count.present and asks_for_device and vendor.default_gpu_count > 0:
            count = _Resource(present=True, integer=vendor.default_gpu_count)
        if count.integer is None or count.integer <= 0:
            return None
        if count.integer > INT32_MAX:
            self.add(
                self._where(vendor.count_resource, limits, path),
                f"must be at most {INT32_MAX} devices, got {count.integer}",
            )
            return None

        memory_mib = 0
        if memory.present:
            # HAMi drops the whole request when memory is not a whole MiB count that fits int32
            # after the factor: "24Gi" reads as 25769803776 MiB and the container gets no GPU.
            # Kept as HAMi does it, because the device plugin will act on HAMi's reading.
            ceiling = INT32_MAX // max(vendor.memory_factor, 1)
            if memory.integer is None or not 0 <= memory.integer <= ceiling:
                return None
            memory_mib = memory.integer

        memory_percent = 0
        if percentage.integer is not None and percentage.integer > 0:
            memory_percent = min(percentage.integer, WHOLE_CARD_PERCENT)
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
        exclusive = not cores.present and (percentage.integer == 100 or not memory.present)
        if exclusive:
            core_percent = EXCLUSIVE_CORE_PERCENT
        elif cores.integer is not None:
            core_percent = cores.integer
            if not 0 <= core_percent <= 100:
                self.add(
                    self._where(vendor.core_resource, limits, path),
                    f"must be between 0 and 100 percent, got {core_percent}",
                )
                core_percent = 0
        else:
            core_percent = vendor.default_core_percent
        return DeviceRequest(
            vendor=vendor.vendor,
            count=count.integer,
            memory_mib=memory_mib,
            memory_percent=memory_percent,
            core_percent=core_percent,
            memory_from_default=memory_from_default,
        )

    def resource(
        self,
        name: str,
        limits: Mapping[str, Any],
        requests: Mapping[str, Any],
        path: str,
    ) -> _Resource:
        if name in limits:
            value, where = limits[name], self._where(name, limits, path)
        elif name in requests:
            value, where = requests[name], f"{path}.requests[{quote(name)}]"
        else:
            return _ABSENT
        try:
            quantity = parse_quantity(value)
        except ValueError as error:
            self.add(where, str(error))
            return _Resource(present=True)
        return _Resource(present=True, integer=quantity_as_int64(quantity))

    @staticmethod
    def _where(name: str, limits: Mapping[str, Any], path: str) -> str:
        section = "limits" if name in limits else "requests"
        return f"{path}.{section}[{quote(name)}]"

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


def parse_quantity(value: object) -> decimal.Decimal:
    """Reads a Kubernetes quantity (a JSON string such as "24Gi", or a JSON number) exactly.

    Raises:
        ValueError: the value is not a Kubernetes quantity.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"must be a Kubernetes quantity, got {json_kind(value)}")
    text = value if isinstance(value, str) else repr(value)
    match = _QUANTITY.fullmatch(text) if len(text) <= _MAX_QUANTITY_CHARS else None
    if match is None:
        raise ValueError(f"must be a Kubernetes quantity such as 4096 or 24Gi, got {quote(text)}")
    number = decimal.Decimal(match["number"])
    suffix = match["suffix"] or ""
    # Enough precision that no digit of the number is rounded; exponents are small integers.
    context = decimal.Context(prec=_MAX_QUANTITY_CHARS + 40, Emax=10**6, Emin=-(10**6))
    if suffix in _BINARY_SUFFIXES:
        return context.multiply(number, decimal.Decimal(2 ** _BINARY_SUFFIXES[suffix]))
    if suffix in _DECIMAL_SUFFIXES:
        return number.scaleb(_DECIMAL_SUFFIXES[suffix], context)
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > 1000:
            # Way outside int64 either way; keep the arithmetic small.
            exponent = 1000 if exponent > 0 else -1000
        return number.scaleb(exponent, context)
    return number


def quantity_as_int64(quantity: decimal.Decimal) -> int | None:
    """The quantity as an integer when it is whole and fits int64, else None (Go's AsInt64)."""
    if abs(quantity) > _INT64_MAX or quantity != quantity.to_integral_value():
        return None
    return int(quantity)
