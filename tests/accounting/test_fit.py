"""The scheduler fit: vectors S1–S10 (docs/design.md §9), the design's seed cases,
the regressions HAMi shipped (padding #2899, quota misclassification #3052), and HAMi's device
rules one by one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from accounting.errors import InvalidInputError
from accounting.fit import (
    GPU_POLICY_ANNOTATION,
    NODE_POLICY_ANNOTATION,
    NOUSE_GPU_TYPE_ANNOTATION,
    NOUSE_GPU_UUID_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
    USE_GPU_UUID_ANNOTATION,
    VGPU_MODE_ANNOTATION,
    FitResult,
    NodeState,
    QuotaContext,
    fit_node,
    fit_pod,
    pod_requests_devices,
)
from accounting.model import Device, DeviceState, DeviceUsage, Pod, QuotaItem
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.builders import PodBuilder, req, usage


def card(
    uuid: str,
    index: int = 0,
    *,
    mib: int = 24576,
    cores: int = 100,
    slots: int = 10,
    used_mib: int = 0,
    used_cores: int = 0,
    used_slots: int = 0,
    model: str = "NVIDIA A10",
    mode: str = "hami-core",
    healthy: bool = True,
) -> DeviceState:
    """One device of a node with what is charged on it now."""
    device = Device(uuid, model, index, slots, mib, cores, mode=mode, healthy=healthy)
    return DeviceState(device, used_mib, used_cores, used_slots)


def node(*devices: DeviceState, name: str = "node1") -> NodeState:
    return NodeState(name, devices)


def memory_quota(limit_mib: int, used_mib: int = 0) -> QuotaContext:
    return QuotaContext(
        {
            "nvidia.com/gpumem": QuotaItem(
                "nvidia.com/gpumem", used=used_mib, limit=limit_mib, limit_set=True
            )
        }
    )


@dataclass(frozen=True)
class Case:
    name: str
    pod: Pod
    node: NodeState
    want_reason: str = ""
    """"" means the pod fits."""
    want_uuids: tuple[tuple[str, ...], ...] | None = None
    """Granted device UUIDs per container position, in the order chosen."""
    want_memory_mib: tuple[tuple[int, ...], ...] | None = None
    """Charged memory per grant, parallel to want_uuids."""
    want_usage: tuple[DeviceUsage, ...] | None = None
    gpu_policy: str = "spread"
    quota: QuotaContext | None = None
    vendor: VendorResources = NVIDIA_RESOURCES


def two_cards(*, used_mib: int = 0, used_cores: int = 0) -> NodeState:
    """Test_calcScore's node: uuid1 and uuid2, 8000 MiB each, equally used."""
    return node(
        card("uuid1", 0, mib=8000, used_mib=used_mib, used_cores=used_cores),
        card("uuid2", 1, mib=8000, used_mib=used_mib, used_cores=used_cores),
    )


