"""The cluster's nodes during a what-if replay: each node's place in the scheduler's order,
what a cheap pre-check reads of it, and which nodes (and namespaces) changed when.

Layer: the what-if simulator (accounting and the standard library only). The scheduler's node
choice is fit_pod's: nodes are walked in ``fit.node_order_key`` order and the first that fits is
taken (fit_pod takes the best key among all that fit: the same node). The pool keeps the nodes
in the default policy's order as usage changes, and numbers every change (a node's usage, a
namespace's usage) so that a shape that failed is tried again only on what changed since. The
pre-check holds no rule of its own: it compares the asks of the fit's plan (whatif.shapes) with
each card's free ``Amount`` as the fit's capacity rule does, so it leaves out only nodes the fit
would refuse.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from accounting.amount import ZERO, Amount
from accounting.fit import NodeState, device_score, node_order_key, node_policy_for
from accounting.ledger import Ledger
from accounting.model import Device, DeviceState, Pod
from whatif.shapes import ShapeQueue


class NodeSummary:
    """A node's place in the scheduler's order and what the cheap pre-check reads: each usable
    card's free capacity (a card of the vendor, healthy, with a slot left), and the envelope of
    them. The NodeState the fit needs is built only when the node is tried."""

    __slots__ = ("_state", "cards", "devices", "envelope", "name", "score", "used")

    def __init__(
        self,
        name: str,
        devices: tuple[Device, ...],
        used: Mapping[str, tuple[int, int, int]],
        vendor: str,
    ) -> None:
        self.name = name
        self.devices = devices
        self.used = used
        self._state: NodeState | None = None
        cards: list[tuple[int, Amount]] = []
        envelope = ZERO
        charged = ZERO
        offered = ZERO
        for device in devices:
            capacity = device.capacity
            held = Amount(*used[device.uuid]) if device.uuid in used else ZERO
            charged += held
            offered += capacity
            if not device.healthy or device.vendor != vendor:
                continue
            free = capacity - held
            if free.slots <= 0:
                continue
            cards.append((device.memory_total_mib, free))
            envelope = envelope.join(free)
        self.cards = tuple(cards)
        """(memory total, free capacity) of every card the fit may place a device on."""
        self.envelope = envelope
        """The most any one of ``cards`` has free, per dimension (nothing without a card)."""
        # NodeState.score, from the same sums.
        self.score = device_score(
            charged.slots,
            offered.slots,
            charged.core_percent,
            offered.core_percent,
            charged.memory_mib,
            offered.memory_mib,
        )

    @property
    def state(self) -> NodeState:
        """The node as the fit reads it (built on first use)."""
        if self._state is None:
            used = self.used
            self._state = NodeState(
                self.name,
                tuple(
                    DeviceState(d, *used[d.uuid]) if d.uuid in used else DeviceState(d)
                    for d in self.devices
                ),
            )
        return self._state

    def takes(self, queue: ShapeQueue) -> bool:
        """Each container's devices could each be taken by a card of its own, as the fit's
        capacity rule says (counted per container: a necessary condition only)."""
        taking = [0] * len(queue.asks)
        for memory_total_mib, free in self.cards:
            for position, need in enumerate(queue.on_card(memory_total_mib)):
                if need.fits_in(free):
                    taking[position] += 1
        return all(
            count >= demand.count for count, demand in zip(taking, queue.asks, strict=True)
        )

    def key(self, node_policy: str) -> tuple[float, str]:
        """Its place in the scheduler's order under ``node_policy``."""
        return node_order_key(self.score, self.name, node_policy)


