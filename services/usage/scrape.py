"""What a scrape of the recorder's /metrics reads from its store: HAMi's scheduler families and
the recorder's own per-device and per-namespace families, from one reading of the store.

Layer: services/usage (runtime). ``RecorderScrape.render`` takes a ``StoreReading`` (one hold
of the store's lock, references only) and writes, outside the lock:

* per registered node, HAMi's device families (``services.usage.hami_metrics``), each device's
  charge summed from the stored pods on it, as HAMi sums its node usage from its pods;
* per stored pod, HAMi's per-container families;
* per namespace, HAMi's quota families and ``hami_accounting_quota_used`` / ``_limit``;
* per device holding one, the init share (``hami_accounting_init_share_held_*``).

Lines are kept between scrapes and written again only for what changed: a node's lines while
its inventory and the charges on its devices are the same, a pod's while its stored value (an
immutable object, compared by identity) and its node's inventory are. At 5,000 nodes × 8 GPUs
the lines run to tens of megabytes, and writing them all on every scrape would hold the GIL
for seconds (docs/observability.md has the measured cost).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from accounting.ledger.totals import add_device_usage
from accounting.lifecycle import StoredPod
from accounting.mig import MigAllocation
from accounting.model import Device
from accounting.policy import AccountingPolicy
from services.usage import hami_metrics
from services.usage.exposition import family, label_set
from services.usage.metrics import (
    INIT_SHARE_HELD_CORES,
    INIT_SHARE_HELD_MIB,
    QUOTA_LIMIT,
    QUOTA_USED,
)
from services.usage.pod_facts import PodFacts
from services.usage.store import StoreReading, UsageStore

_NO_USE = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class _NodeLines:
    devices: tuple[Device, ...]
    members: list[object]
    """The node's stored pods, each followed by its init share or None (compared by
    identity: all immutable)."""
    used: tuple[tuple[int, int, int], ...]
    instances: bool
    """Whether some card of the node shows a created MIG instance."""
    lines: tuple[str, ...]
    """One chunk per device family."""
    held_lines: tuple[str, str]
    """The node's chunks of the two init-share families."""


@dataclass(frozen=True, slots=True)
class _PodLines:
    stored: StoredPod
    devices: tuple[Device, ...]
    lines: tuple[str, ...]
    """One chunk per pod family."""