SCHEDULING_VECTORS = [
    Case(
        "S1 init 20480 then app 10240 share one 24576 card: the merge keeps the init peak",
        PodBuilder("s1").init("init", req(mib=20480)).app("app", req(mib=10240)).build(),
        node(card("g0", mib=24576)),
        want_uuids=(("g0",), ("g0",)),
        want_usage=(usage("g0", 20480, slots=1),),
    ),
    Case(
        "S2 binpack puts init and app on the same card, the init's capacity reset after it",
        PodBuilder("s2")
        .init("init", req(mib=1000, cores=30))
        .app("app", req(mib=1000, cores=30))
        .build(),
        two_cards(),
        gpu_policy="binpack",
        want_uuids=(("uuid2",), ("uuid2",)),
        want_usage=(usage("uuid2", 1000, 30, slots=1),),
    ),
    Case(
        "S3 an init asking two cards takes both, the app goes back to the first",
        PodBuilder("s3")
        .init("init", req(2, mib=1000, cores=30))
        .app("app", req(mib=1000, cores=30))
        .build(),
        two_cards(),
        gpu_policy="binpack",
        want_uuids=(("uuid2", "uuid1"), ("uuid2",)),
        want_usage=(usage("uuid1", 1000, 30, slots=1), usage("uuid2", 1000, 30, slots=1)),
    ),
    Case(
        "S4 an init needing more memory than any card has left fails on both cards",
        PodBuilder("s4").init("init", req(mib=4000)).app("app", req(mib=100)).build(),
        two_cards(used_mib=7500),
        want_reason="2/2 CardInsufficientMemory",
    ),
    Case(
        "S5 an init needing more cores than any card has left fails on both cards",
        PodBuilder("s5")
        .init("init", req(mib=100, cores=30))
        .app("app", req(mib=100, cores=10))
        .build(),
        two_cards(used_cores=80),
        want_reason="2/2 CardInsufficientCore",
    ),
    Case(
        "S6 an init declared before a sidecar never overlaps it: max(5000, 8000) fits 10000",
        PodBuilder("s6")
        .init("init", req(mib=5000, cores=10))
        .sidecar("sidecar", req(mib=8000, cores=10))
        .app("app")
        .build(),
        node(card("g0", mib=10000)),
        want_uuids=(("g0",), ("g0",), ()),
        want_usage=(usage("g0", 8000, 10, slots=1),),
    ),
    Case(
        "S7 a sidecar declared before an init is still running with it: 8000 + 5000 > 10000",
        PodBuilder("s7")
        .sidecar("sidecar", req(mib=8000, cores=10))
        .init("init", req(mib=5000, cores=10))
        .app("app")
        .build(),
        node(card("g0", mib=10000)),
        want_reason="1/1 CardInsufficientMemory",
    ),
    Case(
        "S8 interleaved inits see only the sidecars before them: peak 3000 + 4000 fits 7500",
        PodBuilder("s8")
        .init("init1", req(mib=5000, cores=10))
        .sidecar("sidecar", req(mib=3000, cores=10))
        .init("init2", req(mib=4000, cores=10))
        .app("app", req(mib=1000, cores=10))
        .build(),
        node(card("g0", mib=7500)),
        want_uuids=(("g0",), ("g0",), ("g0",), ("g0",)),
        want_usage=(usage("g0", 7000, 20, slots=2),),
    ),
    Case(
        "S9 a sidecar adds to the app it runs beside: 4000 + 4000 > 7500",
        PodBuilder("s9")
        .sidecar("sidecar", req(mib=4000, cores=10))
        .app("app", req(mib=4000, cores=10))
        .build(),
        node(card("g0", mib=7500)),
        want_reason="1/1 CardInsufficientMemory",
    ),
]

SEED_CASES = [
    Case(
        "seed case 2 init 20 GiB and app 10 GiB fit a 24 GiB card once, not as 30 GiB",
        PodBuilder("seed")
        .init("convert-weights", req(mib=20480))
        .app("server", req(mib=10240))
        .build(),
        node(card("g0", mib=24576)),
        want_uuids=(("g0",), ("g0",)),
        want_usage=(usage("g0", 20480, slots=1),),
    ),
    Case(
        "seed sidecar 2 GiB declared before the 20 GiB init is charged with it: 22 GiB fits 24",
        PodBuilder("seed")
        .sidecar("proxy", req(mib=2048))
        .init("convert", req(mib=20480))
        .app("server", req(mib=10240))
        .build(),
        node(card("g0", mib=24576)),
        want_usage=(usage("g0", 22528, slots=2),),
    ),
    Case(
        "seed sidecar before the init is rejected on a 10000 MiB card",
        PodBuilder("seed")
        .sidecar("proxy", req(mib=6000))
        .init("convert", req(mib=5000))
        .app("server", req(mib=1000))
        .build(),
        node(card("g0", mib=10000)),
        want_reason="1/1 CardInsufficientMemory",
    ),
    Case(
        "seed the same containers with the init before the sidecar fit the 10000 MiB card",
        PodBuilder("seed")
        .init("convert", req(mib=5000))
        .sidecar("proxy", req(mib=6000))
        .app("server", req(mib=1000))
        .build(),
        node(card("g0", mib=10000)),
        want_usage=(usage("g0", 7000, slots=2),),
    ),
    Case(
        "seed several inits are fitted one at a time, each against the same steady copy",
        PodBuilder("seed")
        .init("a", req(mib=9000))
        .init("b", req(mib=9000))
        .init("c", req(mib=9000))
        .app("server", req(mib=1000))
        .build(),
        node(card("g0", mib=10000)),
        want_usage=(usage("g0", 9000, slots=1),),
    ),
]

