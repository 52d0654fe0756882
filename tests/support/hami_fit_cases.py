"""HAMi's own fit test tables, as data: the cases our fit is held to, each naming its source.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/scheduler/scheduler_test.go``
(``Test_ResourceQuota``, ``Test_Filter``), ``pkg/device/nvidia/device_test.go``
(``TestDevices_Fit``) and ``pkg/scheduler/score_test.go`` (``Test_fitInCertainDevice``). Only
the data is brought in (devices, requests, quotas, expected node, cards and reasons), written as
the Kubernetes objects our daemons read: pods with ``nvidia.com/*`` limits, HAMi's register
annotation for the devices, ``limits.nvidia.com/*`` quota keys (HAMi's tests name the same
resources ``hami.io/gpu``, ``hami.io/gpumem``, ``hami.io/gpucores``).

Where a case cannot be read exactly as HAMi's test runs it, ``note`` says how it was carried
over and why; ``want_*`` is then what HAMi's Filter answers for it (the tests call a lower
function). Cards are named per container position in the order they are granted; a value HAMi's
test does not assert is marked "derived" in the note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accounting.model import Device, DeviceState
from tests.support.pods import gpu_device, kube_pod

Json = dict[str, Any]

SCHEDULER_TEST = "pkg/scheduler/scheduler_test.go"
DEVICE_TEST = "pkg/device/nvidia/device_test.go"
SCORE_TEST = "pkg/scheduler/score_test.go"
NAMESPACE = "default"


@dataclass(frozen=True)
class Card:
    """One device of a node as HAMi's tests build a DeviceUsage (type NVIDIA, healthy)."""

    uuid: str
    index: int = 0
    slots: int = 10
    memory_mib: int = 8000
    cores: int = 100
    used_slots: int = 0
    used_mib: int = 0
    used_cores: int = 0
    healthy: bool = True

    def state(self) -> DeviceState:
        device = Device(
            self.uuid, "NVIDIA", self.index, self.slots, self.memory_mib, self.cores,
            healthy=self.healthy,
        )
        return DeviceState(device, self.used_mib, self.used_cores, self.used_slots)

    def register_entry(self) -> Json:
        """The card in hami.io/node-nvidia-register."""
        return gpu_device(
            self.uuid, memory_mib=self.memory_mib, cores=self.cores, slots=self.slots,
            index=self.index, model="NVIDIA", healthy=self.healthy,
        )


def gpu(
    count: int = 1,
    *,
    mib: int | None = None,
    percent: int | None = None,
    cores: int | None = None,
) -> Json:
    """A container's limits, as HAMi's tests write them."""
    limits = {"nvidia.com/gpu": str(count)}
    if mib is not None:
        limits["nvidia.com/gpumem"] = str(mib)
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = str(percent)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return limits


def container(name: str, limits: Mapping[str, str]) -> Json:
    return {"name": name, "image": "busybox", "resources": {"limits": dict(limits)}}


@dataclass(frozen=True)
class HamiCase:
    id: str
    source: str
    """File and test (and the case's name in HAMi's table)."""
    nodes: Mapping[str, Sequence[Card]]
    apps: Sequence[Json]
    init: Sequence[Json] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    quota: Mapping[str, int] = field(default_factory=dict)
    """limits.nvidia.com/* -> value, for the pod's namespace."""
    want_node: str | None = None
    """The chosen node; None when no node fits."""
    want_uuids: Sequence[Sequence[str]] | None = None
    """Cards per container position (init containers first), in the order granted."""
    want_failed: Mapping[str, str] = field(default_factory=dict)
    """Node -> reason, when no node fits."""
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    note: str = ""

    def pod(self, uid: str | None = None) -> Json:
        return kube_pod(
            self.id.split()[0].lower(), uid=uid, namespace=NAMESPACE, init=self.init,
            apps=self.apps, annotations=dict(self.annotations),
        )


# -- Test_ResourceQuota (scheduler_test.go): the quota is checked per candidate card ----------

