"""HAMi's device-ordering tables (tests/support/hami_scoring_cases.py) through accounting.fit.

The readings of hami.io/device-scoring-weights, the device score, and every Filter case through
``fit_pod`` as tests/accounting/test_hami_fit_cases.py runs HAMi's fit tables (the pod from its
Kubernetes JSON, every node of the case a candidate), and against the naive fit node by node.
The Filter cases run through the RPC in tests/scheduler/test_hami_scoring_filter_cases.py.
"""

from __future__ import annotations

import pytest

from accounting.errors import InvalidInputError
from accounting.fit import (
    FitResult,
    NodeState,
    ScoringWeights,
    device_score,
    fit_node,
    fit_pod,
    parse_scoring_weights,
    scoring_weights,
    weighted_score,
)
from accounting.gpu_order import gpu_order, numa_bind_requested
from accounting.kube import pod_json
from accounting.model import Device, DeviceState
from accounting.vendors import NVIDIA_RESOURCES
from bench.naive_fit import naive_fit_node
from tests.accounting.test_hami_fit_cases import nodes, quota_context
from tests.support import hami_scoring_cases
from tests.support.hami_scoring_cases import (
    GPU_POLICY,
    NUMA_BIND,
    WEIGHTS,
    LessCase,
    NumaBindReading,
    ScoreCase,
    ScoringCase,
    WeightsReading,
)

ANNOTATION_PATH = f'metadata.annotations["{WEIGHTS}"]'


@pytest.mark.parametrize("case", hami_scoring_cases.WEIGHT_READINGS, ids=lambda c: c.id)
def test_hami_weights_reading(case: WeightsReading) -> None:
    if case.want is None:
        with pytest.raises(InvalidInputError) as raised:
            parse_scoring_weights(case.value)
        (violation,) = raised.value.violations
        assert violation.path == ANNOTATION_PATH
        assert case.want_error in violation.message
        return
    slot, core, memory = case.want
    assert parse_scoring_weights(case.value) == ScoringWeights(slot=slot, core=core, memory=memory)


def test_no_annotation_weighs_every_fraction_once() -> None:
    assert scoring_weights({}) == ScoringWeights(slot=1, core=1, memory=1)
    assert scoring_weights({}).is_default


@pytest.mark.parametrize(
    "value, problem",
    [
        ("slot=1,core=1,memory=9223372036854775808", '"memory" weight must be an integer'),
        ("slot=1,core=1,memory=1_0", '"memory" weight must be an integer'),
        ("slot=1,core=1,memory=\u0663", '"memory" weight must be an integer'),
        ("slot=1,core=1,memory=", '"memory" weight must be an integer'),
        ("slot=1,core=1,=1", 'unknown weight ""'),
        ("slot=1,core=1,memory=1=2", '"memory" weight must be an integer'),
        ("slot=1,core=1,memory=3,", "expected slot, core, and memory weights"),
        ("slot=1,bandwidth=-1,memory=3", '"bandwidth" weight must not be negative'),
    ],
)
def test_malformed_weights_are_refused_as_hami_refuses_them(value: str, problem: str) -> None:
    # Go's ParseInt: ASCII digits of an int64 only; the checks in HAMi's order (a negative
    # unknown key is refused for its sign first).
    with pytest.raises(InvalidInputError) as raised:
        parse_scoring_weights(value)
    assert problem in raised.value.violations[0].message


def test_a_sign_and_leading_zeros_are_read_as_go_reads_them() -> None:
    assert parse_scoring_weights("slot=+1,core=007,memory=\u30000") == ScoringWeights(
        slot=1, core=7, memory=0
    )


@pytest.mark.parametrize("case", hami_scoring_cases.COMPUTE_SCORE, ids=lambda c: c.id)
def test_hami_device_score(case: ScoreCase) -> None:
    card = case.card
    figures = (card.used_slots, card.slots, card.used_cores, card.cores, card.used_mib,
               card.memory_mib)
    assert weighted_score(ScoringWeights())(*figures) == case.want
    assert weighted_score(ScoringWeights(slot=2, core=3, memory=4))(*figures) == (
        pytest.approx(0.0 if case.want == 0.0 else 10 * (2 * 0.2 + 3 * 0.25 + 4 * 0.25))
    )


def test_default_weights_are_the_unweighted_score_itself() -> None:
    # The fit's precomputed orders are those of the default weights: the same function.
    assert weighted_score(ScoringWeights()) is device_score


@pytest.mark.parametrize("case", hami_scoring_cases.LESS, ids=lambda c: c.id)
def test_hami_device_order(case: LessCase) -> None:
    # The two cards of HAMi's table on one node, in that order, with the table's scores and
    # tasks: HAMi's Fit walks its sorted list from the end, so Less(first, second) means the
    # second is tried first here.
    cards = (case.first, case.second)
    node = NodeState("node1", tuple(
        DeviceState(Device(f"g{p}", "NVIDIA", card.index, 10, 8192, 100, numa=card.numa))
        for p, card in enumerate(cards)
    ))
    columns = node._columns
    annotations = {GPU_POLICY: case.policy}
    if case.numa_bind:
        annotations[NUMA_BIND] = "true"
    order = gpu_order(annotations, default_binpack=False)
    key = order.key_of(
        [card.score for card in cards], columns.numas, [card.used for card in cards],
        columns.rank, columns.index_rank,
    )
    assert (key(1) < key(0)) == case.want_less
    assert order.numa_bind == case.numa_bind


@pytest.mark.parametrize("case", hami_scoring_cases.NUMA_BIND_READINGS, ids=lambda c: c.id)
def test_hami_numa_bind_reading(case: NumaBindReading) -> None:
    annotations = {} if case.value is None else {NUMA_BIND: case.value}
    assert numa_bind_requested(annotations) is case.want


def _fit(case: ScoringCase) -> FitResult:
    pod = pod_json.parse_pod(case.pod(uid=f"uid-{case.id.split()[0]}"), (NVIDIA_RESOURCES,))
    return fit_pod(
        pod, nodes(case), node_policy=case.node_policy, gpu_policy=case.gpu_policy,
        quota=quota_context(case),
    )


@pytest.mark.parametrize("case", hami_scoring_cases.ALL, ids=lambda c: c.id)
def test_hami_scoring_case(case: ScoringCase) -> None:
    if case.want_error is not None:
        with pytest.raises(InvalidInputError) as raised:
            _fit(case)
        assert raised.value.violations[0].path == ANNOTATION_PATH
        assert case.want_error in str(raised.value)
        return
    result = _fit(case)

    assert result.node_name == case.want_node, result.message
    if case.want_node is None:
        assert dict(result.failed_nodes) == dict(case.want_failed)
    if case.want_uuids is not None:
        granted = [tuple(g.uuid for g in grants) for grants in result.grants]
        assert granted == [tuple(uuids) for uuids in case.want_uuids]


@pytest.mark.parametrize(
    "case", [c for c in hami_scoring_cases.ALL if c.want_error is None], ids=lambda c: c.id
)
def test_hami_scoring_case_equals_the_naive_fit_on_every_node(case: ScoringCase) -> None:
    pod = pod_json.parse_pod(case.pod(uid="uid-naive"), (NVIDIA_RESOURCES,))
    quota = quota_context(case)
    for node in nodes(case):
        assert fit_node(pod, node, gpu_policy=case.gpu_policy, quota=quota) == naive_fit_node(
            pod, node, gpu_policy=case.gpu_policy, quota=quota
        )
