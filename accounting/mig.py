"""NVIDIA MIG: the instances a MIG-mode card offers, which one a request gets, and the
``hami.io/vgpu-mig-allocations`` annotation that tells HAMi's device plugin which to create.

Layer: accounting (pure, standard library only). A card in MIG mode (its registration says
``"mode": "mig"``) registers ``migProfiles``: for each instance shape its memory, compute share,
memory slices and the slice ranges (placements) where the hardware can put it. HAMi's scheduler
(v2.10, ``pkg/device/nvidia``) fits a request on such a card to one instance:

* the **profile** is the smallest (by memory, then by slices) whose memory is at least the
  request's and that still has a free placement, so a full small profile spills to a larger one;
* the **placement** is the first free one of that profile, trying the highest start first for
  ``1g.`` and ``3g.`` profiles and the lowest first for the others (HAMi's "balanced packing");
* the card is **charged the instance**: its memory and compute, one slot, whatever the request
  asked. Placements already taken are those of every instance reserved on the card.

``choose_instance`` is that choice; ``encode_allocations`` / ``decode_allocations`` are the
annotation, byte-compatible with HAMi's ``EncodeMigAllocations`` / ``DecodeMigAllocations``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from accounting.errors import Violations
from accounting.limits import INT32_MAX
from accounting.model import MigInstance, MigPlacement, MigProfile
from accounting.quoting import json_kind, quote
from accounting.received_json import bounded_json_array, decode_json
from accounting.validate import check_device_id, check_json_integer

MIG_MODE = "mig"
"""The ``mode`` a card registers when its node's device plugin runs it in MIG mode."""
MIG_ALLOCATIONS_ANNOTATION = "hami.io/vgpu-mig-allocations"
"""Pod annotation: the instance of every MIG grant, for HAMi's device plugin."""
_HIGH_FIRST_PREFIXES = ("1g.", "3g.")
"""Profiles whose placements HAMi tries from the highest start down (``preferHighMigPlacement``)."""
UNKNOWN_INSTANCE = "unknown"
"""The profile name of the instance a MIG grant is given when its own is not known (no
``hami.io/vgpu-mig-allocations`` entry): it holds the whole card."""
MAX_MIG_PROFILES = 64
"""Most profiles one card may register (NVML offers fewer than 20)."""
MAX_MIG_PLACEMENTS = 64
"""Most placements one profile may register (a card has at most 8 memory slices)."""
MAX_MIG_ALLOCATIONS = 4096
"""Most entries one pod's allocation annotation may hold."""


@dataclass(frozen=True, slots=True)
class MigChoice:
    """The instance chosen for a request, with what the card is charged for it."""

    instance: MigInstance
    memory_mib: int
    core_percent: int


def choose_instance(
    profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement], memory_mib: int
) -> MigChoice | None:
    """HAMi's ``selectMigCandidate``: the smallest profile (memory, then slices) with at least
    ``memory_mib`` that has a placement overlapping nothing in ``occupied``, at its first free
    placement; None when no profile fits.
    """
    taken = tuple(occupied)
    for profile in sorted(profiles, key=lambda p: (p.memory_mib, p.slice_count)):
        if profile.memory_mib < memory_mib:
            continue
        for placement in placement_order(profile):
            if not any(placement.overlaps(other) for other in taken):
                return MigChoice(
                    MigInstance(profile.name, placement), profile.memory_mib, profile.core_percent
                )
    return None


def placement_order(profile: MigProfile) -> tuple[MigPlacement, ...]:
    """A profile's placements in the order HAMi tries them: the highest start first for
    ``1g.`` and ``3g.`` profiles, the lowest first for the others (a stable sort by start)."""
    high_first = profile.name.startswith(_HIGH_FIRST_PREFIXES)
    return tuple(sorted(profile.placements, key=lambda p: -p.start if high_first else p.start))


def whole_card(profiles: Sequence[MigProfile]) -> MigPlacement:
    """Every slice the card's profiles can reach: what a MIG grant whose instance is not known
    occupies (HAMi marks such a card unhealthy; taking every slice keeps it closed the same
    way)."""
    end = max((p.end for profile in profiles for p in profile.placements), default=1)
    return MigPlacement(0, max(end, 1))


