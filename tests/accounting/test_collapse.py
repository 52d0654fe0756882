"""Collapse and shrink vectors C1–C17 (docs/design.md §9), sidecar-aware (#2723 / seed).

``effective_usage`` is HAMi's CollapseInitContainerUsage after #2723 and ``steady_state_usage``
its SteadyStateDeviceUsage (the shrink target). Values are MiB / core percent / slots on device
UUIDs g0 and g1; a vector that gives no cores uses 0. Where a vector gives no shrink value, the
steady state is sidecars + apps written out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from accounting.model import DeviceUsage, Pod
from accounting.pod import effective_usage, remaining_usage, steady_state_usage, usage_totals
from tests.builders import PodBuilder, gpu, usage


@dataclass(frozen=True)
class Case:
    name: str
    pod: Pod
    want_effective: tuple[DeviceUsage, ...]
    want_steady: tuple[DeviceUsage, ...]
    want_effective_quota_mib: int | None = None
    """Namespace memory (quota Used) the effective value charges, where the vector says."""
    want_steady_quota_mib: int | None = None


CASES = [
    Case(
        "C1 seed case 2/3: init 20480 + app 10240 charges the init peak, not 30720",
        PodBuilder("p").init("init", gpu("g0", mib=20480)).app("app", gpu("g0", mib=10240)).build(),
        want_effective=(usage("g0", 20480, slots=1),),
        want_steady=(usage("g0", 10240, slots=1),),
    ),
    Case(
        "C2 seed case 4: after init exit 0 the stored value is the app's 10240",
        PodBuilder("p")
        .init("convert-weights", gpu("g0", mib=20480))
        .app("server", gpu("g0", mib=10240))
        .terminated("convert-weights", 0)
        .build(),
        want_effective=(usage("g0", 20480, slots=1),),
        want_steady=(usage("g0", 10240, slots=1),),
    ),
    Case(
        "C3 one init and two apps: the app sum wins and is kept by the shrink",
        PodBuilder("p")
        .init("i", gpu("g0", mib=100, cores=10))
        .app("a1", gpu("g0", mib=200, cores=20))
        .app("a2", gpu("g0", mib=300, cores=30))
        .build(),
        want_effective=(usage("g0", 500, 50, slots=2),),
        want_steady=(usage("g0", 500, 50, slots=2),),
    ),
    Case(
        "C4 three sequential inits peak at 300 and the shrink leaves the app's 50",
        PodBuilder("p")
        .init("i1", gpu("g0", mib=100, cores=10))
        .init("i2", gpu("g0", mib=300, cores=30))
        .init("i3", gpu("g0", mib=200, cores=20))
        .app("a", gpu("g0", mib=50, cores=5))
        .build(),
        want_effective=(usage("g0", 300, 30, slots=1),),
        want_steady=(usage("g0", 50, 5, slots=1),),
    ),
    Case(
        "C5 init and app on different UUIDs are not merged; the shrink drops g0",
        PodBuilder("p")
        .init("i", gpu("g0", mib=1000, cores=10))
        .app("a", gpu("g1", mib=1000, cores=10))
        .build(),
        want_effective=(usage("g0", 1000, 10, slots=1), usage("g1", 1000, 10, slots=1)),
        want_steady=(usage("g1", 1000, 10, slots=1),),
        want_effective_quota_mib=2000,
        want_steady_quota_mib=1000,
    ),
    Case(
        "C6 two UUIDs inside each container collapse per UUID",
        PodBuilder("p")
        .init("i", gpu("g0", mib=200, cores=20), gpu("g1", mib=300, cores=30))
        .app("a", gpu("g0", mib=100, cores=10), gpu("g1", mib=150, cores=15))
        .build(),
        want_effective=(usage("g0", 200, 20, slots=1), usage("g1", 300, 30, slots=1)),
        want_steady=(usage("g0", 100, 10, slots=1), usage("g1", 150, 15, slots=1)),
    ),
    Case(
        "C7 two inits and two apps without any device charge nothing",
        PodBuilder("p").init("i1").init("i2").app("a1").app("a2").build(),
        want_effective=(),
        want_steady=(),
        want_effective_quota_mib=0,
        want_steady_quota_mib=0,
    ),
    Case(
        "C8 three apps sharing g0 take three slots",
        PodBuilder("p")
        .app("a1", gpu("g0", mib=100, cores=10))
        .app("a2", gpu("g0", mib=100, cores=10))
        .app("a3", gpu("g0", mib=100, cores=10))
        .build(),
        want_effective=(usage("g0", 300, 30, slots=3),),
        want_steady=(usage("g0", 300, 30, slots=3),),
    ),
    Case(
        "C9 a sidecar adds to the app sum (HEAD undercounted 4000/40 s1)",
        PodBuilder("p")
        .sidecar("s", gpu("g0", mib=4000, cores=40))
        .app("a", gpu("g0", mib=4000, cores=40))
        .build(),
        want_effective=(usage("g0", 8000, 80, slots=2),),
        want_steady=(usage("g0", 8000, 80, slots=2),),
    ),
    Case(
        "C10 a sidecar declared before the init adds to the init peak",
        PodBuilder("p")
        .sidecar("s", gpu("g0", mib=2048))
        .init("i", gpu("g0", mib=20480))
        .app("a", gpu("g0", mib=10240))
        .build(),
        want_effective=(usage("g0", 22528, slots=2),),
        want_steady=(usage("g0", 12288, slots=2),),
    ),
    Case(
        "C11 a sidecar declared after the init is not in its peak but stays in the shrink target",
        PodBuilder("p")
        .init("i", gpu("g0", mib=20480))
        .sidecar("s", gpu("g0", mib=2048))
        .app("a", gpu("g0", mib=10240))
        .build(),
        want_effective=(usage("g0", 20480, slots=2),),
        want_steady=(usage("g0", 12288, slots=2),),
    ),
    Case(
        "C12 only sidecars in the init list: effective equals steady",
        PodBuilder("p")
        .sidecar("s1", gpu("g0", mib=3000, cores=10))
        .sidecar("s2", gpu("g0", mib=5000, cores=20))
        .app("a", gpu("g0", mib=1000, cores=5))
        .build(),
        want_effective=(usage("g0", 9000, 35, slots=3),),
        want_steady=(usage("g0", 9000, 35, slots=3),),
    ),
    Case(
        "C13 interleaved: the second init sees only the sidecar declared before it",
        PodBuilder("p")
        .init("i1", gpu("g0", mib=5000, cores=10))
        .sidecar("s", gpu("g0", mib=3000, cores=30))
        .init("i2", gpu("g0", mib=4000, cores=20))
        .app("a", gpu("g0", mib=1000, cores=5))
        .build(),
        want_effective=(usage("g0", 7000, 50, slots=2),),
        want_steady=(usage("g0", 4000, 35, slots=2),),
    ),
    Case(
        "C14 sidecar on g0 and init on g1 never add up across UUIDs",
        PodBuilder("p")
        .sidecar("s", gpu("g0", mib=2000, cores=10))
        .init("i", gpu("g1", mib=7000, cores=70))
        .app("a", gpu("g0", mib=3000, cores=30))
        .build(),
        want_effective=(usage("g0", 5000, 40, slots=2), usage("g1", 7000, 70, slots=1)),
        want_steady=(usage("g0", 5000, 40, slots=2),),
    ),
    Case(
        "C15 init then sidecar with a GPU-less app: no overlap, 8000/80 s1",
        PodBuilder("p")
        .init("i", gpu("g0", mib=5000, cores=50))
        .sidecar("s", gpu("g0", mib=8000, cores=80))
        .app("a")
        .build(),
        want_effective=(usage("g0", 8000, 80, slots=1),),
        want_steady=(usage("g0", 8000, 80, slots=1),),
    ),
    Case(
        "C16 sidecar then init with a GPU-less app: overlap, 13000/130 s2",
        PodBuilder("p")
        .sidecar("s", gpu("g0", mib=8000, cores=80))
        .init("i", gpu("g0", mib=5000, cores=50))
        .app("a")
        .build(),
        want_effective=(usage("g0", 13000, 130, slots=2),),
        want_steady=(usage("g0", 8000, 80, slots=1),),
    ),
    Case(
        "C17 a missing restartPolicy keeps the pre-sidecar behaviour exactly",
        PodBuilder("p")
        .init_entry("i", None, gpu("g0", mib=4000, cores=40))
        .app("a", gpu("g0", mib=4000, cores=40))
        .build(),
        want_effective=(usage("g0", 4000, 40, slots=1),),
        want_steady=(usage("g0", 4000, 40, slots=1),),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_collapse_and_shrink_vectors(case: Case) -> None:
    effective = effective_usage(case.pod)
    steady = steady_state_usage(case.pod)

    assert effective == case.want_effective
    assert steady == case.want_steady
    if case.want_effective_quota_mib is not None:
        assert usage_totals(effective)[0] == case.want_effective_quota_mib
    if case.want_steady_quota_mib is not None:
        assert usage_totals(steady)[0] == case.want_steady_quota_mib


# -- progressive release (remaining_usage) ---------------------------------------------------

_THREE_INITS = (
    PodBuilder("p")
    .init("i1", gpu("g0", mib=300, cores=30))
    .sidecar("s", gpu("g0", mib=10, cores=1))
    .init("i2", gpu("g0", mib=200, cores=20))
    .init("i3", gpu("g0", mib=100, cores=10))
    .app("a", gpu("g0", mib=50, cores=5))
    .build()
)


@pytest.mark.parametrize(
    ("first_unfinished", "want"),
    [
        (0, (usage("g0", 300, 30, slots=2),)),
        (2, (usage("g0", 210, 21, slots=2),)),
        (3, (usage("g0", 110, 11, slots=2),)),
        (4, (usage("g0", 60, 6, slots=2),)),
    ],
    ids=[
        "nothing finished yet: the whole effective envelope",
        "first init done: the second init with the sidecar before it",
        "two inits done: the third init with the sidecar before it",
        "every init done: the steady state",
    ],
)
def test_remaining_usage_releases_finished_inits(
    first_unfinished: int, want: tuple[DeviceUsage, ...]
) -> None:
    assert remaining_usage(_THREE_INITS, first_unfinished) == want
