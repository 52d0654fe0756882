"""Conversion between hami.accounting.v1 messages and accounting.model values.

Layer: services (adapter). The one place shared by the three daemons where protobuf meets the
domain: input is converted and validated here (every bad field reported at once, with paths
like ``pod.containers[1].container_class``), output is built here. No accounting rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeVar

from accounting import limits, received_json, validate
from accounting.errors import FieldViolation, InvalidInputError, Violations
from accounting.kube import node_json, pod_json
from accounting.model import (
    DEFAULT_DEVICE_MODE,
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceState,
    DeviceUsage,
    MigInstance,
    MigPlacement,
    MigProfile,
    Pod,
    PodPhase,
    QuotaItem,
)
from accounting.policy import AccountingPolicy
from accounting.vendors import NVIDIA, NVIDIA_RESOURCES, VendorResources
from hami.accounting.v1 import types_pb2, usage_pb2

T = TypeVar("T")

CONTAINER_CLASS_TO_PB: Mapping[ContainerClass, types_pb2.ContainerClass.ValueType] = {
    ContainerClass.INIT: types_pb2.CONTAINER_CLASS_INIT,
    ContainerClass.SIDECAR: types_pb2.CONTAINER_CLASS_SIDECAR,
    ContainerClass.APP: types_pb2.CONTAINER_CLASS_APP,
}
CONTAINER_CLASS_FROM_PB: Mapping[int, ContainerClass] = {
    pb: domain for domain, pb in CONTAINER_CLASS_TO_PB.items()
}

CONTAINER_STATE_TO_PB: Mapping[ContainerState, types_pb2.ContainerState.ValueType] = {
    ContainerState.UNKNOWN: types_pb2.CONTAINER_STATE_UNSPECIFIED,
    ContainerState.WAITING: types_pb2.CONTAINER_STATE_WAITING,
    ContainerState.RUNNING: types_pb2.CONTAINER_STATE_RUNNING,
    ContainerState.TERMINATED: types_pb2.CONTAINER_STATE_TERMINATED,
}
CONTAINER_STATE_FROM_PB: Mapping[int, ContainerState] = {
    pb: domain for domain, pb in CONTAINER_STATE_TO_PB.items()
}

POD_PHASE_TO_PB: Mapping[PodPhase, types_pb2.PodPhase.ValueType] = {
    PodPhase.PENDING: types_pb2.POD_PHASE_PENDING,
    PodPhase.RUNNING: types_pb2.POD_PHASE_RUNNING,
    PodPhase.SUCCEEDED: types_pb2.POD_PHASE_SUCCEEDED,
    PodPhase.FAILED: types_pb2.POD_PHASE_FAILED,
    PodPhase.UNKNOWN: types_pb2.POD_PHASE_UNKNOWN,
}
POD_PHASE_FROM_PB: Mapping[int, PodPhase] = {
    # An unreported phase is read as Pending, as the proto documents.
    types_pb2.POD_PHASE_UNSPECIFIED: PodPhase.PENDING,
    **{pb: domain for domain, pb in POD_PHASE_TO_PB.items()},
}


class PodSourceRequest(Protocol):
    """Any request message with the ``pod_source`` oneof (CheckQuota, Filter, Reserve, Record)."""

    @property
    def pod(self) -> types_pb2.Pod: ...

    @property
    def kubernetes_pod_json(self) -> bytes: ...

    def WhichOneof(self, oneof_group: Literal["pod_source"]) -> str | None: ...


# -- pods --------------------------------------------------------------------------------------


def pod_source_kind(request: PodSourceRequest) -> str | None:
    """Which ``pod_source`` field is set: "pod", "kubernetes_pod_json" or None."""
    # The generated stubs type WhichOneof with a Literal argument per message; all agree here.
    return request.WhichOneof("pod_source")


def pod_source_asks_for_devices(request: PodSourceRequest) -> bool:
    """Whether the request's pod may ask for a device under some policy: a typed pod with a
    device request, or Kubernetes JSON naming an extended resource. False for a pod that asks
    for nothing under any policy, and for input the parser refuses whatever the policy."""
    kind = pod_source_kind(request)
    if kind == "pod":
        return any(r.count > 0 for c in request.pod.containers for r in c.requests)
    if kind == "kubernetes_pod_json":
        try:
            document = received_json.json_object(request.kubernetes_pod_json, "kubernetes_pod_json")
        except InvalidInputError:
            return False
        return pod_json.names_extended_resources(document)
    return False


def pod_from_source(
    request: PodSourceRequest, vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,)
) -> Pod:
    """The request's pod, typed or as Kubernetes JSON, converted and validated.

    Raises:
        InvalidInputError: neither source set (path ``pod_source``), or every problem of the
            pod under ``pod.`` or ``kubernetes_pod_json.``.
    """
    kind = pod_source_kind(request)
    if kind == "pod":
        return pod_from_pb(request.pod)
    if kind == "kubernetes_pod_json":
        path = "kubernetes_pod_json"
        pod = pod_json.parse_pod_json(request.kubernetes_pod_json, vendors, path=path)
        # The parser already checks what it reads; this is the same backstop the typed path has.
        validate.validate_pod(pod, path)
        return pod
    raise InvalidInputError.single("pod_source", "one of pod or kubernetes_pod_json is required")


_GRANT_PATH = re.compile(r"(?:pod\.containers|container_grants)\[([0-9]+)\]\.grants\[([0-9]+)\]")
"""How the rules name a pod's grant in an error (the typed pod's, or Reserve's grants)."""


