"""Admission vectors A1–A15 (docs/design.md §9) and HAMi's quota semantics (§2.4 there).

Each vector runs at the formula level: ``effective_request`` on the pod's requests, then
``check_quota`` against the namespace's QuotaItem values. The expectations are the "#2723 /
seed" column (sidecar-aware).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from accounting.model import Pod, QuotaItem
from accounting.pod import collapse_grants, effective_request
from accounting.quota import QuotaReason, check_quota, check_usage, quota_items_from_limits
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.builders import PodBuilder, gpu, req

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
COUNT = "nvidia.com/gpu"

FITS = QuotaReason.FITS.value
MEMORY_EXCEEDED = QuotaReason.MEMORY_EXCEEDED.value
CORES_EXCEEDED = QuotaReason.CORES_EXCEEDED.value
COUNT_EXCEEDED = QuotaReason.COUNT_EXCEEDED.value
NO_GPU_REQUEST = QuotaReason.NO_GPU_REQUEST.value


def mem_quota(limit: int, used: int = 0) -> dict[str, QuotaItem]:
    return {MEM: QuotaItem(MEM, used=used, limit=limit, limit_set=True)}


def mem_and_cores_quota(mib: int, cores: int) -> dict[str, QuotaItem]:
    return {
        MEM: QuotaItem(MEM, limit=mib, limit_set=True),
        CORES: QuotaItem(CORES, limit=cores, limit_set=True),
    }


@dataclass(frozen=True)
class Case:
    name: str
    pod: Pod
    items: dict[str, QuotaItem]
    want_effective_mib: int
    want_allowed: bool
    want_reason: str
    vendor: VendorResources = field(default=NVIDIA_RESOURCES)


def app_pod(*requests_per_app: int, count: int = 1) -> Pod:
    builder = PodBuilder("p")
    for index, mib in enumerate(requests_per_app):
        builder.app(f"a{index}", req(count, mib=mib))
    return builder.build()


CASES = [
    Case(
        "A1 used 1000 + app 100 fits a 2000 limit",
        app_pod(100),
        mem_quota(2000, used=1000),
        want_effective_mib=100,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A2 used 1000 + app 1024 exceeds a 2000 limit",
        app_pod(1024),
        mem_quota(2000, used=1000),
        want_effective_mib=1024,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A3 two GPUs of 1024 each (2048) on top of 1000 exceed 2000",
        app_pod(1024, count=2),
        mem_quota(2000, used=1000),
        want_effective_mib=2048,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A4 two GPUs of 400 each (800) on top of 1000 fit 2000",
        app_pod(400, count=2),
        mem_quota(2000, used=1000),
        want_effective_mib=800,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A5 inits 800 and 800 with app 500 are charged 800, fits",
        PodBuilder("p")
        .init("i1", req(1, mib=800))
        .init("i2", req(1, mib=800))
        .app("a", req(1, mib=500))
        .build(),
        mem_quota(2000, used=1000),
        want_effective_mib=800,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A6 init 1500 with app 100 on top of 1000 exceeds 2000",
        PodBuilder("p").init("i", req(1, mib=1500)).app("a", req(1, mib=100)).build(),
        mem_quota(2000, used=1000),
        want_effective_mib=1500,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A7 init 20000 app 10000 against 30000 with used 0 is allowed",
        PodBuilder("p").init("i", req(1, mib=20000)).app("a", req(1, mib=10000)).build(),
        mem_quota(30000, used=0),
        want_effective_mib=20000,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A7 the same pod with used 20000 is denied (40000)",
        PodBuilder("p").init("i", req(1, mib=20000)).app("a", req(1, mib=10000)).build(),
        mem_quota(30000, used=20000),
        want_effective_mib=20000,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A7 the same pod with used 10000 is allowed (30000 equals the limit, inclusive)",
        PodBuilder("p").init("i", req(1, mib=20000)).app("a", req(1, mib=10000)).build(),
        mem_quota(30000, used=10000),
        want_effective_mib=20000,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A8 seed case 1: init 30720 with app 4096 is denied by a 24576 quota",
        PodBuilder("p").init("i", req(1, mib=30720)).app("a", req(1, mib=4096)).build(),
        mem_quota(24576),
        want_effective_mib=30720,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A9 memory factor 4: app 4096 asks 16384, within 8192 x 4",
        app_pod(4096),
        mem_quota(8192),
        want_effective_mib=16384,
        want_allowed=True,
        want_reason=FITS,
        vendor=VendorResources(memory_factor=4),
    ),
    Case(
        "A9 memory factor 4: app 8193 asks 32772, over 8192 x 4 = 32768",
        app_pod(8193),
        mem_quota(8192),
        want_effective_mib=32772,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
        vendor=VendorResources(memory_factor=4),
    ),
    Case(
        "A10 an explicit limit of 0 blocks an app asking 1 (HAMi #2313)",
        app_pod(1),
        mem_quota(0),
        want_effective_mib=1,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A11 #2723 regular init 5000/50 then sidecar 8000/80, no GPU app: 8000/80 fits",
        PodBuilder("p")
        .init("i", req(1, mib=5000, cores=50))
        .sidecar("s", req(1, mib=8000, cores=80))
        .app("a")
        .build(),
        mem_and_cores_quota(10000, 100),
        want_effective_mib=8000,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A12 #2723 sidecar 8000/80 then regular init 5000/50: 13000/130 is denied",
        PodBuilder("p")
        .sidecar("s", req(1, mib=8000, cores=80))
        .init("i", req(1, mib=5000, cores=50))
        .app("a")
        .build(),
        mem_and_cores_quota(10000, 100),
        want_effective_mib=13000,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A13 #2723 init 5000, sidecar 3000, init 4000, app 1000: 7000 fits 7500 (flat would deny)",
        PodBuilder("p")
        .init("i1", req(1, mib=5000))
        .sidecar("s", req(1, mib=3000))
        .init("i2", req(1, mib=4000))
        .app("a", req(1, mib=1000))
        .build(),
        mem_quota(7500),
        want_effective_mib=7000,
        want_allowed=True,
        want_reason=FITS,
    ),
    Case(
        "A14 #2723 sidecar 4000 plus app 4000 is 8000, over 7500",
        PodBuilder("p").sidecar("s", req(1, mib=4000)).app("a", req(1, mib=4000)).build(),
        mem_quota(7500),
        want_effective_mib=8000,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    Case(
        "A15 two apps asking 40 percent of a card pass admission (memory sized at scheduling)",
        PodBuilder("p").app("a1", req(1, percent=40)).app("a2", req(1, percent=40)).build(),
        mem_quota(24000),
        want_effective_mib=0,
        want_allowed=True,
        want_reason=FITS,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_admission_vectors(case: Case) -> None:
    request = effective_request(case.pod, case.vendor)

    decision = check_quota("team-a", request, case.items, case.vendor)

    assert request.memory_mib == case.want_effective_mib
    assert (decision.allowed, decision.reason) == (case.want_allowed, case.want_reason)


def test_a15_memory_as_a_percentage_is_sized_only_at_scheduling() -> None:
    pod = PodBuilder("p").app("a1", req(1, percent=40)).app("a2", req(1, percent=40)).build()

    request = effective_request(pod, NVIDIA_RESOURCES)

    assert request.memory_sized_at_scheduling is True
    assert check_quota("team-a", request, mem_quota(24000), NVIDIA_RESOURCES).allowed is True


@pytest.mark.parametrize(
    "pod",
    [
        PodBuilder("p").app("a1", gpu("g0", mib=16000)).app("a2", gpu("g0", mib=16000)).build(),
        PodBuilder("p")
        .init("setup")
        .app("a1", gpu("g0", mib=16000))
        .app("a2", gpu("g0", mib=16000))
        .build(),
    ],
    ids=[
        "A15 scheduler re-check with real card sizes: 2 x 16000 = 32000 over 24000 is denied",
        "A15 a GPU-less init does not turn the first app into an init (HAMi #3052 not copied)",
    ],
)
def test_a15_scheduler_recheck_with_card_sizes(pod: Pod) -> None:
    decision = check_usage(
        "team-a", collapse_grants(pod.containers), mem_quota(24000), NVIDIA_RESOURCES
    )

    assert (decision.allowed, decision.reason) == (False, MEMORY_EXCEEDED)


# -- quota semantics (docs/design.md §2.4) ------------------------------------------------


@dataclass(frozen=True)
class SemanticsCase:
    name: str
    pod: Pod
    items: dict[str, QuotaItem]
    enforce_gpu_count: bool
    want_allowed: bool
    want_reason: str


SEMANTICS = [
    SemanticsCase(
        "a namespace without quota items allows anything",
        app_pod(100000),
        {},
        enforce_gpu_count=False,
        want_allowed=True,
        want_reason=FITS,
    ),
    SemanticsCase(
        "a limit that is not set (deleted quota, used kept) does not block",
        app_pod(5000),
        {MEM: QuotaItem(MEM, used=9000, limit=0, limit_set=False)},
        enforce_gpu_count=False,
        want_allowed=True,
        want_reason=FITS,
    ),
    SemanticsCase(
        "a pod asking for no GPU is not checked",
        PodBuilder("p").app("a").build(),
        mem_quota(0),
        enforce_gpu_count=False,
        want_allowed=True,
        want_reason=NO_GPU_REQUEST,
    ),
    SemanticsCase(
        "cores are checked: 200 used + 300 over 400",
        PodBuilder("p").app("a", req(3, mib=10, cores=100)).build(),
        {CORES: QuotaItem(CORES, used=200, limit=400, limit_set=True)},
        enforce_gpu_count=False,
        want_allowed=False,
        want_reason=CORES_EXCEEDED,
    ),
    SemanticsCase(
        "memory is reported first when memory and cores both exceed",
        PodBuilder("p").app("a", req(1, mib=3000, cores=100)).build(),
        {
            MEM: QuotaItem(MEM, used=0, limit=2000, limit_set=True),
            CORES: QuotaItem(CORES, used=50, limit=100, limit_set=True),
        },
        enforce_gpu_count=False,
        want_allowed=False,
        want_reason=MEMORY_EXCEEDED,
    ),
    SemanticsCase(
        "the GPU count is not enforced by default (HAMi has no count dimension)",
        app_pod(10, count=3),
        {COUNT: QuotaItem(COUNT, used=0, limit=2, limit_set=True)},
        enforce_gpu_count=False,
        want_allowed=True,
        want_reason=FITS,
    ),
    SemanticsCase(
        "the GPU count is enforced when asked: 3 devices over a limit of 2",
        app_pod(10, count=3),
        {COUNT: QuotaItem(COUNT, used=0, limit=2, limit_set=True)},
        enforce_gpu_count=True,
        want_allowed=False,
        want_reason=COUNT_EXCEEDED,
    ),
    SemanticsCase(
        "the GPU count uses the effective formula: init 2 devices, app 1 device fit a limit of 2",
        PodBuilder("p").init("i", req(2, mib=10)).app("a", req(1, mib=10)).build(),
        {COUNT: QuotaItem(COUNT, used=0, limit=2, limit_set=True)},
        enforce_gpu_count=True,
        want_allowed=True,
        want_reason=FITS,
    ),
]


@pytest.mark.parametrize("case", SEMANTICS, ids=lambda c: c.name)
def test_quota_semantics(case: SemanticsCase) -> None:
    decision = check_quota(
        "team-a",
        effective_request(case.pod, NVIDIA_RESOURCES),
        case.items,
        NVIDIA_RESOURCES,
        enforce_gpu_count=case.enforce_gpu_count,
    )

    assert (decision.allowed, decision.reason) == (case.want_allowed, case.want_reason)


def test_denial_message_names_the_resource_and_the_numbers() -> None:
    request = effective_request(app_pod(1024), NVIDIA_RESOURCES)
    decision = check_quota("team-a", request, mem_quota(2000, used=1000), NVIDIA_RESOURCES)

    assert decision.allowed is False
    assert "team-a" in decision.message
    assert "nvidia.com/gpumem: requested 1024, already used 1000, limit 2000" in decision.message


def test_quota_items_from_limits_keeps_only_the_managed_keys() -> None:
    got = quota_items_from_limits(
        {
            "limits.nvidia.com/gpumem": 24576,
            "limits.nvidia.com/gpucores": 200,
            "limits.nvidia.com/gpu": 4,
            "requests.nvidia.com/gpumem": 1,
            "limits.cpu": 8,
        }, (NVIDIA_RESOURCES,)
    )

    assert got == {MEM: 24576, CORES: 200, COUNT: 4}