REGRESSIONS = [
    Case(
        "padding #2899 a GPU-less init on a model-typed node keeps its empty position",
        PodBuilder("pad")
        .init("fetch")
        .app("a", req(mib=2500, cores=25))
        .app("b", req(mib=2500, cores=25))
        .build(),
        node(card("GPU-A", 0, model="NVIDIA-Tesla T4"), card("GPU-B", 1, model="NVIDIA-Tesla T4")),
        want_uuids=((), ("GPU-B",), ("GPU-A",)),
        want_usage=(usage("GPU-A", 2500, 25), usage("GPU-B", 2500, 25)),
    ),
    Case(
        "A15 #3052 two apps at 40% of a 40000 card are 32000 MiB, over a 24000 quota",
        PodBuilder("a15").app("a", req(percent=40)).app("b", req(percent=40)).build(),
        node(card("g0", mib=40000)),
        quota=memory_quota(24000),
        want_reason="1/1 ResourceQuotaNotFit",
    ),
    Case(
        "A15 #3052 a GPU-less init container does not turn the first app into an init",
        PodBuilder("a15").init("setup").app("a", req(percent=40)).app("b", req(percent=40)).build(),
        node(card("g0", mib=40000)),
        quota=memory_quota(24000),
        want_reason="1/1 ResourceQuotaNotFit",
    ),
    Case(
        "A15 #3052 two apps at 30% reach the 24000 quota exactly and fit (inclusive boundary)",
        PodBuilder("a15").init("setup").app("a", req(percent=30)).app("b", req(percent=30)).build(),
        node(card("g0", mib=40000)),
        quota=memory_quota(24000),
        want_uuids=((), ("g0",), ("g0",)),
        want_memory_mib=((), (12000,), (12000,)),
    ),
    Case(
        "quota re-check takes the init peak, not init + app, on a shared card",
        PodBuilder("q").init("convert", req(mib=20000)).app("server", req(mib=10000)).build(),
        node(card("g0", mib=40000)),
        quota=memory_quota(24000),
        want_usage=(usage("g0", 20000, slots=1),),
    ),
    Case(
        "quota re-check counts what the namespace already uses",
        PodBuilder("q").app("server", req(mib=10000)).build(),
        node(card("g0", mib=40000), card("g1", 1, mib=40000)),
        quota=memory_quota(24000, used_mib=16000),
        want_reason="2/2 ResourceQuotaNotFit",
    ),
]

