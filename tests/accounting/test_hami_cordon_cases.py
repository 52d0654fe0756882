"""HAMi's cordon cases (tests/support/hami_cordon_cases.py) through accounting.fit.fit_pod.

The nodes are read from their Kubernetes JSON (``accounting.kube.node_json``, the cordon
annotation with them), the pod from its own; the node, the cards and each failed node's reason
must be HAMi's, and the literal deep-copy fit (bench/naive_fit.py) must agree on every node.
The same cases run through the Filter RPC in tests/scheduler/test_hami_cordon_filter_cases.py.
"""

from __future__ import annotations

import json

import pytest

from accounting.fit import NodeState, fit_node, fit_pod
from accounting.kube import node_json, pod_json
from accounting.model import Device, DeviceState
from accounting.vendors import NVIDIA_RESOURCES
from bench.naive_fit import naive_fit_node
from tests.accounting.test_hami_fit_cases import assert_hami_fit, quota_context
from tests.support import hami_cordon_cases
from tests.support.hami_cordon_cases import NodeCase


def nodes(case: NodeCase) -> list[NodeState]:
    return [NodeState(name, case.states(name)) for name in case.case.nodes]


@pytest.mark.parametrize("case", hami_cordon_cases.ALL, ids=lambda c: c.id)
def test_hami_cordon_case(case: NodeCase) -> None:
    hami = case.case
    pod = pod_json.parse_pod(hami.pod(uid=f"uid-{hami.id.split()[0]}"), (NVIDIA_RESOURCES,))

    result = fit_pod(
        pod, nodes(case), node_policy=hami.node_policy, gpu_policy=hami.gpu_policy,
        quota=quota_context(hami),
    )

    assert_hami_fit(result, hami)


@pytest.mark.parametrize("case", hami_cordon_cases.ALL, ids=lambda c: c.id)
def test_hami_cordon_case_equals_the_naive_fit_on_every_node(case: NodeCase) -> None:
    hami = case.case
    pod = pod_json.parse_pod(hami.pod(uid="uid-naive"), (NVIDIA_RESOURCES,))
    for node in nodes(case):
        assert fit_node(pod, node, gpu_policy=hami.gpu_policy) == naive_fit_node(
            pod, node, gpu_policy=hami.gpu_policy
        )


def test_the_cordon_annotation_is_read_as_hami_reads_it() -> None:
    assert node_json.cordoned_uuids(" dev-1, ,dev-2 ,,") == {"dev-1", "dev-2"}
    assert node_json.cordoned_uuids("") == frozenset()


def test_only_the_node_reader_marks_a_card_cordoned() -> None:
    # A register that writes the cordon key itself cordons nothing; the annotation does.
    case = hami_cordon_cases.CORDON[3]
    node = case.kube_node("node1")
    register = node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    entries = json.loads(register)
    entries[0]["custominfo"] = {"hami.io/device-cordon": "true"}
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = json.dumps(entries)
    devices = node_json.parse_node(node, (NVIDIA_RESOURCES,)).devices
    assert [d.cordoned for d in devices] == [False, False]

    node["metadata"]["annotations"]["hami.io/device-cordon"] = "dev-1"
    devices = node_json.parse_node(node, (NVIDIA_RESOURCES,)).devices
    assert [d.cordoned for d in devices] == [False, True]


def test_a_cordon_that_is_not_a_string_is_refused_naming_the_annotation() -> None:
    node = hami_cordon_cases.CORDON[3].kube_node("node1")
    node["metadata"]["annotations"]["hami.io/device-cordon"] = ["dev-1"]
    with pytest.raises(node_json.InvalidInputError) as raised:
        node_json.parse_node(node, (NVIDIA_RESOURCES,))
    assert "hami.io/device-cordon" in str(raised.value)


def test_a_cordon_change_changes_the_registration_key() -> None:
    # The recorder re-reads a node's devices only when this key changes.
    plain = hami_cordon_cases.CORDON[3].kube_node("node1")
    cordoned = hami_cordon_cases.CORDON[0].kube_node("node1")
    vendors = (NVIDIA_RESOURCES,)
    assert node_json.registration_key(plain, vendors) != node_json.registration_key(
        cordoned, vendors
    )


def test_a_cordoned_card_on_a_mig_node_is_refused_by_the_vendor_walk() -> None:
    # A node with a MIG card is placed by accounting.vendor_fit, which refuses the cordoned
    # card too: only the MIG card is left, and the pod leaves MIG out (vgpu-mode).
    case = hami_cordon_cases.CORDON[0]
    hami_core = list(case.states("node1"))
    mig_card = DeviceState(Device("mig-0", "NVIDIA", 1, 10, 40960, 100, mode="mig"))
    node = NodeState("node1", (*hami_core, mig_card))
    pod = pod_json.parse_pod(case.case.pod(uid="uid-mig"), (NVIDIA_RESOURCES,))
    placed = fit_node(pod, node)
    assert [g.uuid for g in placed.grants[0]] == ["dev-0"]

    cordon_all = hami_cordon_cases.CORDON[1]
    node = NodeState("node1", (*cordon_all.states("node1"), mig_card))
    manifest = case.case.pod(uid="uid-mig2")
    manifest["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": "hami-core"}
    only_hami_core = pod_json.parse_pod(manifest, (NVIDIA_RESOURCES,))
    refused = fit_node(only_hami_core, node)
    assert refused.reason == "1/3 CardTypeMismatch, 2/3 CardCordoned"
