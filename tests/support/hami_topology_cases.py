"""HAMi's tests of the topology-aware GPU policy, as data, each naming its source: the node's
pair scores (``hami.io/node-nvidia-score``) as the node reader reads them, and the choice
NVIDIA's ``Fit`` makes among the cards that pass.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/device/nvidia/device_test.go``
(``TestGetNodeDevices_PairScores``, ``TestGetNodeDevices_InvalidPairScores``,
``TestFit_Topology*``), ``pkg/device/devices_test.go`` (``TestDecodeNodeDevices``) and
``pkg/scheduler/score_test.go`` (``Test_Nvidia_GPU_Topology``). As in
tests/support/hami_cordon_cases.py only the data is brought in, written as the objects our
daemons read: the node with HAMi's register annotation and its pair scores, pods with
``nvidia.com/*`` limits. HAMi's tests call the NVIDIA ``Fit`` on a list of devices and assert
the cards' set; here the pod goes through the whole fit, and the cards are listed in the order
granted (the walk's: equal scores, so the later device first, as ``Fit`` walks its list from
the end). A case marked "derived" follows from HAMi's code (``GetNodeDevices``, ``Fit``,
``computeWorstSingleCard``, ``generateCombinations``, ``computeBestCombination`` in
``pkg/device/nvidia/device.go``) rather than from one of its tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tests.support.hami_cordon_cases import DEVICE_CODE, NodeCase
from tests.support.hami_fit_cases import DEVICE_TEST, Card, HamiCase, container, gpu
from tests.support.hami_scoring_cases import NumaCard

SCORE_TEST = "pkg/scheduler/score_test.go"
DEVICES_TEST = "pkg/device/devices_test.go"
PAIR_SCORE_ANNOTATION = "hami.io/node-nvidia-score"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
TOPOLOGY = {GPU_POLICY: "topology-aware"}


def scores_annotation(scores: Mapping[str, Mapping[str, int]]) -> str:
    """HAMi's ``hami.io/node-nvidia-score``: one entry per card, in the order given."""
    return json.dumps(
        [{"uuid": uuid, "score": dict(card)} for uuid, card in scores.items()],
        separators=(",", ":"),
    )


def _scored(scores: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, str]]:
    return {"node1": {PAIR_SCORE_ANNOTATION: scores_annotation(scores)}}


# -- reading the annotation (GetNodeDevices, DecodePairScores) --------------------------------


@dataclass(frozen=True)
class DecodeCase:
    """A node's register and pair-score annotation, and each card's scores as read."""

    id: str
    source: str
    cards: Sequence[str]
    """The registered cards' UUIDs."""
    value: str
    want: Mapping[str, Mapping[str, int]] | None
    """Per card, its non-zero scores with the node's other cards; None: the node does not
    read (HAMi's ``GetNodeDevices`` fails: the node offers no NVIDIA device)."""
    want_error: str = ""
    """Words the refusal says besides the annotation's name."""


