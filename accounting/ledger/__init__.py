"""The ledger: what each pod is charged per device, and node and namespace totals.

Layer: accounting (pure, in memory). This face hands on the names the recorder, the what-if
replay and the tests use. The ``Ledger`` (``ledger``) coordinates its parts, one job each:
``records`` (what is stored per pod, and per node), ``tombstones`` (the forgotten uids, within
a bound), ``totals`` (node, MIG and namespace totals kept by deltas) and ``bulk_load`` (the
same totals summed in one pass at recovery), ``inventory`` (the registered nodes' devices),
``quota_limits`` (the namespaces' limits), ``reserve_checks`` (what refuses a reservation),
``outcomes`` (what each change answers), ``interning`` (the shared strings of stored pods) and
``wording`` (how answers name usage).
"""

from accounting.ledger.ledger import Ledger
from accounting.ledger.outcomes import (
    LedgerChange,
    RecordOutcome,
    ReleaseOutcome,
    ReserveOutcome,
    ReserveReason,
)
from accounting.ledger.tombstones import DEFAULT_MAX_TOMBSTONES, TombstoneChange

__all__ = [
    "DEFAULT_MAX_TOMBSTONES",
    "Ledger",
    "LedgerChange",
    "RecordOutcome",
    "ReleaseOutcome",
    "ReserveOutcome",
    "ReserveReason",
    "TombstoneChange",
]
