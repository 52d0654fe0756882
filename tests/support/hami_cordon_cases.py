"""HAMi's own tests of placement features beyond those of
tests/support/hami_fit_cases.py, as data, each naming its source: cordoned cards (the node's
``hami.io/device-cordon``) and cards in the sharing modes HAMi's own tests register.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/device/nvidia/device_test.go``
(``TestFit_DeviceCordon``) and ``pkg/scheduler/scheduler_test.go`` (``Test_Filter``,
``Test_ResourceQuota``, with the cards' modes as written there). As in
tests/support/hami_fit_cases.py only the data is brought in, written as the objects our daemons
read: the node with HAMi's register annotation and its own annotations, pods with
``nvidia.com/*`` limits. HAMi's test calls the NVIDIA ``Fit`` on a list
of devices; here the pod goes through the whole fit, so where the order of the walk matters the
note says what it is. A case marked "derived" follows from HAMi's code (``Fit`` in
``pkg/device/nvidia/device.go``) rather than from one of its tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from accounting.annotations import DEVICE_CORDON_ANNOTATION
from accounting.kube import node_json
from accounting.model import DeviceState
from accounting.vendors import NVIDIA_RESOURCES
from tests.support import hami_fit_cases
from tests.support.hami_fit_cases import DEVICE_TEST, Card, HamiCase, Json, container, gpu
from tests.support.pods import kube_node

DEVICE_CODE = "pkg/device/nvidia/device.go"


@dataclass(frozen=True)
class NodeCase:
    """A HAMi case whose nodes carry annotations of their own (besides the register)."""

    case: HamiCase
    node_annotations: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Node -> its annotations (the register annotation is added from the cards)."""

    @property
    def id(self) -> str:
        return self.case.id

    def kube_node(self, name: str) -> Json:
        """The node as the recorder's watch reads it."""
        node = kube_node(name, [card.register_entry() for card in self.case.nodes[name]])
        node["metadata"].setdefault("annotations", {}).update(self.node_annotations.get(name, {}))
        return node

    def states(self, name: str) -> tuple[DeviceState, ...]:
        """The node's devices read from its JSON, each charged what the case's card uses."""
        devices = node_json.parse_node(self.kube_node(name), (NVIDIA_RESOURCES,)).devices
        cards = {card.uuid: card for card in self.case.nodes[name]}
        return tuple(
            DeviceState(
                device,
                cards[device.uuid].used_mib,
                cards[device.uuid].used_cores,
                cards[device.uuid].used_slots,
            )
            for device in devices
        )


# -- TestFit_DeviceCordon (device_test.go) ------------------------------------------------------

def _cordon_node(*, used: bool = False) -> dict[str, tuple[Card, ...]]:
    """HAMi's two devices: 100 slots, 128 MiB, 100 cores each (index 0 both)."""
    return {
        "node1": (
            Card("dev-0", slots=100, memory_mib=128),
            Card("dev-1", slots=100, memory_mib=128, used_slots=int(used),
                 used_mib=64 if used else 0, used_cores=50 if used else 0),
        )
    }


def _cordoned(value: str) -> dict[str, dict[str, str]]:
    return {"node1": {DEVICE_CORDON_ANNOTATION: value}}


_REQUEST = [container("c", gpu(1, mib=64, cores=50))]
_WALK = ("HAMi's test hands Fit dev-0, dev-1 and Fit walks from the end; the whole fit walks "
         "the same order (equal scores, equal index: the later device first)")