DECODE = [
    DecodeCase(
        "PS1 pair scores are attached to their cards",
        f"{DEVICE_TEST} TestGetNodeDevices_PairScores (line 2484)",
        ("GPU-0", "GPU-1"),
        '[{"uuid":"GPU-0","score":{"GPU-1":100}},{"uuid":"GPU-1","score":{"GPU-0":100}}]',
        {"GPU-0": {"GPU-1": 100}, "GPU-1": {"GPU-0": 100}},
    ),
    DecodeCase(
        "PS2 invalid pair scores fail the node",
        f"{DEVICE_TEST} TestGetNodeDevices_InvalidPairScores (line 2501)",
        ("GPU-0",),
        "not-valid-json",
        None,
        "not valid JSON",
    ),
    DecodeCase(
        "PS3 scores of cards the node does not register",
        f"{DEVICES_TEST} TestDecodeNodeDevices (line 902): the value decodes; derived, only "
        "the node's own cards are kept (the only ones the fit looks up)",
        ("GPU-0", "GPU-1"),
        '[{"uuid":"GPU-0","score":{"GPU-1":50,"GPU-2":20,"GPU-3":20}}]',
        {"GPU-0": {"GPU-1": 50}, "GPU-1": {}},
    ),
    DecodeCase(
        "PS4 a card without an entry scores 0",
        f"{DEVICE_CODE} GetNodeDevices (line 319): derived, a card no entry names keeps no "
        "scores; a second entry for a card is ignored (the first found wins)",
        ("GPU-0", "GPU-1", "GPU-2"),
        '[{"uuid":"GPU-1","score":{"GPU-0":7}},{"uuid":"GPU-1","score":{"GPU-0":9}}]',
        {"GPU-0": {}, "GPU-1": {"GPU-0": 7}, "GPU-2": {}},
    ),
    DecodeCase(
        "PS5 keys in any case and nulls, as Go decodes them",
        "pkg/device/devices.go DecodePairScores (line 383): derived, json.Unmarshal matches "
        "field names in any case and reads null as nothing",
        ("GPU-0", "GPU-1"),
        '[null,{"UUID":"GPU-0","Score":{"GPU-1":3,"GPU-0":null}},{"uuid":"GPU-1","score":null}]',
        {"GPU-0": {"GPU-1": 3}, "GPU-1": {}},
    ),
    DecodeCase(
        "PS6 null is no scores",
        "pkg/device/devices.go DecodePairScores (line 383): derived, JSON null decodes",
        ("GPU-0",),
        "null",
        {"GPU-0": {}},
    ),
    DecodeCase(
        "PS7 a fractional score fails the node",
        "pkg/device/devices.go DecodePairScores (line 383): derived, Go's int takes no "
        "fraction",
        ("GPU-0", "GPU-1"),
        '[{"uuid":"GPU-0","score":{"GPU-1":1.5}}]',
        None,
        "must be a whole number within int64, got 1.5",
    ),
    DecodeCase(
        "PS8 a score past int64 fails the node",
        "pkg/device/devices.go DecodePairScores (line 383): derived, Go's int is 64 bits",
        ("GPU-0", "GPU-1"),
        '[{"uuid":"GPU-0","score":{"GPU-1":9223372036854775808}}]',
        None,
        "must be a whole number within int64",
    ),
    DecodeCase(
        "PS9 an object instead of the array fails the node",
        "pkg/device/devices.go DecodePairScores (line 383): derived, the value is a list",
        ("GPU-0",),
        '{"uuid":"GPU-0","score":{}}',
        None,
        "must be a JSON array of pair scores, got an object",
    ),
    DecodeCase(
        "PS10 a UUID that is not a string fails the node",
        "pkg/device/devices.go DecodePairScores (line 383): derived",
        ("GPU-0",),
        '[{"uuid":0,"score":{}}]',
        None,
        "must be a string, got a number",
    ),
]


# -- the choice among the cards that pass (device_test.go TestFit_Topology*) -------------------

def _three(**used: int) -> dict[str, tuple[Card, ...]]:
    """HAMi's TestFit_Topology* devices: 10 slots, 8192 MiB, 100 cores, index 0, 1, 2."""
    return {
        "node1": tuple(
            Card(f"dev-{i}", i, slots=10, memory_mib=8192, used_slots=used.get(f"u{i}", 0),
                 used_mib=used.get(f"m{i}", 0), used_cores=used.get(f"c{i}", 0))
            for i in range(3)
        )
    }


_TRIANGLE = {
    "dev-0": {"dev-1": 100, "dev-2": 200},
    "dev-1": {"dev-0": 100, "dev-2": 150},
    "dev-2": {"dev-0": 200, "dev-1": 150},
}
_ZEROS = {
    "dev-0": {"dev-1": 0, "dev-2": 0},
    "dev-1": {"dev-0": 0, "dev-2": 0},
    "dev-2": {"dev-0": 0, "dev-1": 0},
}
_NEGATIVE = {
    "dev-0": {"dev-1": -5, "dev-2": -3},
    "dev-1": {"dev-0": -5, "dev-2": -1},
    "dev-2": {"dev-0": -3, "dev-1": -1},
}
_WALK = "the fit walks dev-2, dev-1, dev-0 (equal scores: the higher index first)"


def _ask(count: int) -> list[dict[str, object]]:
    """HAMi's request: Memreq 100, Coresreq 10."""
    return [container("c", gpu(count, mib=100, cores=10))]


