"""HAMi's annotation wire formats, byte-compatible with HAMi's Go readers and writers.

Layer: accounting (pure). Two formats live here:

* ``hami.io/vgpu-devices-allocated``: ``UUID,TYPE,MEMORY_MIB,CORE_PERCENT[,SLOTS]:`` per device,
  ``;`` per container position (init containers first, in declaration order). A container
  without a device still writes its ``;``: HAMi v2.10.0 forgot that on model-typed nodes
  (HAMi #2899) and shifted every later container onto the wrong GPU. The optional fifth field
  carries the slot count of a collapsed entry and is written only when it is above 1,
  so raw NVIDIA grants stay in the four-field form every HAMi version reads.
* ``hami.io/node-nvidia-register``: the JSON array of DeviceInfo the device plugin writes.

The annotation keys live in ``accounting.annotations``. Decoders collect every problem and
raise one ``InvalidInputError`` whose paths point into the annotation, e.g.
``annotations["hami.io/vgpu-devices-allocated"][1][0]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from accounting import mig, numbers
from accounting.annotations import (
    DEVICES_ALLOCATED_ANNOTATION,
    NODE_REGISTER_ANNOTATION,
)
from accounting.errors import InvalidInputError, Violations
from accounting.limits import INT32_MAX, INT32_MIN, MAX_DEVICES_PER_NODE, MAX_GRANT_SLOTS
from accounting.model import DEFAULT_DEVICE_MODE, Device, DeviceGrant
from accounting.quoting import json_kind, quote
from accounting.received_json import bounded_json_array, decode_json
from accounting.validate import (
    REGISTER_MIG_FIELDS,
    check_device_id,
    check_integer_text,
    check_json_integer,
    check_mig_profiles,
    check_wire_text,
)
from accounting.vendors import NVIDIA

_ALLOCATED_PATH = f'annotations["{DEVICES_ALLOCATED_ANNOTATION}"]'
_REGISTER_PATH = f'annotations["{NODE_REGISTER_ANNOTATION}"]'
_GRANT_SHAPE = "UUID,TYPE,MEMORY_MIB,CORE_PERCENT[,SLOTS]"

PodDevices = tuple[tuple[DeviceGrant, ...], ...]
"""Grants per container position."""


def encode_pod_devices(per_container: Sequence[Sequence[DeviceGrant]]) -> str:
    """Writes grants per container position as HAMi's vgpu-devices-allocated value.

    Args:
        per_container: one entry per container position, init containers first; an empty
            entry for a container without a device.

    Returns:
        The annotation value; "" for an empty sequence (HAMi writes nothing then).

    Raises:
        InvalidInputError: a UUID or type that would break the format (empty, or holding
            ``,`` ``:`` ``;``), or a number outside what HAMi's int32 fields hold.
    """
    found = Violations()
    for position, grants in enumerate(per_container):
        for index, grant in enumerate(grants):
            path = f"grants[{position}][{index}]"
            check_wire_text(found, path, "uuid", grant.uuid, required=True)
            check_wire_text(found, path, "device_type", grant.vendor, required=False)
            for name, value in (
                ("memory_mib", grant.memory_mib),
                ("core_percent", grant.core_percent),
                ("slots", grant.slots),
            ):
                if not 0 <= value <= INT32_MAX:
                    found.add(f"{path}.{name}", f"must be between 0 and {INT32_MAX}, got {value}")
    found.raise_if_any()
    return "".join(
        "".join(_encode_grant(grant) for grant in grants) + ";" for grants in per_container
    )


def _encode_grant(grant: DeviceGrant) -> str:
    fields = f"{grant.uuid},{grant.vendor},{grant.memory_mib},{grant.core_percent}"
    # Only collapsed entries carry slots; a raw grant keeps HAMi's four fields.
    if grant.slots > 1:
        fields += f",{grant.slots}"
    return fields + ":"


def decode_pod_devices(value: str, *, path: str = _ALLOCATED_PATH) -> PodDevices:
    """Reads a vgpu-devices-allocated value the way HAMi does, position for position.

    Every ``;``-separated piece is one entry, so a well-formed value (which ends in ``;``)
    decodes to one more entry than the pod has containers, the last one empty; ``""`` decodes
    to one empty entry. Empty ``:`` pieces are skipped, as in HAMi.

    Raises:
        InvalidInputError: naming every malformed device entry, e.g.
            ``annotations["hami.io/vgpu-devices-allocated"][1][0]: expected
            UUID,TYPE,MEMORY_MIB,CORE_PERCENT[,SLOTS], got "uuid,type,100"``.
    """
    found = Violations()
    entries = _decode_entries(value, path, found)
    found.raise_if_any()
    return entries


def decode_container_grants(
    value: str, container_count: int, *, path: str = _ALLOCATED_PATH, core_max: int = 100
) -> PodDevices:
    """Reads a vgpu-devices-allocated value aligned to exactly ``container_count`` positions.

    The empty entry after the final ``;`` is dropped, a value missing its final ``;`` is
    accepted, and positions the value does not reach are empty (no device).

    Raises:
        InvalidInputError: malformed entries, and any device at a position the pod does not
            have ("grant for container position 3 but the pod has 3 containers").
    """
    found = Violations()
    entries = _decode_entries(value, path, found, core_max)
    for position in range(container_count, len(entries)):
        if entries[position]:
            found.add(
                f"{path}[{position}]",
                f"grant for container position {position} "
                f"but the pod has {container_count} containers",
            )
    found.raise_if_any()
    aligned = entries[:container_count]
    return aligned + ((),) * (container_count - len(aligned))


def grant_places(value: str) -> tuple[tuple[int, ...], ...]:
    """Where each grant of a vgpu-devices-allocated value is written: per ``;`` position, the
    index of each non-empty ``:`` piece (empty pieces are skipped but keep their index), the
    ``[position][index]`` of the decoders' paths."""
    return tuple(
        tuple(index for index, item in enumerate(piece.split(":")) if item)
        for piece in value.split(";")
    )


