"""HAMi's cordon cases (tests/support/hami_cordon_cases.py) through Scheduler.Filter.

A real recorder and a real scheduler server, as tests/scheduler/test_hami_filter_cases.py: each
case's node is registered from its Kubernetes JSON, its ``hami.io/device-cordon`` annotation
with it, what a card already holds is recorded as a pod HAMi placed there, and the case's pod
is filtered. The answer must be HAMi's, and a cordoned card keeps what it holds.
"""

from __future__ import annotations

import pytest

from hami.accounting.v1 import usage_pb2
from tests.scheduler.conftest import RPC_TIMEOUT_S, Recorder, Scheduler
from tests.scheduler.test_hami_filter_cases import assert_hami_answer, cards, record_used
from tests.support import hami_cordon_cases
from tests.support.hami_cordon_cases import NodeCase
from tests.support.hami_fit_cases import NAMESPACE
from tests.support.pods import to_json


def seed(recorder: Recorder, case: NodeCase) -> None:
    for name, node_cards in case.case.nodes.items():
        recorder.stub.RegisterNode(
            usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(case.kube_node(name))),
            timeout=RPC_TIMEOUT_S,
        )
        record_used(recorder, name, node_cards)
    if case.case.quota:
        recorder.set_quota(NAMESPACE, case.case.quota)


@pytest.mark.parametrize("case", hami_cordon_cases.ALL, ids=lambda c: c.id)
def test_hami_cordon_case_through_filter(recorder: Recorder, scheduler: Scheduler,
                                         case: NodeCase) -> None:
    seed(recorder, case)
    hami = case.case
    pod = hami.pod()

    response = scheduler.filter(pod, list(hami.nodes))

    assert_hami_answer(recorder, hami, pod, response)


def test_a_cordoned_card_keeps_what_it_holds(recorder: Recorder, scheduler: Scheduler) -> None:
    case = hami_cordon_cases.CORDON[2]  # dev-1 cordoned, one pod on it
    seed(recorder, case)

    response = scheduler.filter(case.case.pod(), ["node1"])

    assert cards(response) == [("dev-0",)]
    held = recorder.devices("node1")["dev-1"]
    assert (held.slots_used, held.memory_used_mib, held.cores_used) == (1, 64, 50)