FIT = [
    NodeCase(HamiCase(
        "T1 exact match takes every card that passed",
        f"{DEVICE_TEST} TestFit_TopologyExactMatch (line 2671)",
        {"node1": _three()["node1"][:2]},
        _ask(2),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-1", "dev-0")],
        note="HAMi's test asserts two cards (no pair scores at all); the order is the walk's",
    )),
    NodeCase(HamiCase(
        "T2 one card: the least connected",
        f"{DEVICE_TEST} TestFit_TopologyWorstSingleCard (line 2694)",
        _three(),
        _ask(1),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-1",)],
        note="sums 300, 250, 350: dev-1 is the worst connected; without the policy the "
        "walk's first, dev-2",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "T3 several cards: the best combination",
        f"{DEVICE_TEST} TestFit_TopologyBestCombination (line 2728)",
        _three(),
        _ask(2),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-2", "dev-0")],
        note=f"pairs 150 (dev-2, dev-1), 200 (dev-2, dev-0), 100 (dev-1, dev-0); {_WALK}",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "T4 all scores zero: the first combination",
        f"{DEVICE_TEST} TestFit_TopologyBestCombinationZeroScores (line 2767)",
        _three(),
        _ask(2),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-2", "dev-1")],
        note=f"HAMi's test asserts two cards; every pair ties and the first is kept; {_WALK}",
    ), _scored(_ZEROS)),
    NodeCase(HamiCase(
        "T5 negative scores, one card",
        f"{DEVICE_TEST} TestFit_TopologyNegativeScores: 'SingleGPU' (line 2824)",
        _three(),
        _ask(1),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-0",)],
        note="sums -8, -6, -4: the lowest is dev-0's",
    ), _scored(_NEGATIVE)),
    NodeCase(HamiCase(
        "T6 negative scores, two cards",
        f"{DEVICE_TEST} TestFit_TopologyNegativeScores: 'MultiGPU' (line 2838)",
        _three(),
        _ask(2),
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("dev-2", "dev-1")],
        note=f"pairs -1 (dev-2, dev-1), -3, -5: the highest is -1; {_WALK}",
    ), _scored(_NEGATIVE)),
]


# -- Test_Nvidia_GPU_Topology (score_test.go): six cards, two groups --------------------------

def _six() -> dict[str, tuple[Card, ...]]:
    """makeDevice(id, numa, NVIDIA, 1 used, 4 slots, 8192 MiB, 2048 used, 1 core used, 100)."""
    return {
        "node1": tuple(
            Card(uuid, slots=4, memory_mib=8192, used_slots=1, used_mib=2048, used_cores=1)
            for uuid in "abcdef"
        )
    }


def _pairs(strong: Sequence[tuple[str, str]], weak: int = 1) -> dict[str, dict[str, int]]:
    """Each two of a..f score 100 when ``strong`` lists them (either way), else ``weak``."""
    linked = {frozenset(pair) for pair in strong}
    return {
        a: {b: 100 if frozenset((a, b)) in linked else weak for b in "abcdef" if b != a}
        for a in "abcdef"
    }


_SIX_WALK = ("HAMi's test hands Fit a..f unsorted (NUMA 0, 0, 1, 1, 1, 1) and Fit walks from the "
             "end; here every card is on NUMA 0, so the whole fit walks the same order (equal "
             "scores, equal index: the later device first)")

SCHEDULER = [
    NodeCase(HamiCase(
        "T7 three of six: the best connected triple",
        f"{SCORE_TEST} Test_Nvidia_GPU_Topology: 'test nvidia gpu topology-aware' (line 4227)",
        _six(),
        [container("c", gpu(3, mib=1024, cores=20))],
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("f", "c", "a")],
        note=f"f scores 100 with a and with c, every other pair 1; {_SIX_WALK}",
    ), _scored(_pairs([("a", "f"), ("c", "f")]))),
    NodeCase(HamiCase(
        "T8 one of six: the card apart",
        f"{SCORE_TEST} Test_Nvidia_GPU_Topology: 'test Single Card Topology ' (line 4289)",
        _six(),
        [container("c", gpu(1, mib=1024, cores=20))],
        annotations=TOPOLOGY,
        want_node="node1",
        want_uuids=[("f",)],
        note=f"a..e score 100 with each other, 1 with f; {_SIX_WALK}",
    ), _scored(_pairs([(a, b) for a in "abcde" for b in "abcde" if a < b]))),
]


# -- derived: the quota, too few cards, policy chains -----------------------------------------