def _decode_entries(
    value: str, path: str, found: Violations, core_max: int = 100
) -> PodDevices:
    entries: list[tuple[DeviceGrant, ...]] = []
    for position, piece in enumerate(value.split(";")):
        grants: list[DeviceGrant] = []
        for index, item in enumerate(piece.split(":")):
            if not item:
                continue
            grant = _decode_grant(item, f"{path}[{position}][{index}]", found, core_max)
            if grant is not None:
                grants.append(grant)
        entries.append(tuple(grants))
    return tuple(entries)


def _decode_grant(
    item: str, path: str, found: Violations, core_max: int = 100
) -> DeviceGrant | None:
    fields = item.split(",")
    if len(fields) not in (4, 5):
        found.add(path, f"expected {_GRANT_SHAPE}, got {quote(item)}")
        return None
    uuid, vendor = fields[0], fields[1]
    problems_before = len(found)
    # Splitting took the separators out already: only emptiness and length are left to check.
    check_device_id(found, path, "uuid", uuid)
    memory_mib = check_integer_text(found, f"{path}.memory_mib", fields[2])
    # Percent for most vendors; compute units (AMD) and core masks (AWS Neuron) go higher.
    core_percent = check_integer_text(
        found, f"{path}.core_percent", fields[3], high=core_max or INT32_MAX
    )
    slots = (
        check_integer_text(found, f"{path}.slots", fields[4], high=MAX_GRANT_SLOTS)
        if len(fields) == 5
        else 0
    )
    if memory_mib is None or core_percent is None or slots is None:
        return None
    if len(found) != problems_before:
        return None
    return DeviceGrant(uuid, vendor, memory_mib, core_percent, slots)


def decode_node_register(
    value: str, *, path: str = _REGISTER_PATH, vendor: str = NVIDIA
) -> tuple[Device, ...]:
    """Reads a register annotation in HAMi's JSON form (hami.io/node-nvidia-register and the
    other vendors' ``hami.io/node-register-*``): the array of DeviceInfo HAMi writes at v2.10.

    Keys match in any case, as with Go's decoder (HAMi's Ascend tests write ``"ID"``). Go omits
    zero values, so a missing ``index``, ``numa``, ``count``, ``devmem`` or ``devcore`` is 0, a
    missing ``health`` is false and a missing ``mode`` is hami-core. ``migProfiles`` and
    ``custominfo`` are kept; other keys are ignored; JSON ``null`` is no devices, like Go's
    decoder. Every device gets ``vendor``, the vendor whose annotation it is.

    Raises:
        InvalidInputError: invalid JSON (the legacy comma format included: HAMi's NVIDIA
            reader dropped it), wrong types or ranges, and duplicate ids, e.g.
            ``annotations["hami.io/node-nvidia-register"][2].devmem: must be a non-negative
            integer``.
    """
    document = decode_json(value, path, invalid=lambda error: _json_error_message(value, error))
    if document is None:
        return ()
    document = bounded_json_array(
        document, path, items="devices", noun="devices", limit=MAX_DEVICES_PER_NODE
    )
    found = Violations()
    devices: list[Device] = []
    first_index: dict[str, int] = {}
    for index, element in enumerate(document):
        device = _decode_device(element, f"{path}[{index}]", found, vendor)
        if device is None:
            continue
        first = first_index.setdefault(device.uuid, index)
        if first != index:
            found.add(
                f"{path}[{index}].id",
                f"duplicate device id {quote(device.uuid)}, also {path}[{first}]",
            )
        devices.append(device)
    found.raise_if_any()
    return tuple(devices)