def grants_as_sent(
    error: InvalidInputError,
    request: PodSourceRequest,
    pod: Pod,
    vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,),
) -> InvalidInputError:
    """``error`` with each of ``pod``'s grants named where the request wrote it: the typed
    pod's ``pod.containers[1].grants[0]``, or for Kubernetes JSON the entry of its allocation
    annotation, ``kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"]
    [1][0]``. For a pod whose own grants the rules checked (RecordPod, Reserve without
    ``container_grants``); other paths are kept."""
    if pod_source_kind(request) == "kubernetes_pod_json":
        places = pod_json.grant_paths(pod, vendors, path="kubernetes_pod_json")
    else:
        places = tuple(
            tuple(f"pod.containers[{c}].grants[{g}]" for g in range(len(container.grants)))
            for c, container in enumerate(pod.containers)
        )
    violations: list[FieldViolation] = []
    for violation in error.violations:
        match = _GRANT_PATH.match(violation.path)
        path = violation.path
        if match is not None:
            container, grant = int(match[1]), int(match[2])
            if container < len(places) and grant < len(places[container]):
                path = places[container][grant] + violation.path[match.end():]
        violations.append(FieldViolation(path, violation.message))
    return InvalidInputError(violations)


def pod_from_pb(pb: types_pb2.Pod, path: str = "pod") -> Pod:
    """Converts and validates a typed pod.

    Raises:
        InvalidInputError: every problem, e.g. ``pod.containers[0].container_class: must be
            set`` together with ``pod.uid: must not be empty``.
    """
    found = Violations()
    _check_sizes(found, pb, path)
    found.raise_if_any()
    containers = tuple(
        [
            _container_from_pb(found, container, path, index)
            for index, container in enumerate(pb.containers)
        ]
    )
    pod = Pod(
        uid=pb.uid,
        namespace=pb.namespace,
        name=pb.name,
        containers=containers,
        phase=_enum_from_pb(
            found, POD_PHASE_FROM_PB, pb.status.phase, f"{path}.status.phase", PodPhase.UNKNOWN
        ),
        init_container_statuses=_statuses_from_pb(
            found, pb.status.init_container_statuses, f"{path}.status.init_container_statuses"
        ),
        container_statuses=_statuses_from_pb(
            found, pb.status.container_statuses, f"{path}.status.container_statuses"
        ),
        node_name=pb.node_name,
        # Read-only already: Pod would otherwise copy the mapping a second time to freeze it.
        annotations=MappingProxyType(dict(pb.annotations)),
        terminating=pb.terminating,
    )
    validate.check_pod(found, pod, path)
    found.raise_if_any()
    return pod