DERIVED = [
    NodeCase(HamiCase(
        "TD1 every collected card counts against the quota",
        f"{DEVICE_CODE} Fit and fitQuota (lines 724, 666): derived, under the policy the walk "
        "does not stop at the cards asked for, and each card is priced with all collected "
        "before it",
        _three(),
        [container("c", gpu(1, mib=1000, cores=10))],
        annotations=TOPOLOGY,
        quota={"limits.nvidia.com/gpumem": 2000},
        want_node="node1",
        want_uuids=[("dev-2",)],
        note="dev-2 and dev-1 are collected (2000 MiB), dev-0 would make 3000: refused by the "
        "quota. Of the two, each scores 150 with the other: the first, dev-2, is kept; "
        "without the quota the pick is T2's dev-1",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD2 the quota leaves too few cards",
        f"{DEVICE_CODE} Fit (line 872): derived, the cards collected are counted as "
        "AllocatedCardsInsufficientRequest",
        _three(),
        [container("c", gpu(2, mib=1000, cores=10))],
        annotations=TOPOLOGY,
        quota={"limits.nvidia.com/gpumem": 1500},
        want_failed={"node1": "1/3 AllocatedCardsInsufficientRequest, 2/3 ResourceQuotaNotFit"},
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD3 too few cards pass",
        f"{DEVICE_CODE} Fit (line 872): derived, with HAMi's per-card reasons",
        _three(u1=10, m1=100, c1=10),
        _ask(3),
        annotations=TOPOLOGY,
        want_failed={"node1": "1/3 CardTimeSlicingExhausted, "
                              "2/3 AllocatedCardsInsufficientRequest"},
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD4 topology-aware with binpack in a chain",
        "pkg/util/util.go PolicyContains (line 290): derived, topology-aware anywhere in the "
        "comma-separated policy, each item trimmed; binpack orders the cards",
        _three(u0=2, m0=4000, c0=40, u1=1, m1=2000, c1=20),
        _ask(2),
        annotations={GPU_POLICY: "binpack , topology-aware"},
        want_node="node1",
        want_uuids=[("dev-0", "dev-1")],
        note="no pair scores: every pair ties and the first in binpack's order (the busiest, "
        "dev-0, then dev-1) is kept; spread would take dev-2 and dev-1",
    )),
    NodeCase(HamiCase(
        "TD5 binpack chain with scores",
        "pkg/util/util.go PolicyContains (line 290): derived",
        _three(u0=2, m0=4000, c0=40, u1=1, m1=2000, c1=20),
        _ask(1),
        annotations={GPU_POLICY: "binpack,topology-aware"},
        want_node="node1",
        want_uuids=[("dev-1",)],
        note="binpack alone would take the busiest card, dev-0",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD6 a policy that only contains the word chooses nothing",
        "pkg/util/util.go PolicyContains (line 290): derived, items are compared whole",
        _three(),
        _ask(1),
        annotations={GPU_POLICY: "spread,topology-aware-x"},
        want_node="node1",
        want_uuids=[("dev-2",)],
        note="the walk's first card, as without the policy",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD7 topology-aware with mutex",
        "pkg/util/util.go PolicyContains (line 290): derived, both filters apply",
        _three(u1=1, m1=100, c1=10),
        _ask(1),
        annotations={GPU_POLICY: "mutex, topology-aware"},
        want_node="node1",
        want_uuids=[("dev-2",)],
        note="dev-1 is in use (ExclusiveDeviceAllocateConflict); dev-2 and dev-0 each score "
        "200 with the other and the first in spread's order, dev-2, is kept; without mutex "
        "the least connected card, dev-1, would be taken",
    ), _scored(_TRIANGLE)),
]

# -- derived: numa-bind (device.go Fit, line 746) ------------------------------------------

_TWO_NUMA = {
    "node1": (
        NumaCard("dev-0", 0, slots=10, memory_mib=8192, numa=0),
        NumaCard("dev-1", 1, slots=10, memory_mib=8192, numa=1),
        NumaCard("dev-2", 2, slots=10, memory_mib=8192, numa=1),
    )
}
_NUMA_BIND = {GPU_POLICY: "topology-aware", "nvidia.com/numa-bind": "true"}

NUMA = [
    NodeCase(HamiCase(
        "TD8 numa-bind: the collection starts again at each NUMA node",
        f"{DEVICE_CODE} Fit (lines 746, 831): derived, under numa-bind the walk starts again "
        "at each NUMA node it enters, and under topology-aware it has taken nothing while it "
        "walks (k.Nums stays as asked), so only the last NUMA node's cards are chosen from",
        _TWO_NUMA,
        _ask(1),
        annotations=_NUMA_BIND,
        want_node="node1",
        want_uuids=[("dev-0",)],
        note="the walk visits NUMA node 1 (dev-2, dev-1) then NUMA node 0 (dev-0), which is all "
        "that is left collected; without topology-aware the pod takes dev-2",
    ), _scored(_TRIANGLE)),
    NodeCase(HamiCase(
        "TD9 numa-bind: too few on the last NUMA node, none counted NumaNotFit",
        f"{DEVICE_CODE} Fit (lines 746, 872): derived, NumaNotFit is counted only when the "
        "walk had taken cards (k.Nums below the request), never under topology-aware",
        _TWO_NUMA,
        _ask(2),
        annotations=_NUMA_BIND,
        want_failed={"node1": "1/3 AllocatedCardsInsufficientRequest"},
        note="NUMA node 1 had two cards that would do; HAMi drops them at NUMA node 0",
    ), _scored(_TRIANGLE)),
]

ALL: Sequence[NodeCase] = [*FIT, *SCHEDULER, *DERIVED, *NUMA]
