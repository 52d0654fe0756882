"""HAMi's device-ordering test tables, as data: scoring weights, ties between equal cards and
NUMA binding, each case naming its source.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/util/device_scoring_weights_test.go``
(``TestParseDeviceScoringWeights``, ``TestGetDeviceScoringWeightsByPod``),
``pkg/scheduler/score_test.go`` (``TestCalcScore*``, ``Test_fitInCertainDevice``) and
``pkg/scheduler/policy/gpu_policy_test.go`` (``TestComputeScore*``,
``TestDeviceUsageList_Less``). Only the data is brought in, written as the Kubernetes objects our
daemons read, with the case types of tests/support/hami_fit_cases.py; ``note`` says how a case
was carried over where HAMi's test calls a lower function than its Filter.

HAMi's device score adds the container's own request when the request's type equals the card's
type, which its unit tests set up and real nodes never do (docs/design.md §7): the cards chosen
below are the same either way, and a score HAMi's test asserts with that term is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting.model import Device, DeviceState
from tests.support.hami_fit_cases import Card, HamiCase, Json, container, gpu

WEIGHTS_TEST = "pkg/util/device_scoring_weights_test.go"
SCORE_TEST = "pkg/scheduler/score_test.go"
GPU_POLICY_TEST = "pkg/scheduler/policy/gpu_policy_test.go"
WEIGHTS = "hami.io/device-scoring-weights"
GPU_POLICY = "hami.io/gpu-scheduler-policy"


@dataclass(frozen=True)
class NumaCard(Card):
    """A card of HAMi's tests with its NUMA node."""

    numa: int = 0

    def state(self) -> DeviceState:
        device = Device(
            self.uuid, "NVIDIA", self.index, self.slots, self.memory_mib, self.cores,
            numa=self.numa, healthy=self.healthy,
        )
        return DeviceState(device, self.used_mib, self.used_cores, self.used_slots)

    def register_entry(self) -> Json:
        entry = super().register_entry()
        entry["numa"] = self.numa
        return entry


@dataclass(frozen=True)
class ScoringCase(HamiCase):
    want_error: str | None = None
    """HAMi's Filter fails the pod with this error (no node is tried): the words our refusal
    names beside the annotation."""


# -- the weights' format (device_scoring_weights_test.go) --------------------------------------


@dataclass(frozen=True)
class WeightsReading:
    id: str
    source: str
    value: str
    want: tuple[int, int, int] | None
    """(slot, core, memory); None: refused."""
    want_error: str = ""


def _parse(id_: str, line: int, name: str, value: str, want: tuple[int, int, int] | None,
           error: str = "") -> WeightsReading:
    return WeightsReading(
        id_, f"{WEIGHTS_TEST}:{line} TestParseDeviceScoringWeights: {name!r}", value, want, error
    )


WEIGHT_READINGS = [
    _parse("P1", 73, "valid ordered weights", "slot=1,core=2,memory=3", (1, 2, 3)),
    _parse("P2", 78, "valid reordered weights and whitespace", " memory = 3, slot = 1, core = 0 ",
           (1, 0, 3)),
    _parse("P3", 82, "empty annotation", "", None, "expected slot, core, and memory weights"),
    _parse("P4", 83, "missing dimension", "slot=1,memory=3", None,
           "expected slot, core, and memory weights"),
    _parse("P5", 84, "malformed entry", "slot=1,core,memory=3", None,
           "expected key=value entries"),
    _parse("P6", 85, "non-integer", "slot=1,core=high,memory=3", None,
           '"core" weight must be an integer'),
    _parse("P7", 86, "negative", "slot=1,core=-1,memory=3", None,
           '"core" weight must not be negative'),
    _parse("P8", 87, "unknown key", "slot=1,bandwidth=2,memory=3", None,
           'unknown weight "bandwidth"'),
    _parse("P9", 88, "duplicate key", "slot=1,slot=2,memory=3", None,
           'duplicate "slot" weight'),
    _parse("P10", 89, "all zero", "slot=0,core=0,memory=0", None,
           "at least one weight must be positive"),
    WeightsReading(
        "P11", f"{WEIGHTS_TEST}:37 TestGetDeviceScoringWeightsByPod: 'valid annotation'",
        "slot=1,core=2,memory=3", (1, 2, 3),
    ),
    WeightsReading(
        "P12", f"{WEIGHTS_TEST}:44 TestGetDeviceScoringWeightsByPod: 'invalid annotation'",
        "slot=1,core=-1,memory=3", None, '"core" weight must not be negative',
    ),
]


# -- the weighted device score (gpu_policy_test.go TestComputeScore*) -------------------------


@dataclass(frozen=True)
class ScoreCase:
    id: str
    source: str
    card: Card
    want: float


COMPUTE_SCORE = [
    ScoreCase(
        "S1", f"{GPU_POLICY_TEST}:513 TestComputeScore: "
        "'Zero capacity device returns score 0 without panic'",
        Card("test-device", slots=0, memory_mib=0, cores=0), 0.0,
    ),
    ScoreCase(
        "S2", f"{GPU_POLICY_TEST}:525 TestComputeScore: "
        "'Partial zero capacity (Count=0) returns score 0 without panic'",
        Card("test-device", slots=0, memory_mib=4096, cores=8), 0.0,
    ),
    ScoreCase(
        "S3", f"{GPU_POLICY_TEST}:537 TestComputeScore: 'ContainerDeviceRequests has no data'",
        Card("test-device", slots=10, memory_mib=8192, cores=4, used_slots=2, used_mib=2048,
             used_cores=1),
        7.0,
    ),
]


