"""accounting.explain: the per-container table and the charge over a pod's life under
hami-accounting, HAMi v2.10 and the Kubernetes ResourceQuota.

Pods are written as Kubernetes JSON (tests.support.pods) and read by the shared parser, so the
cases read like the manifests ``hami-accounting explain`` gets.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings

from accounting.explain import (
    REQUEST_DEVICE,
    Amount,
    Explanation,
    Phase,
    Source,
    explain,
)
from accounting.kube.pod_json import parse_pod
from accounting.model import ContainerClass, Pod
from accounting.pod import effective_request, effective_usage, steady_state_usage, usage_totals
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.accounting.strategies import pods
from tests.support.pods import (
    allocation,
    app_container,
    init_container,
    kube_pod,
    sidecar_container,
)

Json = dict[str, Any]


def _explain(manifest: Json, *, memory_factor: int = 1) -> Explanation:
    vendor = VendorResources(memory_factor=memory_factor)
    return explain(parse_pod(manifest, (vendor,)), (vendor,))


def _memory(explanation: Explanation) -> list[tuple[str, int, int, int]]:
    """(label, hami-accounting, HAMi v2.10, Kubernetes) memory per phase."""
    return [
        (c.label, c.hami_accounting.memory_mib, c.hami_v2_10.memory_mib, c.kubernetes.memory_mib)
        for c in explanation.charges
    ]


def _seed(sidecar_first: bool) -> Json:
    sidecar = sidecar_container("log-shipper", gpumem=2048)
    init = init_container("convert-weights", gpumem=20480)
    return kube_pod(
        "trainer",
        init=[sidecar, init] if sidecar_first else [init, sidecar],
        apps=[app_container("server", gpumem=10240)],
    )


# -- the seed's sidecar case -------------------------------------------------------------------


def test_sidecar_declared_before_the_init_container_runs_beside_it() -> None:
    explanation = _explain(_seed(sidecar_first=True))

    assert explanation.source is Source.REQUESTS
    assert explanation.effective == Amount(22528, 0)
    assert explanation.steady == Amount(12288, 0)
    assert _memory(explanation) == [
        ("init container convert-weights running", 22528, 20480, 22528),
        ("init containers done, apps running", 12288, 20480, 22528),
        ("terminal", 0, 0, 0),
    ]
    assert explanation.why == (
        "HAMi v2.10 counts the sidecar as an init container, so it charges "
        "max(10240, 2048, 20480) = 20480 and never releases it while the sidecar runs; "
        "Kubernetes charges 22528 until the pod ends; hami-accounting charges 22528 while the "
        "init container runs and 12288 after."
    )


def test_the_table_shows_the_init_point_with_the_sidecars_before_it() -> None:
    explanation = _explain(_seed(sidecar_first=True))

    sidecar, init, app = explanation.containers
    assert [c.container_class for c in explanation.containers] == [
        ContainerClass.SIDECAR,
        ContainerClass.INIT,
        ContainerClass.APP,
    ]
    assert [(c.position, c.name) for c in explanation.containers] == [
        (0, "log-shipper"),
        (1, "convert-weights"),
        (2, "server"),
    ]
    (line,) = init.devices
    assert line.device == REQUEST_DEVICE
    assert line.amount == Amount(20480, 0)
    assert line.init_point is not None
    assert line.init_point.own == Amount(20480, 0)
    assert line.init_point.sidecars == Amount(2048, 0)
    assert line.init_point.sidecar_names == ("log-shipper",)
    assert line.init_point.total == Amount(22528, 0)
    assert sidecar.devices[0].init_point is None
    assert app.devices[0].init_point is None
    assert init.requests[0].memory_mib == 20480
    (device,) = explanation.devices
    assert (device.device, device.steady, device.effective) == (
        REQUEST_DEVICE,
        Amount(12288, 0),
        Amount(22528, 0),
    )
    assert (device.steady_slots, device.effective_slots) == (2, 2)


def test_init_container_declared_first_does_not_see_the_sidecar() -> None:
    explanation = _explain(_seed(sidecar_first=False))

    assert explanation.effective == Amount(20480, 0)
    assert explanation.steady == Amount(12288, 0)
    assert _memory(explanation) == [
        ("init container convert-weights running", 20480, 20480, 20480),
        ("init containers done, apps running", 12288, 20480, 20480),
        ("terminal", 0, 0, 0),
    ]
    point = explanation.containers[0].devices[0].init_point
    assert point is not None
    assert (point.sidecars, point.sidecar_names) == (Amount(0, 0), ())
    assert "max(10240, 20480, 2048) = 20480" in explanation.why
    assert "Kubernetes charges 20480 until the pod ends" in explanation.why


# -- progressive release -----------------------------------------------------------------------


def test_three_init_containers_are_released_one_by_one() -> None:
    manifest = kube_pod(
        "pipeline",
        init=[
            init_container("download", gpumem=16384, gpucores=50),
            sidecar_container("metrics", gpumem=1024, gpucores=5),
            init_container("convert", gpumem=12288, gpucores=40),
            init_container("warm-up", gpumem=8192, gpucores=30),
        ],
        apps=[app_container("server", gpumem=4096, gpucores=20)],
    )
    explanation = _explain(manifest)

    assert [(c.label, c.hami_accounting) for c in explanation.charges] == [
        ("init container download running", Amount(16384, 50)),
        ("init container convert running", Amount(13312, 45)),
        ("init container warm-up running", Amount(9216, 35)),
        ("init containers done, apps running", Amount(5120, 25)),
        ("terminal", Amount(0, 0)),
    ]
    # HAMi v2.10 holds its peak (the sidecar keeps its gate closed); Kubernetes its effective.
    assert {c.hami_v2_10 for c in explanation.charges[:-1]} == {Amount(16384, 50)}
    assert {c.kubernetes for c in explanation.charges[:-1]} == {Amount(16384, 50)}
    points = [
        c.devices[0].init_point.total
        for c in explanation.containers
        if c.devices and c.devices[0].init_point is not None
    ]
    assert points == [Amount(16384, 50), Amount(13312, 45), Amount(9216, 35)]
    assert "hami-accounting charges 16384, 13312, 9216 as its init containers run" in (
        explanation.why
    )


def test_without_sidecars_hami_shrinks_to_the_apps_once_the_init_containers_exit_0() -> None:
    manifest = kube_pod(
        "a",
        init=[init_container("init", gpumem=8000)],
        apps=[app_container("app", gpumem=5000)],
    )
    explanation = _explain(manifest)

    assert _memory(explanation) == [
        ("init container init running", 8000, 8000, 8000),
        ("init containers done, apps running", 5000, 5000, 8000),
        ("terminal", 0, 0, 0),
    ]
    assert explanation.why.startswith(
        "HAMi v2.10 charges max(5000, 8000) = 8000 until every init container has exited 0, "
        "then 5000; Kubernetes charges 8000 until the pod ends"
    )


def test_hami_under_counts_a_sidecar_beside_the_apps() -> None:
    manifest = kube_pod(
        "p",
        init=[sidecar_container("proxy", gpumem=4000)],
        apps=[app_container("app", gpumem=4000)],
    )
    explanation = _explain(manifest)

    assert [c.phase for c in explanation.charges] == [Phase.APPS_RUNNING, Phase.TERMINAL]
    assert _memory(explanation)[0] == ("init containers done, apps running", 8000, 4000, 8000)
    assert "less than the 8000 its sidecars and apps use together" in explanation.why
    assert "hami-accounting charges 8000 until the pod ends" in explanation.why


def test_an_init_container_without_a_gpu_still_carries_the_sidecars_before_it() -> None:
    manifest = kube_pod(
        "p",
        init=[sidecar_container("proxy", gpumem=2048), init_container("migrate")],
        apps=[app_container("app", gpumem=4096)],
    )
    explanation = _explain(manifest)

    (line,) = explanation.containers[1].devices
    assert line.amount == Amount(0, 0)
    assert line.init_point is not None
    assert (line.init_point.own, line.init_point.sidecars) == (Amount(0, 0), Amount(2048, 0))
    assert _memory(explanation)[0] == ("init container migrate running", 6144, 4096, 6144)


# -- requests: memory factor, device counts, percentages ----------------------------------------


def test_memory_factor_applies_to_hami_but_not_to_kubernetes() -> None:
    explanation = _explain(_seed(sidecar_first=True), memory_factor=2)

    assert _memory(explanation)[0] == (
        "init container convert-weights running",
        45056,
        40960,
        22528,
    )
    assert explanation.memory_factor == 2
    assert "Kubernetes charges 22528 (as written, before the memory factor)" in explanation.why
    assert any("memory factor 2" in note for note in explanation.notes)


def test_kubernetes_charges_the_quantity_per_container_not_per_device() -> None:
    manifest = kube_pod("p", apps=[app_container("app", gpumem=4096, gpus=2)])
    explanation = _explain(manifest)

    assert _memory(explanation)[0] == ("init containers done, apps running", 8192, 8192, 4096)


def test_memory_as_a_share_of_a_card_is_noted() -> None:
    app = {
        "name": "app",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}},
    }
    explanation = _explain(kube_pod("p", apps=[app]))

    assert explanation.effective.memory_mib == 0
    assert any("share of a card" in note for note in explanation.notes)


def test_a_pod_without_devices_is_charged_nothing() -> None:
    explanation = _explain(kube_pod("p", apps=[app_container("app")]))

    assert explanation.devices == ()
    assert {c.hami_accounting for c in explanation.charges} == {Amount(0, 0)}
    assert any("asks for no device" in note for note in explanation.notes)


# -- grants ------------------------------------------------------------------------------------


def test_allocation_annotation_explains_per_device_uuid() -> None:
    manifest = kube_pod(
        "bound",
        init=[
            sidecar_container("log-shipper", gpumem=2048),
            init_container("convert-weights", gpumem=20480),
        ],
        apps=[app_container("server", gpumem=6144, gpus=2)],
        allocation=allocation(
            [("GPU-0", 2048, 0)],
            [("GPU-0", 20480, 0)],
            [("GPU-0", 6144, 0), ("GPU-1", 6144, 0)],
        ),
        node="node1",
    )
    explanation = _explain(manifest)

    assert explanation.source is Source.GRANTS
    assert [
        (line.device, line.amount.memory_mib) for line in explanation.containers[2].devices
    ] == [
        ("GPU-0", 6144),
        ("GPU-1", 6144),
    ]
    point = explanation.containers[1].devices[0].init_point
    assert point is not None and point.total == Amount(22528, 0)
    assert [
        (d.device, d.steady.memory_mib, d.effective.memory_mib) for d in explanation.devices
    ] == [
        ("GPU-0", 8192, 22528),
        ("GPU-1", 6144, 6144),
    ]
    # Each device holds its own peak: 22528 + 6144 on ours, max(2048, 20480, 6144) + 6144 on
    # HAMi; Kubernetes knows only the quantities as written (server: 6144, once).
    assert _memory(explanation) == [
        ("init container convert-weights running", 28672, 26624, 22528),
        ("init containers done, apps running", 14336, 26624, 22528),
        ("terminal", 0, 0, 0),
    ]
    assert any("2 devices" in note for note in explanation.notes)


# -- properties --------------------------------------------------------------------------------


def _amount(totals: tuple[int, int, int]) -> Amount:
    return Amount(totals[0], totals[1])


@settings(max_examples=200, deadline=None)
@given(pods())
def test_on_grants_the_figures_are_the_formulas(pod: Pod) -> None:
    explanation = explain(pod, (NVIDIA_RESOURCES,))
    charges = {c.phase: c for c in explanation.charges}

    if not pod.has_grants:
        assert explanation.source is Source.REQUESTS
        return
    assert explanation.effective == _amount(usage_totals(effective_usage(pod)))
    assert explanation.steady == _amount(usage_totals(steady_state_usage(pod)))
    assert charges[Phase.APPS_RUNNING].hami_accounting == explanation.steady
    assert charges[Phase.TERMINAL].hami_accounting == Amount(0, 0)
    first = explanation.charges[0]
    if first.phase is Phase.INIT_RUNNING:
        assert first.hami_accounting == explanation.effective


@settings(max_examples=200, deadline=None)
@given(pods())
def test_on_requests_the_figures_are_the_effective_request(pod: Pod) -> None:
    on_requests = replace(pod, containers=tuple(replace(c, grants=()) for c in pod.containers))
    explanation = explain(on_requests, (NVIDIA_RESOURCES,))
    request = effective_request(on_requests, NVIDIA_RESOURCES)

    assert explanation.effective == Amount(request.memory_mib, request.core_percent)
    summed = Amount(
        sum(d.effective.memory_mib for d in explanation.devices),
        sum(d.effective.core_percent for d in explanation.devices),
    )
    if explanation.devices:
        assert summed == explanation.effective
        (device,) = explanation.devices
        assert device.effective_slots == max(request.count, 1)
    for charge in explanation.charges[:-1]:
        # Sidecar-unaware HAMi never charges more than the ordering-aware effective request.
        assert charge.hami_v2_10.memory_mib <= explanation.effective.memory_mib
        assert charge.hami_accounting.memory_mib <= explanation.effective.memory_mib
        if all(r.count <= 1 for c in on_requests.containers for r in c.requests):
            assert charge.kubernetes == explanation.effective
