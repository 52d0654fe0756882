"""Properties of the scheduler fit on random pods and nodes (Hypothesis).

* a pod that fits never takes a device past its memory, cores or slots;
* the merged usage the fit reports is exactly accounting.pod.collapse_grants of its grants;
* the shared-state fit gives the same answers as the literal deep-copy fit (bench/naive_fit.py);
* so does the topology-aware policy's choice among the cards that pass (pair scores drawn);
* fit_pod agrees with fit_node on every node and does not depend on the order of the nodes;
* the first node that fits in node_order_key order is fit_pod's choice (what-if replays),
  and fit_nodes without explanations answers as fit_node but for the card count;
* moving one re-scored device (the fit's incremental device order) gives the full re-sort;
* a GPU-less container changes nothing but the positions (HAMi #2899 and #3052).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.annotations import DEVICE_SCORING_WEIGHTS_ANNOTATION, NUMA_BIND_ANNOTATION
from accounting.fit import (
    GPU_POLICY_ANNOTATION,
    NOUSE_GPU_UUID_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
    NodeState,
    QuotaContext,
    _device_order,
    _reposition,
    fit_node,
    fit_nodes,
    fit_pod,
    node_order_key,
    node_policy_for,
)
from accounting.model import (
    Container,
    ContainerClass,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceState,
    Pod,
    QuotaItem,
)
from accounting.pair_scores import encode_card_scores
from accounting.pod import collapse_grants
from accounting.reasons import NOT_EXPLAINED, RESOURCE_QUOTA_NOT_FIT
from bench.naive_fit import naive_fit_node

PROPERTY_SETTINGS = settings(max_examples=500, deadline=None)
MODELS = ("NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA-Tesla T4")
PAIR_SCORES = (-5, 0, 1, 100, 150, 200)
GPU_POLICIES = (
    "binpack", "spread", "numa", "mutex", "Binpack", "binpack,numa", "numa,binpack",
    "spread, numa", "numa,spread", "binpack,spread", "mutex,binpack", "mutex, numa", "x,y",
    "topology-aware", "binpack, topology-aware", "numa,topology-aware",
)
"""hami.io/gpu-scheduler-policy values: single ones, chains, and words HAMi reads as spread;
topology-aware alone and in chains."""


@st.composite
def devices(draw: st.DrawFn, uuid: str, index: int) -> DeviceState:
    slots_total = draw(st.integers(1, 4))
    memory_total_mib = draw(st.sampled_from([1000, 8000, 10000, 24576]))
    cores_total = draw(st.sampled_from([100, 100, 200]))
    device = Device(
        uuid,
        draw(st.sampled_from(MODELS)),
        index,
        slots_total,
        memory_total_mib,
        cores_total,
        numa=draw(st.sampled_from([0, 0, 1])),
        healthy=draw(st.sampled_from([True, True, True, False])),
    )
    return DeviceState(
        device,
        memory_used_mib=draw(st.sampled_from([0, 0, memory_total_mib // 2, memory_total_mib])),
        core_percent_used=draw(st.sampled_from([0, 0, 20, cores_total])),
        slots_used=draw(st.integers(0, slots_total)),
    )


@st.composite
def nodes(
    draw: st.DrawFn, name: str = "node1", min_devices: int = 1, max_devices: int = 4
) -> NodeState:
    count = draw(st.integers(min_devices, max_devices))
    # Repeated indexes are allowed: the tie-break must still be deterministic.
    indexes = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    states = [draw(devices(f"{name}-g{i}", indexes[i])) for i in range(count)]
    if draw(st.booleans()):
        # The node's pair scores (hami.io/node-nvidia-score), which the topology-aware
        # policy chooses cards by: asymmetric, negative and missing ones too.
        uuids = [state.device.uuid for state in states]
        for i, state in enumerate(states):
            scores = draw(
                st.dictionaries(st.sampled_from(uuids), st.sampled_from(PAIR_SCORES), max_size=4)
            )
            info = (("hami.io/node-nvidia-score", encode_card_scores(scores)),)
            states[i] = replace(state, device=replace(state.device, custom_info=info))
    return NodeState(name, tuple(states))


requests = st.one_of(
    st.none(),
    st.builds(
        DeviceRequest,
        vendor=st.just("NVIDIA"),
        count=st.integers(1, 3),
        memory_mib=st.sampled_from([0, 0, 100, 1000, 4000, 9000]),
        memory_percent=st.sampled_from([0, 25, 40, 100]),
        core_percent=st.sampled_from([0, 10, 30, 50, 100, 150]),
    ),
)


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    count = draw(st.integers(1, 5))
    containers = []
    for i in range(count):
        container_class = draw(st.sampled_from(list(ContainerClass)))
        request = draw(requests)
        containers.append(
            Container(f"c{i}", container_class, () if request is None else (request,))
        )
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                [GPU_POLICY_ANNOTATION, USE_GPU_TYPE_ANNOTATION, NOUSE_GPU_UUID_ANNOTATION]
            ),
            st.sampled_from(["binpack", "spread", "a100", "T4", "node1-g1", ""]),
            max_size=2,
        )
    )
    policy = draw(st.sampled_from([None, None, *GPU_POLICIES]))
    if policy is not None:  # the GPU policy as HAMi reads it (accounting.gpu_order)
        annotations[GPU_POLICY_ANNOTATION] = policy
    numa_bind = draw(st.sampled_from([None, None, "true", "1", "false", "yes"]))
    if numa_bind is not None:
        annotations[NUMA_BIND_ANNOTATION] = numa_bind
    weights = draw(st.sampled_from([None, "slot=1,core=1,memory=3", "slot=0, core=4,memory=1"]))
    if weights is not None:  # the pod's own device order (hami.io/device-scoring-weights)
        annotations[DEVICE_SCORING_WEIGHTS_ANNOTATION] = weights
    return Pod("uid", "team-a", "p", tuple(containers), annotations=annotations)


def _quota(
    memory_limit: int | None, cores_limit: int | None, count_limit: int | None, enforce: bool
) -> QuotaContext:
    items = {}
    for resource, used, limit in (
        ("nvidia.com/gpumem", 1000, memory_limit),
        ("nvidia.com/gpucores", 0, cores_limit),
        ("nvidia.com/gpu", 1, count_limit),
    ):
        if limit is not None:
            items[resource] = QuotaItem(resource, used=used, limit=limit, limit_set=True)
    return QuotaContext(items, enforce_gpu_count=enforce)


# Tight limits often, so that the quota refuses some cards and not others (the per-card choice).
quotas = st.one_of(
    st.none(),
    st.builds(
        _quota,
        st.sampled_from([None, 1500, 2000, 5000, 10000, 30000]),
        st.sampled_from([None, 30, 50, 100, 1000]),
        st.sampled_from([None, 2, 3, 4]),
        st.booleans(),
    ),
)
gpu_policies = st.sampled_from(["binpack", "spread"])


def with_grants(pod: Pod, grants: tuple[tuple[DeviceGrant, ...], ...]) -> list[Container]:
    return [
        Container(c.name, c.container_class, c.requests, g)
        for c, g in zip(pod.containers, grants, strict=True)
    ]


@PROPERTY_SETTINGS
@given(pods(), nodes(), gpu_policies)
def test_a_fitting_pod_never_takes_a_device_past_its_capacity(
    pod: Pod, node: NodeState, gpu_policy: str
) -> None:
    fitted = fit_node(pod, node, gpu_policy=gpu_policy)
    states = {state.device.uuid: state for state in node.devices}
    for added in fitted.usage:
        state = states[added.uuid]
        assert state.memory_used_mib + added.memory_mib <= state.device.memory_total_mib
        assert state.core_percent_used + added.core_percent <= state.device.core_percent_total
        assert state.slots_used + added.slots <= state.device.slots_total
    for grants in fitted.grants:
        uuids = [grant.uuid for grant in grants]
        assert len(uuids) == len(set(uuids)), "one request took the same device twice"


@PROPERTY_SETTINGS
@given(pods(), nodes(), gpu_policies)
def test_merged_usage_is_the_collapse_of_the_grants(
    pod: Pod, node: NodeState, gpu_policy: str
) -> None:
    fitted = fit_node(pod, node, gpu_policy=gpu_policy)
    assert fitted.usage == collapse_grants(with_grants(pod, fitted.grants))
    if fitted.fits:
        asked = [any(r.count > 0 for r in c.requests) for c in pod.containers]
        assert [bool(grants) for grants in fitted.grants] == asked


@PROPERTY_SETTINGS
@given(pods(), nodes(), gpu_policies, quotas)
def test_fit_node_equals_the_naive_deep_copy_fit(
    pod: Pod, node: NodeState, gpu_policy: str, quota: QuotaContext | None
) -> None:
    assert fit_node(pod, node, gpu_policy=gpu_policy, quota=quota) == naive_fit_node(
        pod, node, gpu_policy=gpu_policy, quota=quota
    )


@PROPERTY_SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(["node-a", "node-b", "node-c"]), min_size=1, max_size=3, unique=True),
    st.data(),
    gpu_policies,
    quotas,
)
def test_fit_pod_agrees_with_fit_node_whatever_the_node_order(
    pod: Pod,
    names: list[str],
    data: st.DataObject,
    node_policy: str,
    quota: QuotaContext | None,
) -> None:
    candidates = [data.draw(nodes(name)) for name in names]
    result = fit_pod(pod, candidates, node_policy=node_policy, quota=quota)
    assert fit_pod(pod, candidates[::-1], node_policy=node_policy, quota=quota) == result
    if result.reason == "NoGpuRequest":
        return
    fits = {n.node_name: fit_node(pod, n, quota=quota) for n in candidates}
    assert dict(result.failed_nodes) == {
        name: fitted.reason for name, fitted in fits.items() if not fitted.fits
    }
    assert dict(result.scores) == {name: f.score for name, f in fits.items() if f.fits}
    if result.node_name is None:
        assert result.reason == "NoNodeFits"
        return
    assert result.grants == fits[result.node_name].grants
    best = max if node_policy == "binpack" else min
    assert result.scores[result.node_name] == best(result.scores.values())


@PROPERTY_SETTINGS
@given(pods(), nodes(), st.integers(0, 5), st.sampled_from(list(ContainerClass)), quotas)
def test_a_gpu_less_container_only_shifts_positions(
    pod: Pod,
    node: NodeState,
    where: int,
    container_class: ContainerClass,
    quota: QuotaContext | None,
) -> None:
    where = min(where, len(pod.containers))
    padded = Pod(
        pod.uid,
        pod.namespace,
        pod.name,
        (*pod.containers[:where], Container("cpu-only", container_class), *pod.containers[where:]),
        annotations=pod.annotations,
    )
    before, after = fit_node(pod, node, quota=quota), fit_node(padded, node, quota=quota)
    assert (after.fits, after.reason, after.usage) == (before.fits, before.reason, before.usage)
    assert after.grants == (*before.grants[:where], (), *before.grants[where:])


@PROPERTY_SETTINGS
@given(pods(), nodes(min_devices=5, max_devices=8), gpu_policies, quotas)
def test_fit_node_equals_the_naive_fit_on_nodes_of_up_to_eight_gpus(
    pod: Pod, node: NodeState, gpu_policy: str, quota: QuotaContext | None
) -> None:
    # Wide nodes: a charged card can slide several places in the device order.
    assert fit_node(pod, node, gpu_policy=gpu_policy, quota=quota) == naive_fit_node(
        pod, node, gpu_policy=gpu_policy, quota=quota
    )


@st.composite
def topology_pods(draw: st.DrawFn) -> Pod:
    """A pod under the topology-aware policy whose containers are small enough to fit often,
    so that the choice among the cards that pass is made (a request for 1: the least
    connected card; for more: the best combination)."""
    containers = tuple(
        Container(
            f"c{i}",
            draw(st.sampled_from(list(ContainerClass))),
            (
                DeviceRequest(
                    "NVIDIA",
                    draw(st.integers(1, 4)),
                    draw(st.sampled_from([0, 100, 1000])),
                    0,
                    draw(st.sampled_from([0, 10, 20])),
                ),
            ),
        )
        for i in range(draw(st.integers(1, 2)))
    )
    policy = draw(
        st.sampled_from(["topology-aware", "binpack, topology-aware", "spread ,topology-aware"])
    )
    annotations = {GPU_POLICY_ANNOTATION: policy}
    if draw(st.booleans()):  # the collection starts again at each NUMA node (HAMi's quirk)
        annotations[NUMA_BIND_ANNOTATION] = "true"
    return Pod("uid", "team-a", "p", containers, annotations=annotations)


@PROPERTY_SETTINGS
@given(topology_pods(), nodes(min_devices=2, max_devices=8), gpu_policies, quotas)
def test_the_topology_choice_equals_the_naive_fit(
    pod: Pod, node: NodeState, gpu_policy: str, quota: QuotaContext | None
) -> None:
    # The choice among every card that passed, its ties to the first in walk order, and the
    # quota priced on all the cards collected so far.
    assert fit_node(pod, node, gpu_policy=gpu_policy, quota=quota) == naive_fit_node(
        pod, node, gpu_policy=gpu_policy, quota=quota
    )


# Few distinct values, so equal scores (ties broken by the index order) are common.
device_scores = st.lists(st.sampled_from([0.0, 1.5, 2.0, 7.25, 30.0]), min_size=1, max_size=8)


@PROPERTY_SETTINGS
@given(device_scores, st.data(), st.booleans())
def test_repositioning_one_rescored_device_equals_the_full_sort(
    scores: list[float], data: st.DataObject, binpack: bool
) -> None:
    count = len(scores)
    index_descending = data.draw(st.permutations(range(count)))
    rank = [0] * count
    for place, p in enumerate(index_descending):
        rank[p] = place
    order = _device_order(index_descending, scores, binpack)
    moved = data.draw(st.integers(0, count - 1))
    rescored = list(scores)
    rescored[moved] = data.draw(st.sampled_from([0.0, 1.5, 2.0, 7.25, 30.0, 45.0]))

    _reposition(order, moved, rescored, rank, binpack)

    assert order == _device_order(index_descending, rescored, binpack)


@PROPERTY_SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(["node-a", "node-b", "node-c"]), min_size=1, max_size=3, unique=True),
    st.data(),
    gpu_policies,
    quotas,
)
def test_the_first_fit_in_node_order_is_fit_pods_choice(
    pod: Pod,
    names: list[str],
    data: st.DataObject,
    node_policy: str,
    quota: QuotaContext | None,
) -> None:
    candidates = [data.draw(nodes(name)) for name in names]
    result = fit_pod(pod, candidates, node_policy=node_policy, quota=quota)
    policy = node_policy_for(pod, node_policy)
    ordered = sorted(candidates, key=lambda n: node_order_key(n.score, n.node_name, policy))

    first = next((f for f in fit_nodes(pod, ordered, quota=quota) if f.fits), None)

    if result.reason == "NoGpuRequest":
        return
    assert (first.node_name if first else None) == result.node_name
    assert (first.grants if first else ((),) * len(pod.containers)) == result.grants


whole_or_share = st.builds(
    DeviceRequest,
    vendor=st.just("NVIDIA"),
    count=st.integers(1, 2),
    memory_mib=st.just(0),
    memory_percent=st.sampled_from([0, 50, 100]),
    core_percent=st.sampled_from([0, 10, 100]),
)


@st.composite
def sized_pods(draw: st.DrawFn) -> Pod:
    """Pods whose charge depends on the card chosen (whole cards, shares of a card)."""
    classes = draw(st.lists(st.sampled_from(list(ContainerClass)), min_size=1, max_size=3))
    containers = tuple(
        Container(f"c{i}", container_class, (draw(whole_or_share),))
        for i, container_class in enumerate(classes)
    )
    return Pod("uid", "team-a", "p", containers)


@PROPERTY_SETTINGS
@given(
    sized_pods(),
    nodes(min_devices=2, max_devices=8),
    gpu_policies,
    st.sampled_from([1500, 2000, 5000, 9000, 11000, 25576]),
    st.sampled_from([None, 2, 3]),
)
def test_a_quota_between_card_sizes_is_checked_per_card_as_the_naive_fit_does(
    pod: Pod, node: NodeState, gpu_policy: str, memory_limit: int, count_limit: int | None
) -> None:
    # Limits between the card sizes: the quota refuses the large cards and not the small ones,
    # so it takes part in the choice of card (HAMi's fitQuota per candidate card).
    quota = _quota(memory_limit, None, count_limit, True)
    assert fit_node(pod, node, gpu_policy=gpu_policy, quota=quota) == naive_fit_node(
        pod, node, gpu_policy=gpu_policy, quota=quota
    )


@PROPERTY_SETTINGS
@given(pods(), st.lists(nodes(), min_size=1, max_size=3), gpu_policies, quotas)
def test_fit_nodes_without_explanations_answers_as_fit_node_but_for_the_card_count(
    pod: Pod, candidates: list[NodeState], gpu_policy: str, quota: QuotaContext | None
) -> None:
    quiet = fit_nodes(pod, candidates, gpu_policy=gpu_policy, quota=quota, explain_refusals=False)
    for node, fitted in zip(candidates, quiet, strict=True):
        explained = fit_node(pod, node, gpu_policy=gpu_policy, quota=quota)
        if fitted.reason == NOT_EXPLAINED:
            # Only a count of cards is left out, never a quota refusal.
            assert not explained.fits and "/" in explained.reason
            assert RESOURCE_QUOTA_NOT_FIT not in explained.reason
            assert fitted == replace(explained, reason=NOT_EXPLAINED)
        else:
            assert fitted == explained



@st.composite
def quota_bound_pods(draw: st.DrawFn) -> Pod:
    """Pods that leave MIG out (nvidia.com/vgpu-mode) and whose cards the quota often refuses
    one by one: whole cards or large shares."""
    containers = tuple(
        Container(
            f"c{i}",
            draw(st.sampled_from([ContainerClass.APP, ContainerClass.APP, ContainerClass.INIT])),
            (DeviceRequest("NVIDIA", draw(st.integers(1, 2)),
                           draw(st.sampled_from([0, 1000, 3000])),
                           draw(st.sampled_from([0, 50, 100])),
                           draw(st.sampled_from([0, 10, 100]))),),
        )
        for i in range(draw(st.integers(1, 3)))
    )
    return Pod("uid", "team-a", "p", containers,
               annotations={"nvidia.com/vgpu-mode": "hami-core"})


@st.composite
def free_nodes(draw: st.DrawFn) -> NodeState:
    count = draw(st.integers(1, 3))
    return NodeState("node1", tuple(
        DeviceState(
            Device(f"node1-g{i}", MODELS[0], i, 4, draw(st.sampled_from([1000, 2000, 6000, 8000])),
                   100),
            memory_used_mib=draw(st.sampled_from([0, 0, 500])),
            slots_used=draw(st.integers(0, 1)),
        )
        for i in range(count)
    ))


memory_quotas = st.builds(
    _quota,
    st.sampled_from([1500, 2000, 3000, 5000, 7000, 10000]),
    st.sampled_from([None, 150, 1000]),
    st.sampled_from([None, 2, 3]),
    st.booleans(),
)


@PROPERTY_SETTINGS
@given(quota_bound_pods(), free_nodes(), gpu_policies, memory_quotas)
def test_a_mig_card_the_pod_leaves_out_changes_no_placement(
    pod: Pod, node: NodeState, gpu_policy: str, quota: QuotaContext | None
) -> None:
    # With a MIG card the node is placed by accounting.vendor_fit; a pod that leaves MIG out
    # (nvidia.com/vgpu-mode) must get the cards the generic walk gives it without that card,
    # the quota priced card by card on both paths.
    mig_card = DeviceState(Device("node1-mig", "NVIDIA A100-SXM4-40GB", 3, 7, 40960, 100,
                                  mode="mig"))
    with_mig = NodeState(node.node_name, (*node.devices, mig_card))
    walked = fit_node(pod, with_mig, gpu_policy=gpu_policy, quota=quota)
    generic = fit_node(pod, node, gpu_policy=gpu_policy, quota=quota)
    assert (walked.fits, walked.grants) == (generic.fits, generic.grants)