QUOTA_NODE = {
    "node1": (
        Card("device1", 0, memory_mib=2000),
        Card("device2", 1, memory_mib=8000),
        Card("device3", 0, memory_mib=4000),
        Card("device4", 1, memory_mib=6000),
    )
}

RESOURCE_QUOTA = [
    HamiCase(
        "Q1 multi device Resourcequota pass",
        f"{SCHEDULER_TEST} Test_ResourceQuota: 'multi device Resourcequota pass'",
        QUOTA_NODE,
        [container("gpu-burn", gpu(2, mib=2000, cores=100))],
        quota={"limits.nvidia.com/gpucores": 200, "limits.nvidia.com/gpumem": 4000},
        want_node="node1",
        want_uuids=[("device4", "device2")],
        note="cards derived: spread without HAMi's request term (docs/design.md §7) walks "
        "device4, device2, device3, device1; HAMi's test asserts only the node",
    ),
    HamiCase(
        "Q2 multi device Resourcequota deny",
        f"{SCHEDULER_TEST} Test_ResourceQuota: 'multi device Resourcequota deny'",
        QUOTA_NODE,
        [container("gpu-burn", gpu(2, mib=3000, cores=60))],
        quota={"limits.nvidia.com/gpucores": 200, "limits.nvidia.com/gpumem": 4000},
        want_failed={"node1": "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"},
        note="the first card takes 3000 MiB; any second one would make 6000 of 4000, so the "
        "three others are refused by the quota, device1 too although its memory is short "
        "as well: the quota is checked before the memory",
    ),
    HamiCase(
        "Q3 unspecified device Resourcequota pass",
        f"{SCHEDULER_TEST} Test_ResourceQuota: 'unspecified device Resourcequota pass'",
        QUOTA_NODE,
        [container("gpu-burn", gpu(1))],
        quota={"limits.nvidia.com/gpucores": 100, "limits.nvidia.com/gpumem": 2000},
        want_node="node1",
        want_uuids=[("device1",)],
        note="a bare nvidia.com/gpu takes the whole card (and, as after HAMi's webhook, all "
        "its cores): 6000, 8000 and 4000 MiB are over the 2000 MiB quota, the 2000 MiB card "
        "is not; the card is derived (HAMi's test asserts the node)",
    ),
    HamiCase(
        "Q4 unspecified device Resourcequota deny",
        f"{SCHEDULER_TEST} Test_ResourceQuota: 'unspecified device Resourcequota deny'",
        QUOTA_NODE,
        [container("gpu-burn", gpu(1))],
        quota={"limits.nvidia.com/gpucores": 100, "limits.nvidia.com/gpumem": 1500},
        want_failed={"node1": "4/4 ResourceQuotaNotFit"},
    ),
]


# -- Test_Filter (scheduler_test.go): node and GPU policies over two nodes --------------------

FILTER_NODES = {
    "node1": (
        Card("device1", 0, used_slots=1, used_mib=2000, used_cores=25),
        Card("device2", 1),
    ),
    "node2": (
        Card("device3", 0),
        Card("device4", 1, used_slots=1, used_mib=6000, used_cores=75),
    ),
}


def _policies(node: str, gpu_policy: str) -> dict[str, str]:
    return {
        "hami.io/node-scheduler-policy": node,
        "hami.io/gpu-scheduler-policy": gpu_policy,
    }


