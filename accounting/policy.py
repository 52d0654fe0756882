"""The accounting policy: every setting that changes an answer, in one value.

Layer: accounting (pure, standard library only). Which resources name each vendor's devices,
the defaults HAMi's webhook fills in, the memory factor and whether the device count is a quota
dimension all change what a pod is charged, whether it is admitted and where it fits. They
belong to the usage recorder's configuration; the recorder publishes them (``GetPolicy`` and
the first event of every ``WatchUsage``), and the admission and scheduler daemons take them
from there, so the three never answer under different rules.

A policy is identified by ``policy_id``, a fingerprint of its content: two daemons holding the
same id hold the same rules, and an answer that names the id it was computed under can be
checked against the recorder's. The fingerprint covers each vendor's whole table entry
(``accounting.vendors``), not only the configured part, so daemons built with different vendor
tables never take each other's policy for their own. Releases that run side by side compute
it alike (``accounting.policy_fingerprint``): a setting added after a release changes the id
only when it is set away from its default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from accounting import vendors as vendor_table
from accounting.errors import Violations
from accounting.limits import INT32_MAX, MAX_MEMORY_FACTOR
from accounting.policy_fingerprint import policy_fingerprint
from accounting.vendor_spec import VendorSpec
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


@dataclass(frozen=True, slots=True)
class AccountingPolicy:
    """Everything that changes an answer; the recorder's configuration, published with its
    state.

    Raises (on construction):
        InvalidInputError: no vendor, a vendor the vendor table does not have, a vendor keyword
            or resource name used twice, a memory factor HAMi fixes changed, or a factor,
            default or name out of range, each field named.
    """

    vendors: tuple[VendorResources, ...] = (NVIDIA_RESOURCES,)
    """The vendors whose devices are accounted, with their resource names, defaults and memory
    factor (HAMi's device configuration)."""
    enforce_gpu_count: bool = True
    """Whether ``limits.<count resource>`` is enforced where a namespace sets it (our
    extension; HAMi's quota has no count dimension, ``False`` restores its behaviour)."""
    policy_id: str = field(init=False, compare=False)
    """A fingerprint of everything above, e.g. ``p-3f9a1c02d4e5``."""

    def __post_init__(self) -> None:
        if not isinstance(self.vendors, tuple):
            object.__setattr__(self, "vendors", tuple(self.vendors))
        _validate(self.vendors)
        object.__setattr__(self, "policy_id", policy_fingerprint(self))

    def vendor(self, name: str) -> VendorResources | None:
        """The vendor with keyword ``name`` (``NVIDIA``), or None."""
        for vendor in self.vendors:
            if vendor.vendor == name:
                return vendor
        return None

    @property
    def specs(self) -> tuple[VendorSpec, ...]:
        """The vendors' table entries with this policy's names and defaults, in policy order."""
        return vendor_table.specs_for(self.vendors)

    def spec(self, name: str) -> VendorSpec | None:
        """The table entry of vendor ``name`` with this policy's names and defaults, or None
        when the policy does not account that vendor."""
        for spec in self.specs:
            if spec.vendor == name:
                return spec
        return None

    def describe(self) -> str:
        """One line for logs and ``explain``, e.g. ``NVIDIA (memory factor 1), GPU count
        enforced``."""
        vendors = ", ".join(
            f"{v.vendor} (memory factor {v.memory_factor}"
            + (f", default memory {v.default_memory_mib} MiB" if v.default_memory_mib else "")
            + (f", default cores {v.default_core_percent}%" if v.default_core_percent else "")
            + ")"
            for v in self.vendors
        )
        count = "GPU count enforced" if self.enforce_gpu_count else "GPU count not enforced"
        return f"{vendors}, {count}"


_RESOURCE_FIELDS = (
    "count_resource",
    "memory_resource",
    "memory_percentage_resource",
    "core_resource",
)


def _validate(vendors: Sequence[VendorResources]) -> None:
    found = Violations()
    if not vendors:
        found.add("vendors", "at least one vendor is required")
    keywords: dict[str, int] = {}
    resources: dict[str, str] = {}
    for index, vendor in enumerate(vendors):
        path = f"vendors[{index}]"
        entry = vendor_table.find(vendor.vendor)
        if not vendor.vendor:
            found.add(f"{path}.vendor", "must not be empty")
        elif entry is None:
            found.add(f"{path}.vendor", f"{vendor.vendor!r} is not a vendor HAMi schedules; "
                                        f"known: {', '.join(vendor_table.known())}")
        elif vendor.vendor in keywords:
            first = keywords[vendor.vendor]
            found.add(f"{path}.vendor", f"{vendor.vendor!r} is also vendors[{first}]")
        keywords.setdefault(vendor.vendor, index)
        for name in _RESOURCE_FIELDS:
            resource: str = getattr(vendor, name)
            # A dimension the vendor does not have stays absent; the count always exists.
            if not resource and name != "count_resource" and (
                entry is None or not getattr(entry.resources, name)
            ):
                continue
            if "/" not in resource.strip("/"):
                found.add(f"{path}.{name}", f"must be a domain-qualified resource name such as "
                          f"nvidia.com/gpu, got {resource!r}")
            elif resource in resources:
                found.add(f"{path}.{name}", f"{resource!r} is also {resources[resource]}")
            resources.setdefault(resource, f"{path}.{name}")
        if not 1 <= vendor.memory_factor <= MAX_MEMORY_FACTOR:
            found.add(f"{path}.memory_factor",
                      f"must be between 1 and {MAX_MEMORY_FACTOR}, got {vendor.memory_factor}")
        elif (
            entry is not None
            and entry.memory_factor_fixed
            and vendor.memory_factor != entry.resources.memory_factor
        ):
            found.add(f"{path}.memory_factor",
                      f"{entry.title}'s memory unit is fixed at {entry.resources.memory_factor} "
                      f"MiB in HAMi, got {vendor.memory_factor}")
        if not 0 <= vendor.default_memory_mib <= INT32_MAX:
            found.add(f"{path}.default_memory_mib",
                      f"must be between 0 and {INT32_MAX}, got {vendor.default_memory_mib}")
        if not 0 <= vendor.default_core_percent <= 100:
            found.add(f"{path}.default_core_percent",
                      f"must be between 0 and 100, got {vendor.default_core_percent}")
        if not 0 <= vendor.default_gpu_count <= INT32_MAX:
            found.add(f"{path}.default_gpu_count",
                      f"must be between 0 and {INT32_MAX}, got {vendor.default_gpu_count}")
    found.raise_if_any()


def policy_for(
    vendors: Sequence[str] | None = None,
    *,
    memory_factor: int = 1,
    enforce_gpu_count: bool = True,
) -> AccountingPolicy:
    """A policy over vendor table entries by keyword (HAMi's chart defaults when None), with
    NVIDIA's memory factor set (the one HAMi's configuration changes in practice).

    Raises:
        InvalidInputError: a keyword the table does not have, or a factor out of range.
    """
    keywords = (
        tuple(v.vendor for v in vendor_table.DEFAULT_VENDORS) if vendors is None else vendors
    )
    resources = []
    for keyword in keywords:
        entry = vendor_table.spec_for(keyword).resources
        if keyword == NVIDIA_RESOURCES.vendor:
            entry = replace(entry, memory_factor=memory_factor)
        resources.append(entry)
    return AccountingPolicy(tuple(resources), enforce_gpu_count=enforce_gpu_count)


DEFAULT_POLICY = AccountingPolicy()
"""NVIDIA alone with HAMi's defaults: its resource names, memory factor 1, no default memory or
cores, one device for a container that sizes a GPU without counting, and the count enforced
where set. (The recorder's default accounts every vendor HAMi's chart turns on:
``policy_for()``.)"""
