"""HAMi's fit test tables (tests/support/hami_fit_cases.py) through Scheduler.Filter.

A real recorder and a real scheduler server: each case's nodes are registered with HAMi's
register annotation, what is already used on a card is recorded as a pod HAMi placed there, the
quota is set, and the case's pod is filtered over every node of the case. The answer must be
HAMi's node, cards and reasons, and what the recorder stored must be what the answer says.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hami.accounting.v1 import scheduler_pb2
from tests.scheduler.conftest import Recorder, Scheduler, bound_pod
from tests.support import hami_fit_cases
from tests.support.hami_fit_cases import NAMESPACE, Card, HamiCase, Json
from tests.support.pods import app_container

ALLOCATED = "hami.io/vgpu-devices-allocated"


def record_used(recorder: Recorder, node_name: str, node_cards: Sequence[Card]) -> None:
    """What each card already holds, recorded as one pod HAMi placed there."""
    for card in node_cards:
        if not (card.used_slots or card.used_mib or card.used_cores):
            continue
        # HAMi's annotation with the SLOTS field: one pod holding what the card has used.
        annotation = f"{card.uuid},NVIDIA,{card.used_mib},{card.used_cores},{card.used_slots}:;"
        recorder.record(bound_pod(
            f"used-{card.uuid}", node_name, annotation, namespace="elsewhere",
            apps=[app_container("main", gpumem=max(card.used_mib, 1))],
        ))


def seed(recorder: Recorder, case: HamiCase) -> None:
    for name, node_cards in case.nodes.items():
        recorder.register_node(name, [card.register_entry() for card in node_cards])
        record_used(recorder, name, node_cards)
    if case.quota:
        recorder.set_quota(NAMESPACE, case.quota)


def assert_hami_answer(
    recorder: Recorder, case: HamiCase, pod: Json, response: scheduler_pb2.FilterResponse
) -> None:
    """The Filter answered HAMi's node, cards and reasons, and the recorder stored that."""
    uid = pod["metadata"]["uid"]
    if case.want_node is None:
        assert response.reason == "NoNodeFits", response.message
        assert dict(response.failed_nodes) == dict(case.want_failed)
        assert not recorder.stored(uid).found
        return
    assert (response.reason, response.node_name) == ("Scheduled", case.want_node), (
        response.message
    )
    if case.want_uuids is not None:
        assert cards(response) == [tuple(u) for u in case.want_uuids]
    stored = recorder.stored(uid)
    assert stored.found and stored.node_name == case.want_node
    granted = {g.uuid for entry in response.container_grants for g in entry.grants}
    assert {u.uuid for u in stored.stored} == granted


def cards(response: scheduler_pb2.FilterResponse) -> list[tuple[str, ...]]:
    return [tuple(g.uuid for g in entry.grants) for entry in response.container_grants]


@pytest.mark.parametrize("case", hami_fit_cases.ALL, ids=lambda c: c.id)
def test_hami_case_through_filter(recorder: Recorder, scheduler: Scheduler,
                                  case: HamiCase) -> None:
    seed(recorder, case)
    pod = case.pod()

    response = scheduler.filter(pod, list(case.nodes))

    assert_hami_answer(recorder, case, pod, response)