def _check_sizes(found: Violations, pb: types_pb2.Pod, path: str) -> None:
    # Refuse a huge repeated field before converting any element of it.
    if len(pb.containers) > limits.MAX_CONTAINERS:
        found.add(
            f"{path}.containers",
            f"at most {limits.MAX_CONTAINERS} containers, got {len(pb.containers)}",
        )
        return
    for index, container in enumerate(pb.containers):
        if len(container.grants) > limits.MAX_GRANTS_PER_CONTAINER:
            found.add(
                f"{path}.containers[{index}].grants",
                f"at most {limits.MAX_GRANTS_PER_CONTAINER} grants, got {len(container.grants)}",
            )
        if len(container.requests) > limits.MAX_REQUESTS_PER_CONTAINER:
            found.add(
                f"{path}.containers[{index}].requests",
                f"at most {limits.MAX_REQUESTS_PER_CONTAINER} requests, "
                f"got {len(container.requests)}",
            )
    for name, statuses in (
        ("init_container_statuses", pb.status.init_container_statuses),
        ("container_statuses", pb.status.container_statuses),
    ):
        if len(statuses) > limits.MAX_STATUSES:
            found.add(
                f"{path}.status.{name}",
                f"at most {limits.MAX_STATUSES} statuses, got {len(statuses)}",
            )


def _container_from_pb(
    found: Violations, pb: types_pb2.Container, pod_path: str, index: int
) -> Container:
    container_class = CONTAINER_CLASS_FROM_PB.get(pb.container_class)
    if container_class is None:
        # The path is only spelled out for an error: this runs for every container of every
        # request.
        found.add(
            f"{pod_path}.containers[{index}].container_class", _enum_message(pb.container_class)
        )
        # A placeholder so the remaining fields are still checked; the error is raised anyway.
        container_class = ContainerClass.APP
    grants = pb.grants
    return Container(
        pb.name,
        container_class,
        tuple([request_from_pb(request) for request in pb.requests]),
        tuple([grant_from_pb(grant) for grant in grants]) if grants else (),
    )


def _statuses_from_pb(
    found: Violations, statuses: Sequence[types_pb2.ContainerStatus], path: str
) -> tuple[ContainerStatus, ...]:
    if not statuses:
        # A pod being admitted has no status yet: skip building the generator for nothing.
        return ()
    return tuple(
        ContainerStatus(
            name=status.name,
            state=_enum_from_pb(
                found,
                CONTAINER_STATE_FROM_PB,
                status.state,
                f"{path}[{index}].state",
                ContainerState.UNKNOWN,
            ),
            exit_code=status.exit_code,
            restart_count=status.restart_count,
        )
        for index, status in enumerate(statuses)
    )


def _enum_from_pb(
    found: Violations, table: Mapping[int, T], value: int, path: str, fallback: T
) -> T:
    # proto3 enums are open: a newer client can send a number this build does not know.
    converted = table.get(value)
    if converted is None:
        found.add(path, f"unknown value {value}")
        return fallback
    return converted


def _enum_message(value: int) -> str:
    return (
        "must be set" if value == 0 else f"must be INIT, SIDECAR or APP, got unknown value {value}"
    )


