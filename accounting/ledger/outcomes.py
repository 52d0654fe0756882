"""What the ledger's changes answer: the change applied, and what RecordPod, Reserve and
ReleaseReservation did, with Reserve's reason codes.

Layer: accounting (pure values). The recorder's store journals and publishes a ``LedgerChange``;
its gRPC adapter turns the outcomes into answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting import reasons
from accounting.ledger.tombstones import TombstoneChange
from accounting.lifecycle import Decision, StoredPod


@dataclass(frozen=True, slots=True)
class LedgerChange:
    """One applied change: the pod's stored value before and after (None = not tracked)."""

    before: StoredPod | None
    after: StoredPod | None
    tombstone: TombstoneChange | None = None
    """Set by ``forget`` when the uid's tombstone was written (new or hardened)."""

    @property
    def namespace(self) -> str:
        """The namespace of the pod the change is about ("" for a tombstone alone)."""
        pod = self.after or self.before
        return pod.namespace if pod else ""

    @property
    def node_names(self) -> tuple[str, ...]:
        """The nodes whose totals the change touched, sorted."""
        names = {p.node_name for p in (self.before, self.after) if p is not None and p.node_name}
        return tuple(sorted(names))

    @property
    def changed(self) -> bool:
        """True when the stored value differs after the change, or was stored again under a
        new revision (a re-filter that reserved the same placement claims it)."""
        before, after = self.before, self.after
        return before != after or (
            before is not None and after is not None and before.revision != after.revision
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordOutcome:
    """What RecordPod did."""

    decision: Decision
    message: str
    stored: StoredPod | None
    change: LedgerChange
    overcommitted: tuple[str, ...] = ()
    """UUIDs on the pod's node charged beyond their capacity after this change (an init re-run
    whose capacity was handed out meanwhile: recorded anyway, because it is real)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveOutcome:
    """What Reserve did: reserved, or refused with a reason and nothing changed."""

    reserved: bool
    reason: str
    message: str
    stored: StoredPod | None
    change: LedgerChange | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseOutcome:
    """What ReleaseReservation did: released, or refused with a reason and nothing changed."""

    released: bool
    reason: str
    message: str
    change: LedgerChange | None


class ReserveReason:
    """Reserve's reason codes, by name (spelled in accounting.reasons; quota codes come from
    accounting.quota.QuotaReason)."""

    RESERVED = reasons.RESERVED
    INSUFFICIENT_MEMORY = reasons.CARD_INSUFFICIENT_MEMORY
    INSUFFICIENT_CORE = reasons.CARD_INSUFFICIENT_CORE
    SLOTS_EXHAUSTED = reasons.CARD_TIME_SLICING_EXHAUSTED
    NO_GRANTS = reasons.NO_GRANTS
    POD_FORGOTTEN = reasons.POD_FORGOTTEN
    POLICY_CHANGED = reasons.POLICY_CHANGED
    RESERVATION_CHANGED = reasons.RESERVATION_CHANGED
