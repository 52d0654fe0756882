"""The ledger: what each pod is charged per device, and node and namespace totals.

Layer: accounting (pure, in memory, not thread-safe: the usage recorder's store serialises
access and journals every change). The ``Ledger`` coordinates its parts: the pods' records
(``records``), the tombstones of forgotten uids (``tombstones``), the totals kept by deltas
(``totals``, and ``bulk_load`` for recovery), the nodes' inventory (``inventory``), the
namespaces' limits (``quota_limits``) and Reserve's checks (``reserve_checks``). Every change is
applied as a delta between the old and the new stored value of one pod, so add and remove are
symmetric, totals never go negative, and replaying an update changes nothing; a change is
applied whole or not at all.

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

Hot path. RecordPod and Reserve run here on every call: the parts' tables are read through one
local name each (``records.by_uid``, ``totals.node_used``), never through a chain of lookups
per pod or per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from accounting.amount import ZERO, Amount
from accounting.errors import InvalidInputError
from accounting.ledger.bulk_load import load_pods
from accounting.ledger.interning import interned
from accounting.ledger.inventory import NodeInventory
from accounting.ledger.outcomes import (
    LedgerChange,
    RecordOutcome,
    ReleaseOutcome,
    ReserveOutcome,
    ReserveReason,
)
from accounting.ledger.quota_limits import QuotaLimits, namespace_items
from accounting.ledger.records import PodRecords
from accounting.ledger.reserve_checks import (
    capacity_refusal,
    changed_since,
    mig_refusal,
    quota_refusal,
)
from accounting.ledger.tombstones import DEFAULT_MAX_TOMBSTONES, TombstoneChange, Tombstones
from accounting.ledger.totals import UsageTotals
from accounting.ledger.wording import describe_usage
from accounting.lifecycle import Decision, StoredPod, decide
from accounting.model import (
    Device,
    DeviceState,
    MigPlacement,
    Pod,
    QuotaItem,
)
from accounting.pod import effective_usage
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.vendor_spec import Charge


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
            max_tombstones: forgotten uids remembered (see accounting.ledger.tombstones).
            progressive_release: passed to accounting.lifecycle.decide on every record; False
                only to compare release rules (accounting.counting_rules).
        """
        self._tombstones = Tombstones(max_tombstones)
        self.policy = policy
        # One entry per vendor name, in policy order.
        self._vendors = tuple({v.vendor: v for v in policy.vendors}.values())
        # Vendors whose cores are a bit mask of the device's cores (AWS Neuron).
        self._core_masks = frozenset(
            spec.vendor for spec in policy.specs if spec.charge is Charge.CORE_MASK
        )
        self.progressive_release = progressive_release
        self._records = PodRecords()
        self._totals = UsageTotals(self._vendors)
        self._limits = QuotaLimits()
        self._inventory = NodeInventory()
        self.revision = 0

    @property
    def max_tombstones(self) -> int:
        """Forgotten uids remembered at the most."""
        return self._tombstones.max_tombstones

    # -- queries ---------------------------------------------------------------------------

    def pod(self, uid: str) -> StoredPod | None:
        """What is stored for one pod, or None."""
        return self._records.by_uid.get(uid)

    def pods(self) -> Iterable[StoredPod]:
        """Every stored pod (a live view: do not change the ledger while iterating)."""
        return self._records.by_uid.values()

    def pod_uids(self) -> frozenset[str]:
        """The uids of every stored pod."""
        return frozenset(self._records.by_uid)

    def __len__(self) -> int:
        return len(self._records.by_uid)

    def node_names(self) -> tuple[str, ...]:
        """The registered nodes, in registration order."""
        return tuple(self._inventory.devices)

    def node_devices(self, node_name: str) -> tuple[Device, ...] | None:
        """A registered node's inventory, or None."""
        return self._inventory.devices.get(node_name)

    def node_states(self, node_name: str) -> tuple[DeviceState, ...] | None:
        """The node's devices with what is charged on them; None if the node is not registered."""
        devices = self._inventory.devices.get(node_name)
        if devices is None:
            return None
        used = self._totals.node_used.get(node_name, {})
        held = self._totals.node_mig.get(node_name, {})
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
            for uuid, held in self._totals.node_mig.get(node_name, {}).items()
        }

    def node_pod_uids(self, node_name: str) -> tuple[str, ...]:
        """UIDs of the pods stored on a node (registered or not), sorted."""
        return tuple(self._records.by_node.get(node_name, ()))

    def pod_node_names(self) -> tuple[str, ...]:
        """Names of the nodes pods are stored on ("" for pods recorded without a node)."""
        return tuple(self._records.by_node)

    def node_usage(self, node_name: str) -> dict[str, tuple[int, int, int]]:
        """uuid -> (memory_mib, core_percent, slots) charged on a node, registered or not."""
        return {
            uuid: a.as_tuple() for uuid, a in self._totals.node_used.get(node_name, {}).items()
        }

    def node_totals(self, node_name: str) -> tuple[int, int]:
        """(memory_mib, core_percent) charged on a node over all its devices."""
        total = Amount.total(self._totals.node_used.get(node_name, {}).values())
        return total.memory_mib, total.core_percent

    def is_forgotten(self, uid: str) -> bool:
        """True when the uid has a tombstone (it was forgotten and is still remembered)."""
        return uid in self._tombstones.kinds

    def tombstones(self) -> tuple[tuple[str, bool], ...]:
        """(uid, reservable) of every remembered forgotten uid, oldest first."""
        return self._tombstones.listed()

    def namespaces(self) -> tuple[str, ...]:
        """Namespaces with usage or limits, sorted."""
        return tuple(sorted(set(self._totals.namespace_used) | set(self._limits.by_namespace)))

    def namespace_items(self, namespace: str) -> dict[str, QuotaItem]:
        """resource -> QuotaItem for every resource with usage or a limit."""
        return namespace_items(
            self._totals.namespace_used.get(namespace, {}),
            self._limits.by_namespace.get(namespace, {}),
        )

    def namespace_used(self, namespace: str, resource: str) -> int:
        """What a namespace uses of one resource (``nvidia.com/gpumem``); 0 when nothing."""
        return self._totals.namespace_used.get(namespace, {}).get(resource, 0)

    def limits(self, namespace: str) -> dict[str, int]:
        """A namespace's limits keyed by resource name (a copy; empty when none is set)."""
        return dict(self._limits.by_namespace.get(namespace, {}))

    def stored_revision(self, uid: str) -> int:
        """The revision of what is stored for the pod (``StoredPod.revision``), 0 for nothing:
        what a re-filter reads and states it replaces."""
        stored = self._records.by_uid.get(uid)
        return 0 if stored is None else stored.revision

    # -- changes ---------------------------------------------------------------------------

    def record(self, pod: Pod) -> RecordOutcome:
        """Applies the lifecycle rules to a pod's current state (idempotent upsert).

        A forgotten uid with nothing stored answers ``Forgotten`` and changes nothing, before
        any other check: the update is about a pod that no longer exists, or that finished
        before it was first seen. A pod first seen terminal answers ``NotTracked`` and is
        remembered from then on (the change carries its tombstone).
        """
        previous = self._records.by_uid.get(pod.uid)
        if previous is None and pod.uid in self._tombstones.kinds:
            return RecordOutcome(
                decision=Decision.FORGOTTEN,
                message=(
                    f"pod {pod.uid} was forgotten (deleted) or seen finished earlier; a late or "
                    "repeated update charges nothing (Kubernetes never reuses a uid)"
                ),
                stored=None,
                change=LedgerChange(None, None),
            )
        if previous is None and pod.phase.is_terminal:
            tombstone = self._tombstones.bury(pod.uid, reservable=False)
            return RecordOutcome(
                decision=Decision.NOT_TRACKED,
                message=(
                    f"pod is {pod.phase.value}: nothing to charge, and nothing will be "
                    "(remembered like a deleted pod, so a later, staler update is ignored)"
                ),
                stored=None,
                change=LedgerChange(None, None, tombstone),
            )
        if not pod.phase.is_terminal:
            # A terminal update only releases; it must go through even if the node's inventory
            # lost the device meanwhile.
            inventory = self._inventory
            inventory.check_grants(pod)
            pod = inventory.close_unknown_instances(pod, pod.node_name)
        decision = decide(pod, previous, progressive_release=self.progressive_release)
        revision = self.revision
        change = self._apply(previous, decision.stored)
        try:
            overcommitted = self._overcommitted(decision.stored) if change.changed else ()
        except BaseException:
            self.undo(change, revision)
            raise
        return RecordOutcome(
            decision=decision.decision,
            message=decision.message,
            stored=decision.stored,
            change=change,
            overcommitted=overcommitted,
        )

    def _overcommitted(self, stored: StoredPod | None) -> tuple[str, ...]:
        """The pod's devices charged beyond their capacity, in inventory order."""
        if stored is None or not stored.usage:
            return ()
        devices = self._inventory.devices.get(stored.node_name)
        used = self._totals.node_used.get(stored.node_name)
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
        before = self._records.by_uid.get(uid)
        revision = self.revision
        change = self._apply(before, None)
        try:
            tombstone = self._tombstones.bury(uid, reservable=False)
        except BaseException:
            self.undo(change, revision)
            raise
        return change if tombstone is None else LedgerChange(before, None, tombstone)

    def release(self, uid: str, replaces_revision: int) -> ReleaseOutcome:
        """Releases a pod's reservation without forgetting the pod (a re-filter that found no
        node): no tombstone, so the pod can be reserved again. Refused, changing nothing,
        unless what is stored is still ``replaces_revision`` (``ReservationChanged``)."""
        before = self._records.by_uid.get(uid)
        changed = changed_since(uid, before, replaces_revision)
        if changed is not None:
            return ReleaseOutcome(
                released=False,
                reason=ReserveReason.RESERVATION_CHANGED,
                message=changed,
                change=None,
            )
        if before is None:
            return ReleaseOutcome(
                released=False,
                reason=Decision.NOT_TRACKED.value,
                message=f"pod {uid} has nothing stored",
                change=None,
            )
        change = self._apply(before, None)
        return ReleaseOutcome(
            released=True,
            reason=Decision.RELEASED.value,
            message=f"released {describe_usage(before.usage)} on {before.node_name}",
            change=change,
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
        return self._apply(self._records.by_uid.get(uid), None)

    def undo_tombstone(self, change: TombstoneChange) -> None:
        """Puts the tombstones back as they were before ``change`` (a journal write failed)."""
        self._tombstones.undo(change)

    def restore_tombstones(self, tombstones: Iterable[tuple[str, bool]]) -> None:
        """Loads remembered uids (uid, reservable), oldest first (journal recovery), into a
        ledger without tombstones; beyond the bound only the most recent are kept."""
        self._tombstones.restore(tombstones)

    def restore(self, stored: StoredPod) -> LedgerChange:
        """Puts a stored value back as it was acknowledged (journal replay, or the undo of a
        change whose journal write failed), its revision included."""
        return self._apply(self._records.by_uid.get(stored.uid), stored, stamp=False)

    def restore_all(self, stored_pods: Iterable[StoredPod], *, interned: bool = False) -> int:
        """Loads acknowledged pods into an empty ledger in one pass (journal recovery).

        Equivalent to restore() per pod, without per-pod delta bookkeeping
        (accounting.ledger.bulk_load).

        Args:
            stored_pods: the pods, in the order they were first stored.
            interned: the caller already shares the strings and usage tuples that repeat
                (namespace, node, UUID, type; see accounting.ledger.interning), as the
                journal's loader does: the pods are kept as given instead of being rebuilt.
        """
        if self._records.by_uid:
            raise ValueError("restore_all needs an empty ledger; use restore() per pod")
        load_pods(
            stored_pods,
            interned=interned,
            records=self._records,
            totals=self._totals,
            vendors=self._vendors,
        )
        self.revision += 1
        return len(self._records.by_uid)

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
        previous = self._records.by_uid.get(pod.uid)
        if previous is None and self._tombstones.kinds.get(pod.uid) is False:
            return ReserveOutcome(
                reserved=False,
                reason=ReserveReason.POD_FORGOTTEN,
                message=(
                    f"pod {pod.uid} was deleted or seen finished: nothing is reserved for it "
                    "again (Kubernetes never reuses a uid)"
                ),
                stored=None,
                change=None,
            )
        if previous is not None and previous.terminal:
            return ReserveOutcome(
                reserved=False,
                reason=ReserveReason.POD_FORGOTTEN,
                message=(
                    f"pod {pod.uid} already finished; nothing reserved (a finished pod is never "
                    "charged again)"
                ),
                stored=previous,
                change=None,
            )
        if replaces_revision is not None:
            changed = changed_since(pod.uid, previous, replaces_revision)
            if changed is not None:
                return ReserveOutcome(
                    reserved=False,
                    reason=ReserveReason.RESERVATION_CHANGED,
                    message=changed,
                    stored=previous,
                    change=None,
                )
        if policy_id and policy_id != self.policy.policy_id:
            return ReserveOutcome(
                reserved=False,
                reason=ReserveReason.POLICY_CHANGED,
                message=(
                    f"the grants were computed under accounting policy {policy_id}; the "
                    f"recorder's is {self.policy.policy_id} ({self.policy.describe()}): "
                    "nothing reserved"
                ),
                stored=previous,
                change=None,
            )
        if not pod.has_grants:
            return ReserveOutcome(
                reserved=False,
                reason=ReserveReason.NO_GRANTS,
                message="the pod has no grants to reserve",
                stored=None,
                change=None,
            )
        inventory = self._inventory
        devices = inventory.devices.get(node_name)
        if devices is None:
            raise InvalidInputError.single("node_name", f"node {node_name!r} is not registered")
        inventory.check_grants(pod, node_name, path="container_grants")
        placed = inventory.close_unknown_instances(pod, node_name)
        usage = effective_usage(placed)
        totals = self._totals
        refusal = capacity_refusal(
            node_name,
            devices,
            usage,
            previous,
            used=totals.node_used.get(node_name, {}),
            core_masks=self._core_masks,
        )
        if refusal is None:
            refusal = mig_refusal(
                node_name, usage, previous, held=totals.node_mig.get(node_name)
            )
        if refusal is None:
            refusal = quota_refusal(
                pod.namespace,
                usage,
                previous,
                items=self.namespace_items(pod.namespace),
                vendors=self._vendors,
                enforce_gpu_count=self.policy.enforce_gpu_count,
            )
        if refusal is not None:
            return ReserveOutcome(
                reserved=False,
                reason=refusal.reason,
                message=refusal.message,
                stored=previous,
                change=None,
            )
        stored = StoredPod(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            node_name=node_name,
            usage=usage,
            reserved_grants=tuple(container.grants for container in placed.containers),
        )
        # Stored under a new revision even when equal to what was there: a re-filter that
        # reserves the same placement claims it, so a rival that read the old one is refused.
        change = self._apply(previous, stored, restamp=True)
        return ReserveOutcome(
            reserved=True,
            reason=ReserveReason.RESERVED,
            message=f"reserved {describe_usage(usage)} on {node_name}",
            stored=change.after,
            change=change,
        )

    def register_node(self, node_name: str, devices: Sequence[Device]) -> None:
        """Registers or replaces a node's inventory; usage charged on it is kept."""
        self._inventory.register(node_name, devices)
        self.revision += 1

    def forget_node(self, node_name: str) -> None:
        """Drops a node's inventory; pods charged on it keep their stored usage until forgotten."""
        if self._inventory.forget(node_name):
            self.revision += 1

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> None:
        """Replaces a namespace's limits (keyed by resource name); used amounts are kept."""
        self._limits.set(namespace, limits)
        self.revision += 1

    # -- the one walk that changes what is stored -------------------------------------------

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
            after = interned(after, self.revision + 1 if stamp else after.revision)
        records, totals = self._records, self._totals
        try:
            if before is not None:
                totals.add(before, sign=-1)
                del records.by_uid[before.uid]
            if after is not None:
                totals.add(after, sign=+1)
                records.by_uid[after.uid] = after
            if before is None or after is None or before.node_name != after.node_name:
                if before is not None:
                    records.unindex(before)
                if after is not None:
                    records.index(after)
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
        records = self._records
        records.remove_everywhere(uid)
        if before is not None:
            records.by_uid[uid] = before
            records.index(before)
        stored = [p for p in (before, after) if p is not None]
        self._totals.resum(
            records.by_uid.values(),
            {p.node_name for p in stored},
            {p.namespace for p in stored},
        )
