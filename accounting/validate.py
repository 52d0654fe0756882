"""Checks of received values: each field within its bounds, and whole domain values (a pod, a
node inventory) with every offending field at once, nothing changed.

Layer: accounting (pure). Adapters build a ``Pod`` or a device inventory from protobuf or from
Kubernetes JSON, then call ``validate_pod`` / ``validate_devices`` before handing the value to
the rules; the readers (``accounting.kube``, ``accounting.hami_codec``, ``accounting.mig``)
check each field as they read it with the checks here. Size limits (``accounting.limits``)
come first and stop the walk, so a huge repeated field is refused after one ``len()`` instead
of after checking every element.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accounting import numbers
from accounting import vendors as vendor_table
from accounting.errors import Violations
from accounting.limits import (
    INT32_MAX,
    INT32_MIN,
    MAX_ANNOTATIONS_BYTES,
    MAX_CONTAINERS,
    MAX_DEVICE_ID_CHARS,
    MAX_DEVICES_PER_CONTAINER,
    MAX_DEVICES_PER_NODE,
    MAX_GRANT_SLOTS,
    MAX_GRANTS_PER_CONTAINER,
    MAX_MIG_SLICES,
    MAX_NAMESPACE_CHARS,
    MAX_POD_NAME_CHARS,
    MAX_POD_UID_CHARS,
    MAX_REQUESTS_PER_CONTAINER,
    MAX_STATUSES,
)
from accounting.model import Container, ContainerStatus, Device, DeviceGrant, DeviceRequest, Pod
from accounting.quoting import quote, shown

WIRE_SEPARATORS = ",:;"
"""Characters that cannot appear in a UUID or type written into vgpu-devices-allocated."""
_NO_WIRE_SEPARATOR = re.compile(f"[^{re.escape(WIRE_SEPARATORS)}]*")
"""Matches a whole value free of separators (one C scan, for every grant of every request)."""


# The checks below take the object's path and the field's name apart and join them only to
# report a violation: valid input (nearly every call) then builds no path string at all.


def check_range(
    found: Violations,
    path: str,
    field: str,
    value: int,
    low: int = 0,
    high: int = INT32_MAX,
) -> None:
    """Adds a violation at ``path.field`` unless ``low <= value <= high``."""
    if not low <= value <= high:
        found.add(f"{path}.{field}", f"must be between {low} and {high}, got {value}")


def check_integer_text(
    found: Violations, path: str, text: str, low: int = 0, high: int = INT32_MAX
) -> int | None:
    """The integer a text field writes (``accounting.numbers.decimal_integer``: ASCII digits,
    an optional sign, at most ``MAX_INTEGER_DIGITS`` significant digits) when it is from ``low`` to
    ``high``; else a violation at ``path`` and None."""
    number = numbers.decimal_integer(text)
    if number is None:
        found.add(path, f"must be an integer between {low} and {high}, got {quote(text)}")
        return None
    if not low <= number <= high:
        found.add(path, f"must be between {low} and {high}, got {number}")
        return None
    return number


def check_json_integer(
    found: Violations, path: str, value: object, low: int = 0, high: int = INT32_MAX
) -> int | None:
    """A decoded JSON value that must be an integer from ``low`` to ``high`` (JSON ``true``,
    a Python int, is refused as Go's decoder refuses it); else a violation at ``path`` and
    None."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        found.add(path, f"must be an integer between {low} and {high}, got {shown(value)}")
        return None
    return value


def check_device_id(found: Violations, path: str, field: str, value: str) -> None:
    """A device id (UUID) at ``path.field``: not empty, free of the HAMi annotation's
    separators, at most ``MAX_DEVICE_ID_CHARS`` characters."""
    if len(value) > MAX_DEVICE_ID_CHARS:
        found.add(
            f"{path}.{field}",
            f"at most {MAX_DEVICE_ID_CHARS} characters, got {len(value)} characters",
        )
        return
    check_wire_text(found, path, field, value, required=True)


def check_wire_text(
    found: Violations, path: str, field: str, value: str, *, required: bool
) -> None:
    """A UUID or type (at ``path.field``) must fit between the separators of the HAMi pod
    annotation."""
    if required and not value:
        found.add(f"{path}.{field}", "must not be empty")
    elif not _NO_WIRE_SEPARATOR.fullmatch(value):
        found.add(
            f"{path}.{field}",
            f"must not contain any of {WIRE_SEPARATORS!r}, got {quote(value)}",
        )


def validate_pod(pod: Pod, path: str = "pod") -> None:
    """Checks a pod before the rules see it.

    Raises:
        InvalidInputError: naming every offending field, e.g.
            ``pod.containers[1].grants[0].memory_mib: must be between 0 and 2147483647, got -5``.
    """
    found = Violations()
    check_pod(found, pod, path)
    found.raise_if_any()


def validate_devices(devices: Sequence[Device], path: str = "devices") -> None:
    """Checks a node inventory: unique non-empty UUIDs, totals within 0..int32.

    Raises:
        InvalidInputError: naming every offending field, e.g. ``devices[1].uuid``.
    """
    found = Violations()
    check_devices(found, devices, path)
    found.raise_if_any()


def check_namespace(found: Violations, path: str, namespace: str) -> None:
    """Adds a problem of a namespace to ``found``: empty, or longer than a DNS label."""
    if not namespace:
        found.add(path, "must not be empty")
    elif len(namespace) > MAX_NAMESPACE_CHARS:
        found.add(path, f"at most {MAX_NAMESPACE_CHARS} characters (a Kubernetes namespace is "
                        f"a DNS label), got {len(namespace)}")


def check_pod(found: Violations, pod: Pod, path: str) -> None:
    """Adds every problem of ``pod`` to ``found``; for callers that merge other violations."""
    if not pod.uid:
        found.add(f"{path}.uid", "must not be empty")
    elif len(pod.uid) > MAX_POD_UID_CHARS:
        found.add(f"{path}.uid", f"at most {MAX_POD_UID_CHARS} characters, got {len(pod.uid)}")
    check_namespace(found, f"{path}.namespace", pod.namespace)
    if len(pod.name) > MAX_POD_NAME_CHARS:
        found.add(f"{path}.name", f"at most {MAX_POD_NAME_CHARS} characters (a pod's name is a "
                                  f"DNS subdomain), got {len(pod.name)}")
    check_annotations(found, pod.annotations, f"{path}.annotations")
    if len(pod.containers) > MAX_CONTAINERS:
        found.add(
            f"{path}.containers", f"at most {MAX_CONTAINERS} containers, got {len(pod.containers)}"
        )
    else:
        first_index: dict[str, int] = {}
        for index, container in enumerate(pod.containers):
            container_path = f"{path}.containers[{index}]"
            _check_container(found, container, container_path)
            if container.name in first_index:
                found.add(
                    f"{container_path}.name",
                    f"duplicate container name {quote(container.name)}, "
                    f"also {path}.containers[{first_index[container.name]}]",
                )
            elif container.name:
                first_index[container.name] = index
    _check_statuses(found, pod.init_container_statuses, f"{path}.init_container_statuses")
    _check_statuses(found, pod.container_statuses, f"{path}.container_statuses")


def check_devices(found: Violations, devices: Sequence[Device], path: str) -> None:
    """Adds every problem of a node inventory to ``found``."""
    if len(devices) > MAX_DEVICES_PER_NODE:
        found.add(path, f"at most {MAX_DEVICES_PER_NODE} devices, got {len(devices)}")
        return
    first_index: dict[str, int] = {}
    for index, device in enumerate(devices):
        device_path = f"{path}[{index}]"
        check_device_id(found, device_path, "uuid", device.uuid)
        first = first_index.setdefault(device.uuid, index)
        if device.uuid and first != index:
            found.add(
                f"{device_path}.uuid",
                f"duplicate device uuid {quote(device.uuid)}, also {path}[{first}]",
            )
        check_range(found, device_path, "index", device.index)
        check_range(found, device_path, "slots_total", device.slots_total)
        check_range(found, device_path, "memory_total_mib", device.memory_total_mib)
        # Paths name the inventory's fields as the request wrote them (the wire's names).
        check_range(found, device_path, "cores_total", device.core_percent_total)
        check_range(found, device_path, "numa", device.numa, low=INT32_MIN)
        if not device.vendor:
            found.add(f"{device_path}.vendor", "must not be empty")
        check_mig_profiles(found, device, f"{device_path}.mig_profiles", TYPED_MIG_FIELDS)


@dataclass(frozen=True, slots=True)
class MigFieldNames:
    """How a request spells the fields of a MIG profile and of its card, for paths."""

    memory: str
    cores: str
    placements: str
    card_memory: str
    card_cores: str


TYPED_MIG_FIELDS = MigFieldNames(
    "memory_mib", "core_percent", "placements", "memory_total_mib", "cores_total"
)
"""The typed ``MigProfile`` and ``Device`` messages."""
REGISTER_MIG_FIELDS = MigFieldNames("memoryMB", "core", "placements", "devmem", "devcore")
"""A register annotation's ``migProfiles`` entries and their device (HAMi's JSON)."""


def check_mig_profiles(
    found: Violations, device: Device, path: str, names: MigFieldNames
) -> None:
    """Adds every MIG profile (at ``path[i]``) that its card could not hold: more memory or
    compute than the card registers, or a placement outside its ``MAX_MIG_SLICES`` memory
    slices (or of no slice at all). Such a profile was once fitted, then refused at every
    Reserve by the card's own capacity, and the Filter gave up blaming another scheduler."""
    for index, profile in enumerate(device.mig_profiles):
        entry = f"{path}[{index}]"
        if not 0 <= profile.memory_mib <= device.memory_total_mib:
            found.add(
                f"{entry}.{names.memory}",
                f"must be between 0 and the card's memory ({names.card_memory} "
                f"{device.memory_total_mib}), got {profile.memory_mib}",
            )
        if not 0 <= profile.core_percent <= device.core_percent_total:
            found.add(
                f"{entry}.{names.cores}",
                f"must be between 0 and the card's compute ({names.card_cores} "
                f"{device.core_percent_total}), got {profile.core_percent}",
            )
        for p_index, placement in enumerate(profile.placements):
            if placement.start < 0 or placement.size < 1 or placement.end > MAX_MIG_SLICES:
                found.add(
                    f"{entry}.{names.placements}[{p_index}]",
                    f"must cover 1 to {MAX_MIG_SLICES} of the card's memory slices 0-"
                    f"{MAX_MIG_SLICES - 1}, got start {placement.start} size {placement.size}",
                )


def check_grant(found: Violations, grant: DeviceGrant, path: str) -> None:
    """Adds every problem of one grant to ``found``."""
    check_device_id(found, path, "uuid", grant.uuid)
    check_wire_text(found, path, "device_type", grant.vendor, required=False)
    check_range(found, path, "memory_mib", grant.memory_mib)
    # Percent for most vendors; compute units (AMD) and core masks (AWS Neuron) go higher.
    spec = vendor_table.find(grant.vendor)
    core_max = spec.core_max if spec is not None else 100
    check_range(found, path, "core_percent", grant.core_percent, high=core_max or INT32_MAX)
    check_range(found, path, "slots", grant.slots, high=MAX_GRANT_SLOTS)


def _check_container(found: Violations, container: Container, path: str) -> None:
    if not container.name:
        found.add(f"{path}.name", "must not be empty")
    if len(container.requests) > MAX_REQUESTS_PER_CONTAINER:
        found.add(
            f"{path}.requests",
            f"at most {MAX_REQUESTS_PER_CONTAINER} requests, got {len(container.requests)}",
        )
    else:
        vendors: set[str] = set()
        for index, request in enumerate(container.requests):
            _check_request(found, request, f"{path}.requests[{index}]")
            if request.vendor in vendors:
                found.add(
                    f"{path}.requests[{index}].vendor",
                    f"duplicate request for vendor {quote(request.vendor)}",
                )
            vendors.add(request.vendor)
    if len(container.grants) > MAX_GRANTS_PER_CONTAINER:
        found.add(
            f"{path}.grants",
            f"at most {MAX_GRANTS_PER_CONTAINER} grants, got {len(container.grants)}",
        )
    else:
        for index, grant in enumerate(container.grants):
            check_grant(found, grant, f"{path}.grants[{index}]")


def _check_request(found: Violations, request: DeviceRequest, path: str) -> None:
    if not request.vendor:
        found.add(f"{path}.vendor", "must not be empty")
    check_range(found, path, "count", request.count, high=MAX_DEVICES_PER_CONTAINER)
    check_range(found, path, "memory_mib", request.memory_mib)
    check_range(found, path, "memory_percent", request.memory_percent, high=100)
    check_range(found, path, "core_percent", request.core_percent, high=100)
    check_range(found, path, "slices", request.slices, high=MAX_GRANT_SLOTS)


def _check_statuses(
    found: Violations, statuses: Sequence[ContainerStatus], path: str
) -> None:
    if len(statuses) > MAX_STATUSES:
        found.add(path, f"at most {MAX_STATUSES} statuses, got {len(statuses)}")
        return
    for index, status in enumerate(statuses):
        status_path = f"{path}[{index}]"
        if not status.name:
            found.add(f"{status_path}.name", "must not be empty")
        check_range(found, status_path, "exit_code", status.exit_code, low=INT32_MIN)
        check_range(found, status_path, "restart_count", status.restart_count)


def check_annotations(found: Violations, annotations: Mapping[str, str], path: str) -> None:
    """A pod's annotations: within Kubernetes' size limit, no empty key."""
    characters = sum(len(key) + len(value) for key, value in annotations.items())
    # UTF-8 takes at most 4 bytes a character: most pods need no encoding to be measured.
    size = characters if characters * 4 <= MAX_ANNOTATIONS_BYTES else sum(
        len(key.encode()) + len(value.encode()) for key, value in annotations.items()
    )
    if size > MAX_ANNOTATIONS_BYTES:
        found.add(path, f"total size must be at most {MAX_ANNOTATIONS_BYTES} bytes, got {size}")
    if "" in annotations:
        found.add(f'{path}[""]', "annotation keys must not be empty")