DEVICE_RULES = [
    Case(
        "use-gputype matches a case-insensitive substring of the model",
        PodBuilder("t").annotate(USE_GPU_TYPE_ANNOTATION, "a100").app("a", req(mib=1000)).build(),
        node(card("g0", 0, model="NVIDIA A100-SXM4-40GB"), card("g1", 1, model="NVIDIA A10")),
        want_uuids=(("g0",),),
    ),
    Case(
        "use-gputype A10 is a substring of A100 too, so spread's tie goes to the higher index",
        PodBuilder("t").annotate(USE_GPU_TYPE_ANNOTATION, "A10").app("a", req(mib=1000)).build(),
        node(card("g0", 0, model="NVIDIA A10"), card("g1", 1, model="NVIDIA A100-SXM4-40GB")),
        want_uuids=(("g1",),),
    ),
    Case(
        "nouse-gputype excludes the cards whose model contains any entry",
        PodBuilder("t")
        .annotate(NOUSE_GPU_TYPE_ANNOTATION, "t4, a100")
        .app("a", req(mib=1000))
        .build(),
        node(card("g0", 0, model="NVIDIA A10"), card("g1", 1, model="NVIDIA A100-SXM4-40GB")),
        want_uuids=(("g0",),),
    ),
    Case(
        "use-gputype naming no installed model fails every card as a type mismatch",
        PodBuilder("t").annotate(USE_GPU_TYPE_ANNOTATION, "H100").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_reason="2/2 CardTypeMismatch",
    ),
    Case(
        "a blank use-gputype constrains nothing",
        PodBuilder("t").annotate(USE_GPU_TYPE_ANNOTATION, "  ").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_uuids=(("g1",),),
    ),
    Case(
        "vgpu-mode keeps only cards whose mode it names",
        PodBuilder("t").annotate(VGPU_MODE_ANNOTATION, "hami-core").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1, mode="mig")),
        want_uuids=(("g0",),),
    ),
    Case(
        "use-gpuuuid compares exact UUIDs after trimming",
        PodBuilder("t").annotate(USE_GPU_UUID_ANNOTATION, " g0 ,").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_uuids=(("g0",),),
    ),
    Case(
        "use-gpuuuid is not a substring match",
        PodBuilder("t").annotate(USE_GPU_UUID_ANNOTATION, "g").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_reason="2/2 CardUuidMismatch",
    ),
    Case(
        "nouse-gpuuuid excludes the listed card",
        PodBuilder("t").annotate(NOUSE_GPU_UUID_ANNOTATION, "g1").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_uuids=(("g0",),),
    ),
    Case(
        "an unhealthy card is skipped",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1, healthy=False)),
        want_uuids=(("g0",),),
    ),
    Case(
        "unhealthy is reported before any capacity reason",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", 0, healthy=False, used_slots=10), card("g1", 1, used_mib=24000)),
        want_reason="1/2 CardInsufficientMemory, 1/2 CardNotHealth",
    ),
    Case(
        "a card whose slots are all taken is time-slicing exhausted",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", slots=2, used_slots=2)),
        want_reason="1/1 CardTimeSlicingExhausted",
    ),
    Case(
        "the pod's own app containers use up the card's slots",
        PodBuilder("t").app("a", req(mib=10)).app("b", req(mib=10)).app("c", req(mib=10)).build(),
        node(card("g0", slots=2)),
        want_reason="1/1 CardTimeSlicingExhausted",
    ),
    Case(
        "init containers take a slot only for their own turn",
        PodBuilder("t")
        .init("i1", req(mib=10))
        .init("i2", req(mib=10))
        .app("a", req(mib=10))
        .build(),
        node(card("g0", slots=1)),
        want_usage=(usage("g0", 10, slots=1),),
    ),
    Case(
        "100 cores asks for the card alone: refused on a card another task uses",
        PodBuilder("t").app("a", req(mib=1000, cores=100)).build(),
        node(card("g0", used_slots=1, used_mib=1000)),
        want_reason="1/1 ExclusiveDeviceAllocateConflict",
    ),
    Case(
        "100 cores takes the free card and leaves the used one",
        PodBuilder("t").app("a", req(mib=1000, cores=100)).build(),
        node(card("g0", 0), card("g1", 1, used_slots=1, used_mib=1000)),
        gpu_policy="binpack",
        want_uuids=(("g0",),),
    ),
    Case(
        "a share-only task (0 cores) is refused on a card whose cores are all given away",
        PodBuilder("t").app("a", req(mib=1000, cores=0)).build(),
        node(card("g0", used_slots=1, used_cores=100)),
        want_reason="1/1 CardComputeUnitsExhausted",
    ),
    Case(
        "more than 100 cores is clamped to 100",
        PodBuilder("t").app("a", req(mib=1000, cores=150)).build(),
        node(card("g0")),
        want_usage=(usage("g0", 1000, 100),),
    ),
    Case(
        "memory as a percentage is sized from the chosen card",
        PodBuilder("t").app("a", req(percent=25)).build(),
        node(card("g0", 0, mib=40000), card("g1", 1, mib=24576, used_mib=20000)),
        want_uuids=(("g0",),),
        want_memory_mib=((10000,),),
    ),
    Case(
        "memory as a percentage is an integer share (floor)",
        PodBuilder("t").app("a", req(percent=33)).build(),
        node(card("g0", mib=15001)),
        want_memory_mib=((4950,),),
    ),
    Case(
        "a request with neither MiB nor a percentage takes the whole card",
        PodBuilder("t").app("a", req(cores=100)).build(),
        node(card("g0", mib=24576)),
        want_memory_mib=((24576,),),
    ),
    Case(
        "a request with neither MiB nor a percentage takes the configured default memory",
        PodBuilder("t").app("a", req()).build(),
        node(card("g0", mib=24576)),
        vendor=VendorResources(default_memory_mib=1024, memory_factor=4),
        want_memory_mib=((1024,),),
    ),
    Case(
        "MiB requests are charged times the memory factor",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", mib=24576)),
        vendor=VendorResources(memory_factor=4),
        want_memory_mib=((4000,),),
    ),
    Case(
        "a count of 2 takes two distinct cards",
        PodBuilder("t").app("a", req(2, mib=1000)).build(),
        node(card("g0", 0), card("g1", 1), card("g2", 2, used_mib=5000)),
        want_uuids=(("g1", "g0"),),
    ),
    Case(
        "a count above the node's cards is a node-level refusal",
        PodBuilder("t").app("a", req(2, mib=1000)).build(),
        node(card("g0")),
        want_reason="NodeInsufficientDevice",
    ),
    Case(
        "one card short of the count reports the card it could have taken",
        PodBuilder("t").app("a", req(2, mib=1000)).build(),
        node(card("g0", 0), card("g1", 1, healthy=False)),
        want_reason="1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth",
    ),
    Case(
        "another vendor's card is a type mismatch and does not count towards the request",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        NodeState(
            "node1", (DeviceState(Device("x0", "Kunlun XPU", 0, 10, 8000, 100, vendor="XPU")),)
        ),
        want_reason="NodeInsufficientDevice",
    ),
    Case(
        "spread takes the least used card",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", 0, used_mib=12000, used_slots=1), card("g1", 1)),
        want_uuids=(("g1",),),
    ),
    Case(
        "binpack takes the most used card",
        PodBuilder("t").app("a", req(mib=1000)).build(),
        node(card("g0", 0, used_mib=12000, used_slots=1), card("g1", 1)),
        gpu_policy="binpack",
        want_uuids=(("g0",),),
    ),
    Case(
        "the pod's gpu-scheduler-policy annotation beats the configured policy",
        PodBuilder("t").annotate(GPU_POLICY_ANNOTATION, "binpack").app("a", req(mib=1000)).build(),
        node(card("g0", 0, used_mib=12000, used_slots=1), card("g1", 1)),
        gpu_policy="spread",
        want_uuids=(("g0",),),
    ),
    Case(
        "a gpu-scheduler-policy in another case is spread, as HAMi compares it exactly",
        PodBuilder("t").annotate(GPU_POLICY_ANNOTATION, "Binpack").app("a", req(mib=1000)).build(),
        node(card("g0", 0, used_mib=12000, used_slots=1), card("g1", 1)),
        gpu_policy="binpack",
        want_uuids=(("g1",),),
    ),
    Case(
        "an unknown gpu-scheduler-policy annotation is spread, whatever the configured policy",
        PodBuilder("t").annotate(GPU_POLICY_ANNOTATION, "pack").app("a", req(mib=1000)).build(),
        node(card("g0", 0, used_mib=12000, used_slots=1), card("g1", 1)),
        gpu_policy="binpack",
        want_uuids=(("g1",),),
    ),
    Case(
        "binpack sees the pod's own earlier containers: both apps share the card",
        PodBuilder("t").app("a", req(mib=1000)).app("b", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        gpu_policy="binpack",
        want_uuids=(("g1",), ("g1",)),
        want_usage=(usage("g1", 2000, slots=2),),
    ),
    Case(
        "spread sees the pod's own earlier containers: the second app takes the other card",
        PodBuilder("t").app("a", req(mib=1000)).app("b", req(mib=1000)).build(),
        node(card("g0", 0), card("g1", 1)),
        want_uuids=(("g1",), ("g0",)),
    ),
    Case(
        "a sidecar steers a later init's spread choice; the init itself steers nothing",
        PodBuilder("t")
        .sidecar("s", req(mib=1000))
        .init("i", req(mib=1000))
        .app("a", req(mib=1000))
        .build(),
        node(card("g0", 0), card("g1", 1), card("g2", 2)),
        want_uuids=(("g2",), ("g1",), ("g1",)),
        want_usage=(usage("g1", 1000, slots=1), usage("g2", 1000, slots=1)),
    ),
    Case(
        "the first container that does not fit names the reason, in declaration order",
        PodBuilder("t").init("i", req(mib=30000)).app("a", req(2, mib=10)).build(),
        node(card("g0")),
        want_reason="1/1 CardInsufficientMemory",
    ),
]