# -- hami.io/vgpu-mig-allocations ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigRuntime:
    """The identity of a created MIG instance, as HAMi's device plugin writes it back into the
    allocation once it made the instance (HAMi's ``RuntimeReady``)."""

    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One entry of ``hami.io/vgpu-mig-allocations``: the instance of one grant."""

    container_index: int
    """The container's position, init containers first (as in the allocation annotation)."""
    device_index: int
    """The grant's index among the container's NVIDIA grants."""
    gpu_uuid: str
    instance: MigInstance
    runtime: MigRuntime | None = field(default=None, compare=False)
    """The created instance's identity, once the device plugin wrote it (a UUID and two
    integer ids; None before, or when they are not of those types). Not part of the value:
    the scheduler's choice is the same before and after."""


def encode_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The annotation's value, as Go's ``json.Marshal`` of HAMi's ``[]MigAllocation`` writes
    it (compact, fields in HAMi's order); "" for none (HAMi then writes no annotation)."""
    if not allocations:
        return ""
    return json.dumps(
        [
            {
                "containerIndex": a.container_index,
                "deviceIndex": a.device_index,
                "gpuUUID": a.gpu_uuid,
                "profile": a.instance.profile,
                "placement": {
                    "start": a.instance.placement.start,
                    "size": a.instance.placement.size,
                },
            }
            for a in allocations
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )


_INCOMPLETE = "the MIG allocation is incomplete"
_RUNTIME_FIELDS = ("migUUID", "gpuInstanceID", "computeInstanceID")
"""Filled in by the device plugin once it created the instance: all three or none."""


def decode_allocations(value: str, *, path: str) -> tuple[MigAllocation, ...]:
    """Reads the annotation the way HAMi's ``DecodeMigAllocations`` does.

    Raises:
        InvalidInputError: invalid JSON, an entry without its container or device index, GPU
            UUID, profile or a placement of size > 0, one or two of the three runtime fields
            (``migUUID``, ``gpuInstanceID``, ``computeInstanceID``), or two entries for the same
            container and device, each naming its entry.
    """
    if value == "":
        return ()
    document = decode_json(value, path, invalid="must be a JSON array of MIG allocations")
    if document is None:
        return ()
    document = bounded_json_array(
        document, path, items="MIG allocations", noun="allocations", limit=MAX_MIG_ALLOCATIONS
    )
    found = Violations()
    allocations: list[MigAllocation] = []
    seen: dict[tuple[int, int], int] = {}
    for index, element in enumerate(document):
        entry_path = f"{path}[{index}]"
        allocation = _decode_allocation(element, entry_path, found)
        if allocation is None:
            continue
        key = (allocation.container_index, allocation.device_index)
        first = seen.setdefault(key, index)
        if first != index:
            found.add(
                entry_path,
                f"duplicate MIG allocation for container {key[0]} device {key[1]}, "
                f"also {path}[{first}]",
            )
            continue
        allocations.append(allocation)
    found.raise_if_any()
    return tuple(allocations)


def _decode_allocation(element: object, path: str, found: Violations) -> MigAllocation | None:
    if not isinstance(element, dict):
        found.add(path, f"must be an object, got {json_kind(element)}")
        return None
    fields = go_fields(element)
    before = len(found)
    container_index = _index(fields, "containerIndex", path, found)
    device_index = _index(fields, "deviceIndex", path, found)
    gpu_uuid = fields.get("gpuuuid")
    if not isinstance(gpu_uuid, str) or not gpu_uuid:
        found.add(f"{path}.gpuUUID", f"must be a non-empty string ({_INCOMPLETE})")
    else:
        check_device_id(found, path, "gpuUUID", gpu_uuid)
    profile = fields.get("profile")
    if not isinstance(profile, str) or not profile:
        found.add(f"{path}.profile", f"must be a non-empty string ({_INCOMPLETE})")
    placement = decode_placement(fields.get("placement"), f"{path}.placement", found)
    if placement is not None and placement.size == 0:
        found.add(f"{path}.placement.size", f"must be above 0 ({_INCOMPLETE})")
    present = [
        name
        for name in _RUNTIME_FIELDS
        if fields.get(name.lower()) not in (None, "")
    ]
    if present and len(present) != len(_RUNTIME_FIELDS):
        found.add(
            path,
            f"partial runtime identity: {', '.join(present)} without "
            + ", ".join(name for name in _RUNTIME_FIELDS if name not in present),
        )
    if len(found) != before or placement is None:
        return None
    assert isinstance(gpu_uuid, str) and isinstance(profile, str)
    return MigAllocation(container_index, device_index, gpu_uuid, MigInstance(profile, placement),
                         _runtime(fields))


def _runtime(fields: Mapping[str, object]) -> MigRuntime | None:
    mig_uuid = fields.get("miguuid")
    gpu_instance = _instance_id(fields.get("gpuinstanceid"))
    compute_instance = _instance_id(fields.get("computeinstanceid"))
    if not isinstance(mig_uuid, str) or not mig_uuid or gpu_instance is None or (
        compute_instance is None
    ):
        return None
    return MigRuntime(mig_uuid, gpu_instance, compute_instance)


def _instance_id(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT32_MAX:
        return None
    return value


def _index(fields: Mapping[str, object], key: str, path: str, found: Violations) -> int:
    return check_json_integer(found, f"{path}.{key}", fields.get(key.lower(), 0)) or 0


def decode_placement(value: object, path: str, found: Violations) -> MigPlacement | None:
    """A ``{"start": S, "size": N}`` object (Go field names matched in any case); None after
    reporting a problem."""
    if value is None:
        found.add(path, "is required")
        return None
    if not isinstance(value, dict):
        found.add(path, f"must be an object, got {json_kind(value)}")
        return None
    fields = go_fields(value)
    bounds: list[int] = []
    for key in ("start", "size"):
        number = check_json_integer(found, f"{path}.{key}", fields.get(key, 0), high=64)
        if number is None:
            return None
        bounds.append(number)
    return MigPlacement(bounds[0], bounds[1])


def decode_profiles(value: object, path: str, found: Violations) -> tuple[MigProfile, ...]:
    """A card's ``migProfiles``: ``[{"name", "memoryMB", "core", "sliceCount", "placements"}]``
    (Go field names matched in any case; other keys, such as ``instanceCount``, ignored)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        found.add(path, f"must be an array of MIG profiles, got {json_kind(value)}")
        return ()
    if len(value) > MAX_MIG_PROFILES:
        found.add(path, f"at most {MAX_MIG_PROFILES} profiles, got {len(value)}")
        return ()
    profiles: list[MigProfile] = []
    names: dict[str, int] = {}
    for index, element in enumerate(value):
        entry = f"{path}[{index}]"
        if not isinstance(element, dict):
            found.add(entry, f"must be an object, got {json_kind(element)}")
            continue
        fields = go_fields(element)
        before = len(found)
        name = fields.get("name")
        if not isinstance(name, str) or not name:
            found.add(f"{entry}.name", "must be a non-empty string")
            name = ""
        elif name in names:
            found.add(
                f"{entry}.name", f"duplicate profile {quote(name)}, also {path}[{names[name]}]"
            )
        names.setdefault(str(name), index)
        totals = []
        for key, wire in (("memorymb", "memoryMB"), ("core", "core"), ("slicecount", "sliceCount")):
            totals.append(check_json_integer(found, f"{entry}.{wire}", fields.get(key, 0)) or 0)
        raw_placements = fields.get("placements")
        placements: list[MigPlacement] = []
        if raw_placements is not None and not isinstance(raw_placements, list):
            found.add(f"{entry}.placements", f"must be an array, got {json_kind(raw_placements)}")
        elif raw_placements:
            if len(raw_placements) > MAX_MIG_PLACEMENTS:
                found.add(f"{entry}.placements",
                          f"at most {MAX_MIG_PLACEMENTS} placements, got {len(raw_placements)}")
            else:
                for p_index, raw in enumerate(raw_placements):
                    placement = decode_placement(raw, f"{entry}.placements[{p_index}]", found)
                    if placement is not None:
                        placements.append(placement)
        if len(found) == before:
            profiles.append(MigProfile(name, totals[0], totals[1], totals[2], tuple(placements)))
    return tuple(profiles)


def encode_profiles(profiles: Sequence[MigProfile]) -> list[dict[str, object]]:
    """``migProfiles`` as the device plugin writes them (HAMi's compact wire format)."""
    return [
        {
            "name": profile.name,
            "memoryMB": profile.memory_mib,
            "core": profile.core_percent,
            "sliceCount": profile.slice_count,
            "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
        }
        for profile in profiles
    ]


def go_fields(element: Mapping[str, object]) -> dict[str, object]:
    """A JSON object's keys the way Go's ``encoding/json`` matches them to struct fields: in
    any case, a later key overwriting an earlier one for the same field. Keys are returned
    lower-cased."""
    return {key.lower(): value for key, value in element.items()}
