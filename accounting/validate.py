"""Input validation of domain values: every offending field at once, nothing changed.

Layer: accounting (pure). Adapters build a ``Pod`` or a device inventory from protobuf or from
Kubernetes JSON, then call ``validate_pod`` / ``validate_devices`` before handing the value to
the rules. Size limits come first and stop the walk, so a huge repeated field is refused after
one ``len()`` instead of after checking every element.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from accounting import numbers
from accounting import vendors as vendor_table
from accounting.errors import InvalidInputError, Violations
from accounting.model import Container, ContainerStatus, Device, DeviceGrant, DeviceRequest, Pod

INT32_MAX = 2_147_483_647
INT32_MIN = -2_147_483_648

MAX_CONTAINERS = 256
"""Containers per pod (init, sidecar and app together); Kubernetes pods have a handful."""
MAX_GRANTS_PER_CONTAINER = 64
"""Devices granted to one container; more than any node has."""
MAX_REQUESTS_PER_CONTAINER = 16
"""Vendor requests of one container."""
MAX_STATUSES = MAX_CONTAINERS
"""Entries of initContainerStatuses or containerStatuses."""
MAX_DEVICES_PER_NODE = 256
"""Devices in one node inventory."""
MAX_DEVICES_PER_CONTAINER = MAX_DEVICES_PER_NODE
"""Devices one container may ask for: more than a node may register could never be placed."""
MAX_GRANT_SLOTS = 65_536
"""Sharing slots one grant may stand for (HAMi's deviceSplitCount is 10 by default)."""
MAX_MEMORY_FACTOR = 65_536
"""The largest memory factor (HAMi's memoryFactor; 1024 makes gpumem count GiB)."""
MAX_QUOTA_LIMIT = 10**12
"""The largest namespace limit of any resource (MiB, percent or devices): more than a cluster
has, and small enough that limit × memory factor stays well inside int64.

Why these maxima keep every number on the wire inside its int64 or int32 field: a pod has at
most 256 containers, each at most 256 devices of at most 2^31 − 1 MiB, so its effective memory
request times the largest memory factor is below 2^63; a limit times that factor is below 2^57;
one pod's usage on one device (at most 256 × 64 grants) stays below 2^45 MiB, 2^22 percent and
2^30 slots. Only totals over many pods (a node's or a namespace's used amounts) are unbounded
in principle; they are reported saturated at the field's maximum, which no real cluster
reaches."""
INT64_MAX = 2**63 - 1
MAX_DEVICE_ID_CHARS = 320
"""The longest device id (UUID) read from a request or an annotation. The ids HAMi writes are
far shorter (an NVIDIA UUID has 40 characters); the longest an id made from a node's name can
get is 276 (a 253-character name, ``-enflame-drs-`` and a 10-digit index). Every id is stored
and sent in every watch event of its node, so a longer one only costs every reader."""
MAX_NODE_NAME_CHARS = 253
"""A Kubernetes node name is a DNS subdomain: at most 253 characters."""
MAX_MIG_SLICES = 8
"""Memory slices of a MIG-mode card: NVIDIA's cards have at most eight (A100, H100; A30 has
four), and NVML's possible placements, which the device plugin registers, lie inside them."""
MAX_ANNOTATIONS_BYTES = 256 * 1024
"""Kubernetes' own limit on the total size of a pod's annotations (keys plus values)."""

WIRE_SEPARATORS = ",:;"
_NO_WIRE_SEPARATOR = re.compile(f"[^{re.escape(WIRE_SEPARATORS)}]*")
"""Matches a whole value free of separators (one C scan, for every grant of every request)."""
"""Characters that cannot appear in a UUID or type written into vgpu-devices-allocated."""


def json_object(raw: bytes | str, path: str) -> dict[str, Any]:
    """Decodes ``raw`` as one JSON object (what Go's ``json.Marshal`` writes for a Kubernetes
    object), numbers read exactly and boundedly (``decode_json``).

    Raises:
        InvalidInputError: at ``path``: not JSON, nested too deeply, or not an object; or
            text UTF-8 cannot carry, at the string's own path.
    """
    document = decode_json(raw, path)
    if not isinstance(document, dict):
        raise InvalidInputError.single(path, f"must be a JSON object, got {json_kind(document)}")
    return document


InvalidJson = str | Callable[[ValueError], str]
"""What ``decode_json`` says of text that is not JSON: a message, or one made from the error."""


def decode_json(
    raw: bytes | str,
    path: str,
    *,
    invalid: InvalidJson | None = None,
) -> object:
    r"""Decodes JSON text received from outside (a request, an annotation, the Kubernetes API):
    the one place where such text becomes values, so every decoded string is one UTF-8 can
    carry.

    JSON may write a lone UTF-16 surrogate (``"\ud800"``) that no UTF-8 text can hold:
    Python decodes it into a string that protobuf, SQLite and every encoder after the
    decoder refuse, so it is refused here, naming the string (``check_text``).

    Args:
        raw: the text, as bytes (UTF-8) or str.
        path: where the text was received, for errors, e.g.
            ``kubernetes_node_json.metadata.annotations["hami.io/node-nvidia-register"]``.
        invalid: the message for text that is not JSON (default "not valid JSON (why)").

    Raises:
        InvalidInputError: not JSON, nested too deeply, or a string UTF-8 cannot carry.
    """
    try:
        # Exact numbers: a Kubernetes quantity may be a JSON number, and 1e400 is no float;
        # an integer of thousands of digits stays a Decimal for its field to refuse.
        document: object = numbers.json_loads(raw)
    except ValueError as error:  # UnicodeDecodeError included
        if invalid is None:
            message = f"not valid JSON ({error})"
        else:
            message = invalid if isinstance(invalid, str) else invalid(error)
        raise InvalidInputError.single(path, message) from None
    except RecursionError:
        # json.loads recurses per nesting level; hostile input can nest deeper than the stack.
        raise InvalidInputError.single(path, "not valid JSON (nested too deeply)") from None
    # Only an escape or an encoded surrogate (json.loads decodes bytes with "surrogatepass")
    # can make one: text with neither needs no walk. A valid pair matches too and is walked.
    # json.loads also reads UTF-16 and UTF-32 (zero bytes among the first four), whose
    # surrogates neither pattern sees: those are always walked.
    # Substring tests first: a C scan each, a fraction of the pattern's cost on a whole pod.
    if isinstance(raw, bytes):
        may_hold = b"\x00" in raw[:4] or (
            (b"\\u" in raw or b"\xed" in raw) and _SURROGATE_ESCAPE_BYTES.search(raw) is not None
        )
    else:
        may_hold = ("\\u" in raw or not raw.isascii()) and (
            _SURROGATE_OR_ESCAPE.search(raw) is not None
        )
    if may_hold:
        check_text(document, path)
    return document


_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE_OR_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_CHECK_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, default=str)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_text(document: object, path: str = "") -> None:
    r"""Refuses decoded JSON (objects, arrays, strings, numbers) holding a string or key that
    UTF-8 cannot encode — a lone surrogate, the only such text a Python string can hold.

    One C-speed encoding proves the common case; the walk that names each bad string only
    runs when it fails. Keys join the path as ``.name`` when they are identifiers, else as
    ``["key"]``, e.g. ``metadata.annotations["hami.io/node-nvidia-register"]``.

    Raises:
        InvalidInputError: naming each such string, e.g. ``[0].type: must be text UTF-8 can
            encode, got a lone surrogate U+D800 at character 6 of "NVIDIA\ud800"``.
    """
    try:
        _CHECK_ENCODER.encode(document).encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return
    found = Violations()
    # Iterative, in document order: decoded JSON may nest almost as deep as the stack allows.
    stack: list[tuple[object, str, str | None]] = [(document, path, None)]
    while stack:
        value, at, key = stack.pop()
        if key is not None:
            _check_encodable(found, at, key, what="a key")
        if isinstance(value, str):
            _check_encodable(found, at, value)
        elif isinstance(value, dict):
            stack.extend(
                (item, _key_path(at, str(name)), str(name))
                for name, item in reversed(value.items())
            )
        elif isinstance(value, list | tuple):
            stack.extend(
                (item, f"{at}[{index}]", None) for index, item in reversed(list(enumerate(value)))
            )
    found.raise_if_any()


