"""Reads a Kubernetes Pod (what Go's ``json.Marshal(pod)`` writes) into an accounting ``Pod``.

Layer: accounting (pure); the input is plain JSON data, never a Kubernetes client object.

* Classes: ``spec.initContainers`` with ``restartPolicy: Always`` are sidecars, the other init
  containers are init, ``spec.containers`` are apps; declaration order, init list first.
* Requests: each container's resources are read by ``accounting.kube.device_requests``
  (HAMi's ``GenerateResourceRequests`` after its webhook defaults, per vendor of the policy),
  so a pod sent here before or after the webhook reads the same.
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from accounting import hami_codec, mig
from accounting.annotations import VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError, Violations
from accounting.kube.device_requests import read_device_requests
from accounting.limits import (
    INT32_MAX,
    INT32_MIN,
    MAX_CONTAINERS,
    MAX_GRANTS_PER_CONTAINER,
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
from accounting.pod import classify_init_container
from accounting.quoting import json_kind, quote
from accounting.received_json import json_object
from accounting.validate import check_annotations, check_json_integer
from accounting.vendor_spec import VendorSpec
from accounting.vendors import VendorResources, specs_for

DEFAULT_NAMESPACE = "default"
"""What kubectl and the API server assume when a pod names no namespace."""
_PHASES = {phase.value: phase for phase in PodPhase}


def parse_pod_json(
    raw: bytes | str,
    vendors: Sequence[VendorResources],
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
    vendors: Sequence[VendorResources],
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
    pod: Pod, vendors: Sequence[VendorResources], *, path: str = ""
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
        (HAMi #2899), and a grant on a MIG card without an instance is closed off whole by the
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
        return read_device_requests(
            self.found,
            container=name,
            limits=limits,
            requests=requests,
            path=self.at(f"{path}.resources"),
            specs=specs,
            annotations=annotations,
        )

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