CORDON = [
    NodeCase(
        HamiCase(
            "K1 cordoned device is skipped, healthy sibling still fits",
            f"{DEVICE_TEST} TestFit_DeviceCordon: "
            "'cordoned device is skipped, healthy sibling still fits' (line 1250)",
            _cordon_node(),
            _REQUEST,
            want_node="node1",
            want_uuids=[("dev-0",)],
            note=f"{_WALK}; without the cordon the pod takes dev-1",
        ),
        _cordoned("dev-1, "),
    ),
    NodeCase(
        HamiCase(
            "K2 all devices cordoned",
            f"{DEVICE_TEST} TestFit_DeviceCordon: "
            "'all devices cordoned fails with CardCordoned reason' (line 1260)",
            _cordon_node(),
            _REQUEST,
            want_failed={"node1": "2/2 CardCordoned"},
        ),
        _cordoned("dev-0,dev-1"),
    ),
    NodeCase(
        HamiCase(
            "K3 running pods on a cordoned device are unaffected",
            f"{DEVICE_TEST} TestFit_DeviceCordon: "
            "'running pods on a cordoned device are unaffected' (line 1270)",
            _cordon_node(used=True),
            _REQUEST,
            want_node="node1",
            want_uuids=[("dev-0",)],
            note="dev-1 holds a pod (1 slot, 64 MiB, 50 cores) that stays charged: "
            "the Filter test reads its usage back",
        ),
        _cordoned("dev-1"),
    ),
    NodeCase(
        HamiCase(
            "K4 no annotation means nothing cordoned",
            f"{DEVICE_TEST} TestFit_DeviceCordon: "
            "'no annotation or no node info means nothing cordoned' (line 1287)",
            _cordon_node(),
            _REQUEST,
            want_node="node1",
            want_uuids=[("dev-1",)],
            note=f"{_WALK}; HAMi's test asserts only that it fits (the card is derived)",
        ),
    ),
    NodeCase(
        HamiCase(
            "K5 an empty annotation cordons nothing",
            f"{DEVICE_CODE} cordonedDevices (line 698): derived, a blank value or only "
            "commas is nothing cordoned",
            _cordon_node(),
            _REQUEST,
            want_node="node1",
            want_uuids=[("dev-1",)],
        ),
        _cordoned(" , ,"),
    ),
    NodeCase(
        HamiCase(
            "K6 the cordon is checked before the UUID annotations",
            f"{DEVICE_CODE} Fit (line 735): derived, health, then the cordon, then type and "
            "UUID",
            _cordon_node(),
            _REQUEST,
            annotations={"nvidia.com/use-gpuuuid": "dev-1"},
            want_failed={"node1": "1/2 CardCordoned, 1/2 CardUuidMismatch"},
        ),
        _cordoned("dev-1"),
    ),
    NodeCase(
        HamiCase(
            "K7 an unhealthy cordoned card counts as unhealthy",
            f"{DEVICE_CODE} Fit (line 730): derived, health is checked before the cordon",
            {"node1": (Card("dev-0", slots=100, memory_mib=128, healthy=False),
                       Card("dev-1", slots=100, memory_mib=128))},
            _REQUEST,
            want_failed={"node1": "1/2 CardCordoned, 1/2 CardNotHealth"},
        ),
        _cordoned("dev-0 ,dev-1,dev-9"),
    ),
]


# -- Test_Filter, Test_ResourceQuota (scheduler_test.go) with the cards' own modes -------------

@dataclass(frozen=True)
class ModeCard(Card):
    """A card registered in a sharing mode (HAMi's tests write "hami", or none at all)."""

    mode: str = "hami-core"

    def state(self) -> DeviceState:
        plain = super().state()
        return replace(plain, device=replace(plain.device, mode=self.mode or "hami-core"))

    def register_entry(self) -> Json:
        return {**super().register_entry(), "mode": self.mode}


def _in_modes(case: HamiCase, modes: Mapping[str, str], line: int) -> NodeCase:
    """``case`` of tests/support/hami_fit_cases.py with each card in the mode HAMi's test
    registers it in (``modes``: UUID -> mode; "" where the test sets none)."""
    nodes = {
        name: tuple(
            ModeCard(**{f: getattr(card, f) for f in card.__dataclass_fields__},
                     mode=modes[card.uuid])
            for card in cards
        )
        for name, cards in case.nodes.items()
    }
    number = case.id.split()[0]
    return NodeCase(replace(
        case,
        id=f"M{number} {case.id.split(' ', 1)[1]}",
        source=f"{case.source}, the cards' modes as the test's node (line {line})",
        nodes=nodes,
        note="HAMi gives its own path to mig alone; a card in any other mode is placed as "
        f"hami-core. {case.note}".strip(),
    ))


_QUOTA_MODES = {"device1": "hami", "device2": "hami", "device3": "hami", "device4": ""}
_FILTER_MODES = {"device1": "hami", "device2": "", "device3": "hami", "device4": ""}

MODES = [
    *(_in_modes(case, _QUOTA_MODES, 2108) for case in hami_fit_cases.RESOURCE_QUOTA),
    *(_in_modes(case, _FILTER_MODES, 634) for case in hami_fit_cases.FILTER),
]


# -- the quota walked card by card on a node with a MIG card (device.go Fit, fitQuota) ---------

