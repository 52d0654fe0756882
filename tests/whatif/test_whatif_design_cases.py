"""The design documents' cases, replayed by the what-if under every rule: their sums appear in
the per-rule figures exactly.

Setting of both documents: one node, node1, with a single 24Gi (24576 MiB) GPU, and (where a
case says so) a namespace quota of nvidia.com/gpumem 24Gi. Gi values are written in MiB. Every
replay runs 1000 s; a regular init container runs 100 s.
"""

from __future__ import annotations

import pytest

from accounting.counting_rules import CountingRule
from accounting.kube.node_json import NodeRegistration
from accounting.model import ContainerClass, Pod
from tests.builders import PodBuilder, device, req
from whatif.replay import replay
from whatif.results import Outcome, RuleResult
from whatif.workload import ReplayPod, Workload

SUMMED, HAMI, SHRINK, PROGRESSIVE = (
    CountingRule.SUMMED,
    CountingRule.HAMI_V2_10,
    CountingRule.SHRINK,
    CountingRule.PROGRESSIVE,
)
NS = "team-a"
MEM = "nvidia.com/gpumem"
WINDOW_S = 1000
INIT_S = 100
CARD_MIB = 24576


def arriving(builder: PodBuilder, at_s: int = 0, app_run_s: int | None = None) -> ReplayPod:
    pod: Pod = builder.on_node("").build()
    inits = sum(1 for c in pod.containers if c.container_class is ContainerClass.INIT)
    return ReplayPod(pod, at_s, (INIT_S,) * inits, app_run_s)


def cluster(*pods: ReplayPod, quota_mib: int | None = None) -> Workload:
    return Workload(
        pods=pods,
        nodes=(NodeRegistration("node1", (device("gpu0", mib=CARD_MIB),)),),
        window_s=WINDOW_S,
        quotas={NS: {MEM: quota_mib}} if quota_mib is not None else {},
    )


def every_rule(workload: Workload) -> dict[CountingRule, RuleResult]:
    return {rule: replay(workload, rule) for rule in CountingRule}


def pod_figures(result: RuleResult, index: int = 0) -> tuple[object, ...]:
    pod = result.pods[index]
    return pod.outcome, pod.reason, pod.request_mib, pod.peak_stored_mib


def reserved_at(result: RuleResult, at_s: int) -> int:
    """What the ledger stores at ``at_s`` (the step curve's value there)."""
    value = 0
    for moment, reserved in zip(result.times_s, result.reserved_mib, strict=True):
        if moment > at_s:
            break
        value = reserved
    return value


def warmup() -> PodBuilder:
    """Init design: convert-weights (init, 20Gi) then server (app, 10Gi)."""
    return (
        PodBuilder("warmup", namespace=NS)
        .init("convert-weights", req(1, mib=20480))
        .app("server", req(1, mib=10240))
    )


# -- init container design ---------------------------------------------------------------------


def test_init_case_1_every_rule_refuses_an_init_that_could_never_fit_the_quota() -> None:
    big = (
        PodBuilder("big-init", namespace=NS)
        .init("convert-weights", req(1, mib=30720))
        .app("server", req(1, mib=4096))
    )
    results = every_rule(cluster(arriving(big), quota_mib=24576))

    refused = (Outcome.REFUSED, "MemoryQuotaExceeded")
    assert {rule: pod_figures(r) for rule, r in results.items()} == {
        SUMMED: (*refused, 30720 + 4096, 0),
        HAMI: (*refused, 30720, 0),
        SHRINK: (*refused, 30720, 0),
        PROGRESSIVE: (*refused, 30720, 0),
    }
    assert all(dict(r.refused) == {"MemoryQuotaExceeded": 1} for r in results.values())


def test_init_case_2_the_pod_fits_at_20gi_with_4gi_of_headroom_but_not_summed() -> None:
    results = every_rule(cluster(arriving(warmup()), quota_mib=24576))

    for rule in (HAMI, SHRINK, PROGRESSIVE):
        assert pod_figures(results[rule]) == (Outcome.PLACED, "", 20480, 20480), rule
        (namespace,) = results[rule].namespaces
        assert (namespace.peak_used_mib, namespace.min_headroom_mib) == (20480, 4096)
    # Summed, the pod asks 20 + 10 = 30Gi: over the quota before any node is looked at.
    assert pod_figures(results[SUMMED]) == (Outcome.REFUSED, "MemoryQuotaExceeded", 30720, 0)


