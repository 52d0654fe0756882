"""Which failed-node reasons no preemption can lift (kube-scheduler's FailedAndUnresolvableNodes;
accounting.reasons.room_cannot_fix)."""

from __future__ import annotations

import pytest

from accounting.reasons import room_cannot_fix


@pytest.mark.parametrize(
    ("reason", "unresolvable"),
    [
        ("2/2 ResourceQuotaNotFit", True),
        ("1/2 CardTypeMismatch, 1/2 CardCordoned", True),
        ("1/1 CardUuidMismatch", True),
        ("2/2 CardNotHealth", True),
        ("NodeInsufficientDevice", True),
        ("node unregistered", True),
        ("1/1 VendorRuleNotModelled", True),
        # Room a pod on the node holds: preempting it could make the pod fit.
        ("1/1 CardInsufficientMemory", False),
        ("2/2 CardInsufficientCore", False),
        ("1/1 CardTimeSlicingExhausted", False),
        ("1/1 ExclusiveDeviceAllocateConflict", False),
        ("1/2 CardTypeMismatch, 1/2 CardInsufficientMemory", False),
        ("2/2 NumaNotFit", False),
        ("NotExplained", False),
        ("", False),
        ("something else entirely", False),
    ],
)
def test_room_cannot_fix(reason: str, unresolvable: bool) -> None:
    assert room_cannot_fix(reason) is unresolvable