_MIXED = {
    "node1": (
        ModeCard("cardB", 0, memory_mib=2000),
        ModeCard("cardA", 1, memory_mib=6000),
        ModeCard("cardC", 2, memory_mib=40960, mode="mig"),
    )
}
_WHOLE_CARD = [container("c", gpu(1, cores=100))]
_HAMI_CORE = {"nvidia.com/vgpu-mode": "hami-core"}

QUOTA_WALK = [
    NodeCase(HamiCase(
        "QW1 the quota refuses a card, the next one fits",
        f"{DEVICE_CODE} Fit and fitQuota (lines 784, 666): derived, the quota is priced per "
        "card on every NVIDIA node, one with a MIG card too",
        _MIXED,
        _WHOLE_CARD,
        annotations=_HAMI_CORE,
        quota={"limits.nvidia.com/gpumem": 2000},
        want_node="node1",
        want_uuids=[("cardB",)],
        note="spread walks cardC (MIG, left out by vgpu-mode), cardA (its 6000 MiB pass the "
        "2000 MiB quota), then cardB, which fits",
    )),
    NodeCase(HamiCase(
        "QW2 the quota refuses every card the pod may take",
        f"{DEVICE_CODE} Fit and fitQuota (lines 784, 666): derived, each card counted under "
        "its own reason",
        _MIXED,
        _WHOLE_CARD,
        annotations=_HAMI_CORE,
        quota={"limits.nvidia.com/gpumem": 1500},
        want_failed={"node1": "1/3 CardTypeMismatch, 2/3 ResourceQuotaNotFit"},
    )),
    NodeCase(HamiCase(
        "QW3 a second container is priced on what the first took",
        f"{DEVICE_CODE} fitQuota (line 666): derived, the placement so far counts",
        _MIXED,
        [container("a", gpu(1, mib=1500, cores=10)), container("b", gpu(1, mib=1000, cores=10))],
        annotations=_HAMI_CORE,
        quota={"limits.nvidia.com/gpumem": 2000},
        want_failed={"node1": "1/3 CardTypeMismatch, 2/3 ResourceQuotaNotFit"},
        note="the first container takes 1500 MiB of cardA; 1000 more on any card passes the "
        "2000 MiB quota",
    )),
]


# -- TestFit_MutexPolicy (device_test.go): the mutex GPU policy, idle cards only -------------

_MUTEX_NODE = {
    "node1": (
        Card("used", 0, slots=10, memory_mib=8192, used_slots=1, used_mib=1000, used_cores=10),
        Card("idle", 1, slots=10, memory_mib=8192),
    )
}
_MUTEX = {"hami.io/gpu-scheduler-policy": "mutex"}

MUTEX = [
    NodeCase(HamiCase(
        "MX1 mutex skips the used device",
        f"{DEVICE_TEST} TestFit_MutexPolicy: 'mutex skips the used device and allocates only "
        "the idle one' (line 2631)",
        _MUTEX_NODE,
        [container("c", gpu(1, mib=100, cores=10))],
        annotations=_MUTEX,
        want_node="node1",
        want_uuids=[("idle",)],
    )),
    NodeCase(HamiCase(
        "MX2 mutex cannot give 2 cards with one idle",
        f"{DEVICE_TEST} TestFit_MutexPolicy: 'mutex cannot satisfy 2 cards when only one "
        "device is idle' (line 2638)",
        _MUTEX_NODE,
        [container("c", gpu(2, mib=100, cores=10))],
        annotations=_MUTEX,
        want_failed={"node1": "1/2 AllocatedCardsInsufficientRequest, "
                              "1/2 ExclusiveDeviceAllocateConflict"},
        note="HAMi's test asserts only the refusal; the reason follows from its Fit (line 767)",
    )),
    NodeCase(HamiCase(
        "MX3 mutex in a chain",
        "pkg/util/util.go PolicyContains (line 290): derived, mutex anywhere in a "
        "comma-separated policy, each item trimmed",
        _MUTEX_NODE,
        [container("c", gpu(1, mib=100, cores=10))],
        annotations={"hami.io/gpu-scheduler-policy": "binpack, mutex"},
        want_node="node1",
        want_uuids=[("idle",)],
        note="binpack alone would take the used card",
    )),
]

ALL: Sequence[NodeCase] = [*CORDON, *MODES, *QUOTA_WALK, *MUTEX]
