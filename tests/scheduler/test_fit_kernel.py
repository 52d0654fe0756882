"""The vectorized fit gives exactly the reference fit's answer (a differential property test).

``services.scheduler.candidate_fit.fit_columns`` (the vectorized fit, then the reference
fit for what it leaves) over a ``NodeTable`` (and nodes handed in
apart, as the scheduler reads them directly) against ``accounting.fit.fit_pod`` over the same
nodes: random inventories (models, modes, other vendors' devices, repeated indexes, unhealthy
cards, used and overcommitted cards), pods with init containers, sidecars and apps (fixed
memory, shares of a card, whole cards, 0 and 100 cores, several devices), the type, mode and
UUID annotations, both node and GPU policies in the arguments and in the pod's annotations,
the pod's device scoring weights (whose pods the kernel leaves to the reference), the policy's
memory factor and default memory, and quotas from none to tight. The chosen node, its grants,
every failed node's reason, every score, the reason code and the message must be equal. A
second property compares the kernel's own verdict per node (the rows it fits itself) with
fit_node, so the columns are tested even where the answer would hide a difference. A
third draws clusters of alike nodes (copies of a few states under their own names and UUIDs),
where the kernel fits one node per distinct state and hands its verdict to the others. A fourth
pins the tables the plan hands the kernel (per model and mode, per UUID, per set of vendors and
modes), as the kernel lays them over its columns, to the plan's decisions per device.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.annotations import DEVICE_SCORING_WEIGHTS_ANNOTATION, NUMA_BIND_ANNOTATION
from accounting.device_filter import DeviceFilter
from accounting.fit import (
    GPU_POLICY_ANNOTATION,
    NODE_POLICY_ANNOTATION,
    NOUSE_GPU_TYPE_ANNOTATION,
    NOUSE_GPU_UUID_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
    USE_GPU_UUID_ANNOTATION,
    VGPU_MODE_ANNOTATION,
    NodeState,
    QuotaContext,
    fit_node,
    fit_plan,
    fit_pod,
)
from accounting.model import (
    CORDONED_INFO,
    Container,
    ContainerClass,
    Device,
    DeviceRequest,
    DeviceState,
    Pod,
    QuotaItem,
)
from accounting.vendors import VendorResources, spec_for
from services.scheduler import candidate_fit, fit_kernel
from services.scheduler.convert import score_entry
from services.scheduler.node_table import Columns, NodeTable

SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
MODELS = ("NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA-Tesla T4", "NVIDIA H100")
MODES = ("hami-core", "hami-core", "mps", "mig", "hami")
NODE_NAMES = ("node-a", "node-b", "node-c", "node-d", "node-e", "node-f")
MANY_NODE_NAMES = (*NODE_NAMES, "node-g", "node-h", "node-i", "node-j", "node-k", "node-l")


@st.composite
def device_states(draw: st.DrawFn, uuid: str, index: int) -> DeviceState:
    slots = draw(st.integers(1, 4))
    memory = draw(st.sampled_from([1000, 8000, 10000, 24576, 40960]))
    cores = draw(st.sampled_from([100, 100, 100, 200, 0]))
    vendor = draw(st.sampled_from(["NVIDIA"] * 7 + ["OTHER"]))
    device = Device(
        uuid,
        draw(st.sampled_from(MODELS)),
        index,
        slots,
        memory,
        cores,
        numa=draw(st.sampled_from([0, 0, 1])),
        mode=draw(st.sampled_from(MODES)),
        healthy=draw(st.sampled_from([True, True, True, True, False])),
        vendor=vendor,
        # Now and then cordoned (the node's hami.io/device-cordon): its node is the
        # reference fit's.
        custom_info=draw(st.sampled_from([()] * 9 + [((CORDONED_INFO, "true"),)])),
    )
    return DeviceState(
        device,
        memory_used_mib=draw(
            st.sampled_from([0, 0, 0, memory // 4, memory // 2, memory, memory + 10])
        ),
        core_percent_used=draw(st.sampled_from([0, 0, 10, 30, cores])),
        slots_used=draw(st.integers(0, slots + 1)),
    )


@st.composite
def node_states(draw: st.DrawFn, name: str) -> NodeState:
    count = draw(st.integers(0, 8))
    indexes = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    if draw(st.integers(0, 2)) == 0:
        # As most real nodes are: identical cards, the same usage on many of them, so scores
        # tie and the index rank decides the order (in every re-sort too).
        memory = draw(st.sampled_from([8000, 24576]))
        used = draw(st.sampled_from([0, 2000]))
        # Half the cards on NUMA node 1 or none: the NUMA node breaks ties before the index.
        numas = [i % 2 * draw(st.integers(0, 1)) for i in range(count)]
        return NodeState(
            name,
            tuple(
                DeviceState(
                    Device(f"{name}-g{i}", MODELS[0], indexes[i], 4, memory, 100,
                           numa=numas[i]),
                    used * draw(st.integers(0, 1)),
                )
                for i in range(count)
            ),
        )
    return NodeState(
        name, tuple(draw(device_states(f"{name}-g{i}", indexes[i])) for i in range(count))
    )


requests = st.builds(
    DeviceRequest,
    vendor=st.just("NVIDIA"),
    count=st.integers(1, 3),
    memory_mib=st.sampled_from([0, 0, 100, 1000, 4000, 9000, 30000]),
    memory_percent=st.sampled_from([0, 10, 25, 50, 100]),
    core_percent=st.sampled_from([0, 0, 10, 30, 50, 100, 150]),
)

ANNOTATIONS = {
    GPU_POLICY_ANNOTATION: ["binpack", "spread", "Binpack,numa", "mutex", "binpack,numa",
                            "numa,spread", "binpack,spread"],
    NUMA_BIND_ANNOTATION: ["true", "false"],
    NODE_POLICY_ANNOTATION: ["binpack", "spread"],
    USE_GPU_TYPE_ANNOTATION: ["a100", "T4,a10", " "],
    NOUSE_GPU_TYPE_ANNOTATION: ["h100", "a10"],
    USE_GPU_UUID_ANNOTATION: ["node-a-g1,node-b-g0", "node-c-g2", "node-a-g0, node-d-g3,"],
    NOUSE_GPU_UUID_ANNOTATION: ["node-a-g0", "node-b-g1,node-e-g0"],
    VGPU_MODE_ANNOTATION: ["hami-core", "mps", "hami-core,mps"],
    DEVICE_SCORING_WEIGHTS_ANNOTATION: ["slot=1,core=1,memory=3", "core=0, memory=1, slot=5",
                                        "slot=1,core=1,memory=1"],
}


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    count = draw(st.integers(1, 5))
    containers = []
    for i in range(count):
        container_class = draw(st.sampled_from(list(ContainerClass)))
        request = draw(st.one_of(st.none(), requests))
        containers.append(
            Container(f"c{i}", container_class, () if request is None else (request,))
        )
    if not any(c.requests for c in containers):
        containers[0] = Container("c0", containers[0].container_class, (draw(requests),))
    keys = draw(st.lists(st.sampled_from(sorted(ANNOTATIONS)), unique=True, max_size=3))
    annotations = {key: draw(st.sampled_from(ANNOTATIONS[key])) for key in keys}
    return Pod("uid-p", "team-a", "p", tuple(containers), annotations=annotations)


def _quota(memory: int | None, cores: int | None, count: int | None, enforce: bool,
           used: int) -> QuotaContext:
    items = {}
    for resource, limit in (
        ("nvidia.com/gpumem", memory),
        ("nvidia.com/gpucores", cores),
        ("nvidia.com/gpu", count),
    ):
        if limit is not None:
            items[resource] = QuotaItem(
                resource, used=used if "mem" in resource else 0, limit=limit, limit_set=True
            )
    return QuotaContext(items, enforce_gpu_count=enforce)


quotas = st.one_of(
    st.none(),
    st.builds(
        _quota,
        st.sampled_from([None, 2000, 10000, 50000, 10**12]),
        st.sampled_from([None, 50, 300, 10**6]),
        st.sampled_from([None, 2, 100]),
        st.booleans(),
        st.sampled_from([0, 1000]),
    ),
)
vendors = st.sampled_from(
    [
        VendorResources(),
        VendorResources(memory_factor=4),
        VendorResources(default_memory_mib=2048),
    ]
)
policies = st.sampled_from(["binpack", "spread"])

FIT_ARGUMENTS = (policies, policies, quotas, vendors)
"""Node policy, GPU policy, quota and vendor resources, drawn for a fit."""


def table_of(nodes: list[NodeState], churn: list[NodeState]) -> NodeTable:
    """A table that saw ``churn`` first (rows written, then dropped or rewritten), then
    ``nodes``: rows are reused and rewritten in place, as the watch events do."""
    table = NodeTable(encode_score=score_entry)
    for node in churn:
        table.put(node)
    for node in churn[::2]:
        table.drop(node.node_name)
    for node in nodes:
        table.put(node)
    return table


@SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True),
    st.data(),
    *FIT_ARGUMENTS,
)
def test_the_vectorized_fit_gives_the_reference_answer(
    pod: Pod,
    names: list[str],
    data: st.DataObject,
    node_policy: str,
    gpu_policy: str,
    quota: QuotaContext | None,
    vendor: VendorResources,
) -> None:
    nodes = [data.draw(node_states(name)) for name in names]
    apart = data.draw(st.integers(0, len(nodes)))  # these are handed in as NodeStates
    churn = [data.draw(node_states(name)) for name in names[: data.draw(st.integers(0, 3))]]
    table = table_of(nodes[apart:], churn)
    columns, missing = table.gather([n.node_name for n in nodes[apart:]])
    assert missing == []

    assert_reference_answer(
        pod, columns, nodes, nodes[:apart], vendor, node_policy, gpu_policy, quota
    )


def assert_reference_answer(
    pod: Pod,
    columns: Columns,
    nodes: list[NodeState],
    apart: list[NodeState],
    vendor: VendorResources,
    node_policy: str,
    gpu_policy: str,
    quota: QuotaContext | None,
) -> None:
    """The kernel over ``columns`` and the nodes ``apart`` answers as fit_pod over ``nodes``
    (all of them)."""
    plan = fit_plan(pod, vendor=vendor, node_policy=node_policy, gpu_policy=gpu_policy,
                    quota=quota)
    assert plan is not None  # every drawn pod asks for a device
    answer = candidate_fit.fit_columns(plan, columns, apart)

    assert answer == fit_pod(
        pod, nodes, vendor=vendor, node_policy=node_policy, gpu_policy=gpu_policy, quota=quota
    )


@SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True),
    st.data(),
    policies,
    vendors,
)
def test_every_row_the_kernel_fits_itself_gets_the_reference_verdict(
    pod: Pod, names: list[str], data: st.DataObject, gpu_policy: str, vendor: VendorResources
) -> None:
    nodes = [data.draw(node_states(name)) for name in names]
    columns, _ = table_of(nodes, []).gather(names)
    plan = fit_plan(pod, vendor=vendor, gpu_policy=gpu_policy)
    assert plan is not None
    # Every figure drawn fits the columns; a node with a cordoned card is left out.
    cordoned = [any(d.device.cordoned for d in state.devices) for state in columns.states]
    assert columns.fields["kernel_ok"].tolist() == [not c for c in cordoned]
    # Nodes with MIG-mode cards are the vendor's own rules' (the kernel leaves them out), and
    # so is every node for a pod the kernel's device order does not serve (mutex, weights).
    generic = [
        plan.kernel_may_fit and not plan.needs_rules(state.devices) and not c
        for state, c in zip(columns.states, cordoned, strict=True)
    ]

    picks: fit_kernel.Picks = []
    result = fit_kernel._run(
        plan, candidate_fit.tables_for(plan, columns), columns, np.array(generic), picks
    )

    for row, name in enumerate(columns.names):
        if not generic[row]:
            continue
        reference = fit_node(pod, columns.states[row], vendor=vendor, gpu_policy=gpu_policy)
        assert reference.node_name == name
        assert bool(result.fits[row]) == reference.fits
        if not reference.fits:
            assert fit_kernel._reason_text(int(result.reason_keys[row])) == reference.reason
            continue
        # The cards taken, per container in walk order, are the reference fit's grants.
        uuids = columns.uuids[row]
        for ask, taken in zip(plan.asks, picks, strict=True):
            chosen = [uuids[p] for mask in taken for p in mask[:, row].nonzero()[0].tolist()]
            assert chosen == [g.uuid for g in reference.grants[ask.position]]


@SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True),
    st.data(),
    vendors,
)
def test_the_plans_tables_over_the_columns_are_its_decisions_per_device(
    pod: Pod, names: list[str], data: st.DataObject, vendor: VendorResources
) -> None:
    """The tables the plan hands the kernel (per model and mode, per UUID the pod names, per
    set of vendors and modes), laid over the columns by the kernel, refuse exactly the devices
    the pod's selection annotations refuse, and leave to the vendor's rules exactly the nodes
    the plan says need them."""
    nodes = [data.draw(node_states(name)) for name in names]
    columns, _ = table_of(nodes, []).gather(names)
    plan = fit_plan(pod, vendor=vendor)
    assert plan is not None
    tables = candidate_fit.tables_for(plan, columns)
    selection = DeviceFilter.from_annotations(pod.annotations, spec_for(vendor.vendor).selection)

    type_ok, uuid_ok, of_vendor = fit_kernel._allowed(plan, tables, columns)
    rules = np.array(tables.rules_needed)[columns.fields["signature"]]
    for row, state in enumerate(columns.states):
        assert bool(rules[row]) == plan.needs_rules(state.devices)
        for position, device_state in enumerate(state.devices):
            device = device_state.device
            assert bool(of_vendor[position, row]) == (device.vendor == vendor.vendor)
            refuses_type = selection is not None and selection.type_refused(
                device.model, device.mode
            )
            refuses_uuid = selection is not None and selection.uuid_refused(device.uuid)
            assert bool(type_ok[position, row]) == (not refuses_type)
            assert bool(uuid_ok[position, row]) == (not refuses_uuid)


def copy_of(template: NodeState, name: str) -> NodeState:
    """``template``'s devices and usage on a node of its own (its own UUIDs)."""
    return NodeState(
        name,
        tuple(
            dataclasses.replace(d, device=dataclasses.replace(d.device, uuid=f"{name}-g{i}"))
            for i, d in enumerate(template.devices)
        ),
    )


@SETTINGS
@given(
    pods(),
    st.lists(st.sampled_from(MANY_NODE_NAMES), min_size=6, max_size=12, unique=True),
    st.data(),
    *FIT_ARGUMENTS,
)
def test_alike_nodes_get_the_reference_answer(
    pod: Pod,
    names: list[str],
    data: st.DataObject,
    node_policy: str,
    gpu_policy: str,
    quota: QuotaContext | None,
    vendor: VendorResources,
) -> None:
    templates = [data.draw(node_states("template")) for _ in range(data.draw(st.integers(1, 3)))]
    nodes = [copy_of(data.draw(st.sampled_from(templates)), name) for name in names]
    # Rows written, rewritten and dropped first: state ids are freed and given again.
    churn = [copy_of(data.draw(st.sampled_from(templates)), name) for name in names[:3]]
    churn += [data.draw(node_states(name)) for name in names[3:5]]
    columns, missing = table_of(nodes, churn).gather(names)
    assert missing == []
    assert len(set(columns.fields["state_id"].tolist())) <= len(templates)

    assert_reference_answer(pod, columns, nodes, [], vendor, node_policy, gpu_policy, quota)