def pod_to_pb(pod: Pod) -> types_pb2.Pod:
    """The typed message of a pod (the inverse of ``pod_from_pb`` for valid pods)."""
    return types_pb2.Pod(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node_name=pod.node_name,
        containers=[
            types_pb2.Container(
                name=container.name,
                container_class=CONTAINER_CLASS_TO_PB[container.container_class],
                requests=[request_to_pb(request) for request in container.requests],
                grants=[grant_to_pb(grant) for grant in container.grants],
            )
            for container in pod.containers
        ],
        status=types_pb2.PodStatus(
            phase=POD_PHASE_TO_PB[pod.phase],
            init_container_statuses=[status_to_pb(s) for s in pod.init_container_statuses],
            container_statuses=[status_to_pb(s) for s in pod.container_statuses],
        ),
        annotations=dict(pod.annotations),
        terminating=pod.terminating,
    )


def status_to_pb(status: ContainerStatus) -> types_pb2.ContainerStatus:
    return types_pb2.ContainerStatus(
        name=status.name,
        state=CONTAINER_STATE_TO_PB[status.state],
        exit_code=status.exit_code,
        restart_count=status.restart_count,
    )


_Fields = tuple[tuple[str, str], ...]
"""(domain field, message field) pairs of one conversion."""


def _same(*names: str) -> _Fields:
    return tuple((name, name) for name in names)


_REQUEST_FIELDS = _same(
    "vendor", "count", "memory_mib", "memory_percent", "core_percent", "slices"
)
# The wire keeps HAMi's word for the annotation's TYPE field and proto's first names; the
# domain names say what they hold: the vendor on grants and usage, the model on a device, and
# the unit of every number.
_GRANT_FIELDS = (("vendor", "device_type"), *_same("uuid", "memory_mib", "core_percent", "slots"))
_USAGE_FIELDS = _GRANT_FIELDS
_DEVICE_FIELDS = (
    ("model", "device_type"),
    ("core_percent_total", "cores_total"),
    *_same("uuid", "index", "slots_total", "memory_total_mib", "numa", "mode", "healthy", "vendor"),
)
_DEVICE_STATE_FIELDS = (
    ("core_percent_used", "cores_used"),
    *_same("memory_used_mib", "slots_used"),
)
_QUOTA_ITEM_FIELDS = _same("resource", "used", "limit", "limit_set")


def _to_wire(source: object, fields: _Fields) -> dict[str, Any]:
    """The message fields of a domain value: each conversion is its list of fields."""
    return {wire: getattr(source, domain) for domain, wire in fields}


def _from_wire(pb: object, fields: _Fields) -> dict[str, Any]:
    """The domain fields of a message."""
    return {domain: getattr(pb, wire) for domain, wire in fields}


def request_from_pb(pb: types_pb2.DeviceRequest) -> DeviceRequest:
    # Spelled out rather than through _REQUEST_FIELDS: this runs for every request of every
    # pod read, and a test holds it to the table.
    return DeviceRequest(
        pb.vendor, pb.count, pb.memory_mib, pb.memory_percent, pb.core_percent, pb.slices
    )


def request_to_pb(request: DeviceRequest) -> types_pb2.DeviceRequest:
    fields = _to_wire(request, _REQUEST_FIELDS)
    if request.memory_unscaled:
        # On the wire, no memory and no percentage is the policy's default: the reader sizes it.
        fields["memory_mib"] = 0
    return types_pb2.DeviceRequest(**fields)


# -- grants and usage --------------------------------------------------------------------------


def grant_from_pb(pb: types_pb2.DeviceGrant) -> DeviceGrant:
    fields = _from_wire(pb, _GRANT_FIELDS)
    if pb.HasField("mig"):
        fields["mig"] = mig_instance_from_pb(pb.mig)
    return DeviceGrant(**fields)


def grant_to_pb(grant: DeviceGrant) -> types_pb2.DeviceGrant:
    pb = types_pb2.DeviceGrant(**_to_wire(grant, _GRANT_FIELDS))
    if grant.mig is not None:
        pb.mig.CopyFrom(mig_instance_to_pb(grant.mig))
    return pb


def mig_placement_from_pb(pb: types_pb2.MigPlacement) -> MigPlacement:
    return MigPlacement(pb.start, pb.size)


