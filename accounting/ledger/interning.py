"""Stored pods with their repeated strings shared: what keeps a tracked pod small.

Layer: accounting (pure). The namespace, the node, each device's UUID and type repeat across
pods; interned, a tracked pod costs little more than its own uid and name. Used by the ledger
on every stored change and by the one-pass load of journal recovery.
"""

from __future__ import annotations

import sys

from accounting.lifecycle import StoredPod
from accounting.model import DeviceUsage


def interned(
    stored: StoredPod, revision: int, usage: tuple[DeviceUsage, ...] | None = None
) -> StoredPod:
    """``stored`` with its namespace, node and usage interned, stamped with ``revision``;
    ``usage``, when given, is the interned usage to hold (one shared tuple for equal usages).
    Built directly rather than with dataclasses.replace: journal recovery calls this once per
    tracked pod."""
    return StoredPod(
        uid=stored.uid,
        namespace=sys.intern(stored.namespace),
        name=stored.name,
        node_name=sys.intern(stored.node_name),
        usage=interned_usage(stored.usage) if usage is None else usage,
        init_released=stored.init_released,
        terminal=stored.terminal,
        init_progress=stored.init_progress,
        init_restarts=stored.init_restarts,
        revision=revision,
        reserved_grants=stored.reserved_grants,
    )


def interned_usage(usage: tuple[DeviceUsage, ...]) -> tuple[DeviceUsage, ...]:
    """The usage with each device's UUID and type interned."""
    return tuple(
        DeviceUsage(
            sys.intern(u.uuid), sys.intern(u.vendor), u.memory_mib, u.core_percent, u.slots, u.mig
        )
        for u in usage
    )