def _key_path(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{quote(key)}]"


def _check_encodable(found: Violations, path: str, text: str, what: str = "text") -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        found.add(
            path,
            f"must be {what} UTF-8 can encode, got a lone surrogate "
            f"U+{ord(text[error.start]):04X} at character {error.start} of {quote(text)}",
        )


def bounded_json_array(
    document: object, path: str, *, items: str, noun: str, limit: int
) -> list[Any]:
    """``document`` (decoded JSON, not null) as a list of at most ``limit`` entries; else an
    error at ``path`` such as "must be a JSON array of devices, got an object"."""
    if not isinstance(document, list):
        raise InvalidInputError.single(
            path, f"must be a JSON array of {items}, got {json_kind(document)}"
        )
    if len(document) > limit:
        raise InvalidInputError.single(path, f"at most {limit} {noun}, got {len(document)}")
    return document


def json_kind(value: object) -> str:
    """What a decoded JSON value is, for messages: "an object", "a string", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


MAX_QUOTED_CHARS = 80
"""Characters of a received value an error quotes back (``quote``), escapes included."""


def quote(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    r"""Quotes a received value for an error message as a JSON string of printable ASCII (any
    other character as its JSON escape, ``"\u00e9"``), at most ``limit`` characters between
    the quotes, then ``... (N characters)`` when it was longer: hostile input stays small
    whatever its alphabet."""
    quoted = json.dumps(text[:limit])
    if len(quoted) <= limit + 2 and len(text) <= limit:
        return quoted
    # Character by character, so no escape is cut in two (at most ``limit`` of them).
    kept: list[str] = []
    size = 0
    for character in text[:limit]:
        escaped = encode_basestring_ascii(character)[1:-1]
        if size + len(escaped) > limit:
            break
        kept.append(escaped)
        size += len(escaped)
    return f'"{"".join(kept)}"... ({len(text)} characters)'


def shown(value: object) -> str:
    """A received JSON value for a message, kept short: strings quoted and shortened, numbers,
    booleans and null as JSON writes them, objects and arrays by their kind only."""
    if isinstance(value, str):
        return quote(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return json_kind(value)
    number = str(value)
    if len(number) <= MAX_QUOTED_CHARS:
        return number
    return f"{number[:MAX_QUOTED_CHARS]}... ({len(number)} characters)"


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


def check_pod(found: Violations, pod: Pod, path: str) -> None:
    """Adds every problem of ``pod`` to ``found``; for callers that merge other violations."""
    if not pod.uid:
        found.add(f"{path}.uid", "must not be empty")
    if not pod.namespace:
        found.add(f"{path}.namespace", "must not be empty")
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
