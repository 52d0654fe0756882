"""The journal's contents as values: the changes one transaction carries, and the state a load
returns.

Layer: services (usage recorder persistence). Values only; services/usage/journal/database.py
writes the changes and reads the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from accounting.lifecycle import StoredPod
from accounting.model import Device
from services.usage.journal.errors import JournalDamage

# -- the changes a transaction can carry -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutPod:
    """Store (insert or replace) what is charged for one pod."""

    stored: StoredPod
    traceparent: str = ""
    """The pod's hami.io/traceparent, so spans about it after a restart join its trace."""


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Forget one pod."""

    uid: str


@dataclass(frozen=True, slots=True)
class PutNode:
    """Register or replace a node's device inventory."""

    node_name: str
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Drop a node's inventory."""

    node_name: str


@dataclass(frozen=True, slots=True)
class PutQuota:
    """Replace a namespace's limits (keyed by resource name); empty limits delete the row."""

    namespace: str
    limits: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PutTombstone:
    """Remember a forgotten uid, or harden the tombstone it has (see accounting.ledger)."""

    uid: str
    reservable: bool


@dataclass(frozen=True, slots=True)
class DeleteTombstones:
    """Drop tombstones the ledger evicted to keep its bound."""

    uids: tuple[str, ...]


JournalOp = PutPod | DeletePod | PutNode | DeleteNode | PutQuota | PutTombstone | DeleteTombstones
"""One change; ``Journal.commit`` writes a sequence of them as one transaction."""


def writes_row(op: JournalOp) -> bool:
    """Whether the op writes a row, which then carries the transaction's revision: the load
    takes the highest revision it finds, so a transaction with such an op need not write
    ``meta`` (the store never deletes, in the same transaction, a row it writes)."""
    if isinstance(op, PutQuota):
        return bool(op.limits)
    return isinstance(op, PutPod | PutNode | PutTombstone)


# -- what a load returns -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class JournalState:
    """Everything the journal holds, as loaded at start (the readable part when damaged)."""

    pods: tuple[StoredPod, ...] = ()
    nodes: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    """Node name -> devices, in registration order."""
    quotas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Namespace -> resource name (nvidia.com/gpumem) -> limit."""
    traceparents: Mapping[str, str] = field(default_factory=dict)
    """Pod uid -> its hami.io/traceparent (pods without one are absent)."""
    tombstones: tuple[tuple[str, bool], ...] = ()
    """(uid, reservable) of the remembered forgotten uids, oldest first."""
    revision: int = 0
    damage: JournalDamage | None = None
    """What is wrong with the journal; None when it is whole."""
