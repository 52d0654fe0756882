"""The one-pass load of journal recovery: acknowledged pods into an empty ledger's records and
totals, summed directly instead of change by change.

Layer: accounting (pure; called by ``accounting.ledger.ledger.Ledger.restore_all`` only). The
result is what storing each pod in turn would give (``Ledger.restore`` per pod), without the
per-pod delta bookkeeping, which keeps recovery of 100,000 pods well inside a second or two.
"""

from __future__ import annotations

from collections.abc import Iterable

from accounting.amount import Amount
from accounting.ledger.interning import interned as interned_pod
from accounting.ledger.interning import interned_usage
from accounting.ledger.records import PodRecords
from accounting.ledger.totals import UsageTotals, add_device_usage
from accounting.lifecycle import StoredPod
from accounting.model import DeviceUsage
from accounting.vendors import VendorResources


def load_pods(
    stored_pods: Iterable[StoredPod],
    *,
    interned: bool,
    records: PodRecords,
    totals: UsageTotals,
    vendors: Iterable[VendorResources],
) -> None:
    """Loads ``stored_pods`` (in the order they were first stored) into empty ``records`` and
    ``totals``; a pod without a revision is given revision 1.

    Args:
        stored_pods: the pods, in the order they were first stored.
        interned: the caller already shares the strings and usage tuples that repeat
            (namespace, node, UUID, type; see ``accounting.ledger.interning``), as the
            journal's loader does: the pods are kept as given instead of being rebuilt.
        records: where the pods are stored and listed under their nodes.
        totals: the totals they are summed into.
        vendors: the vendors whose resources name a namespace's totals.

    Raises:
        ValueError: a uid appears twice.
    """
    # Each vendor's quota dimensions, in the order usage_totals sums them: memory, cores,
    # devices (held_quantities' names).
    resources = {v.vendor: (v.memory_resource, v.core_resource, v.count_resource) for v in vendors}
    namespace_used = totals.namespace_used
    node_pods = records.by_node
    pods = records.by_uid
    # Many pods carry equal usage: share one interned tuple per distinct value.
    usage_pool: dict[tuple[DeviceUsage, ...], tuple[DeviceUsage, ...]] = {}
    # The one place the totals are summed on plain integers rather than Amounts: per device
    # [memory, cores, slots], turned into Amounts at the end, and per namespace and vendor
    # [memory, cores, devices] (usage_totals' rule: an entry is one device, however many
    # slots it holds), named by the vendor's resources at the end. Recovery of 100,000 pods
    # took twice as long with an Amount per addition, and a namespace share kept per usage
    # tuple held 300 bytes per pod until the end, which stayed resident (docs/benchmarks.md).
    node_sums: dict[str, dict[str, list[int]]] = {}
    vendor_sums: dict[str, dict[str, list[int]]] = {}
    for stored in stored_pods:
        if not interned:
            usage = usage_pool.get(stored.usage)
            if usage is None:
                usage = usage_pool[stored.usage] = interned_usage(stored.usage)
            stored = interned_pod(stored, stored.revision or 1, usage)
        if stored.uid in pods:
            raise ValueError(f"restore_all: pod {stored.uid} appears twice")
        pods[stored.uid] = stored
        uids = node_pods.get(stored.node_name)
        if uids is None:
            node_pods[stored.node_name] = [stored.uid]
        else:
            uids.append(stored.uid)
        if not stored.usage:
            continue
        node = node_sums.get(stored.node_name)
        if node is None:
            node = node_sums[stored.node_name] = {}
        by_vendor = vendor_sums.get(stored.namespace)
        if by_vendor is None:
            by_vendor = vendor_sums[stored.namespace] = {}
        add_device_usage(node, stored.usage)
        for entry in stored.usage:
            held = by_vendor.get(entry.vendor)
            if held is None:
                by_vendor[entry.vendor] = [entry.memory_mib, entry.core_percent, 1]
            else:
                held[0] += entry.memory_mib
                held[1] += entry.core_percent
                held[2] += 1
            if entry.mig:
                totals.count_mig(stored.node_name, entry, +1)
    # One node at a time, so its lists are freed as its Amounts are made.
    node_used = totals.node_used
    node_used.clear()
    for node_name in list(node_sums):
        node_used[node_name] = {
            uuid: Amount(*vector) for uuid, vector in node_sums.pop(node_name).items()
        }
    for namespace_name, by_vendor in vendor_sums.items():
        namespace = namespace_used.setdefault(namespace_name, {})
        for vendor_name, held in by_vendor.items():
            names = resources.get(vendor_name)
            if names is None:  # a vendor this policy does not account
                continue
            for resource, quantity in zip(names, held, strict=True):
                namespace[resource] = namespace.get(resource, 0) + quantity
    for uids in node_pods.values():
        uids.sort()
    # Keep the invariant of the totals: no zero entries.
    for node_name in [n for n, used in node_used.items() if not used]:
        del node_used[node_name]
    for used in node_used.values():
        for uuid in [u for u, amount in used.items() if not amount]:
            del used[uuid]
    for namespace_name, namespace_totals in list(namespace_used.items()):
        for resource in [r for r, v in namespace_totals.items() if v == 0]:
            del namespace_totals[resource]
        if not namespace_totals:
            del namespace_used[namespace_name]
