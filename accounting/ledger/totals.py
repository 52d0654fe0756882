"""The ledger's totals, kept by deltas: what is charged on each device of each node, the MIG
placements held on each card, and what each namespace uses of each resource.

Layer: accounting (pure; a part of ``accounting.ledger.ledger.Ledger``, which alone changes it).
Each stored pod's usage is added when it is stored and taken back when it is replaced or
released, so the totals never go negative, and they hold no zero entry: a device, placement,
resource, node or namespace with nothing charged is absent. Journal recovery fills them in one
pass instead (``accounting.ledger.bulk_load``), to the same invariant.
"""

from __future__ import annotations

from collections.abc import Iterable

from accounting.amount import ZERO, Amount
from accounting.lifecycle import StoredPod
from accounting.model import DeviceUsage, MigPlacement
from accounting.quota import held_quantities
from accounting.vendors import VendorResources


def add_device_usage(sums: dict[str, list[int]], usage: Iterable[DeviceUsage]) -> None:
    """Adds each entry of ``usage`` into ``sums`` (device UUID -> [memory MiB, core percent,
    slots]): what a node's devices are charged is the sum of its stored pods' usage. Plain
    integer lists, for the passes that sum many pods at once (recovery, a metrics scrape)."""
    for entry in usage:
        total = sums.get(entry.uuid)
        if total is None:
            sums[entry.uuid] = [entry.memory_mib, entry.core_percent, entry.slots]
        else:
            total[0] += entry.memory_mib
            total[1] += entry.core_percent
            total[2] += entry.slots


class UsageTotals:
    """Per node and device, per node and MIG card, and per namespace, what the pods hold."""

    __slots__ = ("_vendors", "namespace_used", "node_mig", "node_used")

    def __init__(self, vendors: Iterable[VendorResources]) -> None:
        """Totals of the stored pods' usage; a namespace's are named by ``vendors``' resources."""
        self._vendors = tuple(vendors)
        self.node_used: dict[str, dict[str, Amount]] = {}
        """node -> uuid -> what is charged on the device."""
        self.node_mig: dict[str, dict[str, dict[MigPlacement, int]]] = {}
        """node -> uuid -> MIG placement -> how many pods hold it (pods on MIG cards only)."""
        self.namespace_used: dict[str, dict[str, int]] = {}
        """namespace -> resource -> used."""

    def add(self, stored: StoredPod, sign: int) -> None:
        """Adds (or takes back) one pod's usage to its node's and its namespace's totals."""
        self.add_to_node(stored, sign)
        self.add_to_namespace(stored, sign)

    def add_to_node(self, stored: StoredPod, sign: int) -> None:
        """Adds (or takes back) one pod's usage to its node's devices and MIG cards."""
        node = self.node_used.setdefault(stored.node_name, {})
        for entry in stored.usage:
            held = node.get(entry.uuid, ZERO)
            total = held + entry.amount if sign > 0 else held - entry.amount
            if total:
                node[entry.uuid] = total
            else:  # nothing held now (a usage of zeros was never there to begin with)
                node.pop(entry.uuid, None)
            if entry.mig:
                self.count_mig(stored.node_name, entry, sign)
        if not node:
            del self.node_used[stored.node_name]

    def add_to_namespace(self, stored: StoredPod, sign: int) -> None:
        """Adds (or takes back) one pod's usage to its namespace's resources."""
        namespace = self.namespace_used.setdefault(stored.namespace, {})
        for vendor in self._vendors:
            for resource, quantity in held_quantities(stored.usage, vendor):
                count = namespace.get(resource, 0) + sign * quantity
                if count:
                    namespace[resource] = count
                else:
                    namespace.pop(resource, None)
        if not namespace:
            del self.namespace_used[stored.namespace]

    def count_mig(self, node_name: str, entry: DeviceUsage, sign: int) -> None:
        """Adds (or takes back) the placements one pod holds on one card: each once per pod,
        however many of its containers share it (an init container and an app container may
        be given the same instance in turn)."""
        node = self.node_mig.setdefault(node_name, {})
        card = node.setdefault(entry.uuid, {})
        for placement in {m.placement for m in entry.mig}:
            count = card.get(placement, 0) + sign
            if count > 0:
                card[placement] = count
            else:
                card.pop(placement, None)
        if not card:
            del node[entry.uuid]
        if not node:
            del self.node_mig[node_name]

    def resum(
        self, pods: Iterable[StoredPod], node_names: set[str], namespaces: set[str]
    ) -> None:
        """Sums the totals of some nodes and namespaces again from the stored ``pods``: after
        a change that failed half way (slow, and only ever then)."""
        for node_name in node_names:
            self.node_used.pop(node_name, None)
            self.node_mig.pop(node_name, None)
        for namespace in namespaces:
            self.namespace_used.pop(namespace, None)
        for pod in pods:
            if pod.node_name in node_names:
                self.add_to_node(pod, +1)
            if pod.namespace in namespaces:
                self.add_to_namespace(pod, +1)
