"""Hypothesis properties of the pod formulas, the quota check and the ledger."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.ledger import Ledger
from accounting.model import Container, ContainerClass, DeviceUsage, Pod, QuotaItem
from accounting.pod import (
    EffectiveRequest,
    collapse_grants,
    effective_request,
    effective_usage,
    remaining_usage,
    steady_state_usage,
    usage_phases,
)
from accounting.quota import check_quota
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.accounting.strategies import (
    NODES,
    UUIDS,
    Operation,
    containers,
    effective_requests,
    init_container_count,
    ledger_scripts,
    pods,
    smaller_requests,
)
from tests.builders import device, gpu, req

PROPERTY = settings(max_examples=500, deadline=None)

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
COUNT = "nvidia.com/gpu"


def _by_uuid(usage: tuple[DeviceUsage, ...]) -> dict[str, tuple[int, int, int]]:
    return {u.uuid: (u.memory_mib, u.core_percent, u.slots) for u in usage}


def _covers(big: tuple[DeviceUsage, ...], small: tuple[DeviceUsage, ...]) -> bool:
    """Every UUID of ``small`` is in ``big`` with every dimension at least as large."""
    bigger = _by_uuid(big)
    return all(
        uuid in bigger and all(b >= s for b, s in zip(bigger[uuid], dims, strict=True))
        for uuid, dims in _by_uuid(small).items()
    )


# -- pod formulas ----------------------------------------------------------------------------


@PROPERTY
@given(pods())
def test_effective_is_at_least_steady_per_uuid_and_dimension(pod: Pod) -> None:
    assert _covers(effective_usage(pod), steady_state_usage(pod))


@PROPERTY
@given(pods())
def test_effective_is_at_least_every_init_phase_point(pod: Pod) -> None:
    phases = usage_phases(pod.containers)

    for _, point in phases.init_points:
        assert _covers(phases.effective, point)


@PROPERTY
@given(st.data(), pods())
def test_permuting_app_containers_changes_nothing(data: st.DataObject, pod: Pod) -> None:
    split = init_container_count(pod)
    apps = data.draw(st.permutations(pod.containers[split:]))
    shuffled = replace(pod, containers=(*pod.containers[:split], *apps))

    assert effective_usage(shuffled) == effective_usage(pod)
    assert steady_state_usage(shuffled) == steady_state_usage(pod)
    assert effective_request(shuffled, NVIDIA_RESOURCES) == effective_request(pod, NVIDIA_RESOURCES)


@PROPERTY
@given(pods(init_classes=()))
def test_without_init_containers_effective_is_the_sum_of_grants(pod: Pod) -> None:
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for container in pod.containers:
        for grant in container.grants:
            sums[grant.uuid][0] += grant.memory_mib
            sums[grant.uuid][1] += grant.core_percent
            sums[grant.uuid][2] += grant.slot_weight

    assert _by_uuid(effective_usage(pod)) == {u: tuple(v) for u, v in sums.items()}
    assert effective_usage(pod) == steady_state_usage(pod)


@PROPERTY
@given(st.data(), pods(), containers(name="added"))
def test_adding_a_container_never_decreases_effective(
    data: st.DataObject, pod: Pod, added: Container
) -> None:
    split = init_container_count(pod)
    if added.container_class is ContainerClass.APP:
        position = data.draw(st.integers(split, len(pod.containers)), label="position")
    else:
        position = data.draw(st.integers(0, split), label="position")
    grown = replace(pod, containers=(*pod.containers[:position], added, *pod.containers[position:]))

    assert _covers(effective_usage(grown), effective_usage(pod))
    before = effective_request(pod, NVIDIA_RESOURCES)
    after = effective_request(grown, NVIDIA_RESOURCES)
    assert after.count >= before.count
    assert after.memory_mib >= before.memory_mib
    assert after.core_percent >= before.core_percent


@PROPERTY
@given(pods())
def test_remaining_usage_runs_from_effective_down_to_steady(pod: Pod) -> None:
    positions = range(len(pod.containers) + 1)
    remaining = [remaining_usage(pod, position) for position in positions]

    assert remaining[0] == effective_usage(pod)
    assert remaining[-1] == steady_state_usage(pod)
    for earlier, later in itertools.pairwise(remaining):
        assert _covers(earlier, later)


@PROPERTY
@given(
    st.lists(
        st.tuples(st.sampled_from("ISA"), st.integers(0, 100000)),
        max_size=8,
    )
)
def test_request_formula_and_grant_formula_agree_on_one_device(
    shape: list[tuple[str, int]],
) -> None:
    classes = {"I": ContainerClass.INIT, "S": ContainerClass.SIDECAR, "A": ContainerClass.APP}
    ordered = sorted(shape, key=lambda item: item[0] == "A")  # init list first, as declared
    built = tuple(
        Container(f"c{i}", classes[kind], (req(1, mib=mib),), (gpu("g0", mib=mib),))
        for i, (kind, mib) in enumerate(ordered)
    )
    pod = Pod("uid", "ns", "p", built)

    collapsed = collapse_grants(built)

    assert [u.memory_mib for u in collapsed] == (
        [effective_request(pod, NVIDIA_RESOURCES).memory_mib] if built else []
    )


# -- quota -----------------------------------------------------------------------------------


def _quota_items() -> st.SearchStrategy[dict[str, QuotaItem]]:
    def item(resource: str) -> st.SearchStrategy[QuotaItem]:
        return st.builds(
            QuotaItem,
            resource=st.just(resource),
            used=st.integers(0, 200000),
            limit=st.integers(0, 200000),
            limit_set=st.booleans(),
        )

    return st.fixed_dictionaries(
        {}, optional={MEM: item(MEM), CORES: item(CORES), COUNT: item(COUNT)}
    )


@PROPERTY
@given(
    st.data(),
    effective_requests(),
    _quota_items(),
    st.integers(1, 4),
    st.booleans(),
)
def test_check_quota_is_monotonic(
    data: st.DataObject,
    request: EffectiveRequest,
    items: dict[str, QuotaItem],
    memory_factor: int,
    enforce_gpu_count: bool,
) -> None:
    vendor = VendorResources(memory_factor=memory_factor)
    smaller = data.draw(smaller_requests(request), label="smaller")

    allowed = check_quota("ns", request, items, vendor, enforce_gpu_count=enforce_gpu_count).allowed

    if allowed:
        assert check_quota(
            "ns", smaller, items, vendor, enforce_gpu_count=enforce_gpu_count
        ).allowed


# -- ledger ----------------------------------------------------------------------------------


def _ledger() -> Ledger:
    ledger = Ledger()
    for node in NODES:
        ledger.register_node(
            node,
            [
                device(uuid, mib=163840, cores=200, slots=6, index=index)
                for index, uuid in enumerate(UUIDS)
            ],
        )
    return ledger


def _snapshot(ledger: Ledger) -> tuple[object, ...]:
    return (
        {pod.uid: pod for pod in ledger.pods()},
        {node: ledger.node_usage(node) for node in NODES},
        {ns: ledger.namespace_items(ns) for ns in ledger.namespaces()},
    )


def _assert_totals_are_the_sum_of_stored_values(ledger: Ledger) -> None:
    nodes: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    namespaces: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for stored in ledger.pods():
        for entry in stored.usage:
            vector = nodes[stored.node_name][entry.uuid]
            vector[0] += entry.memory_mib
            vector[1] += entry.core_percent
            vector[2] += entry.slots
            namespaces[stored.namespace][MEM] += entry.memory_mib
            namespaces[stored.namespace][CORES] += entry.core_percent
            namespaces[stored.namespace][COUNT] += 1

    for node in NODES:
        want = {uuid: tuple(v) for uuid, v in nodes[node].items() if v != [0, 0, 0]}
        assert ledger.node_usage(node) == want
        assert all(value >= 0 for values in want.values() for value in values)
    for namespace in {*namespaces, *ledger.namespaces()}:
        got = {resource: item.used for resource, item in ledger.namespace_items(namespace).items()}
        assert got == {r: v for r, v in namespaces[namespace].items() if v}
        assert all(value >= 0 for value in got.values())


def _apply(ledger: Ledger, operation: Operation) -> None:
    action, pod = operation.action, operation.pod
    if action == "record":
        ledger.record(pod)
    elif action == "reserve":
        before = _snapshot(ledger)
        if not ledger.reserve(pod, pod.node_name).reserved:
            assert _snapshot(ledger) == before, "a refused reservation changed the ledger"
    else:
        ledger.forget(pod.uid)


@PROPERTY
@given(ledger_scripts())
def test_ledger_totals_always_equal_the_sum_of_stored_values(script: list[Operation]) -> None:
    ledger = _ledger()

    for operation in script:
        _apply(ledger, operation)
        _assert_totals_are_the_sum_of_stored_values(ledger)

    for uid in sorted(ledger.pod_uids()):
        ledger.forget(uid)
    assert len(ledger) == 0
    assert all(ledger.node_usage(node) == {} for node in NODES)
    assert all(ledger.namespace_items(ns) == {} for ns in ledger.namespaces())


@PROPERTY
@given(ledger_scripts())
def test_replaying_a_record_changes_nothing(script: list[Operation]) -> None:
    ledger = _ledger()

    for operation in script:
        _apply(ledger, operation)
        if operation.action != "record":
            continue
        before = _snapshot(ledger)
        replay = ledger.record(operation.pod)
        assert replay.change.changed is False
        assert _snapshot(ledger) == before