def test_init_case_2_without_a_quota_summed_fits_no_node() -> None:
    results = every_rule(cluster(arriving(warmup())))

    # "Before: rejected, 0 nodes fit, scheduler required 20+10=30Gi".
    assert pod_figures(results[SUMMED]) == (
        Outcome.REFUSED,
        "NoNodeFits: CardInsufficientMemory",
        30720,
        0,
    )
    assert results[SUMMED].peak_reserved_mib == 0
    for rule in (HAMI, SHRINK, PROGRESSIVE):
        assert results[rule].placed == 1, rule


def test_init_case_3_and_4_recorded_20gi_then_shrunk_to_10gi_and_the_12gi_pod_fits() -> None:
    newcomer = PodBuilder("newcomer", namespace="team-b").app("main", req(1, mib=12288))
    results = every_rule(cluster(arriving(warmup()), arriving(newcomer, at_s=30)))

    for rule in (HAMI, SHRINK, PROGRESSIVE):
        result = results[rule]
        # Case 3: while convert-weights runs the warm-up pod is recorded at 20Gi, not 30Gi.
        assert reserved_at(result, 29) == 20480, rule
        # Case 4: the newcomer waits (4Gi free) until convert-weights exits at 100 s; the
        # warm-up pod shrinks to 10Gi, 14Gi are free and the newcomer takes 12Gi of them.
        assert reserved_at(result, 99) == 20480, rule
        assert reserved_at(result, 100) == 10240 + 12288, rule
        assert result.peak_reserved_mib == 22528, rule
        warm, new = result.pods
        assert (warm.outcome, warm.placed_s, warm.peak_stored_mib) == (Outcome.PLACED, 0, 20480)
        assert (new.outcome, new.placed_s, new.waited_s) == (Outcome.PLACED, 100, 70)
        assert result.waited_over_threshold == 1
        assert result.idle_mib_s == 0 and result.unreserved_mib_s == 0
    # Summed, the warm-up pod never fits the card: the newcomer gets it at once.
    summed = results[SUMMED]
    assert [p.outcome for p in summed.pods] == [Outcome.REFUSED, Outcome.PLACED]
    assert summed.pods[1].waited_s == 0 and summed.peak_reserved_mib == 12288


# -- sidecar container design ------------------------------------------------------------------


def test_sidecar_oversubscription_hami_v2_10_lets_a_12gi_pod_onto_a_card_already_at_20gi() -> None:
    proxy = (
        PodBuilder("with-sidecar", namespace=NS)
        .sidecar("proxy", req(1, mib=10240))
        .app("server", req(1, mib=10240))
    )
    later = PodBuilder("later", namespace=NS).app("main", req(1, mib=12288))
    results = every_rule(cluster(arriving(proxy), arriving(later, at_s=10)))

    hami = results[HAMI]
    # Accounted max(10, 10) = 10Gi, so the 12Gi pod schedules: real demand 32Gi on a 24Gi card.
    assert [p.peak_stored_mib for p in hami.pods] == [10240, 12288]
    assert (hami.peak_reserved_mib, hami.peak_requested_mib) == (22528, 32768)
    assert hami.unreserved_mib_s == 10240 * WINDOW_S
    for rule in (SUMMED, SHRINK, PROGRESSIVE):
        result = results[rule]
        # Accounted 20Gi: the 12Gi pod is rejected (it waits for the rest of the window).
        assert [p.outcome for p in result.pods] == [Outcome.PLACED, Outcome.PENDING], rule
        assert (result.peak_reserved_mib, result.peak_requested_mib) == (20480, 20480), rule
        assert (result.pending, result.unreserved_mib_s) == (1, 0), rule


