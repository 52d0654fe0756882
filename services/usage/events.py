"""The recorder's changes as WatchUsage delivers them: kinds, what a watcher asks for, events.

Layer: services/usage (values). The store builds these under its lock, one per change, with the
affected namespace and node state *after* the change; the watch hub (``watch_hub``) encodes each
one once and hands the same bytes to every watcher. Plain frozen values: they cross from the
writer's thread to the hub's event loop without copies or locks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from accounting.model import DeviceState, DeviceUsage, QuotaItem
from accounting.policy import AccountingPolicy


class EventKind(enum.Enum):
    """Kinds of change (UsageEventKind in the schema)."""

    SNAPSHOT = "snapshot"
    POLICY = "policy"
    """The accounting policy in force: the first event of an initial state that asks for it."""
    POD_CHANGED = "pod_changed"
    POD_FORGOTTEN = "pod_forgotten"
    NODE_REGISTERED = "node_registered"
    """A node was registered, its inventory changed, or it was dropped (then without devices)."""
    QUOTA_SET = "quota_set"
    INITIAL_STATE_COMPLETE = "initial_state_complete"
    """Ends the initial state of a watcher that asked for it (also an empty one)."""


class WatchContent(enum.Flag):
    """What a watcher's events carry (WatchContent in the schema)."""

    NODES = enum.auto()
    NAMESPACES = enum.auto()
    ALL = NODES | NAMESPACES


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node's devices with what is charged on them, and the pods charged there."""

    node_name: str
    devices: tuple[DeviceState, ...]
    pod_uids: tuple[str, ...]
    registered: bool = True


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """One change, with the affected namespace and node state after it."""

    kind: EventKind
    revision: int
    pod_uid: str = ""
    namespace: str = ""
    namespace_items: tuple[QuotaItem, ...] = ()
    node: NodeSnapshot | None = None
    stored: tuple[DeviceUsage, ...] = ()
    policy: AccountingPolicy | None = None


@dataclass(frozen=True, slots=True)
class EncodedParts:
    """An event's encoding in three parts whose concatenation is a serialized UsageEvent
    (protobuf reads fields in any order): the change itself (revision, kind, pod, stored
    usage, policy), the namespace's items, and the node. A watcher of namespaces gets the first
    two, a watcher of nodes the first and the last; each part is encoded once for all of them."""

    change: bytes
    namespace: bytes
    node: bytes

    def for_content(self, content: WatchContent) -> bytes:
        namespace = self.namespace if WatchContent.NAMESPACES in content else b""
        node = self.node if WatchContent.NODES in content else b""
        return self.change + namespace + node