def mig_placement_to_pb(placement: MigPlacement) -> types_pb2.MigPlacement:
    return types_pb2.MigPlacement(start=placement.start, size=placement.size)


def mig_instance_from_pb(pb: types_pb2.MigInstance) -> MigInstance:
    return MigInstance(pb.profile, mig_placement_from_pb(pb.placement))


def mig_instance_to_pb(instance: MigInstance) -> types_pb2.MigInstance:
    return types_pb2.MigInstance(
        profile=instance.profile, placement=mig_placement_to_pb(instance.placement)
    )


def mig_profile_from_pb(pb: types_pb2.MigProfile) -> MigProfile:
    return MigProfile(
        pb.name,
        pb.memory_mib,
        pb.core_percent,
        pb.slice_count,
        tuple(mig_placement_from_pb(p) for p in pb.placements),
    )


def mig_profile_to_pb(profile: MigProfile) -> types_pb2.MigProfile:
    return types_pb2.MigProfile(
        name=profile.name,
        memory_mib=profile.memory_mib,
        core_percent=profile.core_percent,
        slice_count=profile.slice_count,
        placements=[mig_placement_to_pb(p) for p in profile.placements],
    )


def grants_from_pb(
    container_grants: Sequence[types_pb2.ContainerGrants], path: str = "container_grants"
) -> tuple[tuple[DeviceGrant, ...], ...]:
    """Grants per container position (Reserve's ``container_grants``), validated.

    Raises:
        InvalidInputError: too many positions or grants, or any bad grant, e.g.
            ``container_grants[1].grants[0].memory_mib: must be between 0 and 2147483647``.
    """
    found = Violations()
    if len(container_grants) > limits.MAX_CONTAINERS:
        found.add(path, f"at most {limits.MAX_CONTAINERS} positions, got {len(container_grants)}")
        found.raise_if_any()
    per_container: list[tuple[DeviceGrant, ...]] = []
    for position, entry in enumerate(container_grants):
        entry_path = f"{path}[{position}].grants"
        if len(entry.grants) > limits.MAX_GRANTS_PER_CONTAINER:
            found.add(
                entry_path,
                f"at most {limits.MAX_GRANTS_PER_CONTAINER} grants, got {len(entry.grants)}",
            )
            per_container.append(())
            continue
        grants = tuple(grant_from_pb(grant) for grant in entry.grants)
        for index, grant in enumerate(grants):
            validate.check_grant(found, grant, f"{entry_path}[{index}]")
        per_container.append(grants)
    found.raise_if_any()
    return tuple(per_container)


def container_grants_to_pb(
    pod: Pod, per_container: Sequence[Sequence[DeviceGrant]]
) -> list[types_pb2.ContainerGrants]:
    """Grants per position, labelled with the container each position belongs to."""
    if len(per_container) != len(pod.containers):
        raise ValueError(
            f"{len(per_container)} grant positions for {len(pod.containers)} containers "
            f"of pod {pod.key}"
        )
    return [
        types_pb2.ContainerGrants(
            container_name=container.name,
            container_class=CONTAINER_CLASS_TO_PB[container.container_class],
            grants=[grant_to_pb(grant) for grant in grants],
        )
        for container, grants in zip(pod.containers, per_container, strict=True)
    ]


def usage_from_pb(pb: types_pb2.DeviceUsage) -> DeviceUsage:
    return DeviceUsage(
        **_from_wire(pb, _USAGE_FIELDS), mig=tuple(mig_instance_from_pb(m) for m in pb.mig)
    )


def usage_to_pb(usage: DeviceUsage) -> types_pb2.DeviceUsage:
    pb = types_pb2.DeviceUsage(**_to_wire(usage, _USAGE_FIELDS))
    if usage.mig:
        pb.mig.extend(mig_instance_to_pb(m) for m in usage.mig)
    return pb


