"""The four accounting rules the what-if compares (accounting.counting_rules), and the release
rule seam they need in the lifecycle and the ledger."""

from __future__ import annotations

import pytest

from accounting.counting_rules import CountingRule, counted_pod
from accounting.ledger import Ledger
from accounting.lifecycle import Decision, decide
from accounting.model import ContainerClass, PodPhase
from accounting.pod import effective_request
from accounting.vendors import NVIDIA_RESOURCES
from tests.builders import PodBuilder, device, gpu, req

INIT, SIDECAR, APP = ContainerClass.INIT, ContainerClass.SIDECAR, ContainerClass.APP
SUMMED, HAMI, SHRINK, PROGRESSIVE = (
    CountingRule.SUMMED,
    CountingRule.HAMI_V2_10,
    CountingRule.SHRINK,
    CountingRule.PROGRESSIVE,
)


@pytest.mark.parametrize(
    ("rule", "counted"),
    [
        (SUMMED, {INIT: APP, SIDECAR: APP, APP: APP}),
        (HAMI, {INIT: INIT, SIDECAR: INIT, APP: APP}),
        (SHRINK, {INIT: INIT, SIDECAR: SIDECAR, APP: APP}),
        (PROGRESSIVE, {INIT: INIT, SIDECAR: SIDECAR, APP: APP}),
    ],
    ids=[
        "summed: every container counted as an app",
        "HAMi v2.10: a sidecar is one more init container",
        "shrink: the classes as Kubernetes runs them",
        "progressive: the classes as Kubernetes runs them",
    ],
)
def test_each_rule_counts_the_declared_classes_as(
    rule: CountingRule, counted: dict[ContainerClass, ContainerClass]
) -> None:
    assert {declared: rule.counted_class(declared) for declared in ContainerClass} == counted


def test_only_progressive_releases_each_init_container_as_it_finishes() -> None:
    assert [rule for rule in CountingRule if rule.progressive_release] == [PROGRESSIVE]


def test_a_rule_that_changes_no_class_gives_the_same_pod_back() -> None:
    pod = PodBuilder("p").sidecar("s", req(1, mib=10)).init("i", req(1, mib=20)).build()

    assert counted_pod(pod, SHRINK) is pod
    assert counted_pod(pod, PROGRESSIVE) is pod
    hami = counted_pod(pod, HAMI)
    assert [c.container_class for c in hami.containers] == [INIT, INIT]
    assert hami.init_container_statuses == pod.init_container_statuses


# The design documents' pods (MiB): each rule's admission figure, from the one formula.
@pytest.mark.parametrize(
    ("builder", "want"),
    [
        (
            PodBuilder("big-init").init("convert", req(1, mib=30720)).app("srv", req(1, mib=4096)),
            {SUMMED: 34816, HAMI: 30720, SHRINK: 30720, PROGRESSIVE: 30720},
        ),
        (
            PodBuilder("warmup").init("convert", req(1, mib=20480)).app("srv", req(1, mib=10240)),
            {SUMMED: 30720, HAMI: 20480, SHRINK: 20480, PROGRESSIVE: 20480},
        ),
        (
            PodBuilder("proxy").sidecar("proxy", req(1, mib=10240)).app("srv", req(1, mib=10240)),
            {SUMMED: 20480, HAMI: 10240, SHRINK: 20480, PROGRESSIVE: 20480},
        ),
        (
            PodBuilder("shrink")
            .sidecar("proxy", req(1, mib=2048))
            .init("prepare", req(1, mib=20480))
            .app("srv", req(1, mib=10240)),
            {SUMMED: 32768, HAMI: 20480, SHRINK: 22528, PROGRESSIVE: 22528},
        ),
        (
            PodBuilder("shrink")
            .init("prepare", req(1, mib=20480))
            .sidecar("proxy", req(1, mib=2048))
            .app("srv", req(1, mib=10240)),
            {SUMMED: 32768, HAMI: 20480, SHRINK: 20480, PROGRESSIVE: 20480},
        ),
    ],
    ids=[
        "init case 1: init 30Gi + app 4Gi",
        "init case 2: init 20Gi + app 10Gi (summed: 20+10 = 30Gi)",
        "sidecar oversubscription: sidecar 10Gi + app 10Gi (HAMi v2.10: max(10, 10))",
        "sidecar shrink restored, sidecar first: 2+20 = 22Gi",
        "sidecar shrink restored, init first: max(20, 2+10) = 20Gi",
    ],
)
def test_the_design_pods_are_charged_per_rule(
    builder: PodBuilder, want: dict[CountingRule, int]
) -> None:
    pod = builder.build()
    assert {
        rule: effective_request(counted_pod(pod, rule), NVIDIA_RESOURCES).memory_mib
        for rule in CountingRule
    } == want


# -- the release rule: progressive or all at once ------------------------------------------


def _two_inits() -> PodBuilder:
    return (
        PodBuilder("two-inits", node="node1")
        .init("download", req(1, mib=20480), gpu("gpu0", mib=20480))
        .init("warmup", req(1, mib=8192), gpu("gpu0", mib=8192))
        .app("srv", req(1, mib=4096), gpu("gpu0", mib=4096))
    )


def _stored_mib(ledger: Ledger) -> int:
    return sum(memory for memory, _, _ in ledger.node_usage("node1").values())


@pytest.mark.parametrize(
    ("progressive", "after_first", "decision"),
    [(True, 8192, Decision.PARTIALLY_RELEASED), (False, 20480, Decision.UNCHANGED)],
    ids=[
        "progressive: the first init's share goes when it exits 0",
        "all at once: the init-inclusive usage is held until the last init exits 0",
    ],
)
def test_the_ledger_releases_by_its_release_rule(
    progressive: bool, after_first: int, decision: Decision
) -> None:
    ledger = Ledger(progressive_release=progressive)
    ledger.register_node("node1", [device("gpu0")])
    builder = _two_inits()
    ledger.record(builder.running("download").build())
    assert _stored_mib(ledger) == 20480

    first = ledger.record(builder.terminated("download").running("warmup").build())
    assert (first.decision, _stored_mib(ledger)) == (decision, after_first)
    assert first.stored is not None and first.stored.init_progress == 1

    last = ledger.record(builder.terminated("warmup").phase(PodPhase.RUNNING).build())
    assert (last.decision, _stored_mib(ledger)) == (Decision.SHRUNK, 4096)


def test_without_progressive_release_a_first_sight_after_one_init_holds_everything() -> None:
    pod = _two_inits().terminated("download").running("warmup").build()

    held = decide(pod, None, progressive_release=False)
    released = decide(pod, None)

    assert held.decision is Decision.RECORDED and held.stored is not None
    assert [u.memory_mib for u in held.stored.usage] == [20480]
    assert released.stored is not None
    assert [u.memory_mib for u in released.stored.usage] == [8192]