FILTER = [
    HamiCase(
        "F1 binpack nodes, binpack cards",
        f"{SCHEDULER_TEST} Test_Filter: node binpack, gpu binpack",
        FILTER_NODES,
        [container("gpu-burn", gpu(1, mib=1000, cores=20))],
        annotations=_policies("binpack", "binpack"),
        want_node="node2",
        want_uuids=[("device4",)],
    ),
    HamiCase(
        "F2 binpack nodes, binpack cards, an init container",
        f"{SCHEDULER_TEST} Test_Filter: node binpack, gpu binpack, with an init container",
        FILTER_NODES,
        [container("gpu-burn", gpu(1, mib=4000, cores=20))],
        init=[container("init", gpu(1, mib=5000, cores=20))],
        annotations=_policies("binpack", "binpack"),
        want_node="node2",
        want_uuids=[("device3",), ("device3",)],
    ),
    HamiCase(
        "F3 binpack nodes, spread cards",
        f"{SCHEDULER_TEST} Test_Filter: node binpack, gpu spread",
        FILTER_NODES,
        [container("gpu-burn", gpu(1, mib=1000, cores=20))],
        annotations=_policies("binpack", "spread"),
        want_node="node2",
        want_uuids=[("device3",)],
        note="HAMi's test accepts device3 or device4; spread takes the idle device3",
    ),
    HamiCase(
        "F4 spread nodes, binpack cards",
        f"{SCHEDULER_TEST} Test_Filter: node spread, gpu binpack",
        FILTER_NODES,
        [container("gpu-burn", gpu(1, mib=1000, cores=20))],
        annotations=_policies("spread", "binpack"),
        want_node="node1",
        want_uuids=[("device1",)],
    ),
    HamiCase(
        "F5 spread nodes, spread cards",
        f"{SCHEDULER_TEST} Test_Filter: node spread, gpu spread",
        FILTER_NODES,
        [container("gpu-burn", gpu(1, mib=1000, cores=20))],
        annotations=_policies("spread", "spread"),
        want_node="node1",
        want_uuids=[("device2",)],
    ),
]


# -- TestDevices_Fit (device_test.go): one card's checks, one reason each --------------------

def _one(card: Card) -> dict[str, tuple[Card, ...]]:
    return {"node1": (card,)}


DEVICES_FIT = [
    HamiCase(
        "D1 fit success",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit success'",
        {"node1": (Card("dev-0", slots=100, memory_mib=128), Card("dev-1", slots=100,
                                                                  memory_mib=128))},
        [container("c", gpu(1, mib=64, cores=50))],
        want_node="node1",
        want_uuids=[("dev-1",)],
    ),
    HamiCase(
        "D2 memory not enough",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail: memory not enough'",
        _one(Card("dev-0", slots=100, memory_mib=128)),
        [container("c", gpu(1, mib=512, cores=50))],
        want_failed={"node1": "1/1 CardInsufficientMemory"},
    ),
    HamiCase(
        "D3 core not enough",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail: core not enough'",
        _one(Card("dev-0", slots=100, memory_mib=1024, used_cores=100)),
        [container("c", gpu(1, mib=512, cores=50))],
        want_failed={"node1": "1/1 CardInsufficientCore"},
    ),
    HamiCase(
        "D5 use uuid mismatch",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail: user assign use uuid mismatch'",
        _one(Card("dev-1", slots=100, memory_mib=1280)),
        [container("c", gpu(1, mib=512, cores=50))],
        annotations={"nvidia.com/use-gpuuuid": "dev-0"},
        want_failed={"node1": "1/1 CardUuidMismatch"},
        note="HAMi's case asks for 2 cards of a 1-card node, which its Filter refuses as "
        "NodeInsufficientDevice before Fit runs; carried over with 1 card so the UUID check "
        "is what refuses",
    ),
    HamiCase(
        "D6 nouse uuid match",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail: user assign no use uuid match'",
        _one(Card("dev-0", slots=100, memory_mib=1280)),
        [container("c", gpu(1, mib=512, cores=50))],
        annotations={"nvidia.com/nouse-gpuuuid": "dev-0"},
        want_failed={"node1": "1/1 CardUuidMismatch"},
        note="carried over with 1 card, as D5",
    ),
    HamiCase(
        "D7 card overused",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail: card overused'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=100)),
        [container("c", gpu(1, mib=512, cores=50))],
        want_failed={"node1": "1/1 CardTimeSlicingExhausted"},
    ),
    HamiCase(
        "D8 core limit can't exceed 100",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit success: but core limit can't exceed 100'",
        _one(Card("dev-0", slots=100, memory_mib=1280)),
        [container("c", gpu(1, mib=512, cores=120))],
        want_node="node1",
        want_uuids=[("dev-0",)],
    ),
    HamiCase(
        "D9 card exclusively",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail:  card exclusively'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=20)),
        [container("c", gpu(1, mib=512, cores=100))],
        want_failed={"node1": "1/1 ExclusiveDeviceAllocateConflict"},
    ),
    HamiCase(
        "D10 CardComputeUnitsExhausted",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail:  CardComputeUnitsExhausted'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=20, used_cores=100)),
        [container("c", gpu(1, mib=512, cores=0))],
        want_failed={"node1": "1/1 CardComputeUnitsExhausted"},
    ),
    HamiCase(
        "D11 AllocatedCardsInsufficientRequest",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail:  AllocatedCardsInsufficientRequest'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=20, used_cores=10)),
        [container("c", gpu(2, mib=512, cores=20))],
        want_failed={"node1": "NodeInsufficientDevice"},
        note="HAMi's Fit answers 1/1 AllocatedCardsInsufficientRequest when called directly; "
        "its Filter refuses 2 cards of a 1-card node first (fitInDevices: "
        "NodeInsufficientDevice), which is what a pod meets",
    ),
    HamiCase(
        "D12 partial allocation, multiple cards",
        f"{DEVICE_TEST} TestDevices_Fit: "
        "'fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards'",
        {"node1": (Card("dev-0", 0, slots=100, memory_mib=1280),
                   Card("dev-1", 1, slots=100, memory_mib=1280),
                   Card("dev-2", 2, slots=100, memory_mib=256))},
        [container("c", gpu(3, mib=512, cores=20))],
        want_failed={"node1": "1/3 CardInsufficientMemory, 2/3 AllocatedCardsInsufficientRequest"},
        note="HAMi's case asks 3 of 2 cards (NodeInsufficientDevice in its Filter); carried "
        "over with a third card too small, so the two that pass are counted as picked",
    ),
    HamiCase(
        "D13 memory percentage",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit success:  memory percentage'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=20, used_cores=10)),
        [container("c", gpu(1, percent=10, cores=20))],
        want_node="node1",
        want_uuids=[("dev-0",)],
    ),
    HamiCase(
        "D14 CardNotHealth",
        f"{DEVICE_TEST} TestDevices_Fit: 'fit fail:  CardNotHealth'",
        _one(Card("dev-0", slots=100, memory_mib=1280, used_slots=20, used_cores=10,
                  healthy=False)),
        [container("c", gpu(1, percent=10, cores=20))],
        want_failed={"node1": "1/1 CardNotHealth"},
    ),
]