def usages_to_pb(usages: Iterable[DeviceUsage]) -> list[types_pb2.DeviceUsage]:
    return [usage_to_pb(usage) for usage in usages]


# -- nodes and devices -------------------------------------------------------------------------


def device_from_pb(pb: types_pb2.Device | types_pb2.DeviceState) -> Device:
    """A typed device (or the device of a DeviceState); an empty mode or vendor means HAMi's
    defaults (hami-core, NVIDIA)."""
    fields = _from_wire(pb, _DEVICE_FIELDS)
    fields["mode"] = pb.mode or DEFAULT_DEVICE_MODE
    fields["vendor"] = pb.vendor or NVIDIA
    if pb.mig_profiles:
        fields["mig_profiles"] = tuple(mig_profile_from_pb(p) for p in pb.mig_profiles)
    if pb.custom_info:
        fields["custom_info"] = tuple(sorted(pb.custom_info.items()))
    return Device(**fields)


def _device_extras(device: Device) -> dict[str, Any]:
    """The repeated and map fields of a device message, only when set (cheap for most)."""
    extras: dict[str, Any] = {}
    if device.mig_profiles:
        extras["mig_profiles"] = [mig_profile_to_pb(p) for p in device.mig_profiles]
    if device.custom_info:
        extras["custom_info"] = dict(device.custom_info)
    return extras


def device_to_pb(device: Device) -> types_pb2.Device:
    return types_pb2.Device(**_to_wire(device, _DEVICE_FIELDS), **_device_extras(device))


def devices_from_inventory_pb(
    inventory: types_pb2.NodeInventory, path: str = "inventory.devices"
) -> tuple[Device, ...]:
    """A typed node inventory, validated (unique UUIDs, totals within int32).

    Raises:
        InvalidInputError: every bad device field, e.g. ``inventory.devices[1].uuid``.
    """
    if len(inventory.devices) > limits.MAX_DEVICES_PER_NODE:
        raise InvalidInputError.single(
            path,
            f"at most {limits.MAX_DEVICES_PER_NODE} devices, got {len(inventory.devices)}",
        )
    devices = tuple(device_from_pb(device) for device in inventory.devices)
    validate.validate_devices(devices, path)
    return devices


def node_from_source(
    request: usage_pb2.RegisterNodeRequest,
    vendors: Sequence[VendorResources] = (NVIDIA_RESOURCES,),
) -> node_json.NodeRegistration:
    """RegisterNode's node: typed inventory or Kubernetes Node JSON (every one of ``vendors``'
    devices read from it), validated.

    ``node_name`` wins when set; with JSON it may be empty and ``metadata.name`` is used.

    Raises:
        InvalidInputError: no source (path ``node_source``), no name, or bad devices.
    """
    kind = request.WhichOneof("node_source")
    found = Violations()
    if len(request.node_name) > limits.MAX_NODE_NAME_CHARS:
        found.add("node_name", f"at most {limits.MAX_NODE_NAME_CHARS} characters, "
                               f"got {len(request.node_name)} characters")
    if kind == "kubernetes_node_json":
        try:
            node = node_json.parse_node_json(request.kubernetes_node_json, vendors)
        except InvalidInputError as error:
            found.extend(error)
        found.raise_if_any()
        return node_json.NodeRegistration(request.node_name or node.node_name, node.devices)
    if kind == "inventory":
        if not request.node_name:
            found.add("node_name", "must not be empty with an inventory")
        try:
            devices = devices_from_inventory_pb(request.inventory)
        except InvalidInputError as error:
            found.extend(error)
            devices = ()
        found.raise_if_any()
        return node_json.NodeRegistration(request.node_name, devices)
    raise InvalidInputError.single(
        "node_source", "one of kubernetes_node_json or inventory is required"
    )


