"""What the usage store's writes accept: a node's inventory and a ResourceQuota's limits,
checked before the store's lock is taken.

Layer: services/usage (recorder state). Bad input is refused whole, every violation named,
before anything is applied: the store's walk (apply, commit, publish, or undo) only ever sees
values it can store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from accounting.errors import InvalidInputError, Violations
from accounting.limits import MAX_QUOTA_LIMIT
from accounting.model import Device
from accounting.quota import quota_items_from_limits, quota_keys
from accounting.validate import check_namespace, validate_devices
from accounting.vendors import VendorResources


def checked_inventory(node_name: str, devices: Sequence[Device]) -> tuple[Device, ...]:
    """The node's devices as a tuple, once the name is given and the inventory is good.

    Raises:
        InvalidInputError: no name, or a bad inventory (duplicate UUIDs, negative totals).
    """
    devices = tuple(devices)
    found = Violations()
    if not node_name:
        found.add("node_name", "must not be empty")
    try:
        validate_devices(devices, "devices")
    except InvalidInputError as error:
        found.extend(error)
    found.raise_if_any()
    return devices


def checked_limits(
    namespace: str, limits: Mapping[str, int], vendors: Sequence[VendorResources]
) -> dict[str, int]:
    """The limits keyed by resource name, from limits keyed like a ResourceQuota's spec.hard
    (``limits.nvidia.com/gpumem``) for ``vendors``; empty limits unset them all.

    Raises:
        InvalidInputError: no namespace, an unknown key, or a limit outside
            0..``MAX_QUOTA_LIMIT``, each named.
    """
    found = Violations()
    check_namespace(found, "namespace", namespace)
    by_resource = quota_items_from_limits(limits, vendors)
    if len(by_resource) != len(limits):
        known = tuple(quota_keys(vendors))
        for key in sorted(limits):
            if key not in known:
                found.add(f"limits[{key!r}]", f"unknown quota key; expected one of {known}")
    for key, value in sorted(limits.items()):
        if not 0 <= value <= MAX_QUOTA_LIMIT:
            found.add(
                f"limits[{key!r}]", f"must be between 0 and {MAX_QUOTA_LIMIT}, got {value}"
            )
    found.raise_if_any()
    return by_resource
