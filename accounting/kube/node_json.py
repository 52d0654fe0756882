"""Reads a Kubernetes Node (as decoded JSON) into the devices HAMi registered on it.

Layer: accounting (pure). Each vendor of the policy says where its devices are written
(``VendorSpec.devices``): a register annotation in HAMi's JSON form (NVIDIA's
``hami.io/node-nvidia-register`` and most others), the older ``:``-separated form (Hygon,
Iluvatar), Metax sGPU's and Enflame DRS's own JSON, or nothing at all, the devices then being
made up from ``status.capacity`` the way HAMi does (Cambricon, Metax GPU, Moore Threads, Enflame
GCU, Kunlun, AWS Neuron). A node with none of them simply has no HAMi devices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from accounting import hami_codec, numbers, pair_scores
from accounting.annotations import DEVICE_CORDON_ANNOTATION, NODE_PAIR_SCORE_ANNOTATION
from accounting.errors import InvalidInputError, Violations
from accounting.kube import quantity
from accounting.limits import INT32_MAX, MAX_DEVICES_PER_NODE, MAX_NODE_NAME_CHARS
from accounting.model import CORDONED_INFO, Device
from accounting.quoting import json_kind, quote
from accounting.received_json import bounded_json_array, decode_json, json_object
from accounting.validate import (
    WIRE_SEPARATORS,
    check_device_id,
    check_integer_text,
    check_json_integer,
)
from accounting.vendor_data import (
    ASCEND_SOFT_SPLIT_INFO,
    AWS_INSTANCE_TYPE_INFO,
    DRS_PROFILE_NAME,
    DRS_PROFILES_INFO,
    PAIR_SCORES_INFO,
)
from accounting.vendor_spec import CapacityDevices, DeviceSource, VendorSpec
from accounting.vendors import VendorResources, specs_for

ASCEND_SOFT_SPLIT_ANNOTATION = "hami-vnpu-core"
"""Node annotation: ``"true"`` when the node's Ascend NPUs support hami-core (soft split)."""


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """A node's name and the devices registered on it: each vendor's in registration order,
    vendors in policy order."""

    node_name: str
    devices: tuple[Device, ...] = ()


def parse_node_json(
    raw: bytes | str,
    vendors: Sequence[VendorResources],
    *,
    path: str = "kubernetes_node_json",
) -> NodeRegistration:
    """Parses ``json.Marshal(node)`` output.

    Raises:
        InvalidInputError: not a JSON object, or any problem ``parse_node`` finds.
    """
    return parse_node(json_object(raw, path), vendors, path=path)


def parse_node(
    obj: Mapping[str, Any],
    vendors: Sequence[VendorResources],
    *,
    path: str = "",
) -> NodeRegistration:
    """Builds a ``NodeRegistration`` from a Kubernetes Node object, for the policy's vendors.

    Raises:
        InvalidInputError: a missing ``metadata.name`` and every problem of every vendor's
            devices, together, each naming its annotation or capacity.
    """
    prefix = f"{path}." if path else ""
    found = Violations()
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        found.add(f"{prefix}metadata.name", "must be a non-empty string")
        name = ""
    elif len(name) > MAX_NODE_NAME_CHARS:
        # Device ids are made from it (capacity vendors, Enflame DRS).
        found.add(f"{prefix}metadata.name",
                  f"at most {MAX_NODE_NAME_CHARS} characters, got {len(name)} characters")
        name = ""
    annotations = metadata.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        found.add(f"{prefix}metadata.annotations", "must be an object")
        annotations = {}
    capacity = _capacity(obj, prefix, found)
    devices: list[Device] = []
    for spec in specs_for(vendors):
        try:
            devices.extend(
                _vendor_devices(spec, name, annotations or {}, capacity, obj, prefix)
            )
        except InvalidInputError as error:
            found.extend(error)
    if len(devices) > MAX_DEVICES_PER_NODE:
        found.add(f"{prefix}metadata.annotations",
                  f"at most {MAX_DEVICES_PER_NODE} devices per node, got {len(devices)}")
    seen: dict[str, str] = {}
    for device in devices:
        other = seen.setdefault(device.uuid, device.vendor)
        if other != device.vendor:
            found.add(f"{prefix}metadata.annotations",
                      f"device id {quote(device.uuid)} is registered by both {other} and "
                      f"{device.vendor}")
    found.raise_if_any()
    return NodeRegistration(node_name=name, devices=tuple(devices))