def assert_case(case: Case) -> None:
    fitted = fit_node(
        case.pod, case.node, vendor=case.vendor, gpu_policy=case.gpu_policy, quota=case.quota
    )
    assert fitted.reason == case.want_reason
    assert fitted.fits == (case.want_reason == "")
    assert len(fitted.grants) == len(case.pod.containers)
    if not fitted.fits:
        assert fitted.grants == ((),) * len(case.pod.containers)
        assert fitted.usage == ()
    if case.want_uuids is not None:
        assert tuple(tuple(g.uuid for g in grants) for grants in fitted.grants) == case.want_uuids
    if case.want_memory_mib is not None:
        memory = tuple(tuple(g.memory_mib for g in grants) for grants in fitted.grants)
        assert memory == case.want_memory_mib
    if case.want_usage is not None:
        assert fitted.usage == case.want_usage
    for grants in fitted.grants:
        assert all(g.vendor == "NVIDIA" and g.slots == 0 for g in grants)


@pytest.mark.parametrize("case", SCHEDULING_VECTORS, ids=lambda c: c.name)
def test_fit_node_scheduling_vectors(case: Case) -> None:
    assert_case(case)


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.name)
def test_fit_node_seed_cases(case: Case) -> None:
    assert_case(case)


@pytest.mark.parametrize("case", REGRESSIONS, ids=lambda c: c.name)
def test_fit_node_hami_regressions(case: Case) -> None:
    assert_case(case)