def saturated(value: int, high: int = limits.INT64_MAX) -> int:
    """A total over many pods as its wire field can carry it: at most ``high``.

    Every stored quantity is bounded (accounting.limits' maxima), so one pod's numbers always
    fit; a node's or a namespace's total over pods is bounded only by how many pods there are,
    and is reported saturated rather than failing the whole answer with INTERNAL. Saturating
    is the safe side: a total at the maximum leaves no room, so nothing more fits or passes.
    """
    return value if value <= high else high


def device_state_to_pb(state: DeviceState) -> types_pb2.DeviceState:
    extras = _device_extras(state.device)
    if state.mig_in_use:
        extras["mig_in_use"] = [mig_placement_to_pb(p) for p in state.mig_in_use]
    return types_pb2.DeviceState(
        **_to_wire(state.device, _DEVICE_FIELDS),
        # Totals over pods are saturated at the wire field's maximum (never wrapped).
        memory_used_mib=saturated(state.memory_used_mib),
        cores_used=saturated(state.core_percent_used, limits.INT32_MAX),
        slots_used=saturated(state.slots_used, limits.INT32_MAX),
        **extras,
    )


def device_state_from_pb(pb: types_pb2.DeviceState) -> DeviceState:
    """The inverse of ``device_state_to_pb``, for clients of GetNodeUsage/WatchUsage."""
    fields = _from_wire(pb, _DEVICE_STATE_FIELDS)
    if pb.mig_in_use:
        fields["mig_in_use"] = tuple(mig_placement_from_pb(p) for p in pb.mig_in_use)
    return DeviceState(device_from_pb(pb), **fields)


def node_usage_to_pb(
    node_name: str, states: Iterable[DeviceState], pod_uids: Iterable[str]
) -> types_pb2.NodeUsage:
    return types_pb2.NodeUsage(
        node_name=node_name,
        devices=[device_state_to_pb(state) for state in states],
        pod_uids=list(pod_uids),
    )


def quota_item_to_pb(item: QuotaItem) -> types_pb2.QuotaItem:
    fields = _to_wire(item, _QUOTA_ITEM_FIELDS)
    fields["used"] = saturated(item.used)
    return types_pb2.QuotaItem(**fields)


def quota_item_from_pb(pb: types_pb2.QuotaItem) -> QuotaItem:
    return QuotaItem(**_from_wire(pb, _QUOTA_ITEM_FIELDS))


# -- the accounting policy ---------------------------------------------------------------------

_VENDOR_POLICY_FIELDS = _same(
    "vendor",
    "count_resource",
    "memory_resource",
    "memory_percentage_resource",
    "core_resource",
    "memory_factor",
    "default_memory_mib",
    "default_core_percent",
    "default_gpu_count",
)


def policy_to_pb(policy: AccountingPolicy) -> types_pb2.AccountingPolicy:
    return types_pb2.AccountingPolicy(
        policy_id=policy.policy_id,
        vendors=[
            types_pb2.VendorPolicy(**_to_wire(v, _VENDOR_POLICY_FIELDS))
            for v in policy.vendors
        ],
        enforce_gpu_count=policy.enforce_gpu_count,
    )


def policy_from_pb(pb: types_pb2.AccountingPolicy, path: str = "policy") -> AccountingPolicy:
    """The recorder's policy as it published it, checked like any input.

    Raises:
        InvalidInputError: a policy the rules cannot run under (no vendor, a factor out of
            range...), or one whose content does not match its ``policy_id``.
    """
    try:
        policy = AccountingPolicy(
            tuple(
                VendorResources(**_from_wire(v, _VENDOR_POLICY_FIELDS))
                for v in pb.vendors
            ),
            enforce_gpu_count=pb.enforce_gpu_count,
        )
    except InvalidInputError as error:
        found = Violations()
        found.extend(error, f"{path}.")
        found.raise_if_any()
        raise
    if pb.policy_id and pb.policy_id != policy.policy_id:
        raise InvalidInputError.single(
            f"{path}.policy_id",
            f"{pb.policy_id} does not match the policy's content ({policy.policy_id})",
        )
    return policy