def _json_error_message(value: str, error: ValueError) -> str:
    if not value.strip():
        return "must be a JSON array of devices, got an empty value"
    if not value.lstrip().startswith(("[", "{", "null")) and "," in value:
        return (
            "must be a JSON array of devices; the legacy comma format "
            "(id,count,devmem,devcore,type,numa,health:) is not accepted for NVIDIA"
        )
    return f"must be a JSON array of devices, not valid JSON ({error})"


def _decode_device(element: object, path: str, found: Violations, vendor: str) -> Device | None:
    if not isinstance(element, dict):
        found.add(path, f"must be an object, got {json_kind(element)}")
        return None
    element = mig.go_fields(element)
    before = len(found)
    uuid = _json_str(element, "id", path, found)
    if isinstance(element.get("id", ""), str):
        check_device_id(found, path, "id", uuid)
    device = Device(
        uuid=uuid,
        model=_json_str(element, "type", path, found),
        index=_json_int(element, "index", path, found),
        slots_total=_json_int(element, "count", path, found),
        memory_total_mib=_json_int(element, "devmem", path, found),
        core_percent_total=_json_int(element, "devcore", path, found),
        numa=_json_int(element, "numa", path, found, low=INT32_MIN),
        mode=_json_str(element, "mode", path, found) or DEFAULT_DEVICE_MODE,
        healthy=_json_bool(element, "health", path, found),
        vendor=vendor,
        mig_profiles=mig.decode_profiles(element.get("migprofiles"), f"{path}.migProfiles", found),
        custom_info=decode_custom_info(element.get("custominfo"), f"{path}.custominfo", found),
    )
    if len(found) == before:
        check_mig_profiles(found, device, f"{path}.migProfiles", REGISTER_MIG_FIELDS)
    return device if len(found) == before else None


