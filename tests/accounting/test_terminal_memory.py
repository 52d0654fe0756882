"""A pod once seen finished is never charged again, whatever order its statuses arrive in.

Issue 15: when the first update the recorder got for a pod was Succeeded or Failed, a later,
staler Running or Pending update charged the pod again (30 of 274 delivery orders of a
model-based run ended wrong). The property: for any delivery order of one pod's statuses —
duplicates, reorderings, skips, and a recorder restart (the ledger rebuilt from what the journal
keeps: stored pods and tombstones) anywhere in between — from the moment a terminal status has
been delivered nothing is charged for that pod, on its node or in its namespace (a late Reserve
of it included).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.ledger import Ledger
from accounting.model import Pod, PodPhase
from tests.builders import PodBuilder, device, gpu

NS = "team-a"
NODE = "node1"
RESERVE = 6
"""A delivery that is not a status but the scheduler's Reserve of the bound pod."""


def _life(exit_code: int, terminal: PodPhase) -> list[Pod]:
    """The statuses of one pod's life in order: bound with init running, the first init done,
    every init done and the app running, a re-run of the inits (new sandbox), finished."""
    builder = (
        PodBuilder("job", namespace=NS, node=NODE)
        .sidecar("proxy", gpu("g0", mib=1024, cores=5))
        .init("fetch", gpu("g0", mib=8192, cores=40))
        .init("convert", gpu("g1", mib=16384, cores=60))
        .app("train", gpu("g0", mib=4096, cores=20), gpu("g1", mib=2048, cores=10))
    )
    life = [builder.build()]
    life.append(builder.running("proxy").running("fetch").build())
    life.append(builder.terminated("fetch").running("convert").build())
    life.append(builder.terminated("convert", exit_code).phase(PodPhase.RUNNING)
                .running("train").build())
    life.append(builder.running("fetch", restarts=1).forget_status("convert").build())
    life.append(builder.terminated("train", exit_code).phase(terminal).build())
    return life


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.register_node(NODE, [device("g0"), device("g1", index=1)])
    return ledger


def _restarted(ledger: Ledger) -> Ledger:
    """A new ledger from what the journal keeps (the store's recovery path)."""
    fresh = Ledger()
    for node in ledger.node_names():
        fresh.register_node(node, ledger.node_devices(node) or ())
    fresh.restore_all(list(ledger.pods()))
    fresh.restore_tombstones(ledger.tombstones())
    return fresh


def _charged(ledger: Ledger, uid: str) -> list[object]:
    stored = ledger.pod(uid)
    found: list[object] = []
    if stored is not None and stored.usage:
        found.append(stored.usage)
    if ledger.node_usage(NODE):
        found.append(ledger.node_usage(NODE))
    if ledger.namespace_items(NS):
        found.append(ledger.namespace_items(NS))
    return found


@settings(max_examples=600, deadline=None)
@given(
    exit_code=st.sampled_from([0, 1]),
    terminal=st.sampled_from([PodPhase.SUCCEEDED, PodPhase.FAILED]),
    order=st.lists(st.integers(0, 6), min_size=1, max_size=14),
    restart_at=st.one_of(st.none(), st.integers(0, 13)),
)
def test_once_a_terminal_status_is_seen_nothing_is_charged(
    exit_code: int, terminal: PodPhase, order: list[int], restart_at: int | None
) -> None:
    life = _life(exit_code, terminal)
    uid = life[0].uid
    ledger = _ledger()
    seen_terminal = False
    for step, index in enumerate(order):
        if step == restart_at:
            ledger = _restarted(ledger)
        if index == RESERVE:
            # The scheduler's Reserve of the bound pod, arriving late (or early).
            ledger.reserve(life[1], NODE)
        else:
            ledger.record(life[index])
            seen_terminal = seen_terminal or life[index].phase.is_terminal
        if seen_terminal:
            assert _charged(ledger, uid) == [], (step, order)


def test_the_issue_15_order_terminal_first_then_stale_running() -> None:
    life = _life(0, PodPhase.SUCCEEDED)
    ledger = _ledger()
    ledger.record(life[5])
    for stale in (life[3], life[1], life[0], life[4]):
        ledger.record(stale)
        assert _charged(ledger, life[0].uid) == []