# -- the weights in the Filter (score_test.go TestCalcScore*, gpu_policy_test.go) -------------


def _weighted_cards() -> dict[str, tuple[Card, ...]]:
    """newDeviceScoringWeightTestNodes (score_test.go:4060) and newDeviceScore
    (gpu_policy_test.go:668): gpu-a busy in cores, gpu-b busy in slots and memory."""
    return {"node1": (
        Card("gpu-a", 0, slots=10, memory_mib=100, cores=100, used_slots=1, used_mib=10,
             used_cores=90),
        Card("gpu-b", 1, slots=10, memory_mib=100, cores=100, used_slots=7, used_mib=20,
             used_cores=10),
    )}


def _policy(gpu_policy: str, weights: str | None = None) -> dict[str, str]:
    annotations = {GPU_POLICY: gpu_policy}
    if weights is not None:
        annotations[WEIGHTS] = weights
    return annotations


_ONE_40_PERCENT = [container("main", gpu(1, percent=40))]

WEIGHTED_FILTER = [
    ScoringCase(
        "W1 default weights, binpack",
        f"{SCORE_TEST}:4083 TestCalcScoreUsesPodDeviceScoringWeights (without the annotation)",
        _weighted_cards(), _ONE_40_PERCENT,
        annotations=_policy("binpack"),
        want_node="node1", want_uuids=[("gpu-a",)],
    ),
    ScoringCase(
        "W2 memory weighs 3, binpack",
        f"{SCORE_TEST}:4083 TestCalcScoreUsesPodDeviceScoringWeights (slot=1,core=1,memory=3)",
        _weighted_cards(), _ONE_40_PERCENT,
        annotations=_policy("binpack", "slot=1,core=1,memory=3"),
        want_node="node1", want_uuids=[("gpu-b",)],
    ),
    ScoringCase(
        "W3 init container, default weights",
        f"{SCORE_TEST}:4112 TestCalcScoreUsesPodDeviceScoringWeightsForInitContainers "
        "(without the annotation)",
        _weighted_cards(), [container("app", {})], init=_ONE_40_PERCENT,
        annotations=_policy("binpack"), want_node="node1", want_uuids=[("gpu-a",), ()],
    ),
    ScoringCase(
        "W4 init container, memory weighs 3",
        f"{SCORE_TEST}:4112 TestCalcScoreUsesPodDeviceScoringWeightsForInitContainers "
        "(slot=1,core=1,memory=3)",
        _weighted_cards(), [container("app", {})], init=_ONE_40_PERCENT,
        annotations=_policy("binpack", "slot=1,core=1,memory=3"),
        want_node="node1", want_uuids=[("gpu-b",), ()],
    ),
    ScoringCase(
        "W5 a negative weight",
        f"{SCORE_TEST}:4048 TestCalcScoreRejectsInvalidDeviceScoringWeights",
        _weighted_cards(), _ONE_40_PERCENT, annotations={WEIGHTS: "slot=1,core=-1,memory=3"},
        want_error='"core" weight must not be negative',
        note="HAMi's test calls calcScore with no node; here the pod has a node it would fit",
    ),
    ScoringCase(
        "W6 memory weighs 3, spread",
        f"{GPU_POLICY_TEST}:685 TestComputeScoreWithResourceWeights: "
        "'memory weight changes the device preference' (spread)",
        _weighted_cards(), _ONE_40_PERCENT,
        annotations=_policy("spread", "slot=1,core=1,memory=3"),
        want_node="node1", want_uuids=[("gpu-a",)],
        note="HAMi's test sorts the two cards and reads the last (the first Fit tries)",
    ),
    ScoringCase(
        "W7 core weighs 3, binpack",
        f"{GPU_POLICY_TEST}:705 TestComputeScoreWithResourceWeights: "
        "'core weight can independently change the device preference'",
        _weighted_cards(), _ONE_40_PERCENT,
        annotations=_policy("binpack", "slot=1,core=3,memory=1"),
        want_node="node1", want_uuids=[("gpu-a",)],
        note="as W6",
    ),
    ScoringCase(
        "W8 default weights, spread",
        f"{GPU_POLICY_TEST}:674 TestComputeScoreWithResourceWeights: "
        "'default weights preserve current score'",
        _weighted_cards(), _ONE_40_PERCENT,
        annotations=_policy("spread"),
        want_node="node1", want_uuids=[("gpu-b",)],
        note="HAMi's test asserts the scores 16 and 15 (with its request term); spread takes "
        "the lower, gpu-b, which is what a pod meets (card derived)",
    ),
    ScoringCase(
        "W9 weights over two containers",
        f"{GPU_POLICY_TEST}:685 TestComputeScoreWithResourceWeights (memory weighs 3, binpack), "
        "two containers",
        _weighted_cards(), [container("a", gpu(1, percent=40)), container("b", gpu(1, percent=40))],
        annotations=_policy("binpack", "slot=1,core=1,memory=3"),
        want_node="node1", want_uuids=[("gpu-b",), ("gpu-b",)],
        note="derived: after the first container gpu-b holds 60 of 100 MiB and stays the "
        "busier under the weights, so the second container takes it too (gpu-a under 1,1,1 "
        "after the first: see W1)",
    ),
]

ALL = [*WEIGHTED_FILTER]
"""Every Filter case of this file (the readings and scores are checked on their own)."""
