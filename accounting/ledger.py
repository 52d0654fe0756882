"""The ledger: what each pod is charged per device, and node and namespace totals.

Layer: accounting (pure, in memory, not thread-safe: the usage recorder's store serialises
access and journals every change). Every change is applied as a delta between the old and the
new stored value of one pod, so add and remove are symmetric, totals never go negative, and
replaying an update changes nothing.

Tombstones. Kubernetes never reuses a pod uid, so a forgotten uid is remembered: a RecordPod that
arrives after the ForgetPod (a late or retried informer update, or a delete seen before its add)
changes nothing and answers ``Forgotten``. The ledger keeps the most recent
``DEFAULT_MAX_TOMBSTONES`` forgotten uids and drops the oldest beyond that. The bound is safe
because a late update is late by seconds or minutes (an informer retry or resync, a reordered
delivery), while a uid drops out only after 100,000 later deletions. Should an update older than
that still arrive, the pod is charged again as before tombstones existed, until a ForgetPod (or,
with the Kubernetes source, the next re-list) releases it.

Reserve and tombstones. A forget means the pod was deleted: its tombstone refuses Reserve
(``PodForgotten``) as well as RecordPod, so a Filter still running for a deleted pod stores
nothing. The scheduler never forgets a pod to filter it again: a re-filter's Reserve states the
reservation it replaces (``replaces_revision``: the ``StoredPod.revision`` it read, 0 for
none) and replaces it atomically, and a re-filter that finds no node releases it with
``release``, which leaves no tombstone. Either is refused (``ReservationChanged``), changing
nothing, when what is stored is no longer what the scheduler read: another Filter for the same
pod, on another scheduler replica, got there first, and its answer is the one that stands.
Journals written before this rule may hold "reservable" tombstones (a stored pod forgotten,
which then might have been a re-filter's release): they still refuse RecordPod only.

Finished pods. A pod that reached Succeeded or Failed never uses a device again. One that was
tracked stays stored with nothing charged (``StoredPod.terminal``) until it is forgotten; one
whose *first* update is already terminal (a recorder restarted or a watch re-listed after the
pod finished, or updates delivered out of order) is remembered with a tombstone that refuses
RecordPod and Reserve, like a delete, so a later, staler Running or Pending update charges
nothing. Either way, once a terminal status has been seen nothing is charged for that uid.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from accounting import reasons
from accounting.amount import ZERO, Amount, Dimension
from accounting.errors import InvalidInputError, Violations
from accounting.lifecycle import Decision, StoredPod, decide
from accounting.limits import MAX_QUOTA_LIMIT
from accounting.mig import MIG_MODE, UNKNOWN_INSTANCE, whole_card
from accounting.model import (
    Device,
    DeviceState,
    DeviceUsage,
    MigInstance,
    MigPlacement,
    Pod,
    QuotaItem,
)
from accounting.pod import effective_usage
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import check_usage, held_quantities
from accounting.vendor_spec import Charge

DEFAULT_MAX_TOMBSTONES = 100_000
"""Forgotten uids remembered (the most recent ones); see the module docstring for the bound."""


@dataclass(frozen=True, slots=True)
class TombstoneChange:
    """A tombstone written by a forget: the uid, its new kind, and what it replaced."""

    uid: str
    reservable: bool
    """True: refuses RecordPod only (only restored from journals written before every forget
    meant a delete); False: refuses Reserve too."""
    previous: bool | None
    """The kind it had before (None: the uid was not remembered)."""
    evicted: tuple[tuple[str, bool], ...] = ()
    """The oldest tombstones dropped to keep the bound, oldest first, with their kinds."""


@dataclass(frozen=True, slots=True)
class LedgerChange:
    """One applied change: the pod's stored value before and after (None = not tracked)."""

    before: StoredPod | None
    after: StoredPod | None
    tombstone: TombstoneChange | None = None
    """Set by ``forget`` when the uid's tombstone was written (new or hardened)."""

    @property
    def namespace(self) -> str:
        """The namespace of the pod the change is about ("" for a tombstone alone)."""
        pod = self.after or self.before
        return pod.namespace if pod else ""

    @property
    def node_names(self) -> tuple[str, ...]:
        """The nodes whose totals the change touched, sorted."""
        names = {p.node_name for p in (self.before, self.after) if p is not None and p.node_name}
        return tuple(sorted(names))

    @property
    def changed(self) -> bool:
        """True when the stored value differs after the change, or was stored again under a
        new revision (a re-filter that reserved the same placement claims it)."""
        before, after = self.before, self.after
        return before != after or (
            before is not None and after is not None and before.revision != after.revision
        )


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What RecordPod did."""

    decision: Decision
    message: str
    stored: StoredPod | None
    change: LedgerChange
    overcommitted: tuple[str, ...] = ()
    """UUIDs on the pod's node charged beyond their capacity after this change (an init re-run
    whose capacity was handed out meanwhile: recorded anyway, because it is real)."""


@dataclass(frozen=True, slots=True)
class ReserveOutcome:
    """What Reserve did: reserved, or refused with a reason and nothing changed."""

    reserved: bool
    reason: str
    message: str
    stored: StoredPod | None
    change: LedgerChange | None


@dataclass(frozen=True, slots=True)
class ReleaseOutcome:
    """What ReleaseReservation did: released, or refused with a reason and nothing changed."""

    released: bool
    reason: str
    message: str
    change: LedgerChange | None


class ReserveReason:
    """Reserve's reason codes, by name (spelled in accounting.reasons; quota codes come from
    accounting.quota.QuotaReason)."""

    RESERVED = reasons.RESERVED
    INSUFFICIENT_MEMORY = reasons.CARD_INSUFFICIENT_MEMORY
    INSUFFICIENT_CORE = reasons.CARD_INSUFFICIENT_CORE
    SLOTS_EXHAUSTED = reasons.CARD_TIME_SLICING_EXHAUSTED
    NO_GRANTS = reasons.NO_GRANTS
    POD_FORGOTTEN = reasons.POD_FORGOTTEN
    POLICY_CHANGED = reasons.POLICY_CHANGED
    RESERVATION_CHANGED = reasons.RESERVATION_CHANGED


class Ledger:
    """Per-pod stored usage with node and namespace totals kept by deltas."""

    def __init__(
        self,
        policy: AccountingPolicy = DEFAULT_POLICY,
        *,
        max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
        progressive_release: bool = True,
    ) -> None:
        """A ledger deciding under ``policy`` (the recorder's: what it publishes is this).

        Args:
            policy: the accounting policy.
            max_tombstones: forgotten uids remembered (see the module docstring).
            progressive_release: passed to accounting.lifecycle.decide on every record; False
                only to compare release rules (accounting.counting_rules).
        """
        if max_tombstones < 1:
            raise ValueError(f"max_tombstones must be >= 1, got {max_tombstones}")
        self.policy = policy
        self._vendors = {v.vendor: v for v in policy.vendors}
        # Vendors whose cores are a bit mask of the device's cores (AWS Neuron).
        self._core_masks = frozenset(
            spec.vendor for spec in policy.specs if spec.charge is Charge.CORE_MASK
        )
        self._pods: dict[str, StoredPod] = {}
        # node -> uids of the pods stored there, sorted. A list per node rather than a set: a
        # set of 8 uids takes 728 bytes, the list 120, and GetNodeUsage wants them sorted.
        self._node_pods: dict[str, list[str]] = {}
        # uid -> reservable (see TombstoneChange), and the uids oldest first. A deque for the
        # order because popping a dict's first key again and again is not O(1): the deleted
        # slots at its front are scanned until the next resize.
        self._tombstones: dict[str, bool] = {}
        self._tombstone_order: collections.deque[str] = collections.deque()
        self.max_tombstones = max_tombstones
        self.progressive_release = progressive_release
        # node -> uuid -> what is charged on the device
        self._node_used: dict[str, dict[str, Amount]] = {}
        # node -> uuid -> MIG placement -> how many pods hold it (pods on MIG cards only)
        self._node_mig: dict[str, dict[str, dict[MigPlacement, int]]] = {}
        # namespace -> resource -> used
        self._namespace_used: dict[str, dict[str, int]] = {}
        # namespace -> resource -> limit (absent = no limit)
        self._limits: dict[str, dict[str, int]] = {}
        self._nodes: dict[str, tuple[Device, ...]] = {}
        self.revision = 0

    # -- queries ---------------------------------------------------------------------------

    def pod(self, uid: str) -> StoredPod | None:
        """What is stored for one pod, or None."""
        return self._pods.get(uid)

    def pods(self) -> Iterable[StoredPod]:
        """Every stored pod (a live view: do not change the ledger while iterating)."""
        return self._pods.values()

    def pod_uids(self) -> frozenset[str]:
        """The uids of every stored pod."""
        return frozenset(self._pods)

    def __len__(self) -> int:
        return len(self._pods)

    def node_names(self) -> tuple[str, ...]:
        """The registered nodes, in registration order."""
        return tuple(self._nodes)

    def node_devices(self, node_name: str) -> tuple[Device, ...] | None:
        """A registered node's inventory, or None."""
        return self._nodes.get(node_name)

    def node_states(self, node_name: str) -> tuple[DeviceState, ...] | None:
        """The node's devices with what is charged on them; None if the node is not registered."""
        devices = self._nodes.get(node_name)
        if devices is None:
            return None
        used = self._node_used.get(node_name, {})
        held = self._node_mig.get(node_name, {})
        states = tuple(
            DeviceState(d, *used[d.uuid].as_tuple()) if d.uuid in used else DeviceState(d)
            for d in devices
        )
        if not held:
            return states
        return tuple(
            dataclasses.replace(state, mig_in_use=tuple(sorted(held[state.device.uuid])))
            if state.device.uuid in held
            else state
            for state in states
        )

    def node_mig_in_use(self, node_name: str) -> dict[str, tuple[MigPlacement, ...]]:
        """uuid -> the MIG placements pods hold on it, sorted (registered or not)."""
        return {
            uuid: tuple(sorted(held))
            for uuid, held in self._node_mig.get(node_name, {}).items()
        }

    def node_pod_uids(self, node_name: str) -> tuple[str, ...]:
        """UIDs of the pods stored on a node (registered or not), sorted."""
        return tuple(self._node_pods.get(node_name, ()))

    def pod_node_names(self) -> tuple[str, ...]:
        """Names of the nodes pods are stored on ("" for pods recorded without a node)."""
        return tuple(self._node_pods)

    def node_usage(self, node_name: str) -> dict[str, tuple[int, int, int]]:
        """uuid -> (memory_mib, core_percent, slots) charged on a node, registered or not."""
        return {uuid: a.as_tuple() for uuid, a in self._node_used.get(node_name, {}).items()}

    def node_totals(self, node_name: str) -> tuple[int, int]:
        """(memory_mib, core_percent) charged on a node over all its devices."""
        total = Amount.total(self._node_used.get(node_name, {}).values())
        return total.memory_mib, total.core_percent

    def is_forgotten(self, uid: str) -> bool:
        """True when the uid has a tombstone (it was forgotten and is still remembered)."""
        return uid in self._tombstones

    def tombstones(self) -> tuple[tuple[str, bool], ...]:
        """(uid, reservable) of every remembered forgotten uid, oldest first."""
        return tuple((uid, self._tombstones[uid]) for uid in self._tombstone_order)

    def namespaces(self) -> tuple[str, ...]:
        """Namespaces with usage or limits, sorted."""
        return tuple(sorted(set(self._namespace_used) | set(self._limits)))

    def namespace_items(self, namespace: str) -> dict[str, QuotaItem]:
        """resource -> QuotaItem for every resource with usage or a limit."""
        used = self._namespace_used.get(namespace, {})
        limits = self._limits.get(namespace, {})
        return {
            resource: QuotaItem(
                resource, used.get(resource, 0), limits.get(resource, 0), resource in limits
            )
            for resource in sorted(set(used) | set(limits))
        }

    def namespace_used(self, namespace: str, resource: str) -> int:
        """What a namespace uses of one resource (``nvidia.com/gpumem``); 0 when nothing."""
        return self._namespace_used.get(namespace, {}).get(resource, 0)

    def limits(self, namespace: str) -> dict[str, int]:
        """A namespace's limits keyed by resource name (a copy; empty when none is set)."""
        return dict(self._limits.get(namespace, {}))

    # -- changes ---------------------------------------------------------------------------

    def record(self, pod: Pod) -> RecordOutcome:
        """Applies the lifecycle rules to a pod's current state (idempotent upsert).

        A forgotten uid with nothing stored answers ``Forgotten`` and changes nothing, before
        any other check: the update is about a pod that no longer exists, or that finished
        before it was first seen. A pod first seen terminal answers ``NotTracked`` and is
        remembered from then on (the change carries its tombstone).
        """
        previous = self._pods.get(pod.uid)
        if previous is None and pod.uid in self._tombstones:
            return RecordOutcome(
                Decision.FORGOTTEN,
                f"pod {pod.uid} was forgotten (deleted) or seen finished earlier; a late or "
                "repeated update charges nothing (Kubernetes never reuses a uid)",
                None,
                LedgerChange(None, None),
            )
        if previous is None and pod.phase.is_terminal:
            tombstone = self._bury(pod.uid, reservable=False)
            return RecordOutcome(
                Decision.NOT_TRACKED,
                f"pod is {pod.phase.value}: nothing to charge, and nothing will be (remembered "
                "like a deleted pod, so a later, staler update is ignored)",
                None,
                LedgerChange(None, None, tombstone),
            )
        if not pod.phase.is_terminal:
            # A terminal update only releases; it must go through even if the node's inventory
            # lost the device meanwhile.
            self._check_grants_on_node(pod)
            pod = self._close_unknown_instances(pod, pod.node_name)
        decision = decide(pod, previous, progressive_release=self.progressive_release)
        revision = self.revision
        change = self._apply(previous, decision.stored)
        try:
            overcommitted = self._overcommitted(decision.stored) if change.changed else ()
        except BaseException:
            self.undo(change, revision)
            raise
        return RecordOutcome(
            decision.decision, decision.message, decision.stored, change, overcommitted
        )

    def _close_unknown_instances(self, pod: Pod, node_name: str) -> Pod:
        """A grant on a registered MIG-mode card that names no instance (its
        hami.io/vgpu-mig-allocations entry is missing) holds the whole card: where its instance
        is cannot be known, so nothing else is placed there until the pod goes (HAMi marks such
        a card unhealthy)."""
        devices = self._nodes.get(node_name)
        if not devices:
            return pod
        mig_cards = {d.uuid: d for d in devices if d.mode == MIG_MODE}
        if not mig_cards or not any(
            g.mig is None and g.uuid in mig_cards for c in pod.containers for g in c.grants
        ):
            return pod
        containers = tuple(
            dataclasses.replace(
                container,
                grants=tuple(
                    dataclasses.replace(
                        grant,
                        mig=MigInstance(
                            UNKNOWN_INSTANCE, whole_card(mig_cards[grant.uuid].mig_profiles)
                        ),
                    )
                    if grant.mig is None and grant.uuid in mig_cards
                    else grant
                    for grant in container.grants
                ),
            )
            for container in pod.containers
        )
        return dataclasses.replace(pod, containers=containers)

    def _overcommitted(self, stored: StoredPod | None) -> tuple[str, ...]:
        if stored is None or not stored.usage:
            return ()
        devices = self._nodes.get(stored.node_name)
        used = self._node_used.get(stored.node_name)
        if not devices or not used:
            return ()
        # Only the pod's own devices, in inventory order; runs on every recorded change.
        mine = {u.uuid for u in stored.usage}
        return tuple(
            device.uuid
            for device in devices
            if device.uuid in mine
            and not used.get(device.uuid, ZERO).fits_in(device.capacity)
        )

    def forget(self, uid: str) -> LedgerChange:
        """The pod was deleted: releases exactly what is stored for it (shrunk or not), forgets
        it, and writes its tombstone, which refuses RecordPod and Reserve from then on."""
        before = self._pods.get(uid)
        revision = self.revision
        change = self._apply(before, None)
        try:
            tombstone = self._bury(uid, reservable=False)
        except BaseException:
            self.undo(change, revision)
            raise
        return change if tombstone is None else LedgerChange(before, None, tombstone)

    def stored_revision(self, uid: str) -> int:
        """The revision of what is stored for the pod (``StoredPod.revision``), 0 for nothing:
        what a re-filter reads and states it replaces."""
        stored = self._pods.get(uid)
        return 0 if stored is None else stored.revision

    def _changed_since(self, uid: str, replaces_revision: int) -> str | None:
        """Why what is stored for the pod is no longer what the caller read, or None."""
        stored = self._pods.get(uid)
        current = 0 if stored is None else stored.revision
        if current == replaces_revision:
            return None
        read = "nothing" if not replaces_revision else f"revision {replaces_revision}"
        now = (
            "nothing"
            if stored is None
            else f"revision {current} ({_describe(stored.usage)} on {stored.node_name})"
        )
        return (
            f"pod {uid} was read with {read} stored and now has {now}: another Filter for the "
            "same pod (or an update) changed it meanwhile, and that stands; nothing changed"
        )

    def release(self, uid: str, replaces_revision: int) -> ReleaseOutcome:
        """Releases a pod's reservation without forgetting the pod (a re-filter that found no
        node): no tombstone, so the pod can be reserved again. Refused, changing nothing,
        unless what is stored is still ``replaces_revision`` (``ReservationChanged``)."""
        changed = self._changed_since(uid, replaces_revision)
        if changed is not None:
            return ReleaseOutcome(False, ReserveReason.RESERVATION_CHANGED, changed, None)
        before = self._pods.get(uid)
        if before is None:
            return ReleaseOutcome(
                False, Decision.NOT_TRACKED.value, f"pod {uid} has nothing stored", None
            )
        change = self._apply(before, None)
        return ReleaseOutcome(
            True,
            Decision.RELEASED.value,
            f"released {_describe(before.usage)} on {before.node_name}",
            change,
        )

    def undo(self, change: LedgerChange, revision: int) -> None:
        """Puts back what ``change`` replaced, tombstone included, and the ledger's revision
        as it was (``revision``): for a change that was never acknowledged (its journal write,
        or anything after it was applied, failed)."""
        if change.tombstone is not None:
            self.undo_tombstone(change.tombstone)
        if change.before is not None:
            self.restore(change.before)
        elif change.after is not None:
            self.drop(change.after.uid)
        self.revision = revision

    def drop(self, uid: str) -> LedgerChange:
        """Releases what is stored for a pod without a tombstone: only to undo a change that
        stored it and was never acknowledged (its journal write failed)."""
        return self._apply(self._pods.get(uid), None)

    def _bury(self, uid: str, reservable: bool) -> TombstoneChange | None:
        """Writes a tombstone, evicting the oldest beyond the bound; None when nothing changed.

        A tombstone only ever hardens (reservable -> not), in place: its age is the first forget.
        """
        tombstones = self._tombstones
        previous = tombstones.get(uid)
        if previous is not None:
            if not previous or reservable:
                return None
            tombstones[uid] = False
            return TombstoneChange(uid, False, previous)
        tombstones[uid] = reservable
        self._tombstone_order.append(uid)
        evicted: list[tuple[str, bool]] = []
        while len(tombstones) > self.max_tombstones:
            oldest = self._tombstone_order.popleft()
            evicted.append((oldest, tombstones.pop(oldest)))
        return TombstoneChange(uid, reservable, None, tuple(evicted))

    def undo_tombstone(self, change: TombstoneChange) -> None:
        """Puts the tombstones back as they were before ``change`` (a journal write failed)."""
        if change.previous is not None:
            self._tombstones[change.uid] = change.previous
            return
        del self._tombstones[change.uid]
        self._tombstone_order.pop()  # the newest: the uid ``change`` added
        for uid, reservable in reversed(change.evicted):
            self._tombstones[uid] = reservable
            self._tombstone_order.appendleft(uid)

    def restore_tombstones(self, tombstones: Iterable[tuple[str, bool]]) -> None:
        """Loads remembered uids (uid, reservable), oldest first (journal recovery), into a
        ledger without tombstones; beyond the bound only the most recent are kept."""
        if self._tombstones:
            raise ValueError("restore_tombstones needs a ledger without tombstones")
        for uid, reservable in tombstones:
            if uid not in self._tombstones:
                self._tombstone_order.append(uid)
            self._tombstones[uid] = reservable
        while len(self._tombstones) > self.max_tombstones:
            del self._tombstones[self._tombstone_order.popleft()]

    def restore(self, stored: StoredPod) -> LedgerChange:
        """Puts a stored value back as it was acknowledged (journal replay, or the undo of a
        change whose journal write failed), its revision included."""
        return self._apply(self._pods.get(stored.uid), stored, stamp=False)

    def restore_all(self, stored_pods: Iterable[StoredPod], *, interned: bool = False) -> int:
        """Loads acknowledged pods into an empty ledger in one pass (journal recovery).

        Equivalent to restore() per pod, without per-pod delta bookkeeping: totals are summed
        directly, which keeps recovery of 100,000 pods well inside a second or two.

        Args:
            stored_pods: the pods, in the order they were first stored.
            interned: the caller already shares the strings and usage tuples that repeat
                (namespace, node, UUID, type; see ``_interned``), as the journal's loader does:
                the pods are kept as given instead of being rebuilt.
        """
        if self._pods:
            raise ValueError("restore_all needs an empty ledger; use restore() per pod")
        # Each vendor's quota dimensions, in the order usage_totals sums them: memory, cores,
        # devices (held_quantities' names).
        resources = {
            v.vendor: (v.memory_resource, v.core_resource, v.count_resource)
            for v in self._vendors.values()
        }
        namespace_used = self._namespace_used
        node_pods = self._node_pods
        pods = self._pods
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
                    usage = usage_pool[stored.usage] = _interned_usage(stored.usage)
                stored = StoredPod(
                    stored.uid,
                    sys.intern(stored.namespace),
                    stored.name,
                    sys.intern(stored.node_name),
                    usage,
                    stored.init_released,
                    stored.terminal,
                    stored.init_progress,
                    stored.init_restarts,
                    stored.revision or 1,
                    stored.reserved_grants,
                )
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
            for entry in stored.usage:
                vector = node.get(entry.uuid)
                if vector is None:
                    node[entry.uuid] = [entry.memory_mib, entry.core_percent, entry.slots]
                else:
                    vector[0] += entry.memory_mib
                    vector[1] += entry.core_percent
                    vector[2] += entry.slots
                held = by_vendor.get(entry.vendor)
                if held is None:
                    by_vendor[entry.vendor] = [entry.memory_mib, entry.core_percent, 1]
                else:
                    held[0] += entry.memory_mib
                    held[1] += entry.core_percent
                    held[2] += 1
                if entry.mig:
                    self._count_mig(stored.node_name, entry, +1)
        # One node at a time, so its lists are freed as its Amounts are made.
        self._node_used = node_used = {}
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
        # Keep the invariant of _add_to_totals: no zero entries.
        for node_name in [n for n, used in node_used.items() if not used]:
            del node_used[node_name]
        for used in node_used.values():
            for uuid in [u for u, amount in used.items() if not amount]:
                del used[uuid]
        for namespace_name, totals in list(namespace_used.items()):
            for resource in [r for r, v in totals.items() if v == 0]:
                del totals[resource]
            if not totals:
                del namespace_used[namespace_name]
        self.revision += 1
        return len(pods)

    def reserve(
        self,
        pod: Pod,
        node_name: str,
        *,
        policy_id: str = "",
        replaces_revision: int | None = None,
    ) -> ReserveOutcome:
        """Atomically re-checks capacity and quota for the pod's grants on a node, then records.

        A reservation that exists for the same pod (a re-filter) is replaced: its usage does not
        count against the new placement. Refusals change nothing. A uid forgotten with nothing
        stored (a delete, or a pod first seen finished) and a pod stored as finished are refused
        with ``PodForgotten`` before any other check: a finished pod is never charged again.
        Then, when ``replaces_revision`` is given, what is stored for the pod must still be
        that (``StoredPod.revision``, 0 for nothing), else ``ReservationChanged``. Grants
        computed under another policy than this ledger's (``policy_id``, when given) are
        refused with ``PolicyChanged`` after that.
        """
        previous = self._pods.get(pod.uid)
        if previous is None and self._tombstones.get(pod.uid) is False:
            return ReserveOutcome(
                False,
                ReserveReason.POD_FORGOTTEN,
                f"pod {pod.uid} was deleted or seen finished: nothing is reserved for it "
                "again (Kubernetes never reuses a uid)",
                None,
                None,
            )
        if previous is not None and previous.terminal:
            return ReserveOutcome(
                False,
                ReserveReason.POD_FORGOTTEN,
                f"pod {pod.uid} already finished; nothing reserved (a finished pod is never "
                "charged again)",
                previous,
                None,
            )
        if replaces_revision is not None:
            changed = self._changed_since(pod.uid, replaces_revision)
            if changed is not None:
                return ReserveOutcome(
                    False, ReserveReason.RESERVATION_CHANGED, changed, previous, None
                )
        if policy_id and policy_id != self.policy.policy_id:
            return ReserveOutcome(
                False,
                ReserveReason.POLICY_CHANGED,
                f"the grants were computed under accounting policy {policy_id}; the recorder's "
                f"is {self.policy.policy_id} ({self.policy.describe()}): nothing reserved",
                previous,
                None,
            )
        if not pod.has_grants:
            return ReserveOutcome(
                False, ReserveReason.NO_GRANTS, "the pod has no grants to reserve", None, None
            )
        devices = self._nodes.get(node_name)
        if devices is None:
            raise InvalidInputError.single("node_name", f"node {node_name!r} is not registered")
        self._check_grants_on_node(pod, node_name, path="container_grants")
        placed = self._close_unknown_instances(pod, node_name)
        usage = effective_usage(placed)
        refusal = self._capacity_refusal(node_name, devices, usage, previous)
        if refusal is None:
            refusal = self._mig_refusal(node_name, usage, previous)
        if refusal is None:
            refusal = self._quota_refusal(pod.namespace, usage, previous)
        if refusal is not None:
            return ReserveOutcome(False, refusal[0], refusal[1], previous, None)
        stored = StoredPod(
            pod.uid,
            pod.namespace,
            pod.name,
            node_name,
            usage,
            reserved_grants=tuple(container.grants for container in placed.containers),
        )
        # Stored under a new revision even when equal to what was there: a re-filter that
        # reserves the same placement claims it, so a rival that read the old one is refused.
        change = self._apply(previous, stored, restamp=True)
        return ReserveOutcome(
            True,
            ReserveReason.RESERVED,
            f"reserved {_describe(usage)} on {node_name}",
            change.after,
            change,
        )

    def register_node(self, node_name: str, devices: Sequence[Device]) -> None:
        """Registers or replaces a node's inventory; usage charged on it is kept."""
        # Interned UUIDs: the pods' usage (interned too) then shares them instead of copies.
        self._nodes[sys.intern(node_name)] = tuple(
            device if sys.intern(device.uuid) is device.uuid
            else dataclasses.replace(device, uuid=sys.intern(device.uuid))
            for device in devices
        )
        self.revision += 1

    def forget_node(self, node_name: str) -> None:
        """Drops a node's inventory; pods charged on it keep their stored usage until forgotten."""
        if self._nodes.pop(node_name, None) is not None:
            self.revision += 1

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> None:
        """Replaces a namespace's limits (keyed by resource name); used amounts are kept."""
        bad = Violations()
        for resource, value in limits.items():
            if not 0 <= value <= MAX_QUOTA_LIMIT:
                bad.add(
                    f"limits[{resource!r}]",
                    f"must be between 0 and {MAX_QUOTA_LIMIT}, got {value}",
                )
        bad.raise_if_any()
        if limits:
            self._limits[namespace] = dict(limits)
        else:
            self._limits.pop(namespace, None)
        self.revision += 1

    # -- internals -------------------------------------------------------------------------

    def _check_grants_on_node(
        self, pod: Pod, node_name: str | None = None, path: str = "pod.containers"
    ) -> None:
        """A grant for a UUID the (registered) node does not have is bad input."""
        node = node_name or pod.node_name
        devices = self._nodes.get(node)
        if devices is None:
            return  # The informer may see a pod before its node; accept what we cannot check.
        known = {d.uuid for d in devices}
        bad = Violations()
        for index, container in enumerate(pod.containers):
            for grant_index, grant in enumerate(container.grants):
                if grant.uuid not in known:
                    bad.add(
                        f"{path}[{index}].grants[{grant_index}].uuid",
                        f"node {node} has no device {grant.uuid}",
                    )
        bad.raise_if_any()

    def _capacity_refusal(
        self,
        node_name: str,
        devices: tuple[Device, ...],
        usage: tuple[DeviceUsage, ...],
        previous: StoredPod | None,
    ) -> tuple[str, str] | None:
        by_uuid = {d.uuid: d for d in devices}
        used = self._node_used.get(node_name, {})
        mine = (
            {u.uuid: u.amount for u in previous.usage}
            if previous and previous.node_name == node_name
            else {}
        )
        for entry in usage:
            capacity = by_uuid[entry.uuid].capacity
            # A re-filter replaces the pod's own reservation: it does not count against itself.
            others = used.get(entry.uuid, ZERO) - mine.get(entry.uuid, ZERO)
            short = reasons.card_shortfall(entry.amount, capacity - others)
            if short is not None:
                return reasons.CARD_CAPACITY_REASON[short], _shortfall_message(
                    entry, node_name, short, others, capacity
                )
            if entry.vendor in self._core_masks and others.core_percent & entry.core_percent:
                # Cores counted as a bit mask (AWS Neuron): the same core twice is a conflict
                # even when the sum fits (the masks of other pods are disjoint, so their sum is
                # their union).
                return reasons.CARD_INSUFFICIENT_CORE, (
                    f"device {entry.uuid} on {node_name}: cores {entry.core_percent:b} "
                    f"requested, cores {others.core_percent:b} held by other pods"
                )
        return None

    def _mig_refusal(
        self, node_name: str, usage: tuple[DeviceUsage, ...], previous: StoredPod | None
    ) -> tuple[str, str] | None:
        """A MIG instance of the grants that overlaps one another pod holds on its card."""
        held = self._node_mig.get(node_name)
        if not held:
            return None
        mine: dict[str, set[MigPlacement]] = {}
        if previous is not None and previous.node_name == node_name:
            for entry in previous.usage:
                mine[entry.uuid] = {m.placement for m in entry.mig}
        for entry in usage:
            taken = held.get(entry.uuid)
            if not taken or not entry.mig:
                continue
            others = [p for p in taken if p not in mine.get(entry.uuid, ())]
            for instance in entry.mig:
                clash = next((p for p in others if p.overlaps(instance.placement)), None)
                if clash is not None:
                    return reasons.MIG_PLACEMENT_TAKEN, (
                        f"device {entry.uuid} on {node_name}: MIG instance {instance.profile} at "
                        f"slices {instance.placement.start}-{instance.placement.end - 1} overlaps "
                        f"slices {clash.start}-{clash.end - 1} another pod holds"
                    )
        return None

    def _quota_refusal(
        self, namespace: str, usage: tuple[DeviceUsage, ...], previous: StoredPod | None
    ) -> tuple[str, str] | None:
        items = self.namespace_items(namespace)
        if previous is not None and previous.namespace == namespace:
            for vendor in self._vendors.values():
                for resource, quantity in held_quantities(previous.usage, vendor):
                    if resource in items:
                        item = items[resource]
                        items[resource] = QuotaItem(
                            resource, item.used - quantity, item.limit, item.limit_set
                        )
        for vendor in self._vendors.values():
            decision = check_usage(
                namespace, usage, items, vendor, enforce_gpu_count=self.policy.enforce_gpu_count
            )
            if not decision.allowed:
                return decision.reason, decision.message
        return None

    def _apply(
        self,
        before: StoredPod | None,
        after: StoredPod | None,
        *,
        stamp: bool = True,
        restamp: bool = False,
    ) -> LedgerChange:
        """Stores ``after`` in place of ``before``; with ``stamp``, ``after`` carries the
        revision of this change (else the one it has: a value put back as acknowledged). An
        equal value changes nothing, unless ``restamp`` asks for a new revision anyway."""
        if before == after and not (restamp and after is not None):
            return LedgerChange(before, before)
        if after is not None:
            after = _interned(after, self.revision + 1 if stamp else after.revision)
        try:
            if before is not None:
                self._add_to_totals(before, sign=-1)
                del self._pods[before.uid]
            if after is not None:
                self._add_to_totals(after, sign=+1)
                self._pods[after.uid] = after
            if before is None or after is None or before.node_name != after.node_name:
                if before is not None:
                    self._unindex(before)
                if after is not None:
                    self._index(after)
        except BaseException:
            # Whatever failed, and wherever: the change is either applied whole or not at all.
            self._put_back(before, after)
            raise
        self.revision += 1
        return LedgerChange(before, after)

    def _put_back(self, before: StoredPod | None, after: StoredPod | None) -> None:
        """Undoes a change ``_apply`` left half done: the pod stored as ``before`` again, and
        the totals of the nodes and the namespaces it touched summed again from the pods
        (slow, and only ever after a failure)."""
        uid = (before or after).uid  # type: ignore[union-attr]  # _apply has one of them
        self._pods.pop(uid, None)
        for node_name, uids in list(self._node_pods.items()):
            if uid in uids:
                uids.remove(uid)
                if not uids:
                    del self._node_pods[node_name]
        if before is not None:
            self._pods[uid] = before
            self._index(before)
        stored = [p for p in (before, after) if p is not None]
        nodes = {p.node_name for p in stored}
        namespaces = {p.namespace for p in stored}
        for node_name in nodes:
            self._node_used.pop(node_name, None)
            self._node_mig.pop(node_name, None)
        for namespace in namespaces:
            self._namespace_used.pop(namespace, None)
        for pod in self._pods.values():
            if pod.node_name in nodes:
                self._add_to_node(pod, +1)
            if pod.namespace in namespaces:
                self._add_to_namespace(pod, +1)

    def _index(self, stored: StoredPod) -> None:
        uids = self._node_pods.get(stored.node_name)
        if uids is None:
            self._node_pods[stored.node_name] = [stored.uid]
        else:
            bisect.insort(uids, stored.uid)

    def _unindex(self, stored: StoredPod) -> None:
        uids = self._node_pods[stored.node_name]
        del uids[bisect.bisect_left(uids, stored.uid)]
        if not uids:
            del self._node_pods[stored.node_name]

    def _add_to_totals(self, stored: StoredPod, sign: int) -> None:
        """Adds (or takes back) one pod's usage to its node's and its namespace's totals."""
        self._add_to_node(stored, sign)
        self._add_to_namespace(stored, sign)

    def _add_to_node(self, stored: StoredPod, sign: int) -> None:
        node = self._node_used.setdefault(stored.node_name, {})
        for entry in stored.usage:
            held = node.get(entry.uuid, ZERO)
            total = held + entry.amount if sign > 0 else held - entry.amount
            if total:
                node[entry.uuid] = total
            else:  # nothing held now (a usage of zeros was never there to begin with)
                node.pop(entry.uuid, None)
            if entry.mig:
                self._count_mig(stored.node_name, entry, sign)
        if not node:
            del self._node_used[stored.node_name]

    def _add_to_namespace(self, stored: StoredPod, sign: int) -> None:
        namespace = self._namespace_used.setdefault(stored.namespace, {})
        for vendor in self._vendors.values():
            for resource, quantity in held_quantities(stored.usage, vendor):
                count = namespace.get(resource, 0) + sign * quantity
                if count:
                    namespace[resource] = count
                else:
                    namespace.pop(resource, None)
        if not namespace:
            del self._namespace_used[stored.namespace]


    def _count_mig(self, node_name: str, entry: DeviceUsage, sign: int) -> None:
        """Adds (or takes back) the placements one pod holds on one card: each once per pod,
        however many of its containers share it (an init container and an app container may
        be given the same instance in turn)."""
        node = self._node_mig.setdefault(node_name, {})
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
            del self._node_mig[node_name]


def _shortfall_message(
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


def _interned(stored: StoredPod, revision: int) -> StoredPod:
    """Shares the strings that repeat across pods (namespace, node, UUID, type): a tracked pod
    then costs little more than its own uid and name; stamped with ``revision``. Built directly
    rather than with dataclasses.replace: journal recovery calls this once per tracked pod."""
    return StoredPod(
        stored.uid,
        sys.intern(stored.namespace),
        stored.name,
        sys.intern(stored.node_name),
        _interned_usage(stored.usage),
        stored.init_released,
        stored.terminal,
        stored.init_progress,
        stored.init_restarts,
        revision,
        stored.reserved_grants,
    )


def _interned_usage(usage: tuple[DeviceUsage, ...]) -> tuple[DeviceUsage, ...]:
    return tuple(
        DeviceUsage(
            sys.intern(u.uuid), sys.intern(u.vendor), u.memory_mib, u.core_percent, u.slots, u.mig
        )
        for u in usage
    )


def _describe(usage: Iterable[DeviceUsage]) -> str:
    return (
        ", ".join(f"{u.uuid} {u.memory_mib} MiB/{u.core_percent}%/{u.slots} slots" for u in usage)
        or "nothing"
    )
