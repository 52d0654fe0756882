"""What a change to the recorder's state tells its watchers: the events built from the ledger
after the change, and the initial state a new watcher is sent.

Layer: services/usage (recorder state). Functions of the ledger only, called by the store under
its lock (services/usage/store.py), so each event shows the namespace's and node's state right
after its change; the watch hub encodes and sends them (services/usage/watch_hub.py).
"""

from __future__ import annotations

from accounting.ledger import Ledger, LedgerChange
from accounting.policy import AccountingPolicy
from services.usage.events import EventKind, NodeSnapshot, UsageEvent, WatchContent


def node_snapshot(ledger: Ledger, node_name: str) -> NodeSnapshot:
    """A node's devices with what is charged on them and the pods charged there (a node that
    is not registered has none, and says so)."""
    states = ledger.node_states(node_name)
    uids = ledger.node_pod_uids(node_name)
    return NodeSnapshot(node_name, states or (), uids, registered=states is not None)


def pod_change_events(
    ledger: Ledger, change: LedgerChange, pod_uid: str, wanted: WatchContent
) -> list[UsageEvent]:
    """One event per node the change touched (one without a node when it touched none), with
    the namespace's items and the node's state when some watcher wants them."""
    after = change.after
    kind = EventKind.POD_CHANGED if after is not None else EventKind.POD_FORGOTTEN
    items = (
        tuple(ledger.namespace_items(change.namespace).values())
        if WatchContent.NAMESPACES in wanted
        else ()
    )
    with_nodes = WatchContent.NODES in wanted
    stored = after.usage if after is not None else ()
    revision = ledger.revision
    return [
        UsageEvent(
            kind,
            revision,
            pod_uid=pod_uid,
            namespace=change.namespace,
            namespace_items=items,
            node=node_snapshot(ledger, node_name) if node_name and with_nodes else None,
            stored=stored,
        )
        for node_name in change.node_names or ("",)
    ]


def node_registered_events(
    ledger: Ledger, node_name: str, wanted: WatchContent
) -> list[UsageEvent]:
    """What a node's new inventory (or its drop) tells watchers."""
    with_nodes = WatchContent.NODES in wanted
    return [
        UsageEvent(
            EventKind.NODE_REGISTERED,
            ledger.revision,
            node=node_snapshot(ledger, node_name) if with_nodes else None,
        )
    ]


def initial_events(
    ledger: Ledger,
    policy: AccountingPolicy,
    content: WatchContent,
    *,
    send_policy: bool,
    revision: int,
) -> list[UsageEvent]:
    """A new watcher's initial state: with ``send_policy`` a POLICY event, then a SNAPSHOT
    event per node and namespace its content asks for."""
    events: list[UsageEvent] = []
    if send_policy:
        events.append(UsageEvent(EventKind.POLICY, revision, policy=policy))
    if WatchContent.NODES in content:
        events.extend(
            UsageEvent(EventKind.SNAPSHOT, revision, node=node_snapshot(ledger, name))
            for name in ledger.node_names()
        )
    if WatchContent.NAMESPACES in content:
        events.extend(
            UsageEvent(
                EventKind.SNAPSHOT,
                revision,
                namespace=namespace,
                namespace_items=tuple(ledger.namespace_items(namespace).values()),
            )
            for namespace in ledger.namespaces()
        )
    return events