class NodePool:
    """Every node's summary, the default policy's order of them, and the change numbers."""

    def __init__(
        self,
        ledger: Ledger,
        inventories: Mapping[str, tuple[Device, ...]],
        vendor_name: str,
        node_policy: str,
    ) -> None:
        self.ledger = ledger
        self.inventories = inventories
        self.vendor_name = vendor_name
        # Default node-policy order of every node: (key, name), kept sorted as usage changes.
        self.default_policy = node_policy_for_default(node_policy)
        self.nodes: dict[str, NodeSummary] = {}
        self.order: list[tuple[float, str]] = []
        for name in inventories:
            summary = self.summarise(name)
            self.nodes[name] = summary
            bisect.insort(self.order, summary.key(self.default_policy))
        self.seq = 0
        """The number of the last change (of a node's usage or of a namespace's)."""
        self.node_seq: dict[str, int] = dict.fromkeys(inventories, 0)
        self.namespace_seq: dict[str, int] = {}
        self.change_log: list[tuple[int, str]] = []
        self._empty_nodes: list[NodeState] | None = None

    def summarise(self, name: str) -> NodeSummary:
        """The node's summary on the ledger's current usage."""
        return NodeSummary(
            name, self.inventories[name], self.ledger.node_usage(name), self.vendor_name
        )

    def node_changed(self, name: str) -> None:
        """The ledger changed what is charged on the node."""
        old = self.nodes[name]
        new = self.summarise(name)
        self.nodes[name] = new
        old_key = old.key(self.default_policy)
        new_key = new.key(self.default_policy)
        if old_key != new_key:
            del self.order[bisect.bisect_left(self.order, old_key)]
            bisect.insort(self.order, new_key)
        self.seq += 1
        self.node_seq[name] = self.seq
        self.change_log.append((self.seq, name))

    def namespace_changed(self, namespace: str) -> None:
        """The namespace's usage changed."""
        self.seq += 1
        self.namespace_seq[namespace] = self.seq

    def changed_since(self, seq: int) -> set[str]:
        """The nodes changed after change number ``seq``."""
        start = bisect.bisect_right(self.change_log, (seq, "\uffff"))
        return {name for _, name in self.change_log[start:]}

    def walk(self, queue: ShapeQueue) -> Iterator[NodeState]:
        """Every node in the order fit_pod prefers them, without those that surely refuse the
        shape."""
        if queue.node_policy != self.default_policy:
            yield from self.passing(queue, self.nodes)
            return
        nodes = self.nodes
        most, fits, fine = queue.most_devices, queue.need.fits_in, queue.fine
        # Not changed while this walks it: a placement ends the walk. The pre-check is inlined:
        # this loop visits every busy node before the first that may take the pod.
        for _, name in self.order:
            summary = nodes[name]
            if (
                len(summary.cards) >= most
                and fits(summary.envelope)
                and (not fine or summary.takes(queue))
            ):
                yield summary.state

    def passing(self, queue: ShapeQueue, names: Iterable[str]) -> list[NodeState]:
        """Those of the named nodes that may take the shape, in the order fit_pod prefers."""
        most, fits, fine = queue.most_devices, queue.need.fits_in, queue.fine
        passing = [
            summary
            for summary in map(self.nodes.__getitem__, names)
            if len(summary.cards) >= most
            and fits(summary.envelope)
            and (not fine or summary.takes(queue))
        ]
        if len(passing) > 1:
            policy = queue.node_policy
            passing.sort(key=lambda summary: summary.key(policy))
        return [summary.state for summary in passing]

    def empty_nodes(self) -> list[NodeState]:
        """One empty node per kind of inventory in the pool (devices alike but for UUIDs)."""
        if self._empty_nodes is None:
            kinds: dict[tuple[object, ...], tuple[Device, ...]] = {}
            for name in sorted(self.inventories):
                devices = self.inventories[name]
                kind = tuple(replace(d, uuid=str(i)) for i, d in enumerate(devices))
                kinds.setdefault(kind, devices)
            self._empty_nodes = [
                NodeState(f"empty-{i}", tuple(DeviceState(d) for d in devices))
                for i, devices in enumerate(kinds.values())
            ]
        return self._empty_nodes


def node_policy_for_default(node_policy: str) -> str:
    """The configured node policy, checked (a pod without annotation gets it)."""
    return node_policy_for(Pod("", "", "", ()), node_policy)