# -- Test_fitInCertainDevice (score_test.go): many reasons on one node ------------------------

def _certain(uuid: str, *, used_slots: int = 1, used_mib: int = 2048,
             used_cores: int = 1) -> Card:
    return Card(uuid, slots=4, memory_mib=8192, used_slots=used_slots, used_mib=used_mib,
                used_cores=used_cores)


KINDS_OF_REASONS = HamiCase(
    "R1 kinds of not-fit reasons",
    f"{SCORE_TEST} Test_fitInCertainDevice: 'test device kind of not fit reason'",
    {"node1": (
        _certain("b"), _certain("q"), _certain("i"),
        _certain("c", used_slots=4), _certain("j", used_slots=4), _certain("u", used_slots=4),
        _certain("l", used_slots=4),
        _certain("d", used_mib=8048), _certain("m", used_mib=8048),
        _certain("e", used_cores=90),
    )},
    [container("c", gpu(2, mib=1024, cores=20))],
    annotations={"nvidia.com/use-gpuuuid": "a,f,c,d,e,g,h,j,l,u,m"},
    want_failed={"node1": "1/10 CardInsufficientCore, 2/10 CardInsufficientMemory, "
                          "3/10 CardUuidMismatch, 4/10 CardTimeSlicingExhausted"},
    note="HAMi's node also holds a (Hygon DCU) and f (Metax GPU), which its Filter never hands "
    "the NVIDIA Fit (getNodeResources), so its denominator is 10: they are left out here",
)

ALL = [*RESOURCE_QUOTA, *FILTER, *DEVICES_FIT, KINDS_OF_REASONS]
