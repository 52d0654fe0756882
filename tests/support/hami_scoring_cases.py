"""HAMi's device-ordering test tables, as data: scoring weights, ties between equal cards and
NUMA binding, each case naming its source.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/util/device_scoring_weights_test.go``
(``TestParseDeviceScoringWeights``, ``TestGetDeviceScoringWeightsByPod``),
``pkg/scheduler/score_test.go`` (``TestCalcScore*``, ``Test_fitInCertainDevice``),
``pkg/scheduler/policy/gpu_policy_test.go`` (``TestComputeScore*``,
``TestDeviceUsageList_Less``), ``pkg/scheduler/numa_sort_test.go`` and
``pkg/device/nvidia/device_test.go`` (``TestAssertNuma``, ``TestFit_NumaSwitching``). Only the
data is brought in, written as the Kubernetes objects our
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
NUMA_SORT_TEST = "pkg/scheduler/numa_sort_test.go"
DEVICE_TEST = "pkg/device/nvidia/device_test.go"
GPU_POLICY_CODE = "pkg/scheduler/policy/gpu_policy.go"
DEVICE_CODE_FIT = "pkg/device/nvidia/device.go Fit"
WEIGHTS = "hami.io/device-scoring-weights"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
NUMA_BIND = "nvidia.com/numa-bind"


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


# -- the order of two cards (gpu_policy_test.go TestDeviceUsageList_Less) ----------------------


@dataclass(frozen=True)
class LessCard:
    """A DeviceUsage of the table: index, NUMA node, tasks (Used) and the score given."""

    index: int
    numa: int
    used: int
    score: float


@dataclass(frozen=True)
class LessCase:
    id: str
    source: str
    policy: str
    numa_bind: bool
    first: LessCard
    second: LessCard
    want_less: bool
    """HAMi's Less(first, second): the first sorts before the second, so HAMi's Fit, which
    walks the sorted list from its end, tries the second first."""


def _less(
    line: int, name: str, policy: str, numa_bind: bool,
    first: tuple[int, int, int, float], second: tuple[int, int, int, float], want: bool,
) -> LessCase:
    return LessCase(
        f"L{line}", f"{GPU_POLICY_TEST}:{line} TestDeviceUsageList_Less: {name!r}", policy,
        numa_bind, LessCard(*first), LessCard(*second), want,
    )


# (index, numa, used, score) as each case writes its two DeviceUsages (zero where unwritten).
LESS = [
    _less(134, "Binpack policy with same Numa", "binpack", False,
          (0, 0, 10, 10), (0, 0, 20, 20), True),
    _less(143, "Binpack: score primary, lower score sorts first across NUMA", "binpack", False,
          (0, 1, 10, 10), (0, 0, 20, 20), True),
    _less(152, "Binpack: score primary, higher score sorts last even on lower NUMA", "binpack",
          False, (0, 0, 10, 10), (0, 1, 20, 20), True),
    _less(161, "Binpack: NUMA tiebreaker when scores equal", "binpack", False,
          (0, 0, 0, 15), (0, 1, 0, 15), True),
    _less(170, "Binpack: score primary over NUMA, high-NUMA high-score sorts last", "binpack",
          False, (0, 1, 0, 20), (0, 0, 0, 10), False),
    _less(179, "Spread: score primary, higher score sorts first", "spread", False,
          (0, 0, 10, 10), (0, 0, 20, 20), False),
    _less(188, "Spread: score primary, lower score sorts last across NUMA", "spread", False,
          (0, 1, 10, 10), (0, 0, 20, 20), False),
    _less(197, "Spread: score primary over NUMA, high-NUMA high-score sorts first", "spread",
          False, (0, 1, 0, 20), (0, 0, 0, 10), True),
    _less(206, "Spread: NUMA tiebreaker when scores equal", "spread", False,
          (0, 0, 0, 15), (0, 1, 0, 15), True),
    _less(216, "Binpack+NumaBind: NUMA primary, higher NUMA sorts first regardless of Score",
          "binpack", True, (0, 1, 0, 5), (0, 0, 0, 99), True),
    _less(226, "Binpack+NumaBind: same NUMA falls back to lower Score first", "binpack", True,
          (0, 0, 0, 10), (0, 0, 0, 20), True),
    _less(236, "Spread+NumaBind: NUMA primary, lower NUMA sorts first regardless of Score",
          "spread", True, (0, 0, 0, 5), (0, 1, 0, 99), True),
    _less(246, "Spread+NumaBind: same NUMA falls back to higher Score first", "spread", True,
          (0, 0, 0, 20), (0, 0, 0, 10), True),
    _less(256, "Mutex: busy GPU sorts before idle GPU", "mutex", False,
          (0, 0, 2, 0), (0, 0, 0, 0), True),
    _less(265, "Mutex: idle GPU sorts after busy GPU", "mutex", False,
          (0, 0, 0, 0), (0, 0, 1, 0), False),
    _less(274, "Mutex: NUMA tiebreaker when both idle", "mutex", False,
          (0, 0, 0, 0), (0, 1, 0, 0), True),
    _less(283, "Bare numa: NUMA is the sort key regardless of score", "numa", False,
          (0, 0, 0, 99), (0, 1, 0, 5), True),
    _less(292, "Bare numa: same NUMA falls to deterministic Index tiebreak", "numa", False,
          (3, 0, 0, 10), (1, 0, 0, 20), False),
    _less(301, "Chain binpack,numa: score primary, numa tiebreak when scores equal",
          "binpack,numa", False, (0, 0, 0, 15), (0, 1, 0, 15), True),
    _less(310, "Chain spread,numa: score primary, numa tiebreak when scores equal",
          "spread,numa", False, (0, 0, 0, 15), (0, 1, 0, 15), True),
    _less(319, "Chain numa,spread: numa primary regardless of score", "numa,spread", False,
          (0, 1, 0, 5), (0, 0, 0, 99), False),
    _less(328, "Chain numa,spread: same NUMA falls back to spread (higher score first)",
          "numa,spread", False, (0, 0, 0, 20), (0, 0, 0, 10), True),
    _less(337, "Chain mutex,spread: mutex is a Fit() filter, not a sort key; spread decides "
          "order", "mutex,spread", False, (0, 0, 5, 10), (0, 0, 0, 20), False),
    _less(346, "Chain with only filter tokens (mutex,topology-aware) falls back to spread",
          "mutex,topology-aware", False, (0, 0, 0, 10), (0, 0, 0, 20), False),
    _less(355, "Chain binpack,numa: deterministic Index tiebreak when score and numa both tie",
          "binpack,numa", False, (5, 0, 0, 10), (2, 0, 0, 10), False),
    _less(364, "Chain binpack,spread + NumaBind: numa forced primary to keep groups contiguous",
          "binpack,spread", True, (0, 0, 0, 99), (0, 1, 0, 5), True),
    _less(374, "Chain spread,numa + NumaBind: numa moved to front, spread breaks same-NUMA "
          "ties", "spread,numa", True, (0, 0, 0, 20), (0, 0, 0, 10), True),
]


# -- nvidia.com/numa-bind read as Go's ParseBool (device_test.go TestAssertNuma) ---------------


@dataclass(frozen=True)
class NumaBindReading:
    id: str
    source: str
    value: str | None
    """None: the annotation is absent."""
    want: bool


NUMA_BIND_READINGS = [
    NumaBindReading("B1", f"{DEVICE_TEST}:1580 TestAssertNuma: 'NumaBind=true enforces numa'",
                    "true", True),
    NumaBindReading("B2", f"{DEVICE_TEST}:1585 TestAssertNuma: 'NumaBind=false does not "
                    "enforce'", "false", False),
    NumaBindReading("B3", f"{DEVICE_TEST}:1590 TestAssertNuma: 'NumaBind invalid value'",
                    "notabool", False),
    NumaBindReading("B4", f"{DEVICE_TEST}:1595 TestAssertNuma: 'NumaBind key absent'",
                    None, False),
    *(
        NumaBindReading(f"B5 {value!r}", "derived: Go's strconv.ParseBool reads it as true",
                        value, True)
        for value in ("1", "t", "T", "TRUE", "True")
    ),
    *(
        NumaBindReading(f"B6 {value!r}", "derived: Go's strconv.ParseBool refuses it, which "
                        "HAMi reads as false", value, False)
        for value in ("yes", "on", " true", "tRUE", "")
    ),
]


# -- NUMA and policy chains in the Filter (numa_sort_test.go, device_test.go, derived) -------


def _numa_cards(*cards: tuple[str, int, int]) -> dict[str, tuple[Card, ...]]:
    """node1 with HAMi's test cards (10 slots, 8192 MiB, 100 cores): (uuid, NUMA node, cores
    in use), indexed in the order given; the cores in use make the device score (10 x
    cores / 100)."""
    return {"node1": tuple(
        NumaCard(uuid, index, memory_mib=8192, used_cores=cores, used_slots=1 if cores else 0,
                 numa=numa)
        for index, (uuid, numa, cores) in enumerate(cards)
    )}


def _numa_bind(**more: str) -> dict[str, str]:
    return {NUMA_BIND: "true", **more}


_TWO_SMALL = [container("main", gpu(2, mib=100, cores=10))]
_ONE_SMALL = [container("main", gpu(1, mib=100, cores=10))]

NUMA_FILTER = [
    ScoringCase(
        "N1 numa-bind switches NUMA node",
        f"{DEVICE_TEST}:2587 TestFit_NumaSwitching",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 1, 0), ("dev-2", 0, 0)), _TWO_SMALL,
        annotations=_numa_bind(), want_node="node1", want_uuids=[("dev-1", "dev-0")],
        note="HAMi's test walks the three cards unsorted from the end (dev-2 first, then the "
        "switch to NUMA 1); through the Filter they are sorted first, NUMA 1 before 0",
    ),
    ScoringCase(
        "N2 numa-bind keeps a NUMA node's cards together",
        f"{NUMA_SORT_TEST}:61 TestNumaBindSortPreservesAffinity",
        _numa_cards(("A_n0", 0, 50), ("B_n0", 0, 10), ("C_n1", 1, 30)), _TWO_SMALL,
        annotations=_numa_bind(), want_node="node1", want_uuids=[("B_n0", "A_n0")],
        note="the scores 5, 1, 3 come from the cores in use; C_n1 alone cannot take two",
    ),
    ScoringCase(
        "N3 without numa-bind the score decides across NUMA nodes",
        f"{NUMA_SORT_TEST}:95 TestScorePrimarySelectsAcrossNuma",
        _numa_cards(("P_n0", 0, 10), ("Q_n1", 1, 80), ("R_n1", 1, 50)), _ONE_SMALL,
        want_node="node1", want_uuids=[("P_n0",)],
    ),
    ScoringCase(
        "N4 no NUMA node has the cards",
        f"derived: {DEVICE_CODE_FIT} with numa-bind, one card per NUMA node",
        _numa_cards(("dev-0", 0, 0), ("dev-1", 1, 0)), _TWO_SMALL,
        annotations=_numa_bind(),
        want_failed={"node1": "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"},
        note="dev-1 (NUMA 1) is taken, then the walk enters NUMA 0 and starts again: dev-1 "
        "counts as NumaNotFit, dev-0 as taken when the walk ends",
    ),
    ScoringCase(
        "N5 spread breaks a tie by NUMA node",
        f"{GPU_POLICY_TEST}:206 TestDeviceUsageList_Less: 'Spread: NUMA tiebreaker when scores "
        "equal', in the Filter",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 0)), _ONE_SMALL,
        want_node="node1", want_uuids=[("dev-0",)],
        note="two idle cards: the one on NUMA 1 before the higher index",
    ),
    ScoringCase(
        "N6 binpack breaks a tie by NUMA node",
        f"{GPU_POLICY_TEST}:161 TestDeviceUsageList_Less: 'Binpack: NUMA tiebreaker when scores "
        "equal', in the Filter",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 0)), _ONE_SMALL,
        annotations=_policy("binpack"), want_node="node1", want_uuids=[("dev-0",)],
    ),
    ScoringCase(
        "N7 chain numa,binpack: the NUMA node first",
        f"{GPU_POLICY_TEST}:319 TestDeviceUsageList_Less: 'Chain numa,spread: numa primary "
        "regardless of score', with binpack, in the Filter",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 50)), _ONE_SMALL,
        annotations=_policy("numa,binpack"), want_node="node1", want_uuids=[("dev-0",)],
        note="binpack alone takes dev-1, the busier",
    ),
    ScoringCase(
        "N8 chain binpack,spread: ties by index alone",
        f"derived: {GPU_POLICY_CODE} lessByChain (its last key is the index)",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 0)), _ONE_SMALL,
        annotations=_policy("binpack,spread"), want_node="node1", want_uuids=[("dev-1",)],
        note="unlike N6: a chain without numa does not look at the NUMA node",
    ),
    ScoringCase(
        "N9 mutex: idle cards, the higher NUMA node first",
        f"{GPU_POLICY_TEST}:274 TestDeviceUsageList_Less: 'Mutex: NUMA tiebreaker when both "
        "idle', in the Filter",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 0), ("dev-2", 1, 30)), _ONE_SMALL,
        annotations=_policy("mutex"), want_node="node1", want_uuids=[("dev-0",)],
    ),
    ScoringCase(
        "N10 a policy in another case is spread",
        f"derived: {GPU_POLICY_CODE} Less (binpack only when the policy is exactly 'binpack')",
        _numa_cards(("dev-0", 0, 50), ("dev-1", 0, 0)), _ONE_SMALL,
        annotations=_policy("Binpack"), gpu_policy="binpack",
        want_node="node1", want_uuids=[("dev-1",)],
    ),
    ScoringCase(
        "N11 binpack with numa-bind: the lowest NUMA node first",
        f"{GPU_POLICY_TEST}:216 TestDeviceUsageList_Less: 'Binpack+NumaBind: NUMA primary', "
        "in the Filter",
        _numa_cards(("dev-0", 1, 50), ("dev-1", 0, 0), ("dev-2", 0, 0)), _ONE_SMALL,
        annotations=_numa_bind(**_policy("binpack")), want_node="node1",
        want_uuids=[("dev-2",)],
        note="dev-0 is the busiest, but NUMA 0 comes first; its two idle cards tie: the "
        "higher index",
    ),
    ScoringCase(
        "N12 numa-bind: a card refused by UUID still starts its NUMA node",
        f"derived: {DEVICE_CODE_FIT} (the NUMA switch comes before the UUID check)",
        _numa_cards(("dev-0", 0, 0), ("dev-1", 1, 0)), _TWO_SMALL,
        annotations=_numa_bind(**{"nvidia.com/nouse-gpuuuid": "dev-0"}),
        want_failed={"node1": "1/2 CardUuidMismatch, 1/2 NumaNotFit"},
    ),
    ScoringCase(
        "N13 numa-bind: the quota sees one NUMA node's cards",
        f"derived: {DEVICE_CODE_FIT} (fitQuota reads the cards taken so far, which the NUMA "
        "switch empties)",
        _numa_cards(("dev-0", 1, 0), ("dev-1", 0, 0), ("dev-2", 0, 0)), _TWO_SMALL,
        annotations=_numa_bind(), quota={"limits.nvidia.com/gpumem": 200},
        want_node="node1", want_uuids=[("dev-2", "dev-1")],
        note="dev-0 (NUMA 1) is taken first; without the switch emptying it, dev-1 would make "
        "300 MiB",
    ),
]

ALL = [*WEIGHTED_FILTER, *NUMA_FILTER]
"""Every Filter case of this file (the readings and scores are checked on their own)."""
