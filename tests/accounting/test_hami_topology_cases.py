"""HAMi's topology-aware cases (tests/support/hami_topology_cases.py) through
accounting.fit.fit_pod, and the node's pair scores as the node reader reads them.

The nodes are read from their Kubernetes JSON (``accounting.kube.node_json``, the pair-score
annotation with them), the pod from its own; the node, the cards in the order granted and each
failed node's reason must be HAMi's, and the literal deep-copy fit (bench/naive_fit.py) must
agree on every node. The same cases run through the Filter RPC in
tests/scheduler/test_hami_topology_filter_cases.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any

import pytest

from accounting import mig
from accounting.fit import NodeState, fit_node, fit_plan, fit_pod
from accounting.fit.card_walk import LEFT_BY_TOPOLOGY, TAKEN, card_walks
from accounting.kube import node_json, pod_json
from accounting.model import Device, DeviceState, MigPlacement, MigProfile
from accounting.pair_scores import card_scores, encode_card_scores
from accounting.reasons import VENDOR_RULE_NOT_MODELLED
from accounting.vendor_data import PAIR_SCORES_INFO
from accounting.vendor_fit import topology
from accounting.vendors import HYGON_SPEC, NVIDIA_RESOURCES
from bench.naive_fit import naive_fit_node
from tests.accounting.test_hami_fit_cases import assert_hami_fit, quota_context
from tests.support import hami_topology_cases
from tests.support.hami_cordon_cases import NodeCase
from tests.support.hami_topology_cases import (
    DECODE,
    PAIR_SCORE_ANNOTATION,
    DecodeCase,
    scores_annotation,
)
from tests.support.pods import gpu_device, kube_node

NVIDIA = (NVIDIA_RESOURCES,)


def _manifest(case: NodeCase, uid: str) -> dict[str, Any]:
    """The case's pod, to change: a copy (the cases' containers are shared data)."""
    return copy.deepcopy(case.case.pod(uid=uid))


def nodes(case: NodeCase) -> list[NodeState]:
    return [NodeState(name, case.states(name)) for name in case.case.nodes]


@pytest.mark.parametrize("case", hami_topology_cases.ALL, ids=lambda c: c.id)
def test_hami_topology_case(case: NodeCase) -> None:
    hami = case.case
    pod = pod_json.parse_pod(hami.pod(uid=f"uid-{hami.id.split()[0]}"), NVIDIA)

    result = fit_pod(
        pod, nodes(case), node_policy=hami.node_policy, gpu_policy=hami.gpu_policy,
        quota=quota_context(hami),
    )

    assert_hami_fit(result, hami)


@pytest.mark.parametrize("case", hami_topology_cases.ALL, ids=lambda c: c.id)
def test_hami_topology_case_equals_the_naive_fit_on_every_node(case: NodeCase) -> None:
    hami = case.case
    pod = pod_json.parse_pod(hami.pod(uid="uid-naive"), NVIDIA)
    quota = quota_context(hami)
    for node in nodes(case):
        assert fit_node(pod, node, gpu_policy=hami.gpu_policy, quota=quota) == naive_fit_node(
            pod, node, gpu_policy=hami.gpu_policy, quota=quota
        )


def _uuids(case: NodeCase, annotations: dict[str, str]) -> list[tuple[str, ...]]:
    manifest = _manifest(case, "uid-plain")
    manifest["metadata"]["annotations"] = annotations
    result = fit_pod(pod_json.parse_pod(manifest, NVIDIA), nodes(case),
                     quota=quota_context(case.case))
    return [tuple(g.uuid for g in grants) for grants in result.grants]


def test_without_the_policy_the_walks_first_cards_are_taken() -> None:
    # The cases' cards differ from what the pod would take without the policy.
    worst, best, quota = (
        hami_topology_cases.FIT[1], hami_topology_cases.FIT[2], hami_topology_cases.DERIVED[0]
    )
    assert _uuids(worst, {}) == [("dev-2",)]
    assert _uuids(best, {}) == [("dev-2", "dev-1")]
    # Without the policy the quota sees only the card taken: dev-2 again, but for another
    # reason (T2's choice, dev-1, is what the policy takes without the quota).
    assert _uuids(quota, {}) == [("dev-2",)]
    assert _uuids(worst, {"hami.io/gpu-scheduler-policy": " topology-aware "}) == [("dev-1",)]


# -- reading the annotation ----------------------------------------------------------------


def _node(case: DecodeCase, value: object) -> dict[str, object]:
    node = kube_node("node1", [gpu_device(uuid, index=i) for i, uuid in enumerate(case.cards)])
    node["metadata"]["annotations"][PAIR_SCORE_ANNOTATION] = value
    return node


@pytest.mark.parametrize("case", DECODE, ids=lambda c: c.id)
def test_the_pair_scores_are_read_as_hami_reads_them(case: DecodeCase) -> None:
    node = _node(case, case.value)
    if case.want is None:
        with pytest.raises(node_json.InvalidInputError) as raised:
            node_json.parse_node(node, NVIDIA)
        message = str(raised.value)
        assert f'metadata.annotations["{PAIR_SCORE_ANNOTATION}"]' in message
        assert case.want_error in message
        return
    devices = node_json.parse_node(node, NVIDIA).devices
    assert {d.uuid: card_scores(d.info(PAIR_SCORES_INFO)) for d in devices} == case.want
    for device in devices:
        # No key at all for a card without a score: its inventory stays as it was.
        assert (device.info(PAIR_SCORES_INFO) is None) == (not case.want[device.uuid])


def test_a_pair_score_annotation_that_is_not_a_string_is_refused_naming_it() -> None:
    with pytest.raises(node_json.InvalidInputError) as raised:
        node_json.parse_node(_node(DECODE[0], [{"uuid": "GPU-0"}]), NVIDIA)
    assert f'["{PAIR_SCORE_ANNOTATION}"]: must be a string' in str(raised.value)


def test_only_the_node_reader_gives_a_card_its_scores() -> None:
    # A register that writes the key itself scores nothing; the annotation does.
    node = _node(DECODE[0], DECODE[0].value)
    del node["metadata"]["annotations"][PAIR_SCORE_ANNOTATION]
    register = json.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    register[0]["custominfo"] = {PAIR_SCORES_INFO: '{"GPU-1":5}'}
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = json.dumps(register)
    devices = node_json.parse_node(node, NVIDIA).devices
    assert [d.info(PAIR_SCORES_INFO) for d in devices] == [None, None]

    node["metadata"]["annotations"][PAIR_SCORE_ANNOTATION] = DECODE[0].value
    devices = node_json.parse_node(node, NVIDIA).devices
    assert [d.info(PAIR_SCORES_INFO) for d in devices] == ['{"GPU-1":100}', '{"GPU-0":100}']


def test_a_pair_score_change_changes_the_registration_key() -> None:
    # The recorder re-reads a node's devices only when this key changes.
    plain = _node(DECODE[0], DECODE[0].value)
    changed = _node(DECODE[0], DECODE[0].value.replace("100", "90"))
    assert node_json.registration_key(plain, NVIDIA) != node_json.registration_key(
        changed, NVIDIA
    )


def test_the_stored_form_reads_back_and_tolerates_any_client() -> None:
    assert encode_card_scores({"b": 2, "a": -1, "c": 0}) == '{"a":-1,"b":2}'
    assert card_scores('{"a":-1,"b":2}') == {"a": -1, "b": 2}
    # A typed inventory's custom_info may say anything: what does not read scores nothing.
    assert card_scores("not json") == {}
    assert card_scores("[1]") == {}
    assert card_scores('{"a":1.5,"b":true,"c":3}') == {"c": 3}


# -- the choice --------------------------------------------------------------------------


def _brute_force(
    uuids: list[str], count: int, scores: dict[str, dict[str, int]]
) -> tuple[int, ...]:
    """generateCombinations and computeBestCombination as HAMi writes them."""
    best: tuple[int, ...] = ()
    best_sum = -1
    for combination in itertools.combinations(range(len(uuids)), count):
        total = sum(
            scores.get(uuids[i], {}).get(uuids[j], 0)
            for i, j in itertools.combinations(combination, 2)
        )
        if not best or total > best_sum:
            best, best_sum = combination, total
    return best


def test_sixteen_cards_eight_asked_is_hamis_best_combination() -> None:
    rng = random.Random(27)
    uuids = [f"GPU-{i}" for i in range(16)]
    scores = {a: {b: rng.choice([0, 0, 10, 20, 40]) for b in uuids if b != a} for a in uuids}
    assert topology.choose(uuids, 8, scores) == _brute_force(uuids, 8, scores)


def _least_connected(uuids: list[str], scores: dict[str, dict[str, int]]) -> int:
    """computeWorstSingleCard as HAMi writes it."""
    worst, worst_sum = -1, 0
    for i, a in enumerate(uuids):
        total = sum(scores.get(a, {}).get(b, 0) for b in uuids if b != a)
        if worst < 0 or total < worst_sum:
            worst, worst_sum = i, total
    return worst


def test_the_choice_is_hamis_on_random_scores_with_ties_and_repeated_cards() -> None:
    rng = random.Random(2027)
    for _ in range(400):
        cards = [f"g{i}" for i in range(rng.randint(1, 6))]
        # A MIG card passes once per instance: the same UUID in a row.
        uuids = [u for u in cards for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        scores = {
            a: {b: rng.choice([-3, 0, 0, 1, 2, 5]) for b in cards if rng.random() < 0.7}
            for a in cards
        }
        count = rng.randint(1, len(uuids))
        want = (
            tuple(range(len(uuids))) if count == len(uuids)
            else (_least_connected(uuids, scores),) if count == 1
            else _brute_force(uuids, count, scores)
        )
        assert topology.choose(uuids, count, scores) == want, (uuids, count, scores)


def test_a_mig_card_is_one_card_however_many_instances_passed() -> None:
    # Another instance of the same card is no other card for the single-card sum, but its
    # pairs count in a combination (HAMi looks the card's own UUID up, finding 0 unless the
    # annotation scores a card with itself).
    uuids = ["m", "m", "n"]
    scores = {"m": {"n": 5, "m": 50}, "n": {"m": 1}}
    assert topology.choose(uuids, 1, scores) == (2,)  # m: 5, m: 5, n: 1 + 1
    assert topology.choose(uuids, 2, scores) == (0, 1)  # (m, m): 50, (m, n): 5


def test_past_the_bound_the_node_is_refused_naming_the_rule() -> None:
    uuids = [f"GPU-{i}" for i in range(20)]
    assert topology.choose(uuids, 10, {}) is None  # C(20, 10) = 184,756
    assert topology.choose(uuids, 3, {}) == (0, 1, 2)
    devices = tuple(DeviceState(Device(u, "NVIDIA", i, 10, 8000, 100)) for i, u in enumerate(uuids))
    manifest = _manifest(hami_topology_cases.FIT[0], "uid-bound")
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "10"
    refused = fit_node(pod_json.parse_pod(manifest, NVIDIA), NodeState("big", devices))
    assert refused.reason.startswith(f"20/20 {VENDOR_RULE_NOT_MODELLED} (NVIDIA: a topology")
    assert str(topology.MAX_COMBINATIONS) in refused.reason


def test_a_mig_card_chosen_takes_the_instance_the_walk_found_first() -> None:
    # HAMi chooses each instance again as the grants are charged: the card's first instances.
    # They are the walk's first on the card (visited again and again), which the choice keeps.
    profile = MigProfile("1g.10gb", 10240, 14, 1, tuple(MigPlacement(s, 1) for s in range(3)))
    first = mig.choose_instance((profile,), [], 10000)
    assert first is not None
    scored = {"mig": {"plain": 1}, "plain": {"mig": 9}}
    node = NodeState("n", (
        DeviceState(Device("mig", "NVIDIA A100", 0, 7, 40960, 100, mode="mig",
                           mig_profiles=(profile,), custom_info=_info(scored["mig"]))),
        DeviceState(Device("plain", "NVIDIA A100", 1, 10, 40960, 100,
                           custom_info=_info(scored["plain"]))),
    ))
    manifest = _manifest(hami_topology_cases.FIT[0], "uid-mig")
    manifest["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "10",
    }
    pod = pod_json.parse_pod(manifest, NVIDIA)
    (grant,) = fit_node(pod, node).grants[0]
    # The walk collects plain and the MIG card's three instances: plain sums 9 with each of
    # them (27), every instance 1 with plain: the first instance is the least connected.
    assert (grant.uuid, grant.mig) == ("mig", first.instance)
    # Two asked: (plain, an instance) 9 beats two instances (0): the first instance again.
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    grants = fit_node(pod_json.parse_pod(manifest, NVIDIA), node).grants[0]
    assert sorted((g.uuid, g.mig) for g in grants) == [("mig", first.instance), ("plain", None)]


def _info(scores: dict[str, int]) -> tuple[tuple[str, str], ...]:
    return ((PAIR_SCORES_INFO, encode_card_scores(scores)),)


# -- which fit places the pod --------------------------------------------------------------


def test_a_topology_pod_is_left_to_the_reference_fit_for_nvidia_only() -> None:
    case = hami_topology_cases.FIT[1].case
    topology_pod = pod_json.parse_pod(case.pod(uid="uid-k"), NVIDIA)
    plan = fit_plan(topology_pod)
    assert plan is not None and not plan.kernel_may_fit
    manifest = _manifest(hami_topology_cases.FIT[1], "uid-k2")
    manifest["metadata"]["annotations"] = {"hami.io/gpu-scheduler-policy": "spread"}
    plain = fit_plan(pod_json.parse_pod(manifest, NVIDIA))
    assert plain is not None and plain.kernel_may_fit
    # HAMi reads the policy in NVIDIA's Fit alone: another vendor's pod stays on the kernel.
    hygon = HYGON_SPEC.resources
    other = {
        "metadata": {"name": "dcu", "namespace": "default", "uid": "uid-dcu",
                     "annotations": {"hami.io/gpu-scheduler-policy": "topology-aware"}},
        "spec": {"containers": [{"name": "c", "resources": {
            "limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000"}}}]},
    }
    dcu = fit_plan(pod_json.parse_pod(other, (hygon,)), vendor=hygon)
    assert dcu is not None and dcu.kernel_may_fit


def test_scores_annotation_is_hamis_format() -> None:
    assert json.loads(scores_annotation({"a": {"b": 1}})) == [{"uuid": "a", "score": {"b": 1}}]


# -- explain --node ------------------------------------------------------------------------


def test_explain_shows_the_cards_the_topology_choice_left() -> None:
    # T2: every card passes, the least connected (dev-1) is taken, the others are shown as
    # left by the policy; TD2: too few pass under the quota, the node's reason is the fit's;
    # past the choice's bound none is taken and the node's reason names it.
    worst = hami_topology_cases.FIT[1]
    pod = pod_json.parse_pod(worst.case.pod(uid="uid-walk"), NVIDIA)
    fitted, (walk,) = card_walks(pod, nodes(worst)[0])
    assert [(c.uuid, c.verdict) for c in walk.cards] == [
        ("dev-2", LEFT_BY_TOPOLOGY), ("dev-1", TAKEN), ("dev-0", LEFT_BY_TOPOLOGY),
    ]
    assert fitted.fits and not walk.refusal
    short = hami_topology_cases.DERIVED[1]
    pod = pod_json.parse_pod(short.case.pod(uid="uid-walk2"), NVIDIA)
    fitted, (walk,) = card_walks(pod, nodes(short)[0], quota=quota_context(short.case))
    assert walk.refusal == fitted.reason == short.case.want_failed["node1"]
    # The card that passed is shown taken, as the walk had it when it ran out.
    assert [c.verdict for c in walk.cards] == [TAKEN, "ResourceQuotaNotFit", "ResourceQuotaNotFit"]
    devices = tuple(DeviceState(Device(f"GPU-{i}", "NVIDIA", i, 10, 8000, 100)) for i in range(20))
    manifest = _manifest(worst, "uid-walk3")
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "10"
    pod = pod_json.parse_pod(manifest, NVIDIA)
    fitted, (walk,) = card_walks(pod, NodeState("big", devices))
    assert walk.refusal == fitted.reason and VENDOR_RULE_NOT_MODELLED in walk.refusal
    assert {c.verdict for c in walk.cards} == {LEFT_BY_TOPOLOGY}
