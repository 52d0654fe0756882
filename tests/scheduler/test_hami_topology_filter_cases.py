"""HAMi's topology-aware cases (tests/support/hami_topology_cases.py) through Scheduler.Filter.

A real recorder and a real scheduler server, as tests/scheduler/test_hami_cordon_filter_cases.py:
each case's node is registered from its Kubernetes JSON, its ``hami.io/node-nvidia-score``
annotation with it, so the pair scores cross the wire to the recorder, its journal and the
scheduler's node cache as the inventory does; what a card already holds is recorded as a pod
HAMi placed there, and the case's pod is filtered. The answer must be HAMi's.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from accounting.kube import node_json
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import usage_pb2
from services.common.convert.node_messages import device_from_pb, device_to_pb
from services.usage.journal.codec import decode_devices, encode_devices
from tests.scheduler.conftest import RPC_TIMEOUT_S, Recorder, Scheduler
from tests.scheduler.test_hami_cordon_filter_cases import seed
from tests.scheduler.test_hami_filter_cases import assert_hami_answer, cards
from tests.support import hami_topology_cases
from tests.support.hami_cordon_cases import NodeCase
from tests.support.hami_topology_cases import PAIR_SCORE_ANNOTATION
from tests.support.pods import to_json


@pytest.mark.parametrize("case", hami_topology_cases.ALL, ids=lambda c: c.id)
def test_hami_topology_case_through_filter(recorder: Recorder, scheduler: Scheduler,
                                           case: NodeCase) -> None:
    seed(recorder, case)
    hami = case.case
    pod = hami.pod()

    response = scheduler.filter(pod, list(hami.nodes))

    assert_hami_answer(recorder, hami, pod, response)


def test_the_pair_scores_survive_the_wire_and_the_journal() -> None:
    case = hami_topology_cases.FIT[1]  # T2: three scored cards
    devices = node_json.parse_node(case.kube_node("node1"), (NVIDIA_RESOURCES,)).devices
    assert all(device.custom_info for device in devices)
    assert tuple(device_from_pb(device_to_pb(device)) for device in devices) == devices
    assert decode_devices(encode_devices(devices)) == devices


def test_a_score_change_reaches_the_scheduler(recorder: Recorder, scheduler: Scheduler) -> None:
    # T2 takes dev-1 (the least connected); scored again so that dev-0 is, it takes dev-0.
    case = hami_topology_cases.FIT[1]
    seed(recorder, case)
    assert cards(scheduler.filter(case.case.pod(), ["node1"])) == [("dev-1",)]
    node = case.kube_node("node1")
    node["metadata"]["annotations"][PAIR_SCORE_ANNOTATION] = hami_topology_cases.scores_annotation(
        {"dev-1": {"dev-2": 500}, "dev-2": {"dev-1": 500}}
    )
    recorder.stub.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(node)), timeout=RPC_TIMEOUT_S
    )
    # The scheduler's cache follows the recorder's stream; the next Filter sees the scores.
    assert cards(scheduler.filter(case.case.pod(), ["node1"])) == [("dev-0",)]


def test_a_node_whose_scores_do_not_read_is_refused_naming_the_annotation(
    recorder: Recorder,
) -> None:
    node = hami_topology_cases.FIT[1].kube_node("node1")
    node["metadata"]["annotations"][PAIR_SCORE_ANNOTATION] = "not-valid-json"
    with pytest.raises(grpc.RpcError) as raised:
        recorder.stub.RegisterNode(
            usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(node)),
            timeout=RPC_TIMEOUT_S,
        )
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert PAIR_SCORE_ANNOTATION in error.details()
    assert recorder.devices("node1") == {}
