"""HAMi's device-ordering tables (tests/support/hami_scoring_cases.py) through Scheduler.Filter.

As tests/scheduler/test_hami_filter_cases.py runs HAMi's fit tables: a real recorder and a real
scheduler, the case's nodes registered with HAMi's register annotation and their usage recorded;
the answer must be HAMi's node, cards and reasons, and a pod HAMi's Filter fails with an error
is refused as INVALID_ARGUMENT naming the annotation, nothing stored.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tests.scheduler.conftest import Recorder, Scheduler
from tests.scheduler.test_hami_filter_cases import cards, seed
from tests.support import hami_scoring_cases
from tests.support.hami_scoring_cases import WEIGHTS, ScoringCase


@pytest.mark.parametrize("case", hami_scoring_cases.ALL, ids=lambda c: c.id)
def test_hami_scoring_case_through_filter(
    recorder: Recorder, scheduler: Scheduler, case: ScoringCase
) -> None:
    seed(recorder, case)
    pod = case.pod()
    uid = pod["metadata"]["uid"]

    if case.want_error is not None:
        with pytest.raises(grpc.RpcError) as raised:
            scheduler.filter(pod, list(case.nodes))
        error: Any = raised.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert WEIGHTS in error.details() and case.want_error in error.details()
        assert not recorder.stored(uid).found
        return
    response = scheduler.filter(pod, list(case.nodes))

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