def decode_custom_info(value: object, path: str, found: Violations) -> tuple[tuple[str, str], ...]:
    """HAMi's ``custominfo`` object as sorted (key, text) pairs: strings as they are, numbers
    and booleans as JSON writes them (``{"NetworkID": 1}`` gives ``("NetworkID", "1")``)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        found.add(path, f"must be an object, got {json_kind(value)}")
        return ()
    pairs: list[tuple[str, str]] = []
    for key, item in value.items():
        if isinstance(item, str):
            pairs.append((key, item))
        elif isinstance(item, Decimal):
            # Read exactly (accounting.numbers.json_loads): kept as written, not as a float.
            pairs.append((key, str(item)))
        elif isinstance(item, bool | int | float) or item is None:
            pairs.append((key, json.dumps(item)))
        # Nested objects and arrays mean nothing to the accounting: left out.
    return tuple(sorted(pairs))


def custom_info_int(text: str | None) -> int:
    """A number of a device's ``custom_info`` the way HAMi's ``readCustomInfoInt`` reads it:
    0 when absent or when it does not read (a typed inventory may come from any client)."""
    return numbers.decimal_integer((text or "").strip()) or 0


def custom_info_profiles(text: str | None) -> dict[str, str]:
    """The DRS profiles of a device's ``custom_info`` (JSON: name -> profile id), the way
    HAMi's ``parseProfilesFromCustomInfo`` reads them: anything but an object gives none, and
    an id that is not a string is left out."""
    try:
        listed = numbers.json_loads(text or "{}")
    except (ValueError, RecursionError):
        return {}
    if not isinstance(listed, dict):
        return {}
    return {name: profile_id for name, profile_id in listed.items() if isinstance(profile_id, str)}


_LEGACY_SHAPE = "id,count,devmem,devcore,type,numa,health[,index,mode]"


def decode_legacy_register(value: str, *, path: str, vendor: str) -> tuple[Device, ...]:
    """Reads a register annotation in HAMi's older ``:``-separated form, as HAMi's Hygon and
    Iluvatar backends still write it: ``id,count,devmem,devcore,type,numa,health[,index,
    mode]:`` per device (exactly 7 or 9 fields; empty pieces skipped; mode hami-core unless
    given).

    Raises:
        InvalidInputError: no ``:`` at all, a piece with another number of fields, a number
            or health that does not read, or a duplicate id, naming the piece.
    """
    if ":" not in value:
        raise InvalidInputError.single(
            path, f"must be {_LEGACY_SHAPE}: per device, got {quote(value)}"
        )
    found = Violations()
    devices: list[Device] = []
    first_index: dict[str, int] = {}
    pieces = [piece for piece in value.split(":") if piece]
    if len(pieces) > MAX_DEVICES_PER_NODE:
        raise InvalidInputError.single(
            path, f"at most {MAX_DEVICES_PER_NODE} devices, got {len(pieces)}"
        )
    for index, piece in enumerate(pieces):
        piece_path = f"{path}[{index}]"
        fields = piece.split(",")
        if len(fields) not in (7, 9):
            found.add(piece_path, f"expected {_LEGACY_SHAPE}, got {quote(piece)}")
            continue
        before = len(found)
        uuid = fields[0]
        check_device_id(found, piece_path, "id", uuid)
        totals = [
            check_integer_text(found, f"{piece_path}.{name}", text)
            for text, name in zip(fields[1:4], ("count", "devmem", "devcore"), strict=True)
        ]
        numa = check_integer_text(found, f"{piece_path}.numa", fields[5], low=INT32_MIN)
        health = fields[6].strip().lower()
        if health not in ("true", "false"):
            found.add(f"{piece_path}.health", f"must be true or false, got {quote(fields[6])}")
        device_index = (
            check_integer_text(found, f"{piece_path}.index", fields[7]) if len(fields) == 9 else 0
        )
        mode = (fields[8] if len(fields) == 9 else "") or DEFAULT_DEVICE_MODE
        if len(found) != before:
            continue
        assert numa is not None and device_index is not None
        slots_total, memory_total_mib, core_percent_total = (n or 0 for n in totals)
        first = first_index.setdefault(uuid, index)
        if first != index:
            found.add(
                f"{piece_path}.id", f"duplicate device id {quote(uuid)}, also {path}[{first}]"
            )
            continue
        devices.append(
            Device(
                uuid=uuid,
                model=fields[4],
                index=device_index,
                slots_total=slots_total,
                memory_total_mib=memory_total_mib,
                core_percent_total=core_percent_total,
                numa=numa,
                mode=mode,
                healthy=health == "true",
                vendor=vendor,
            )
        )
    found.raise_if_any()
    return tuple(devices)


def _json_int(
    element: Mapping[str, Any], key: str, path: str, found: Violations, low: int = 0
) -> int:
    value = element.get(key)
    if value is None:
        return 0
    return check_json_integer(found, f"{path}.{key}", value, low=low) or 0


def _json_str(element: Mapping[str, Any], key: str, path: str, found: Violations) -> str:
    value = element.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        found.add(f"{path}.{key}", f"must be a string, got {json_kind(value)}")
        return ""
    return value


def _json_bool(element: Mapping[str, Any], key: str, path: str, found: Violations) -> bool:
    value = element.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        found.add(f"{path}.{key}", f"must be true or false, got {json_kind(value)}")
        return False
    return value


def encode_node_register(devices: Sequence[Device]) -> str:
    """Writes devices as the device plugin does: compact JSON, zero values omitted.

    Keys follow Go's DeviceInfo order (id, index, count, devmem, devcore, type, numa, mode,
    migProfiles, health) and ``omitempty``, so a healthy device at index 0 has no ``index``
    key.
    """
    documents: list[dict[str, object]] = []
    for device in devices:
        document: dict[str, object] = {"id": device.uuid}
        for key, value in (
            ("index", device.index),
            ("count", device.slots_total),
            ("devmem", device.memory_total_mib),
            ("devcore", device.core_percent_total),
            ("type", device.model),
            ("numa", device.numa),
            ("mode", device.mode),
            ("migProfiles", mig.encode_profiles(device.mig_profiles)),
            ("health", device.healthy),
        ):
            if value:
                document[key] = value
        if not device.uuid:
            del document["id"]
        documents.append(document)
    text = json.dumps(documents, separators=(",", ":"), ensure_ascii=False)
    # Go's encoder escapes these inside strings; outside strings they never occur in JSON.
    for character, escaped in _GO_ESCAPES.items():
        text = text.replace(character, escaped)
    return text


_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
