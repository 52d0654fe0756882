"""A vendor the table does not have, added the way a new vendor is: one table entry.

``ACME_SPEC`` follows the generic memory/cores/slots path with nothing but data; tests that
show a new vendor needs nothing else register it for their duration (``acme_vendor``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from accounting import vendors
from accounting.vendor_spec import VendorSpec
from accounting.vendors import VendorResources

ACME_SPEC = VendorSpec(
    resources=VendorResources(
        vendor="Acme",
        count_resource="acme.com/npu",
        memory_resource="acme.com/npumem",
        memory_percentage_resource="acme.com/npumem-percentage",
        core_resource="acme.com/npucores",
    ),
    title="Acme NPU",
    source="(not in HAMi: a table entry added by the tests)",
    allocated_annotation="hami.io/acme-devices-allocated",
    to_allocate_annotation="hami.io/acme-devices-to-allocate",
    register_annotation="hami.io/node-acme-register",
)


@contextmanager
def registered(spec: VendorSpec = ACME_SPEC) -> Iterator[VendorSpec]:
    """The table with ``spec`` added, for the block's duration."""
    vendors.register(spec)
    try:
        yield spec
    finally:
        vendors.unregister(spec.vendor)