@pytest.mark.parametrize("case", DEVICE_RULES, ids=lambda c: c.name)
def test_fit_node_device_rules(case: Case) -> None:
    assert_case(case)


def s10_nodes() -> list[NodeState]:
    """Test_Filter's two nodes: node1 lightly used on device1, node2 heavily on device4."""
    return [
        node(
            card("device1", 0, mib=8000, used_mib=2000, used_cores=25, used_slots=1),
            card("device2", 1, mib=8000),
            name="node1",
        ),
        node(
            card("device3", 0, mib=8000),
            card("device4", 1, mib=8000, used_mib=6000, used_cores=75, used_slots=1),
            name="node2",
        ),
    ]


def s10_pod() -> Pod:
    return (
        PodBuilder("s10")
        .init("init", req(mib=5000, cores=20))
        .app("app", req(mib=4000, cores=20))
        .build()
    )


def test_fit_pod_s10_binpack_chooses_the_busier_node_and_the_free_card_for_the_init() -> None:
    result = fit_pod(s10_pod(), s10_nodes(), node_policy="binpack", gpu_policy="binpack")
    assert result.reason == "Scheduled"
    assert result.node_name == "node2"
    assert dict(result.scores) == pytest.approx({"node1": 3.0, "node2": 8.0})
    assert result.failed_nodes == {}
    assert tuple(tuple(g.uuid for g in grants) for grants in result.grants) == (
        ("device3",),
        ("device3",),
    )


def test_fit_pod_node_policy_spread_picks_the_emptiest_node() -> None:
    result = fit_pod(s10_pod(), s10_nodes(), node_policy="spread", gpu_policy="binpack")
    assert result.node_name == "node1"


