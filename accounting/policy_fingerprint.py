"""The accounting policy's fingerprint (``policy_id``), computed alike by every release that
can run beside this one.

Layer: accounting (pure, standard library only). A daemon checks the policy it receives by
computing the fingerprint of its content with its own vendor table and comparing it with the id
the recorder sent; during a rolling update, the two can be different releases. Content is
walked field by field: a field a release has already fingerprinted always counts, whatever its
value; a field added after it counts only when set away from its default. So a newer setting
left at its default gives the id an older daemon computes from the same policy, and the two
answer under it side by side; a policy that sets it gives an id no older daemon can reproduce,
and an older daemon refuses to answer under it, as it must, since it would ignore the setting.

The walk of the fields of ``FINGERPRINTED_AT_V0_2_0`` gives the canonical JSON of release
0.2.0, byte for byte (``dataclasses.asdict`` of the policy's vendor table entries and its
count setting, keys sorted), so a policy's id is the one 0.2.0 computes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Protocol


class FingerprintedPolicy(Protocol):
    """What the fingerprint reads of an ``accounting.policy.AccountingPolicy`` (a dataclass): its
    fields, and its vendors' whole table entries. Named here so this module, which the policy
    imports to compute its own id, imports nothing of the policy back."""

    @property
    def specs(self) -> Sequence[object]:
        """The vendor table entry of each configured vendor."""
        ...

FINGERPRINTED_AT_V0_2_0: Mapping[str, frozenset[str]] = {
    "AccountingPolicy": frozenset({"vendors", "enforce_gpu_count"}),
    "VendorResources": frozenset({
        "vendor", "count_resource", "memory_resource", "memory_percentage_resource",
        "core_resource", "memory_factor", "default_memory_mib", "default_core_percent",
        "default_gpu_count",
    }),
    "VendorSpec": frozenset({
        "resources", "title", "source", "allocated_annotation", "to_allocate_annotation",
        "devices", "register_annotation", "capacity", "selection", "enabled_by_default",
        "memory_factor_fixed", "core_unit", "core_max", "limits_only", "exclusive_default",
        "whole_device", "totals_divided_by_count", "multi_device_core_percent", "count_minimum",
        "count_multiple", "memory_templates", "template_whole_memory_mib",
        "template_capacity_mib", "template_single_device", "allowed_memory_units",
        "whole_memory_units", "soft_split_annotation", "memory_quantity_units_are_bytes",
        "charge", "checks_capacity", "used_device_refused", "one_device_per_pod", "rule",
        "notes",
    }),
    "CapacityDevices": frozenset({
        "count_resource", "id_word", "units_per_device", "slots", "memory_mib",
        "memory_resource", "core_total", "second_half_numa", "cores_per_device_resource",
    }),
    "MemoryTemplate": frozenset({"name", "memory_mib", "core_percent"}),
    "Selection": frozenset({
        "use_type", "nouse_type", "use_uuid", "nouse_uuid", "extra_use_uuid",
        "extra_nouse_uuid", "mode",
    }),
}
"""The fields release 0.2.0 fingerprints, by class name: they count whatever their value. A
class not named here is newer than 0.2.0: it is reached only through a newer field set away
from its default, and all of its fields count."""

_NOT_FINGERPRINTED = frozenset({"policy_id"})
"""The policy's own id, which the fingerprint is of."""


def policy_fingerprint(
    policy: FingerprintedPolicy,
    *,
    counted: Mapping[str, frozenset[str]] = FINGERPRINTED_AT_V0_2_0,
) -> str:
    """The id of ``policy``, e.g. ``p-3f9a1c02d4e5``: a hash of its canonical content, with each
    vendor's whole table entry in place of its configured part.

    Args:
        policy: The policy (its ``policy_id`` is not read).
        counted: The fields that count whatever their value (tests pass another release's).
    """
    content = _fields(policy, counted, replaced={"vendors": list(policy.specs)})
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=_plain)
    return "p-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def fingerprint_content(
    value: object, counted: Mapping[str, frozenset[str]] = FINGERPRINTED_AT_V0_2_0
) -> object:
    """``value`` as the fingerprint reads it: dataclasses as dicts of the fields that count,
    sequences as lists, anything else as it is.

    Args:
        value: A field's value.
        counted: The fields that count whatever their value.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields(value, counted, replaced={})
    if isinstance(value, (list, tuple)):
        return [fingerprint_content(item, counted) for item in value]
    if isinstance(value, dict):
        return {key: fingerprint_content(item, counted) for key, item in value.items()}
    return value


def _fields(
    value: object, counted: Mapping[str, frozenset[str]], *, replaced: Mapping[str, object]
) -> dict[str, object]:
    # A class missing from the table is newer than every counted field: all of it counts.
    always = counted.get(type(value).__name__)
    content: dict[str, object] = {}
    for item in dataclasses.fields(value):  # type: ignore[arg-type]
        if item.name in _NOT_FINGERPRINTED:
            continue
        field_value = replaced.get(item.name, getattr(value, item.name))
        if always is not None and item.name not in always and _is_default(item, field_value):
            continue
        content[item.name] = fingerprint_content(field_value, counted)
    return content


def _is_default(item: dataclasses.Field[object], value: object) -> bool:
    if item.default is not dataclasses.MISSING:
        return bool(value == item.default)
    if item.default_factory is not dataclasses.MISSING:
        return bool(value == item.default_factory())
    return False  # a field without a default always counts


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"not JSON: {value!r}")
