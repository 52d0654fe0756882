"""The ordering-aware formula (KEP-753, HAMi #2723) on requests and on grants.

The golden table is V01–V26 (docs/design.md §9): the "Upstream" column is
what Kubernetes' PodRequests returns, and HAMi (after #2723) applies the same formula per device
UUID. Each vector runs twice: through ``effective_request`` on a pod whose containers each ask
for one GPU with that much memory, and through ``collapse_grants`` on the same shape with every
container granted that much memory on one UUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from accounting.model import ContainerClass, Pod
from accounting.pod import classify_init_container, collapse_grants, effective_request
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.builders import PodBuilder, gpu, req

_TOKEN = re.compile(r"([ISA])\((\d+)\)")


def _pod(shape: str, *, as_grants: bool) -> Pod:
    """Builds ``I(20) S(2) A(10)``: I = regular init, S = sidecar, A = app container."""
    builder = PodBuilder("vector")
    tokens = _TOKEN.findall(shape)
    assert " ".join(f"{k}({v})" for k, v in tokens) == shape, f"unparsed notation in {shape!r}"
    for index, (kind, value) in enumerate(tokens):
        item = gpu("g0", mib=int(value)) if as_grants else req(1, mib=int(value))
        add = {"I": builder.init, "S": builder.sidecar, "A": builder.app}[kind]
        add(f"{kind.lower()}{index}", item)
    return builder.build()


@dataclass(frozen=True)
class Vector:
    id: str
    shape: str
    want_memory_mib: int
    pins: str

    @property
    def name(self) -> str:
        return f"{self.id} {self.shape}: {self.pins}"


VECTORS = [
    Vector("V01", "A(10)", 10, "no init at all"),
    Vector("V02", "I(20) A(10)", 20, "design case 2 fits a 24Gi card"),
    Vector("V03", "I(30) A(4)", 30, "design case 1 exceeds a 24Gi quota"),
    Vector("V04", "I(8000) A(5000)", 8000, "quota example held after init exits"),
    Vector("V05", "I(5) I(3) A(1) A(1)", 5, "inits maxed, apps summed"),
    Vector("V06", "S(10) A(10)", 20, "sidecar is additive (oversubscription case)"),
    Vector("V07", "S(2) I(20) A(10)", 22, "sidecar before init adds to it"),
    Vector("V08", "I(20) S(2) A(10)", 20, "sidecar after the last init does not inflate"),
    Vector("V09", "I(12) S(2) A(10)", 12, "tie between init peak and steady state"),
    Vector("V10", "S(8) I(10) A(1)", 18, "order corner, sidecar first"),
    Vector("V11", "I(10) S(8) A(1)", 10, "same pod swapped order is 8 less"),
    Vector("V12", "S(1) I(4) S(2) I(4) S(3) A(0)", 7, "interleaved, 2nd init sees 1+2 only"),
    Vector("V13", "I(5) S(1) S(2) S(3) A(1)", 7, "upstream test multiple restartable"),
    Vector("V14", "I(5) S(1) S(2) I(5) S(3) A(1)", 8, "upstream test later sidecar excluded"),
    Vector("V15", "S(10) I(200) A(100)", 210, "upstream restartable-init, init and regular"),
    Vector("V16", "S(100) I(200) A(100)", 300, "website #57244 (docs say 200m)"),
    Vector("V17", "S(4) S(2) A(1)", 7, "sidecars only, summed"),
    Vector("V18", "I(4) S(2)", 4, "no app containers, sidecar after init"),
    Vector("V19", "S(3) S(4)", 7, "no app containers, sidecars only"),
    Vector("V20", "I(0) A(0)", 0, "explicit zero is present with value 0"),
    Vector("V21", "I(1) A(0)", 1, "GPU only in init is charged for the pod lifetime"),
    Vector("V22", "S(1) A(1)", 2, "upstream test restartable init container"),
    Vector(
        "V23", "S(6000) I(16000) I(12000) S(4000) A(8000)", 22000, "realistic mix, sidecar first"
    ),
    Vector(
        "V24", "I(16000) S(6000) I(12000) S(4000) A(8000)", 18000, "reordered, steady = 2nd init"
    ),
    Vector("V25", "I(10000) I(10000) I(10000) A(0)", 10000, "HAMi #1942 must not sum to 30000"),
    Vector("V26", "S(4000) A(4000)", 8000, "Volcano #5829 / HAMi PR #2723"),
]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_effective_request_matches_upstream_pod_requests(vector: Vector) -> None:
    pod = _pod(vector.shape, as_grants=False)

    got = effective_request(pod, NVIDIA_RESOURCES)

    assert got.memory_mib == vector.want_memory_mib


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_collapse_grants_on_one_uuid_matches_upstream_pod_requests(vector: Vector) -> None:
    pod = _pod(vector.shape, as_grants=True)

    got = collapse_grants(pod.containers)

    assert [u.uuid for u in got] == ["g0"], "one entry per UUID, present even when zero"
    assert got[0].memory_mib == vector.want_memory_mib


def test_v20_explicit_zero_is_still_a_gpu_request_while_no_request_is_empty() -> None:
    zero = effective_request(_pod("I(0) A(0)", as_grants=False), NVIDIA_RESOURCES)
    none = effective_request(PodBuilder("cpu-only").init("i0").app("a0").build(), NVIDIA_RESOURCES)

    assert (zero.count, zero.memory_mib, zero.is_empty) == (1, 0, False)
    assert (none.count, none.memory_mib, none.is_empty) == (0, 0, True)


# -- classification -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restart_policy", "want"),
    [
        (None, ContainerClass.INIT),
        ("", ContainerClass.INIT),
        ("Never", ContainerClass.INIT),
        ("OnFailure", ContainerClass.INIT),
        ("always", ContainerClass.INIT),
        ("Always", ContainerClass.SIDECAR),
    ],
    ids=[
        "missing restartPolicy is a regular init container",
        "empty restartPolicy is a regular init container",
        "restartPolicy Never is a regular init container",
        "restartPolicy OnFailure is a regular init container",
        "restartPolicy is case sensitive, lower-case always is not a sidecar",
        "restartPolicy Always is a native sidecar",
    ],
)
def test_classify_init_container(restart_policy: str | None, want: ContainerClass) -> None:
    assert classify_init_container(restart_policy) is want


# -- request formula details ------------------------------------------------------------------


@dataclass(frozen=True)
class RequestCase:
    name: str
    pod: Pod
    vendor: VendorResources
    want_count: int
    want_memory_mib: int
    want_core_percent: int
    want_sized_at_scheduling: bool


REQUEST_CASES = [
    RequestCase(
        "each dimension peaks independently (memory from the app, cores from the init)",
        PodBuilder("p")
        .init("i", req(1, mib=1000, cores=80))
        .app("a", req(1, mib=4000, cores=10))
        .build(),
        NVIDIA_RESOURCES,
        want_count=1,
        want_memory_mib=4000,
        want_core_percent=80,
        want_sized_at_scheduling=False,
    ),
    RequestCase(
        "count multiplies memory and cores (HAMi fitResourceQuota)",
        PodBuilder("p").app("a", req(2, mib=1024, cores=30)).build(),
        NVIDIA_RESOURCES,
        want_count=2,
        want_memory_mib=2048,
        want_core_percent=60,
        want_sized_at_scheduling=False,
    ),
    RequestCase(
        "an init asking for 2 GPUs outweighs an app asking for 1",
        PodBuilder("p").init("i", req(2, mib=1000)).app("a", req(1, mib=1000)).build(),
        NVIDIA_RESOURCES,
        want_count=2,
        want_memory_mib=2000,
        want_core_percent=0,
        want_sized_at_scheduling=False,
    ),
    RequestCase(
        "memory factor 4 is applied once, to the effective value",
        PodBuilder("p").init("i", req(1, mib=3000)).app("a", req(1, mib=1000)).build(),
        VendorResources(memory_factor=4),
        want_count=1,
        want_memory_mib=12000,
        want_core_percent=0,
        want_sized_at_scheduling=False,
    ),
    RequestCase(
        "memory as a percentage of a card is sized only at scheduling",
        PodBuilder("p").app("a", req(1, percent=40)).build(),
        NVIDIA_RESOURCES,
        want_count=1,
        want_memory_mib=0,
        want_core_percent=0,
        want_sized_at_scheduling=True,
    ),
    RequestCase(
        "requests of another vendor and zero-count requests are ignored",
        PodBuilder("p")
        .init("i", req(1, mib=9999, vendor="Ascend"))
        .app("a", req(0, mib=5000), req(1, mib=100, vendor="Ascend"))
        .build(),
        NVIDIA_RESOURCES,
        want_count=0,
        want_memory_mib=0,
        want_core_percent=0,
        want_sized_at_scheduling=False,
    ),
]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=lambda c: c.name)
def test_effective_request_dimensions(case: RequestCase) -> None:
    got = effective_request(case.pod, case.vendor)

    assert (got.count, got.memory_mib, got.core_percent, got.memory_sized_at_scheduling) == (
        case.want_count,
        case.want_memory_mib,
        case.want_core_percent,
        case.want_sized_at_scheduling,
    )