def test_fit_pod_node_policy_annotation_beats_the_argument() -> None:
    pod = (
        PodBuilder("s10")
        .annotate(NODE_POLICY_ANNOTATION, "spread")
        .init("init", req(mib=5000, cores=20))
        .app("app", req(mib=4000, cores=20))
        .build()
    )
    result = fit_pod(pod, s10_nodes(), node_policy="binpack")
    assert result.node_name == "node1"


def test_fit_pod_equal_scores_go_to_the_smaller_node_name_whatever_the_input_order() -> None:
    pod = PodBuilder("p").app("a", req(mib=1000)).build()
    nodes = [node(card(f"{name}-g0"), name=name) for name in ("node-c", "node-a", "node-b")]
    for policy in ("binpack", "spread"):
        assert fit_pod(pod, nodes, node_policy=policy).node_name == "node-a"
        assert fit_pod(pod, nodes[::-1], node_policy=policy).node_name == "node-a"


def test_fit_pod_no_node_fits_lists_every_node_with_its_reason() -> None:
    pod = PodBuilder("big").app("a", req(mib=9000)).build()
    result = fit_pod(pod, s10_nodes())
    assert result == FitResult(
        node_name=None,
        grants=((),),
        failed_nodes={
            "node1": "2/2 CardInsufficientMemory",
            "node2": "2/2 CardInsufficientMemory",
        },
        scores={},
        reason="NoNodeFits",
        message="0/2 nodes fit: node1: 2/2 CardInsufficientMemory; "
        "node2: 2/2 CardInsufficientMemory",
    )


def test_fit_pod_skips_nodes_that_fail_and_reports_them() -> None:
    pod = PodBuilder("p").app("a", req(mib=7000)).build()
    result = fit_pod(pod, s10_nodes(), node_policy="binpack")
    # node2 is busier, but only node1's free device2 and node2's free device3 have 7000 MiB.
    assert result.node_name == "node2"
    assert result.grants == fit_node(pod, s10_nodes()[1]).grants
    quota_result = fit_pod(pod, s10_nodes(), quota=memory_quota(6000))
    assert quota_result.reason == "NoNodeFits"
    assert dict(quota_result.failed_nodes) == {
        "node1": "2/2 ResourceQuotaNotFit",
        "node2": "2/2 ResourceQuotaNotFit",
    }


def test_fit_pod_without_a_gpu_request_chooses_no_node() -> None:
    pod = PodBuilder("cpu").init("setup").app("web").build()
    assert not pod_requests_devices(pod)
    result = fit_pod(pod, s10_nodes())
    assert (result.node_name, result.reason, result.grants) == (None, "NoGpuRequest", ((), ()))
    assert result.failed_nodes == {} and result.scores == {}


def test_pod_requests_devices_sees_init_containers_and_sidecars() -> None:
    assert pod_requests_devices(PodBuilder("p").init("i", req(mib=1)).app("a").build())
    assert pod_requests_devices(PodBuilder("p").sidecar("s", req(mib=1)).app("a").build())
    assert not pod_requests_devices(PodBuilder("p").app("a", req(0, mib=1)).build())
    assert not pod_requests_devices(PodBuilder("p").app("a", req(vendor="XPU")).build())


def test_fit_node_reports_the_node_score_before_the_pod() -> None:
    busy = s10_nodes()[1]
    fitted = fit_node(s10_pod(), busy)
    assert fitted.score == pytest.approx(8.0)
    assert busy.score == fitted.score
    assert node().score == 0.0


def test_fit_node_does_not_change_the_node_state() -> None:
    state = node(card("g0", used_mib=100))
    before = (state.devices, state.score)
    pod = PodBuilder("p").init("i", req(mib=1000)).app("a", req(mib=1000)).build()
    first = fit_node(pod, state)
    assert (state.devices, state.score) == before
    assert fit_node(pod, state) == first


@pytest.mark.parametrize(
    ("argument", "value"),
    [("gpu_policy", "mutex"), ("node_policy", "random")],
    ids=["unknown gpu policy", "unknown node policy"],
)
def test_fit_pod_refuses_an_unknown_configured_policy(argument: str, value: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        fit_pod(s10_pod(), s10_nodes(), **{argument: value})  # type: ignore[arg-type]
    assert raised.value.violations[0].path == argument
