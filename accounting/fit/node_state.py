"""A candidate node as the fit reads it: ``NodeState`` (its devices and what is charged on
them) and the flat per-device columns built once per state (``_NodeColumns``: free capacity,
scores, device orders, and the per-vendor caches the placing fills).

Layer: accounting (pure).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

from accounting.fit.device_order import _device_order, device_score
from accounting.model import Device, DeviceState, DeviceUsage


class _NodeColumns:
    """A node's device state as flat per-field tuples, built once per NodeState.

    The fit reads integers by device position from these instead of walking frozen objects,
    and starts from precomputed free capacity, scores and device orders. Positions are those
    of NodeState.devices.
    """

    __slots__ = (
        "binpack_order",
        "cores_free",
        "cores_total",
        "cores_used",
        "device_scores",
        "devices",
        "index_rank",
        "memory_free",
        "memory_total",
        "memory_used",
        "node_score",
        "numas",
        "rank",
        "rules_needed",
        "score_terms",
        "slots_free",
        "slots_total",
        "slots_used",
        "spread_order",
        "unfiltered",
        "uuids",
    )

    def __init__(self, devices: tuple[DeviceState, ...]) -> None:
        self.devices = devices
        # One pass over the frozen objects: this runs for every node state the scheduler builds.
        uuids: list[str] = []
        slots_total: list[int] = []
        memory_total: list[int] = []
        cores_total: list[int] = []
        slots_used: list[int] = []
        memory_used: list[int] = []
        cores_used: list[int] = []
        scores: list[float] = []
        for state in devices:
            device = state.device
            uuids.append(device.uuid)
            slots_total.append(device.slots_total)
            memory_total.append(device.memory_total_mib)
            cores_total.append(device.core_percent_total)
            slots_used.append(state.slots_used)
            memory_used.append(state.memory_used_mib)
            cores_used.append(state.core_percent_used)
            scores.append(
                device_score(
                    state.slots_used,
                    device.slots_total,
                    state.core_percent_used,
                    device.core_percent_total,
                    state.memory_used_mib,
                    device.memory_total_mib,
                )
            )
        self.uuids = tuple(uuids)
        self.slots_total = tuple(slots_total)
        self.memory_total = tuple(memory_total)
        self.cores_total = tuple(cores_total)
        self.slots_used = tuple(slots_used)
        self.memory_used = tuple(memory_used)
        self.cores_used = tuple(cores_used)
        self.device_scores = tuple(scores)
        # The fit compares requests with what is left, so it starts from free capacity (negative
        # on an overcommitted device, which then refuses everything, as total - used would).
        self.slots_free = tuple(map(operator.sub, slots_total, slots_used))
        self.memory_free = tuple(map(operator.sub, memory_total, memory_used))
        self.cores_free = tuple(map(operator.sub, cores_total, cores_used))
        self.node_score = device_score(
            sum(slots_used),
            sum(slots_total),
            sum(cores_used),
            sum(cores_total),
            sum(memory_used),
            sum(memory_total),
        )
        # Ties between equally scored devices go to the higher NUMA node, then the higher
        # index, under both policies (accounting.gpu_order: HAMi's sort, walked from its end);
        # a policy chain breaks them by index alone.
        index_descending = sorted(
            range(len(devices)), key=lambda p: (devices[p].device.index, p), reverse=True
        )
        index_rank = [0] * len(devices)
        for position, p in enumerate(index_descending):
            index_rank[p] = position
        numa_descending = sorted(
            index_descending, key=lambda p: devices[p].device.numa, reverse=True
        )
        rank = [0] * len(devices)
        for position, p in enumerate(numa_descending):
            rank[p] = position
        # Device position -> its place in the tie-break (0 is tried first on a tie).
        self.rank = tuple(rank)
        self.index_rank = tuple(index_rank)
        self.numas = tuple(state.device.numa for state in devices)
        self.binpack_order = tuple(_device_order(numa_descending, scores, True))
        self.spread_order = tuple(_device_order(numa_descending, scores, False))
        # Static refusals and the orders without refused devices, per vendor, for pods without
        # device-selection annotations; filled on first use. A benign race under threads: both
        # writers store the same value.
        self.unfiltered: dict[str, _Allowed] = {}
        # Per vendor: whether its devices here need accounting.vendor_fit (filled on first use).
        self.rules_needed: dict[str, bool] = {}
        # Which vendor term the node score gets here (accounting.fit.node_score; filled on
        # first use): the node is read once, not once per pod.
        self.score_terms: str | None = None


@dataclass(frozen=True, slots=True)
class NodeState:
    """One candidate node: its devices with what is charged on them now."""

    node_name: str
    devices: tuple[DeviceState, ...]
    _columns: _NodeColumns = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple):
            object.__setattr__(self, "devices", tuple(self.devices))
        # Built once per snapshot; every pod fitted against this node reuses it.
        object.__setattr__(self, "_columns", _NodeColumns(self.devices))

    @classmethod
    def unused(cls, node_name: str, devices: Iterable[Device]) -> NodeState:
        """The node with nothing charged on its devices (a Node object read alone: a template
        node, or a manifest explained without the recorder)."""
        return cls(node_name, tuple(DeviceState(device) for device in devices))

    @property
    def score(self) -> float:
        """HAMi's node score on current usage (binpack prefers high, spread low)."""
        return self._columns.node_score

    def without(self, usage: Iterable[DeviceUsage]) -> NodeState:
        """The node as it would be without ``usage`` (a pod's own stored charge, which must
        not count against the pod when it is filtered again); never below nothing used."""
        released = {entry.uuid: entry for entry in usage}
        if not any(state.device.uuid in released for state in self.devices):
            return self
        devices = []
        for state in self.devices:
            entry = released.get(state.device.uuid)
            if entry is not None:
                state = DeviceState(
                    state.device,
                    max(state.memory_used_mib - entry.memory_mib, 0),
                    max(state.core_percent_used - entry.core_percent, 0),
                    max(state.slots_used - entry.slots, 0),
                )
            devices.append(state)
        return NodeState(self.node_name, tuple(devices))

    def with_added(self, usage: Iterable[DeviceUsage]) -> NodeState:
        """The node as it would be with ``usage`` charged too (a placement its copy does not
        show yet); a MIG card's instances are kept as they are."""
        added: dict[str, list[DeviceUsage]] = {}
        for entry in usage:
            added.setdefault(entry.uuid, []).append(entry)
        if not any(state.device.uuid in added for state in self.devices):
            return self
        devices = []
        for state in self.devices:
            for entry in added.get(state.device.uuid, ()):
                state = dataclasses.replace(
                    state,
                    memory_used_mib=state.memory_used_mib + entry.memory_mib,
                    core_percent_used=state.core_percent_used + entry.core_percent,
                    slots_used=state.slots_used + entry.slots,
                )
            devices.append(state)
        return NodeState(self.node_name, tuple(devices))


_Allowed = tuple[tuple[str | None, ...], tuple[int, ...], tuple[int, ...], int]
"""(static refusal per device, binpack order, spread order, the vendor's device count) for one
pod's vendor and filter; the orders leave out the refused devices, so the fit's device loop
never meets them."""