@pytest.mark.parametrize(
    ("sidecar_first", "charged_mib", "running_during_init_mib"),
    [(True, 22528, 22528), (False, 20480, 20480)],
    ids=[
        "sidecar declared before the init: 2+20 = 22Gi, then 12Gi",
        "init declared first: max(20, 2+10) = 20Gi, then 12Gi",
    ],
)
def test_sidecar_shrink_restored(
    sidecar_first: bool, charged_mib: int, running_during_init_mib: int
) -> None:
    builder = PodBuilder("shrink", namespace=NS)
    if sidecar_first:
        builder.sidecar("proxy", req(1, mib=2048))
    builder.init("prepare", req(1, mib=20480))
    if not sidecar_first:
        builder.sidecar("proxy", req(1, mib=2048))
    builder.app("server", req(1, mib=10240))
    results = every_rule(cluster(arriving(builder), quota_mib=24576))

    for rule in (SHRINK, PROGRESSIVE):
        result = results[rule]
        assert pod_figures(result) == (Outcome.PLACED, "", charged_mib, charged_mib), rule
        assert reserved_at(result, 99) == charged_mib, rule
        assert reserved_at(result, 100) == 12288, rule
        assert result.idle_mib_s == (charged_mib - running_during_init_mib) * INIT_S, rule
        assert result.unreserved_mib_s == 0, rule
    # HAMi v2.10: max(2, 20, 10) = 20Gi, and the running sidecar keeps the gate closed.
    hami = results[HAMI]
    assert pod_figures(hami) == (Outcome.PLACED, "", 20480, 20480)
    assert reserved_at(hami, 100) == reserved_at(hami, WINDOW_S) == 20480
    assert hami.unreserved_mib_s == (running_during_init_mib - 20480) * INIT_S
    assert hami.idle_mib_s == (20480 - 12288) * (WINDOW_S - INIT_S)
    # Summed: 2 + 20 + 10 = 32Gi, over the quota.
    assert pod_figures(results[SUMMED]) == (Outcome.REFUSED, "MemoryQuotaExceeded", 32768, 0)


def test_no_sidecars_is_the_init_design_and_the_end_releases_everything() -> None:
    results = every_rule(cluster(arriving(warmup(), app_run_s=400)))

    for rule in (HAMI, SHRINK, PROGRESSIVE):
        result = results[rule]
        assert [reserved_at(result, t) for t in (0, 100, 499, 500)] == [20480, 10240, 10240, 0]


def test_resource_quota_interplay_the_shrink_frees_quota_for_pod_b() -> None:
    pod_a = (
        PodBuilder("pod-a", namespace=NS)
        .init("init", req(1, mib=8000))
        .app("app", req(1, mib=5000))
    )
    pod_b = PodBuilder("pod-b", namespace=NS).app("app", req(1, mib=5000))
    results = every_rule(cluster(arriving(pod_a), arriving(pod_b, at_s=150), quota_mib=10000))

    for rule in (HAMI, SHRINK, PROGRESSIVE):
        result = results[rule]
        # After the shrink A holds 5000: B fits exactly (5000 + 5000 == 10000).
        assert [p.outcome for p in result.pods] == [Outcome.PLACED, Outcome.PLACED], rule
        (namespace,) = result.namespaces
        assert (namespace.peak_used_mib, namespace.min_headroom_mib) == (10000, 0), rule
    # Summed, A asks 13000 of a 10000 quota; B alone fits.
    summed = results[SUMMED]
    assert [(p.outcome, p.reason) for p in summed.pods] == [
        (Outcome.REFUSED, "MemoryQuotaExceeded"),
        (Outcome.PLACED, ""),
    ]


# -- beyond the design: progressive release ------------------------------------------------


def test_progressive_release_lets_go_of_each_init_as_it_finishes() -> None:
    two_stage = (
        PodBuilder("two-stage", namespace=NS)
        .init("download", req(1, mib=20480))
        .init("warmup", req(1, mib=8192))
        .app("server", req(1, mib=4096))
    )
    results = every_rule(cluster(arriving(two_stage)))

    progressive, shrink = results[PROGRESSIVE], results[SHRINK]
    assert [reserved_at(progressive, t) for t in (0, 100, 200)] == [20480, 8192, 4096]
    assert [reserved_at(shrink, t) for t in (0, 100, 200)] == [20480, 20480, 4096]
    assert (progressive.idle_mib_s, shrink.idle_mib_s) == (0, (20480 - 8192) * INIT_S)
    # Summed, the pod asks 20 + 8 + 4 = 32Gi at once: more than the card.
    assert pod_figures(results[SUMMED]) == (
        Outcome.REFUSED,
        "NoNodeFits: CardInsufficientMemory",
        32768,
        0,
    )