def registration_key(
    obj: Mapping[str, Any], vendors: Sequence[VendorResources]
) -> str:
    """Everything of a Node the devices are read from, as one string: a node update whose key
    did not change cannot have changed its inventory (nodes are updated every few seconds)."""
    metadata = obj.get("metadata")
    annotations = _object(metadata, "annotations")
    labels = _object(metadata, "labels")
    extras = [
        annotations.get(ASCEND_SOFT_SPLIT_ANNOTATION),
        labels.get(AWS_INSTANCE_TYPE_LABEL),
        annotations.get(DEVICE_CORDON_ANNOTATION),
        annotations.get(NODE_PAIR_SCORE_ANNOTATION),
    ]
    return json.dumps([*_sources(obj, vendors), *extras], separators=(",", ":"), default=str)


def has_devices(
    obj: Mapping[str, Any], vendors: Sequence[VendorResources]
) -> bool:
    """Whether the Node carries anything one of the vendors' devices are read from."""
    return any(part is not None for part in _sources(obj, vendors))


def _object(parent: object, key: str) -> Mapping[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


def _sources(obj: Mapping[str, Any], vendors: Sequence[VendorResources]) -> list[object]:
    """Per vendor, the register annotation's value, or the capacities devices are made up
    from (None where absent)."""
    annotations = _object(obj.get("metadata"), "annotations")
    capacity = _object(obj.get("status"), "capacity")
    parts: list[object] = []
    for spec in specs_for(vendors):
        if spec.capacity is None:
            parts.append(annotations.get(spec.register_annotation))
            continue
        parts.append(capacity.get(spec.capacity.count_resource))
        for resource in (spec.capacity.memory_resource, spec.capacity.cores_per_device_resource):
            if resource and spec.capacity.count_resource in capacity:
                parts.append(capacity.get(resource))
    return parts


AWS_INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The node label AWS Neuron's fit reads (``inf*`` instances place devices freely)."""


def _capacity(obj: Mapping[str, Any], prefix: str, found: Violations) -> Mapping[str, Any]:
    status = obj.get("status")
    if status is None:
        return {}
    if not isinstance(status, dict):
        found.add(f"{prefix}status", f"must be an object, got {json_kind(status)}")
        return {}
    capacity = status.get("capacity")
    if capacity is None:
        return {}
    if not isinstance(capacity, dict):
        found.add(f"{prefix}status.capacity", f"must be an object, got {json_kind(capacity)}")
        return {}
    return capacity


def _vendor_devices(
    spec: VendorSpec,
    node_name: str,
    annotations: Mapping[str, Any],
    capacity: Mapping[str, Any],
    obj: Mapping[str, Any],
    prefix: str,
) -> tuple[Device, ...]:
    source = spec.devices
    if source is DeviceSource.CAPACITY:
        assert spec.capacity is not None
        return _capacity_devices(spec, spec.capacity, node_name, capacity, obj, prefix)
    value = annotations.get(spec.register_annotation)
    if value is None:
        return ()
    path = f"{prefix}metadata.annotations[{quote(spec.register_annotation)}]"
    if not isinstance(value, str):
        raise InvalidInputError.single(path, "must be a string")
    if source is DeviceSource.REGISTER_LEGACY:
        return hami_codec.decode_legacy_register(value, path=path, vendor=spec.vendor)
    if source is DeviceSource.METAX_SGPU:
        return _metax_devices(spec, value, path)
    if source is DeviceSource.ENFLAME_DRS:
        return _enflame_devices(spec, value, node_name, path, prefix)
    devices = hami_codec.decode_node_register(value, path=path, vendor=spec.vendor)
    if spec.rule == "nvidia":
        devices = _with_cordon(devices, annotations.get(DEVICE_CORDON_ANNOTATION), prefix)
        devices = _with_pair_scores(
            devices, annotations.get(NODE_PAIR_SCORE_ANNOTATION), prefix
        )
    if spec.rule == "ascend":
        soft_split = annotations.get(ASCEND_SOFT_SPLIT_ANNOTATION) == "true"
        devices = tuple(
            _with_info(device, ASCEND_SOFT_SPLIT_INFO, "true" if soft_split else "false")
            for device in devices
        )
    return devices


def cordoned_uuids(value: str) -> frozenset[str]:
    """The UUIDs of ``hami.io/device-cordon``: split at commas, each trimmed, empty ones
    ignored (HAMi's reading; a UUID of no card of the node cordons nothing)."""
    return frozenset(part.strip() for part in value.split(",")) - {""}


def _with_cordon(devices: tuple[Device, ...], value: object, prefix: str) -> tuple[Device, ...]:
    """The NVIDIA devices with ``CORDONED_INFO`` set on those the annotation names and on no
    other (HAMi cordons NVIDIA cards only)."""
    if value is None:
        cordoned: frozenset[str] = frozenset()
    elif isinstance(value, str):
        cordoned = cordoned_uuids(value)
    else:
        raise InvalidInputError.single(
            f"{prefix}metadata.annotations[{quote(DEVICE_CORDON_ANNOTATION)}]", "must be a string"
        )
    if not cordoned and not any(device.info(CORDONED_INFO) is not None for device in devices):
        return devices
    marked = []
    for device in devices:
        pairs = dict(device.custom_info)
        pairs.pop(CORDONED_INFO, None)
        if device.uuid in cordoned:
            pairs[CORDONED_INFO] = "true"
        marked.append(replace(device, custom_info=tuple(sorted(pairs.items()))))
    return tuple(marked)


def _with_pair_scores(
    devices: tuple[Device, ...], value: object, prefix: str
) -> tuple[Device, ...]:
    """The NVIDIA devices each with its pair scores of ``hami.io/node-nvidia-score``
    (``PAIR_SCORES_INFO``, set on no other): only the scores with the node's own cards, the only
    ones the topology-aware policy looks up.

    Raises:
        InvalidInputError: naming the annotation, for a value HAMi's ``DecodePairScores``
            refuses (HAMi's node then offers no NVIDIA device; here the node's devices do not
            read, as with a register annotation that does not).
    """
    path = f"{prefix}metadata.annotations[{quote(NODE_PAIR_SCORE_ANNOTATION)}]"
    if value is None:
        scores: dict[str, dict[str, int]] = {}
    elif isinstance(value, str):
        scores = pair_scores.decode_pair_scores(value, path)
    else:
        raise InvalidInputError.single(path, "must be a string")
    if not scores and not any(device.info(PAIR_SCORES_INFO) is not None for device in devices):
        return devices
    uuids = {device.uuid for device in devices}
    scored = []
    for device in devices:
        pairs = dict(device.custom_info)
        pairs.pop(PAIR_SCORES_INFO, None)
        mine = {other: n for other, n in scores.get(device.uuid, {}).items() if other in uuids}
        if any(mine.values()):
            pairs[PAIR_SCORES_INFO] = pair_scores.encode_card_scores(mine)
        scored.append(replace(device, custom_info=tuple(sorted(pairs.items()))))
    return tuple(scored)


def _with_info(device: Device, key: str, value: str) -> Device:
    pairs = dict(device.custom_info)
    pairs[key] = value
    return replace(device, custom_info=tuple(sorted(pairs.items())))


def _capacity_count(
    capacity: Mapping[str, Any], resource: str, prefix: str
) -> int:
    if resource not in capacity:
        return 0
    path = f"{prefix}status.capacity[{quote(resource)}]"
    try:
        value = quantity.parse_quantity(capacity[resource])
    except quantity.QuantityError as error:
        raise InvalidInputError.single(path, str(error)) from None
    count = numbers.whole_decimal(value, 0, INT32_MAX)
    if count is None:
        raise InvalidInputError.single(
            path, f"must be a whole number between 0 and {INT32_MAX}, got "
                  f"{quantity.describe(value)}"
        )
    return count


def _check_id_maker(node_name: str, prefix: str) -> None:
    """Device ids ``<node>-<word>-<i>`` are made from the node's name: it must not hold what
    separates them in the allocation annotations (its length is bounded already)."""
    found = Violations()
    check_device_id(found, f"{prefix}metadata", "name", node_name)
    if found:
        raise InvalidInputError.single(
            f"{prefix}metadata.name",
            f"device ids are made from it, so it must not contain any of {WIRE_SEPARATORS!r}, "
            f"got {quote(node_name)}",
        )


def _capacity_devices(
    spec: VendorSpec,
    rule: CapacityDevices,
    node_name: str,
    capacity: Mapping[str, Any],
    obj: Mapping[str, Any],
    prefix: str,
) -> tuple[Device, ...]:
    """HAMi's ``GetNodeDevices`` for vendors without a register annotation: one device per
    ``units_per_device`` of the counting capacity, ids ``<node>-<word>-<i>``."""
    units = _capacity_count(capacity, rule.count_resource, prefix)
    if not units:
        return ()
    _check_id_maker(node_name, prefix)
    count = -(-units // rule.units_per_device)
    if count > MAX_DEVICES_PER_NODE:
        raise InvalidInputError.single(
            f"{prefix}status.capacity[{quote(rule.count_resource)}]",
            f"{units} makes {count} devices, at most {MAX_DEVICES_PER_NODE} per node",
        )
    memory_mib = rule.memory_mib
    if rule.memory_resource:
        total = _capacity_count(capacity, rule.memory_resource, prefix)
        # HAMi: memory capacity × unit × units per device / counting capacity, per device.
        memory_mib = min(
            total * spec.resources.memory_factor * rule.units_per_device // units, INT32_MAX
        )
    slots, core_total = rule.slots, rule.core_total
    info: tuple[tuple[str, str], ...] = ()
    if rule.cores_per_device_resource:
        cores = _capacity_count(capacity, rule.cores_per_device_resource, prefix) // units
        slots, core_total = cores, (1 << min(cores, 30)) - 1
        metadata = obj.get("metadata")
        labels = metadata.get("labels") if isinstance(metadata, dict) else None
        instance = labels.get(AWS_INSTANCE_TYPE_LABEL) if isinstance(labels, dict) else None
        info = ((AWS_INSTANCE_TYPE_INFO, instance if isinstance(instance, str) else ""),)
    return tuple(
        Device(
            uuid=f"{node_name}-{rule.id_word}-{index}",
            model=spec.vendor,
            index=index,
            slots_total=slots,
            memory_total_mib=memory_mib,
            core_percent_total=core_total,
            numa=1 if rule.second_half_numa and index >= count // 2 else 0,
            vendor=spec.vendor,
            custom_info=info,
        )
        for index in range(count)
    )


def _metax_devices(spec: VendorSpec, value: str, path: str) -> tuple[Device, ...]:
    """Metax's ``metax-tech.com/node-gpu-devices``: ``[{"uuid", "totalDevCount",
    "totalCompute", "totalVRam", "numa", "healthy", "qosPolicy", "model", "linkZone"}]``."""
    document = _json_array(value, path)
    found = Violations()
    devices: list[Device] = []
    first_index: dict[str, int] = {}
    for index, element in enumerate(document):
        entry = f"{path}[{index}]"
        if not isinstance(element, dict):
            found.add(entry, f"must be an object, got {json_kind(element)}")
            continue
        fields = {key.lower(): item for key, item in element.items()}
        before = len(found)
        uuid = fields.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            found.add(f"{entry}.uuid", "must be a non-empty string")
        else:
            check_device_id(found, entry, "uuid", uuid)
        totals = [
            check_json_integer(found, f"{entry}.{wire}", fields.get(key, 0))
            for key, wire in (
                ("totaldevcount", "totalDevCount"),
                ("totalvram", "totalVRam"),
                ("totalcompute", "totalCompute"),
                ("numa", "numa"),
                ("linkzone", "linkZone"),
            )
        ]
        healthy = fields.get("healthy", False)
        if not isinstance(healthy, bool):
            found.add(f"{entry}.healthy", f"must be true or false, got {json_kind(healthy)}")
        qos = fields.get("qospolicy", "")
        model = fields.get("model", "")
        if len(found) != before:
            continue
        assert isinstance(uuid, str)
        first = first_index.setdefault(uuid, index)
        if first != index:
            found.add(f"{entry}.uuid", f"duplicate device uuid {quote(uuid)}, also {path}[{first}]")
            continue
        slots, memory_mib, cores, numa, link_zone = (number or 0 for number in totals)
        devices.append(
            Device(
                uuid=uuid,
                model=spec.vendor,
                index=index,
                slots_total=slots,
                memory_total_mib=memory_mib,
                core_percent_total=cores,
                numa=numa,
                mode="",
                healthy=bool(healthy),
                vendor=spec.vendor,
                custom_info=(
                    ("LinkZone", str(link_zone)),
                    ("Model", model if isinstance(model, str) else ""),
                    ("QosPolicy", qos if isinstance(qos, str) else ""),
                ),
            )
        )
    found.raise_if_any()
    return tuple(devices)


def _enflame_devices(
    spec: VendorSpec, value: str, node_name: str, path: str, prefix: str
) -> tuple[Device, ...]:
    """Enflame's ``enflame.com/gcu-drs-capacity``: ``{"devices": [{"index", "minor",
    "capacity"}], "profiles": {"<slices>g.<GB>gb": "<id>"}}``; each device offers every
    profile, with ``capacity`` slices and the largest profile's memory."""
    document = decode_json(value, path, invalid="must be a JSON object with devices and profiles")
    if not isinstance(document, dict):
        raise InvalidInputError.single(path, f"must be a JSON object, got {json_kind(document)}")
    profiles = document.get("profiles")
    if not isinstance(profiles, dict):
        raise InvalidInputError.single(f"{path}.profiles", "must be an object of profiles")
    found = Violations()
    shapes = _drs_shapes(profiles, f"{path}.profiles", found)
    found.raise_if_any()
    slices = [size for size, _ in shapes]
    gigabytes = [memory_gb for _, memory_gb in shapes]
    if not slices or max(slices) <= 0:
        raise InvalidInputError.single(f"{path}.profiles", "no valid <slices>g.<GB>gb profile")
    max_gb = max(gigabytes) or max(slices)
    if max_gb > _MAX_DRS_GB:
        raise InvalidInputError.single(
            f"{path}.profiles", f"a device of {max_gb} GB is more than a device may hold "
                                f"(at most {_MAX_DRS_GB} GB, {INT32_MAX} MiB)"
        )
    entries = document.get("devices")
    if not isinstance(entries, list):
        raise InvalidInputError.single(f"{path}.devices", "must be an array of devices")
    if len(entries) > MAX_DEVICES_PER_NODE:
        raise InvalidInputError.single(
            f"{path}.devices", f"at most {MAX_DEVICES_PER_NODE} devices, got {len(entries)}"
        )
    devices: list[Device] = []
    first_position: dict[int, int] = {}
    encoded_profiles = json.dumps(
        {str(k): str(v) for k, v in sorted(profiles.items())}, separators=(",", ":")
    )
    if entries:
        _check_id_maker(node_name, prefix)
    for position, entry in enumerate(entries):
        entry_path = f"{path}.devices[{position}]"
        if not isinstance(entry, dict):
            found.add(entry_path, f"must be an object, got {json_kind(entry)}")
            continue
        raw_index = entry.get("index")
        # HAMi's strconv.Atoi: an index that does not read is the device's position.
        written = numbers.decimal_integer(raw_index) if isinstance(raw_index, str) else None
        index = position if written is None else written
        if not 0 <= index <= INT32_MAX:
            found.add(f"{entry_path}.index", f"must be between 0 and {INT32_MAX}, got {index}")
            continue
        capacity = entry.get("capacity")
        if isinstance(capacity, str):
            capacity = check_integer_text(found, f"{entry_path}.capacity", capacity, low=1)
            if capacity is None:
                continue
        elif check_json_integer(found, f"{entry_path}.capacity", capacity, low=1) is None:
            continue
        assert isinstance(capacity, int)
        first = first_position.setdefault(index, position)
        if first != position:
            found.add(f"{entry_path}.index",
                      f"duplicate device index {index}, also {path}.devices[{first}]")
            continue
        devices.append(
            Device(
                uuid=f"{node_name}-enflame-drs-{index}",
                model=spec.vendor,
                index=index,
                slots_total=capacity,
                memory_total_mib=max_gb * 1024,
                core_percent_total=100,
                vendor=spec.vendor,
                custom_info=(
                    ("maxSlice", str(max(slices))),
                    ("minor", str(entry.get("minor") or index)),
                    (DRS_PROFILES_INFO, encoded_profiles),
                ),
            )
        )
    found.raise_if_any()
    return tuple(devices)


_MAX_DRS_GB = INT32_MAX // 1024
"""The most GB a DRS profile may give a device: its memory in MiB is an int32."""


def _drs_shapes(
    profiles: Mapping[str, Any], path: str, found: Violations
) -> list[tuple[int, int]]:
    """(slices, GB) of every profile named ``<slices>g.<GB>gb``; other names are skipped, as
    HAMi's ``parseProfile`` reads them as nothing, and numbers beyond int32 are refused."""
    shapes: list[tuple[int, int]] = []
    for name in profiles:
        shape = DRS_PROFILE_NAME.fullmatch(str(name))
        if shape is None:
            continue
        size = check_integer_text(found, f"{path}[{quote(str(name))}]", shape.group(1))
        memory_gb = check_integer_text(found, f"{path}[{quote(str(name))}]", shape.group(2))
        if size is not None and memory_gb is not None:
            shapes.append((size, memory_gb))
    return shapes


def _json_array(value: str, path: str) -> list[Any]:
    document = decode_json(value, path, invalid="must be a JSON array of devices")
    if document is None:
        return []
    document = bounded_json_array(
        document, path, items="devices", noun="devices", limit=MAX_DEVICES_PER_NODE
    )
    return document
