"""Every design case (docs/design.md §9), through the ledger (record, reserve, shrink) and the
quota check.

Setting of both documents: one node, node1, with a single 24Gi (24576 MiB) GPU, and a namespace
quota of nvidia.com/gpumem 24Gi. Gi values are written in MiB.
"""

from __future__ import annotations

import pytest

from accounting.ledger import Ledger, ReserveReason
from accounting.lifecycle import Decision
from accounting.model import PodPhase, QuotaItem
from accounting.pod import effective_request
from accounting.quota import QuotaReason, check_quota
from accounting.vendors import NVIDIA_RESOURCES
from tests.builders import PodBuilder, device, gpu, req, usage

MEM = "nvidia.com/gpumem"
NS = "team-a"


def _cluster(quota_mib: int = 24576) -> Ledger:
    ledger = Ledger()
    ledger.register_node("node1", [device("gpu0", mib=24576)])
    ledger.set_quota(NS, {MEM: quota_mib})
    return ledger


def _used_mib(ledger: Ledger) -> int:
    item = ledger.namespace_items(NS).get(MEM)
    return item.used if item else 0


def _free_mib(ledger: Ledger) -> int:
    (state,) = ledger.node_states("node1") or ()
    return state.memory_free_mib


def _gpu_pod(name: str, mib: int) -> PodBuilder:
    """A single-container pod granted ``mib`` on the card, with the matching request."""
    return PodBuilder(name, namespace=NS).app("main", req(1, mib=mib), gpu("gpu0", mib=mib))


def _init_app_pod() -> PodBuilder:
    """The init-container case (docs/design.md §9): convert-weights (init, 20Gi) then server
    (app, 10Gi)."""
    return (
        PodBuilder("warmup", namespace=NS)
        .init("convert-weights", req(1, mib=20480), gpu("gpu0", mib=20480))
        .app("server", req(1, mib=10240), gpu("gpu0", mib=10240))
    )


# -- init container design -------------------------------------------------------------------


def test_init_case_1_admission_catches_an_init_request_that_could_never_fit() -> None:
    ledger = _cluster()
    pod = (
        PodBuilder("big-init", namespace=NS)
        .init("convert-weights", req(1, mib=30720))
        .app("server", req(1, mib=4096))
        .build()
    )

    request = effective_request(pod, NVIDIA_RESOURCES)
    decision = check_quota(NS, request, ledger.namespace_items(NS), NVIDIA_RESOURCES)

    assert request.memory_mib == 30720
    assert (decision.allowed, decision.reason) == (False, QuotaReason.MEMORY_EXCEEDED.value)


def test_init_case_2_a_pod_that_fits_is_no_longer_wrongly_rejected() -> None:
    ledger = _cluster()
    pod = _init_app_pod().build()

    request = effective_request(pod, NVIDIA_RESOURCES)
    assert check_quota(NS, request, ledger.namespace_items(NS), NVIDIA_RESOURCES).allowed
    outcome = ledger.reserve(pod, "node1")

    assert (outcome.reserved, outcome.reason) == (True, ReserveReason.RESERVED)
    assert _free_mib(ledger) == 4096


def test_init_case_3_recorded_usage_matches_the_real_peak() -> None:
    ledger = _cluster()
    builder = _init_app_pod()
    ledger.reserve(builder.build(), "node1")

    outcome = ledger.record(builder.running("convert-weights").phase(PodPhase.PENDING).build())

    assert outcome.decision is Decision.UNCHANGED
    assert ledger.node_usage("node1") == {"gpu0": (20480, 0, 1)}
    assert _used_mib(ledger) == 20480


def test_init_case_4_usage_shrinks_once_the_init_container_finishes() -> None:
    ledger = _cluster()
    warmup = _init_app_pod()
    ledger.reserve(warmup.build(), "node1")
    ledger.record(warmup.running("convert-weights").build())
    newcomer = _gpu_pod("newcomer", 12288).build()

    refused = ledger.reserve(newcomer, "node1")
    assert (refused.reserved, refused.reason) == (False, ReserveReason.INSUFFICIENT_MEMORY)

    shrink = ledger.record(
        warmup.terminated("convert-weights", 0).running("server").phase(PodPhase.RUNNING).build()
    )
    assert shrink.decision is Decision.SHRUNK
    assert _used_mib(ledger) == 10240
    assert _free_mib(ledger) == 14336

    admitted = ledger.reserve(newcomer, "node1")
    assert (admitted.reserved, admitted.reason) == (True, ReserveReason.RESERVED)
    assert _free_mib(ledger) == 2048
    assert _used_mib(ledger) == 22528


# -- sidecar container design ----------------------------------------------------------------


def test_sidecar_oversubscription_prevented() -> None:
    ledger = _cluster()
    pod = (
        PodBuilder("with-sidecar", namespace=NS)
        .sidecar("proxy", req(1, mib=10240), gpu("gpu0", mib=10240))
        .app("server", req(1, mib=10240), gpu("gpu0", mib=10240))
        .build()
    )

    assert effective_request(pod, NVIDIA_RESOURCES).memory_mib == 20480
    assert ledger.reserve(pod, "node1").reserved
    assert _used_mib(ledger) == 20480

    later = ledger.reserve(_gpu_pod("later", 12288).build(), "node1")
    assert (later.reserved, later.reason) == (False, ReserveReason.INSUFFICIENT_MEMORY)


def _shrink_restored_pod(sidecar_first: bool) -> PodBuilder:
    """The sidecar case (docs/design.md §9): init 20Gi + sidecar 2Gi + app 10Gi, in either
    declaration order."""
    builder = PodBuilder("shrink", namespace=NS)
    if sidecar_first:
        builder.sidecar("proxy", req(1, mib=2048), gpu("gpu0", mib=2048))
    builder.init("prepare", req(1, mib=20480), gpu("gpu0", mib=20480))
    if not sidecar_first:
        builder.sidecar("proxy", req(1, mib=2048), gpu("gpu0", mib=2048))
    return builder.app("server", req(1, mib=10240), gpu("gpu0", mib=10240))