class RecorderScrape:
    """Writes the scrape-time families of one store; ``render`` is what /metrics appends."""

    def __init__(
        self,
        store: UsageStore,
        *,
        legacy_hami_metrics: bool = False,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """Args:
        store: the recorder's store.
        legacy_hami_metrics: also write HAMi's pre-2.8 metric names (HAMi's
            ``--legacy-metrics``).
        leading: whether this replica takes writes; a standby writes none of these
            families (its copy is stale, and a sum over replicas must count the cluster once).
        """
        self._store = store
        self._leading = leading
        self._legacy = legacy_hami_metrics
        self._device_families, self._pod_families, self._quota_families = (
            hami_metrics.families(legacy_hami_metrics)
        )
        policy: AccountingPolicy = store.policy
        self._tracked = frozenset(
            resource
            for vendor in policy.vendors
            for resource in (vendor.memory_resource, vendor.core_resource)
            if resource
        )
        self._memory_factors = {
            vendor.memory_resource: vendor.memory_factor
            for vendor in policy.vendors
            if vendor.memory_resource
        }
        self._nodes: dict[str, _NodeLines] = {}
        self._pods: dict[str, _PodLines] = {}
        self._lock = threading.Lock()
        """One scrape writes at a time (the metrics server answers each on its own thread)."""

    def render(self) -> str:
        """The text of every scrape-time family, of one revision of the store."""
        if not self._leading():
            return ""
        with self._lock:
            return "".join(self._render(self._store.reading()))

    def _render(self, reading: StoreReading) -> list[str]:
        inventories = dict(reading.nodes)
        facts = reading.pod_facts
        members: dict[str, list[object]] = {}
        """node -> its stored pods, each followed by its facts (or None)."""
        pods: dict[str, _PodLines] = {}
        for stored in reading.pods:
            if not stored.usage:
                continue
            pods[stored.uid] = self._pod_lines(stored, inventories)
            known = facts.get(stored.uid)
            node = members.get(stored.node_name)
            if node is None:
                node = members[stored.node_name] = []
            node.append(stored)
            node.append(known if known is not None and known.stored is stored else None)
        self._pods = pods
        nodes = {
            name: self._node_lines(name, devices, members.get(name, []))
            for name, devices in reading.nodes
        }
        self._nodes = nodes
        quota_lines = [
            hami_metrics.quota_lines(namespace, items, self._tracked, self._legacy)
            for namespace, items in reading.namespaces
        ]
        parts: list[str] = []
        for index, (name, help_text) in enumerate(self._device_families):
            parts.append(family(name, help_text, [n.lines[index] for n in nodes.values()]))
        for index, (name, help_text) in enumerate(self._pod_families):
            parts.append(family(name, help_text, [p.lines[index] for p in pods.values()]))
        for index, (name, help_text) in enumerate(self._quota_families):
            parts.append(family(name, help_text, [q[index] for q in quota_lines]))
        parts.extend(self._quota(reading))
        for index, (name, help_text) in enumerate((INIT_SHARE_HELD_MIB, INIT_SHARE_HELD_CORES)):
            parts.append(family(name, help_text, [n.held_lines[index] for n in nodes.values()]))
        return parts

    def _node_lines(
        self, name: str, devices: tuple[Device, ...], members: list[object]
    ) -> _NodeLines:
        known = self._nodes.get(name)
        if (
            known is not None
            and known.devices is devices
            and len(known.members) == len(members)
            and all(map(operator.is_, known.members, members))
        ):
            return known  # the same inventory, the same stored pods and facts
        charges: dict[str, list[int]] = {}
        held: dict[str, list[int]] = {}
        instances: dict[str, list[MigAllocation]] = {}
        for stored, pod_facts in zip(members[::2], members[1::2], strict=True):
            assert isinstance(stored, StoredPod)
            add_device_usage(charges, stored.usage)
            if isinstance(pod_facts, PodFacts):
                add_device_usage(held, pod_facts.init_share)
                for instance in pod_facts.mig_instances:
                    instances.setdefault(instance.gpu_uuid, []).append(instance)
        used = tuple(
            (u[0], u[1], u[2]) if (u := charges.get(d.uuid)) is not None else _NO_USE
            for d in devices
        )
        if (known is not None and known.devices is devices and known.used == used
                and not instances and not known.instances):
            lines = known.lines
        else:
            per_device = [
                hami_metrics.device_lines(name, device, charge, self._legacy,
                                          instances.get(device.uuid, ()))
                for device, charge in zip(devices, used, strict=True)
            ]
            lines = tuple("".join(column) for column in zip(*per_device, strict=True)) or tuple(
                "" for _ in self._device_families
            )
        return _NodeLines(devices, members, used, bool(instances), lines,
                          _held_lines(name, devices, held))

    def _pod_lines(
        self, stored: StoredPod, inventories: Mapping[str, tuple[Device, ...]]
    ) -> _PodLines:
        devices = inventories.get(stored.node_name, ())
        known = self._pods.get(stored.uid)
        if known is not None and known.stored is stored and known.devices is devices:
            return known
        by_uuid = {d.uuid: d for d in devices}
        return _PodLines(stored, devices, hami_metrics.pod_lines(stored, by_uuid, self._legacy))

    def _quota(self, reading: StoreReading) -> list[str]:
        used: list[str] = []
        limits: list[str] = []
        for namespace, items in reading.namespaces:
            for item in items:
                labels = label_set((("namespace", namespace), ("resource", item.resource)))
                used.append(f"{QUOTA_USED[0]}{labels} {item.used}\n")
                if item.limit_set:
                    factor = self._memory_factors.get(item.resource, 1)
                    limit = item.limit * factor if factor > 1 else item.limit
                    limits.append(f"{QUOTA_LIMIT[0]}{labels} {limit}\n")
        return [family(*QUOTA_USED, used), family(*QUOTA_LIMIT, limits)]


def _held_lines(
    node_name: str, devices: tuple[Device, ...], held: Mapping[str, list[int]]
) -> tuple[str, str]:
    """The node's lines of the two init-share families: a line per device holding a share."""
    if not held:
        return "", ""
    memory: list[str] = []
    cores: list[str] = []
    for device in devices:
        share = held.get(device.uuid)
        if share is None:
            continue
        labels = label_set((("node", node_name), ("device_uuid", device.uuid)))
        memory.append(f"{INIT_SHARE_HELD_MIB[0]}{labels} {share[0]}\n")
        cores.append(f"{INIT_SHARE_HELD_CORES[0]}{labels} {share[1]}\n")
    return "".join(memory), "".join(cores)
