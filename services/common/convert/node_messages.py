"""Nodes and devices between hami.accounting.v1 and accounting.model: a device and its MIG
profiles, RegisterNode's node (typed inventory, or Kubernetes Node JSON read by
``accounting.kube.node_json``) in, validated; device states and node usage out, totals
saturated.

Layer: services (adapter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from accounting import limits, validate
from accounting.errors import InvalidInputError, Violations
from accounting.kube import node_json
from accounting.model import DEFAULT_DEVICE_MODE, Device, DeviceState, MigProfile
from accounting.vendors import NVIDIA, VendorResources
from hami.accounting.v1 import types_pb2, usage_pb2
from services.common.convert.grant_messages import mig_placement_from_pb, mig_placement_to_pb
from services.common.convert.wire_fields import from_wire, same_names, saturated, to_wire

_DEVICE_FIELDS = (
    ("model", "device_type"),
    ("core_percent_total", "cores_total"),
    *same_names(
        "uuid", "index", "slots_total", "memory_total_mib", "numa", "mode", "healthy", "vendor"
    ),
)

_DEVICE_STATE_FIELDS = (
    ("core_percent_used", "cores_used"),
    *same_names("memory_used_mib", "slots_used"),
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


def device_from_pb(pb: types_pb2.Device | types_pb2.DeviceState) -> Device:
    """A typed device (or the device of a DeviceState); an empty mode or vendor means HAMi's
    defaults (hami-core, NVIDIA)."""
    fields = from_wire(pb, _DEVICE_FIELDS)
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
    return types_pb2.Device(**to_wire(device, _DEVICE_FIELDS), **_device_extras(device))


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
    vendors: Sequence[VendorResources],
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


def device_state_to_pb(state: DeviceState) -> types_pb2.DeviceState:
    extras = _device_extras(state.device)
    if state.mig_in_use:
        extras["mig_in_use"] = [mig_placement_to_pb(p) for p in state.mig_in_use]
    return types_pb2.DeviceState(
        **to_wire(state.device, _DEVICE_FIELDS),
        # Totals over pods are saturated at the wire field's maximum (never wrapped).
        memory_used_mib=saturated(state.memory_used_mib),
        cores_used=saturated(state.core_percent_used, limits.INT32_MAX),
        slots_used=saturated(state.slots_used, limits.INT32_MAX),
        **extras,
    )


def device_state_from_pb(pb: types_pb2.DeviceState) -> DeviceState:
    """The inverse of ``device_state_to_pb``, for clients of GetNodeUsage/WatchUsage."""
    fields = from_wire(pb, _DEVICE_STATE_FIELDS)
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