@pytest.mark.parametrize(
    ("sidecar_first", "want_charged_mib"),
    [(True, 22528), (False, 20480)],
    ids=[
        "shrink restored, sidecar declared before the init: 2+20 = 22Gi, then 12Gi",
        "shrink restored, init declared first: max(20, 2+10) = 20Gi, then 12Gi",
    ],
)
def test_sidecar_shrink_restored(sidecar_first: bool, want_charged_mib: int) -> None:
    ledger = _cluster()
    builder = _shrink_restored_pod(sidecar_first)

    assert effective_request(builder.build(), NVIDIA_RESOURCES).memory_mib == want_charged_mib
    added = ledger.record(builder.running("proxy").running("prepare").build())
    assert (added.decision, _used_mib(ledger)) == (Decision.RECORDED, want_charged_mib)

    shrunk = ledger.record(
        builder.terminated("prepare", 0).running("server").phase(PodPhase.RUNNING).build()
    )
    assert (shrunk.decision, _used_mib(ledger)) == (Decision.SHRUNK, 12288)
    assert ledger.node_usage("node1") == {"gpu0": (12288, 0, 2)}


@pytest.mark.parametrize(
    "terminal",
    [PodPhase.SUCCEEDED, PodPhase.FAILED],
    ids=[
        "terminal phase Succeeded with the sidecar still listed: usage zero",
        "terminal phase Failed with the sidecar still listed: usage zero",
    ],
)
def test_sidecar_terminal_phase_releases_everything(terminal: PodPhase) -> None:
    ledger = _cluster()
    builder = _shrink_restored_pod(sidecar_first=True)
    ledger.record(builder.running("proxy").running("prepare").build())

    outcome = ledger.record(builder.running("proxy").phase(terminal).build())

    assert outcome.decision is Decision.RELEASED
    assert _used_mib(ledger) == 0
    assert ledger.node_usage("node1") == {}


def test_sidecar_design_without_sidecars_is_identical_to_the_init_design() -> None:
    ledger = _cluster()
    warmup = _init_app_pod()

    ledger.record(warmup.running("convert-weights").build())
    assert _used_mib(ledger) == 20480
    ledger.record(warmup.terminated("convert-weights", 0).phase(PodPhase.RUNNING).build())
    assert _used_mib(ledger) == 10240
    ledger.record(warmup.terminated("server", 0).phase(PodPhase.SUCCEEDED).build())
    assert _used_mib(ledger) == 0


def test_sidecar_crash_loop_exit_0_gap_keeps_the_sidecar_usage() -> None:
    ledger = _cluster()
    builder = _shrink_restored_pod(sidecar_first=False)
    ledger.record(builder.running("prepare").running("proxy").build())
    assert _used_mib(ledger) == 20480

    # The sidecar exits 0 while the init still runs: the gate stays closed, nothing changes.
    gap_before = ledger.record(builder.terminated("proxy", 0, restarts=1).build())
    assert (gap_before.decision, _used_mib(ledger)) == (Decision.UNCHANGED, 20480)

    # The init exits 0 while the sidecar sits in its exit-0 gap: the shrink keeps the sidecar.
    shrunk = ledger.record(
        builder.terminated("prepare", 0).running("server").phase(PodPhase.RUNNING).build()
    )
    assert (shrunk.decision, _used_mib(ledger)) == (Decision.SHRUNK, 12288)
    stored = ledger.pod(builder.build().uid)
    assert stored is not None
    assert stored.usage == (usage("gpu0", 12288, slots=2),)

    # More gaps and restarts never let the sidecar's share read zero.
    for restarts in (2, 3):
        ledger.record(builder.running("proxy", restarts=restarts).build())
        assert _used_mib(ledger) == 12288
        ledger.record(builder.terminated("proxy", 0, restarts=restarts).build())
        assert _used_mib(ledger) == 12288


def test_resource_quota_interplay_shrink_frees_capacity_only_inside_hami() -> None:
    ledger = _cluster(quota_mib=10000)
    pod_a = (
        PodBuilder("pod-a", namespace=NS)
        .init("init", req(1, mib=8000), gpu("gpu0", mib=8000))
        .app("app", req(1, mib=5000), gpu("gpu0", mib=5000))
    )
    pod_b = PodBuilder("pod-b", namespace=NS).app("app", req(1, mib=5000)).build()

    upstream_charge_a = effective_request(pod_a.build(), NVIDIA_RESOURCES).memory_mib
    assert upstream_charge_a == 8000
    ledger.reserve(pod_a.build(), "node1")
    ledger.record(pod_a.terminated("init", 0).running("app").phase(PodPhase.RUNNING).build())
    assert _used_mib(ledger) == 5000

    # Inside HAMi the shrink freed 3000: pod B fits exactly (5000 + 5000 == 10000).
    request_b = effective_request(pod_b, NVIDIA_RESOURCES)
    inside = check_quota(NS, request_b, ledger.namespace_items(NS), NVIDIA_RESOURCES)
    assert inside.allowed is True

    # Kubernetes' ResourceQuota keeps charging pod A 8000 while it is non-terminal: B is refused.
    upstream_items = {MEM: QuotaItem(MEM, used=upstream_charge_a, limit=10000, limit_set=True)}
    upstream = check_quota(NS, request_b, upstream_items, NVIDIA_RESOURCES)
    assert (upstream.allowed, upstream.reason) == (False, QuotaReason.MEMORY_EXCEEDED.value)
