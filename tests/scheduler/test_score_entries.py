"""The scores of a Filter's answer, written from the score entries the node table encoded.

``filter_response_bytes`` joins the entries the node table encoded for the nodes the vectorized
fit fitted (``FilterOutcome.score_entries``) after the rest of the message, and encodes the
scores of the nodes the reference fit fitted beside them; the decoded answer must carry every
score of ``FitResult.scores`` exactly once, whichever way each was written.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import pytest

from accounting.fit import FitResult, JoinedScores
from accounting.model import Container, ContainerClass, DeviceRequest, Pod
from accounting.reasons import SCHEDULED
from hami.accounting.v1 import scheduler_pb2
from services.scheduler.convert import FilterOutcome, filter_response_bytes, score_entry
from services.scheduler.fit_kernel import ColumnScores

POD = Pod(
    "uid-p",
    "team-a",
    "p",
    (Container("c0", ContainerClass.APP, (DeviceRequest("NVIDIA", 1, 1000, 0, 10),)),),
)
KERNEL = {"node-a": 2.5, "node-b": 0.0, "node-c": 7.25}
REFERENCE = {"node-d": 1.5}


def column_scores() -> ColumnScores:
    return ColumnScores(list(KERNEL), list(KERNEL.values()), np.arange(len(KERNEL)))


def decoded_scores(scores: Mapping[str, float], entries: list[bytes]) -> list[tuple[str, float]]:
    fit = FitResult(None, ((),), MappingProxyType({}), scores, SCHEDULED, "m")
    outcome = FilterOutcome(fit=fit, reason=SCHEDULED, message="m", score_entries=entries)
    answer = scheduler_pb2.FilterResponse.FromString(filter_response_bytes(POD, outcome))
    return sorted((entry.node_name, entry.score) for entry in answer.scores)


ENTRIES = [score_entry(name, score) for name, score in KERNEL.items()]


@pytest.mark.parametrize(
    ("scores", "entries", "expected"),
    [
        # The kernel's scores, their entries joined as encoded.
        (column_scores(), ENTRIES, KERNEL),
        # The kernel's beside the reference fit's: the entries, then the reference's encoded.
        (JoinedScores(column_scores(), REFERENCE), ENTRIES, {**KERNEL, **REFERENCE}),
        # Entries that do not cover the kernel's part are not used: every score is encoded.
        (JoinedScores(column_scores(), REFERENCE), ENTRIES[:1], {**KERNEL, **REFERENCE}),
        (column_scores(), [], KERNEL),
        # The reference fit's answer alone.
        (MappingProxyType(REFERENCE), [], REFERENCE),
    ],
)
def test_every_score_is_written_once(
    scores: Mapping[str, float], entries: list[bytes], expected: dict[str, float]
) -> None:
    assert decoded_scores(scores, entries) == sorted(expected.items())


def test_joined_scores_read_as_one_mapping() -> None:
    joined = JoinedScores(column_scores(), REFERENCE)
    assert len(joined) == len(KERNEL) + len(REFERENCE)
    assert dict(joined) == {**KERNEL, **REFERENCE}
    assert joined["node-d"] == 1.5 and joined["node-c"] == 7.25
    assert joined == {**KERNEL, **REFERENCE}
