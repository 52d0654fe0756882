"""How the ledger's answers name usage: a stored usage in one line, and the numbers of a
capacity shortfall.

Layer: accounting (pure). The sentences of ``accounting.ledger``'s outcomes and refusals.
"""

from __future__ import annotations

from collections.abc import Iterable

from accounting.amount import Amount, Dimension
from accounting.model import DeviceUsage


def describe_usage(usage: Iterable[DeviceUsage]) -> str:
    """Each device's charge as "uuid memory MiB/cores%/slots slots", or "nothing"."""
    return (
        ", ".join(f"{u.uuid} {u.memory_mib} MiB/{u.core_percent}%/{u.slots} slots" for u in usage)
        or "nothing"
    )


def shortfall_message(
    entry: DeviceUsage, node_name: str, short: Dimension, others: Amount, capacity: Amount
) -> str:
    """The sentence of a capacity refusal, with the numbers of the short dimension."""
    where = f"device {entry.uuid} on {node_name}"
    if short is Dimension.MEMORY:
        return (
            f"{where}: {entry.memory_mib} MiB requested, "
            f"{others.memory_mib} MiB used of {capacity.memory_mib} MiB"
        )
    if short is Dimension.CORES:
        return (
            f"{where}: {entry.core_percent}% cores requested, "
            f"{others.core_percent}% used of {capacity.core_percent}%"
        )
    return f"{where}: {entry.slots} slots requested, {others.slots} used of {capacity.slots}"
