"""The ledger: totals by deltas, reservations, and bad input that changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidInputError
from accounting.ledger import Ledger, ReserveReason
from accounting.lifecycle import Decision, StoredPod
from accounting.model import DeviceUsage, MigInstance, MigPlacement, Pod, PodPhase
from accounting.policy import AccountingPolicy
from accounting.quota import QuotaReason
from accounting.vendors import NVIDIA_RESOURCES, spec_for
from tests.builders import PodBuilder, device, gpu, usage

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
COUNT = "nvidia.com/gpu"
NS = "team-a"


def _ledger(*, slots: int = 10) -> Ledger:
    ledger = Ledger()
    ledger.register_node(
        "node1",
        [device("g0", mib=24576, slots=slots), device("g1", mib=24576, slots=slots, index=1)],
    )
    return ledger


def _snapshot(ledger: Ledger) -> tuple[object, ...]:
    """Everything a change could touch."""
    return (
        {pod.uid: pod for pod in ledger.pods()},
        {node: ledger.node_states(node) for node in ledger.node_names()},
        {node: ledger.node_usage(node) for node in ("node1", "node2")},
        {ns: ledger.namespace_items(ns) for ns in ledger.namespaces()},
        {ns: ledger.limits(ns) for ns in ledger.namespaces()},
        ledger.revision,
    )


def _pod(name: str, *grants_per_app: int, node: str = "node1") -> Pod:
    builder = PodBuilder(name, namespace=NS, node=node)
    for index, mib in enumerate(grants_per_app):
        builder.app(f"a{index}", gpu("g0", mib=mib, cores=10))
    return builder.build()


# -- totals ----------------------------------------------------------------------------------


def test_record_charges_node_and_namespace_with_the_effective_usage() -> None:
    ledger = _ledger()
    pod = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=20480, cores=10))
        .app("a", gpu("g0", mib=10240, cores=5), gpu("g1", mib=1000, cores=1))
        .build()
    )

    ledger.record(pod)

    states = {s.device.uuid: s for s in ledger.node_states("node1") or ()}
    g0 = states["g0"]
    assert (g0.memory_used_mib, g0.core_percent_used, g0.slots_used) == (20480, 10, 1)
    assert states["g0"].memory_free_mib == 4096
    assert (states["g1"].memory_used_mib, states["g1"].slots_used) == (1000, 1)
    items = ledger.namespace_items(NS)
    assert (items[MEM].used, items[CORES].used, items[COUNT].used) == (21480, 11, 2)


def test_recording_the_same_update_twice_changes_nothing() -> None:
    ledger = _ledger()
    pod = _pod("p", 1000)
    ledger.record(pod)
    before = _snapshot(ledger)

    outcome = ledger.record(pod)

    assert outcome.decision is Decision.UNCHANGED
    assert outcome.change.changed is False
    assert _snapshot(ledger) == before


def test_forget_returns_every_total_to_zero_and_drops_empty_entries() -> None:
    ledger = _ledger()
    pods = [_pod("p1", 1000), _pod("p2", 2000, 3000)]
    for pod in pods:
        ledger.record(pod)

    for pod in pods:
        ledger.forget(pod.uid)

    assert len(ledger) == 0
    assert ledger.node_usage("node1") == {}
    assert ledger.namespace_items(NS) == {}


_TWO_VENDORS = AccountingPolicy(vendors=(NVIDIA_RESOURCES, spec_for("DCU").resources))
_RESTORED_USAGE = st.builds(
    DeviceUsage,
    uuid=st.sampled_from(["g0", "g1", "d0"]),
    # DCU is accounted by the policy; MLU is not (its devices count on nodes only).
    vendor=st.sampled_from(["NVIDIA", "DCU", "MLU"]),
    memory_mib=st.integers(0, 4096),
    core_percent=st.integers(0, 100),
    slots=st.integers(0, 3),
    mig=st.sampled_from([(), (MigInstance("1g.5gb", MigPlacement(0, 1)),)]),
)
_RESTORED_PODS = st.lists(
    st.tuples(st.sampled_from(["ns-a", "ns-b"]), st.sampled_from(["node1", "node2"]),
              st.lists(_RESTORED_USAGE, max_size=3, unique_by=lambda u: u.uuid)),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(_RESTORED_PODS)
def test_restoring_all_at_once_gives_the_totals_of_restoring_one_by_one(
    pods: list[tuple[str, str, list[DeviceUsage]]],
) -> None:
    stored = [
        StoredPod(
            uid=f"uid-{i}",
            namespace=namespace,
            name=f"p{i}",
            node_name=node,
            usage=tuple(held),
            revision=i + 1,
        )
        for i, (namespace, node, held) in enumerate(pods)
    ]
    one_by_one, at_once = Ledger(_TWO_VENDORS), Ledger(_TWO_VENDORS)
    for pod in stored:
        one_by_one.restore(pod)

    at_once.restore_all(stored)

    for name in ("node1", "node2"):
        assert at_once.node_usage(name) == one_by_one.node_usage(name)
        assert at_once.node_pod_uids(name) == one_by_one.node_pod_uids(name)
        assert at_once.node_mig_in_use(name) == one_by_one.node_mig_in_use(name)
    assert at_once.namespaces() == one_by_one.namespaces()
    for namespace in ("ns-a", "ns-b"):
        assert at_once.namespace_items(namespace) == one_by_one.namespace_items(namespace)


def test_forget_of_an_unknown_pod_changes_nothing() -> None:
    ledger = _ledger()
    ledger.record(_pod("p", 1000))
    before = _snapshot(ledger)

    change = ledger.forget("uid-never-seen")

    assert change.changed is False
    assert _snapshot(ledger) == before


def test_restore_puts_back_an_acknowledged_value_exactly() -> None:
    ledger = _ledger()
    stored = StoredPod(
        uid="uid-x",
        namespace=NS,
        name="x",
        node_name="node1",
        usage=(usage("g0", 10240, 5, slots=1),),
        init_released=True,
    )

    ledger.restore(stored)
    ledger.restore(stored)

    assert ledger.pod("uid-x") == stored
    assert ledger.namespace_items(NS)[MEM].used == 10240
    assert ledger.node_usage("node1") == {"g0": (10240, 5, 1)}


def test_set_quota_keeps_used_and_an_empty_mapping_removes_the_limits() -> None:
    ledger = _ledger()
    ledger.record(_pod("p", 1000))

    ledger.set_quota(NS, {MEM: 24576})
    assert ledger.namespace_items(NS)[MEM].used == 1000
    assert ledger.namespace_items(NS)[MEM].limit == 24576
    assert ledger.namespace_items(NS)[MEM].limit_set is True

    ledger.set_quota(NS, {})
    assert ledger.namespace_items(NS)[MEM].limit_set is False
    assert ledger.namespace_items(NS)[MEM].used == 1000


# -- bad input -------------------------------------------------------------------------------


def test_set_quota_refuses_a_negative_limit_naming_the_key_and_keeps_the_old_limits() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 10000})
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.set_quota(NS, {MEM: 20000, CORES: -1})

    assert [v.path for v in error.value.violations] == [f"limits[{CORES!r}]"]
    assert CORES in str(error.value)
    assert _snapshot(ledger) == before


def test_record_refuses_a_grant_for_a_device_the_node_lacks_and_changes_nothing() -> None:
    ledger = _ledger()
    ledger.record(_pod("other", 1000))
    bad = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=100))
        .app("a", gpu("g1", mib=100), gpu("GPU-missing", mib=100))
        .build()
    )
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.record(bad)

    assert [v.path for v in error.value.violations] == ["pod.containers[1].grants[1].uuid"]
    assert "GPU-missing" in str(error.value)
    assert _snapshot(ledger) == before


def test_reserve_on_an_unregistered_node_is_bad_input_and_changes_nothing() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)

    with pytest.raises(InvalidInputError) as error:
        ledger.reserve(_pod("p", 1000), "node-unknown")

    assert [v.path for v in error.value.violations] == ["node_name"]
    assert _snapshot(ledger) == before


def test_reserve_refuses_a_grant_for_a_device_the_node_lacks_naming_the_field() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)
    pod = PodBuilder("p", namespace=NS).app("a", gpu("GPU-missing", mib=100)).build()

    with pytest.raises(InvalidInputError) as error:
        ledger.reserve(pod, "node1")

    assert [v.path for v in error.value.violations] == ["container_grants[0].grants[0].uuid"]
    assert _snapshot(ledger) == before


# -- reserve ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    name: str
    slots_per_device: int
    quota: dict[str, int]
    already: tuple[Pod, ...]
    pod: Pod
    want_reason: str


def _cores_pod(name: str, cores: int) -> Pod:
    return PodBuilder(name, namespace=NS).app("a", gpu("g0", mib=100, cores=cores)).build()


REFUSALS = [
    Refusal(
        "memory: 20480 held, 12288 more does not fit a 24576 card",
        10,
        {},
        (_pod("held", 20480),),
        _pod("p", 12288),
        ReserveReason.INSUFFICIENT_MEMORY,
    ),
    Refusal(
        "cores: 60 percent held, 50 more exceed 100",
        10,
        {},
        (_cores_pod("held", 60),),
        _cores_pod("p", 50),
        ReserveReason.INSUFFICIENT_CORE,
    ),
    Refusal(
        "slots: a one-slot card already shared is exhausted",
        1,
        {},
        (_pod("held", 100),),
        _pod("p", 100),
        ReserveReason.SLOTS_EXHAUSTED,
    ),
    Refusal(
        "quota: 8000 used + 4000 over a 10000 limit",
        10,
        {MEM: 10000},
        (_pod("held", 8000),),
        _pod("p", 4000),
        QuotaReason.MEMORY_EXCEEDED.value,
    ),
    Refusal(
        "quota: an explicit limit of 0 refuses the first reservation",
        10,
        {MEM: 0},
        (),
        _pod("p", 1),
        QuotaReason.MEMORY_EXCEEDED.value,
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.name)
def test_reserve_refusal_changes_nothing(case: Refusal) -> None:
    ledger = _ledger(slots=case.slots_per_device)
    ledger.set_quota(NS, case.quota)
    for pod in case.already:
        assert ledger.reserve(pod, "node1").reserved
    before = _snapshot(ledger)

    outcome = ledger.reserve(case.pod, "node1")

    assert (outcome.reserved, outcome.reason) == (False, case.want_reason)
    assert outcome.change is None
    assert ledger.pod(case.pod.uid) is None
    assert _snapshot(ledger) == before


def test_reserve_without_grants_is_refused_and_changes_nothing() -> None:
    ledger = _ledger()
    before = _snapshot(ledger)

    outcome = ledger.reserve(PodBuilder("p", namespace=NS).app("a").build(), "node1")

    assert (outcome.reserved, outcome.reason) == (False, ReserveReason.NO_GRANTS)
    assert _snapshot(ledger) == before


def test_reserve_stores_the_effective_usage_and_the_boundary_is_inclusive() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 24576})
    pod = (
        PodBuilder("p", namespace=NS)
        .init("i", gpu("g0", mib=24576, cores=10))
        .app("a", gpu("g0", mib=10240, cores=5))
        .build()
    )

    outcome = ledger.reserve(pod, "node1")

    assert (outcome.reserved, outcome.reason) == (True, ReserveReason.RESERVED)
    stored = ledger.pod(pod.uid)
    assert stored is not None
    assert (stored.node_name, stored.usage) == ("node1", (usage("g0", 24576, 10, slots=1),))
    assert ledger.namespace_items(NS)[MEM].used == 24576


def test_reserving_again_for_the_same_pod_replaces_the_old_reservation() -> None:
    ledger = _ledger()
    ledger.set_quota(NS, {MEM: 20000})
    first = _pod("p", 15000)
    again = _pod("p", 16000)
    assert ledger.reserve(first, "node1").reserved

    outcome = ledger.reserve(again, "node1")

    assert outcome.reserved, outcome.message
    assert ledger.node_usage("node1") == {"g0": (16000, 10, 1)}
    assert ledger.namespace_items(NS)[MEM].used == 16000


def test_a_terminal_pod_stays_released_when_seen_again() -> None:
    ledger = _ledger()
    builder = PodBuilder("p", namespace=NS).app("a", gpu("g0", mib=1000))
    ledger.record(builder.build())
    ledger.record(builder.phase(PodPhase.SUCCEEDED).build())

    outcome = ledger.record(builder.phase(PodPhase.RUNNING).build())

    assert outcome.decision is Decision.UNCHANGED
    assert ledger.namespace_items(NS) == {}
    assert ledger.node_usage("node1") == {}


def test_a_pod_first_seen_finished_is_remembered_and_never_charged() -> None:
    # Issue 15: a stale Running update after a first Succeeded once charged the pod again.
    ledger = _ledger()
    builder = (PodBuilder("p", namespace=NS).init("i", gpu("g0", mib=8000, cores=30))
               .app("a", gpu("g0", mib=1000, cores=10)))

    first = ledger.record(builder.phase(PodPhase.SUCCEEDED).build())
    assert (first.decision, first.stored) == (Decision.NOT_TRACKED, None)
    assert first.change.tombstone is not None and not first.change.tombstone.reservable
    assert ledger.tombstones() == (("uid-team-a-p", False),)
    before = _snapshot(ledger)

    stale = ledger.record(builder.phase(PodPhase.PENDING).running("i").build())
    reserved = ledger.reserve(builder.build(), "node1")
    # Recording the terminal status again, and the delete, change nothing either.
    again = ledger.record(builder.phase(PodPhase.FAILED).build())
    forgotten = ledger.forget("uid-team-a-p")

    assert stale.decision is Decision.FORGOTTEN and "seen finished" in stale.message
    assert (reserved.reserved, reserved.reason) == (False, ReserveReason.POD_FORGOTTEN)
    assert again.decision is Decision.FORGOTTEN
    assert (forgotten.changed, forgotten.tombstone) == (False, None)
    assert _snapshot(ledger) == before
    assert ledger.node_usage("node1") == {} and ledger.namespace_items(NS) == {}


# -- tombstones: a forgotten uid is never charged again ----------------------------------------


def test_an_update_after_the_pods_forget_charges_nothing() -> None:
    ledger = _ledger()
    pod = _pod("late", 4096)
    ledger.record(pod)
    ledger.forget(pod.uid)
    before = _snapshot(ledger)

    outcome = ledger.record(pod)

    assert outcome.decision is Decision.FORGOTTEN
    assert pod.uid in outcome.message and "forgotten" in outcome.message
    assert (outcome.stored, outcome.change.changed) == (None, False)
    assert _snapshot(ledger) == before
    assert ledger.node_usage("node1") == {} and ledger.namespace_items(NS) == {}


def test_a_delete_seen_before_the_add_refuses_the_add_and_the_reservation() -> None:
    ledger = _ledger()
    pod = _pod("early-delete", 4096)
    change = ledger.forget(pod.uid)
    assert change.tombstone is not None and not change.tombstone.reservable
    before = _snapshot(ledger)

    recorded = ledger.record(pod)
    reserved = ledger.reserve(pod, "node1")

    assert recorded.decision is Decision.FORGOTTEN
    assert (reserved.reserved, reserved.reason, reserved.change) == (
        False, ReserveReason.POD_FORGOTTEN, None)
    assert pod.uid in reserved.message
    assert _snapshot(ledger) == before


def test_a_forgotten_pod_is_refused_before_its_grants_are_checked() -> None:
    # The late update names a device the node has lost meanwhile: still just Forgotten.
    ledger = _ledger()
    pod = _pod("late", 4096)
    ledger.record(pod)
    ledger.forget(pod.uid)
    ledger.register_node("node1", [device("other")])

    assert ledger.record(pod).decision is Decision.FORGOTTEN


def test_a_forgotten_reservation_refuses_a_later_reserve_for_the_deleted_pod() -> None:
    # A forget is a delete, also of a stored pod: a Filter still running for it stores nothing.
    ledger = _ledger()
    pod = _pod("deleted", 4096)
    reserved = ledger.reserve(pod, "node1")
    assert reserved.reserved and reserved.stored is not None

    change = ledger.forget(pod.uid)

    assert change.tombstone is not None and not change.tombstone.reservable
    for replaces in (None, reserved.stored.revision, 0):
        outcome = ledger.reserve(pod, "node1", replaces_revision=replaces)
        assert (outcome.reserved, outcome.reason) == (False, ReserveReason.POD_FORGOTTEN)
    assert ledger.record(pod).decision is Decision.FORGOTTEN
    assert ledger.node_usage("node1") == {}


def test_a_refilter_replaces_exactly_the_reservation_it_read() -> None:
    ledger = _ledger()
    first = ledger.reserve(_pod("refilter", 4096), "node1", replaces_revision=0)
    assert first.reserved and first.stored is not None
    read = ledger.stored_revision(first.stored.uid)
    assert read == first.stored.revision > 0

    again = ledger.reserve(_pod("refilter", 8192), "node1", replaces_revision=read)

    assert again.reserved and again.stored is not None
    assert again.stored.revision > read
    assert ledger.node_usage("node1") == {"g0": (8192, 10, 1)}
    # A rival that read the first reservation (or nothing) is refused and changes nothing.
    for stale in (read, 0):
        rival = ledger.reserve(_pod("refilter", 1000), "node1", replaces_revision=stale)
        assert (rival.reserved, rival.reason) == (False, ReserveReason.RESERVATION_CHANGED)
        assert "8192 MiB" in rival.message
    assert ledger.node_usage("node1") == {"g0": (8192, 10, 1)}


def test_reserving_the_same_placement_again_claims_it_under_a_new_revision() -> None:
    # Two Filters of one pod that read the same reservation and fit the same placement: the
    # first one's Reserve changes the revision, so the second is refused, not silently equal.
    ledger = _ledger()
    stored = ledger.reserve(_pod("same", 4096), "node1").stored
    assert stored is not None

    first = ledger.reserve(_pod("same", 4096), "node1", replaces_revision=stored.revision)
    second = ledger.reserve(_pod("same", 4096), "node1", replaces_revision=stored.revision)

    assert first.reserved and first.change is not None and first.change.changed
    assert second.reason == ReserveReason.RESERVATION_CHANGED
    assert ledger.node_usage("node1") == {"g0": (4096, 10, 1)}


def test_release_states_what_it_releases_and_leaves_no_tombstone() -> None:
    ledger = _ledger()
    stored = ledger.reserve(_pod("released", 4096), "node1").stored
    assert stored is not None

    stale = ledger.release(stored.uid, stored.revision + 1)
    assert (stale.released, stale.reason) == (False, ReserveReason.RESERVATION_CHANGED)
    assert ledger.node_usage("node1") == {"g0": (4096, 10, 1)}

    released = ledger.release(stored.uid, stored.revision)

    assert released.released and ledger.node_usage("node1") == {}
    assert not ledger.is_forgotten(stored.uid)
    assert ledger.reserve(_pod("released", 1000), "node1", replaces_revision=0).reserved
    nothing = ledger.release("never-stored", 0)
    assert (nothing.released, nothing.reason) == (False, Decision.NOT_TRACKED.value)


def test_a_reservable_tombstone_from_an_older_journal_still_refuses_updates_only() -> None:
    ledger = _ledger()
    ledger.restore_tombstones([("old-uid", True)])
    pod = PodBuilder("old", uid="old-uid", namespace=NS, node="node1").app(
        "a", gpu("g0", mib=1000)
    ).build()

    assert ledger.record(pod).decision is Decision.FORGOTTEN
    assert ledger.reserve(pod, "node1").reserved


def test_tombstones_keep_the_most_recent_and_an_evicted_uid_is_charged_again() -> None:
    ledger = Ledger(max_tombstones=2)
    ledger.register_node("node1", [device("g0", mib=24576)])
    pods = [_pod(f"p{i}", 1000) for i in range(3)]
    ledger.forget(pods[0].uid)
    ledger.forget(pods[1].uid)

    change = ledger.forget(pods[2].uid)

    assert change.tombstone is not None
    assert change.tombstone.evicted == ((pods[0].uid, False),)
    assert ledger.tombstones() == ((pods[1].uid, False), (pods[2].uid, False))
    assert not ledger.is_forgotten(pods[0].uid)
    assert ledger.record(pods[0]).decision is Decision.RECORDED
    assert ledger.record(pods[1]).decision is Decision.FORGOTTEN


def test_undo_tombstone_restores_the_kinds_and_the_order() -> None:
    ledger = Ledger(max_tombstones=2)
    ledger.register_node("node1", [device("g0", mib=24576)])
    a, b, c = (_pod(name, 1000) for name in "abc")
    ledger.restore_tombstones([(a.uid, True)])  # reservable, from an older journal
    ledger.forget(b.uid)
    before = ledger.tombstones()

    for uid in (c.uid, a.uid):  # a new one evicting the oldest; a hardened one
        change = ledger.forget(uid).tombstone
        assert change is not None and ledger.tombstones() != before
        ledger.undo_tombstone(change)
        assert ledger.tombstones() == before


def test_restore_tombstones_keeps_the_order_and_the_bound() -> None:
    ledger = Ledger(max_tombstones=2)
    ledger.restore_tombstones([("u1", True), ("u2", False), ("u3", True)])

    assert ledger.tombstones() == (("u2", False), ("u3", True))
    with pytest.raises(ValueError, match="without tombstones"):
        ledger.restore_tombstones([("u4", False)])
    with pytest.raises(ValueError, match="max_tombstones"):
        Ledger(max_tombstones=0)


def test_drop_undoes_a_first_record_without_a_tombstone() -> None:
    ledger = _ledger()
    pod = _pod("p", 1000)
    ledger.record(pod)

    change = ledger.drop(pod.uid)

    assert (change.before is not None, change.tombstone) == (True, None)
    assert not ledger.is_forgotten(pod.uid)
    assert ledger.record(pod).decision is Decision.RECORDED


# -- pods by node ------------------------------------------------------------------------------


ledger_steps = st.lists(
    st.tuples(st.sampled_from(["record", "reserve", "forget"]), st.integers(0, 5),
              st.sampled_from(["node1", "node2"])),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ledger_steps)
def test_pods_by_node_and_tombstones_follow_any_history(
    steps: list[tuple[str, int, str]],
) -> None:
    ledger = Ledger(max_tombstones=3)
    for node in ("node1", "node2"):
        ledger.register_node(node, [device("g0", mib=10**6, slots=100)])
    forgotten: list[str] = []
    for kind, number, node in steps:
        pod = _pod(f"p{number}", 1000, node=node)
        if kind == "forget":
            ledger.forget(pod.uid)
            # A remembered uid keeps its age (hardened in place at most); an evicted one
            # comes back as the newest.
            if pod.uid not in forgotten[-3:]:
                if pod.uid in forgotten:
                    forgotten.remove(pod.uid)
                forgotten.append(pod.uid)
        else:
            was_stored = ledger.pod(pod.uid) is not None
            remembered = dict(ledger.tombstones())
            if kind == "record":
                decision = ledger.record(pod).decision
                assert (decision is Decision.FORGOTTEN) == (
                    not was_stored and pod.uid in remembered), decision
            else:
                outcome = ledger.reserve(pod, node)
                refused = not was_stored and remembered.get(pod.uid) is False
                assert outcome.reserved is not refused, outcome
        for name in ("node1", "node2", ""):
            assert ledger.node_pod_uids(name) == tuple(
                sorted(p.uid for p in ledger.pods() if p.node_name == name))
        assert set(ledger.pod_node_names()) == {p.node_name for p in ledger.pods()}
        remembered = [uid for uid, _ in ledger.tombstones()]
        assert remembered == forgotten[-3:]
        # Restoring the same pods in one pass gives the same index.
        restored = Ledger()
        restored.restore_all(ledger.pods())
        for name in ("node1", "node2"):
            assert restored.node_pod_uids(name) == ledger.node_pod_uids(name)
            assert restored.node_totals(name) == ledger.node_totals(name)
