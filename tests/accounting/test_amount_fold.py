"""The amount type and the one fold over a pod's containers (accounting.amount, accounting.fold).

The fold is the formula every figure takes (stored usage, effective request, fit merge,
progressive release); these tests pin its algebra, and a differential test pins the effective
request (a fold over per-vendor request amounts) to the fold over grants of the same shape.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.amount import ZERO, Amount, Dimension
from accounting.fold import phases
from accounting.model import Container, DeviceGrant, DeviceRequest, Pod
from accounting.pod import (
    collapse_grants,
    device_demand,
    effective_request,
    grant_amounts,
    size_request,
)
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from tests.accounting.strategies import pods
from tests.builders import PodBuilder, gpu, req

PROPERTY = settings(max_examples=300, deadline=None)
AMOUNTS = st.builds(
    Amount, st.integers(0, 10**6), st.integers(0, 400), st.integers(0, 20)
)


@PROPERTY
@given(AMOUNTS, AMOUNTS, AMOUNTS)
def test_addition_and_join_are_a_lattice(a: Amount, b: Amount, c: Amount) -> None:
    assert a + b == b + a and (a + b) + c == a + (b + c) and a + ZERO == a
    assert (a + b) - b == a
    assert a.join(b) == b.join(a) and a.join(a) == a and a.join(ZERO) == a
    assert a.fits_in(a.join(b)) and b.fits_in(a.join(b))
    assert a.join(b).fits_in(a + b)
    # Adding the same thing to both sides of a join distributes (the init point rule).
    assert (a + c).join(b + c) == a.join(b) + c


@PROPERTY
@given(AMOUNTS, AMOUNTS)
def test_over_names_exactly_the_dimensions_that_do_not_fit(need: Amount, free: Amount) -> None:
    short = need.over(free)
    assert (not short) == need.fits_in(free)
    for dimension in Dimension:
        exceeds = getattr(need, dimension.value) > getattr(free, dimension.value)
        assert (dimension in short) == exceeds
    order = (Dimension.SLOTS, Dimension.MEMORY, Dimension.CORES)
    assert need.over(free, order) == tuple(d for d in order if d in short)


def test_amount_total_and_truth() -> None:
    assert Amount.total([Amount(1, 2, 3), Amount(10, 20, 30)]) == Amount(11, 22, 33)
    assert Amount.total([]) == ZERO and not ZERO and Amount(slots=1)


def test_the_fold_walks_declaration_order() -> None:
    pod = (
        PodBuilder("p")
        .sidecar("s1", gpu("g0", mib=1, cores=1))
        .init("i1", gpu("g0", mib=4))
        .sidecar("s2", gpu("g0", mib=2))
        .init("i2", gpu("g0", mib=4))
        .app("a", gpu("g0", mib=1))
        .build()
    )
    walked = phases(pod.containers, grant_amounts)

    assert walked.steady == {"g0": Amount(4, 1, 3)}
    assert [(p.position, p.running) for p in walked.init_points] == [
        (1, {"g0": Amount(5, 1, 2)}),
        (3, {"g0": Amount(7, 1, 3)}),
    ]
    assert walked.effective == {"g0": Amount(7, 1, 3)}
    assert walked.remaining(2) == {"g0": Amount(7, 1, 3)}
    assert walked.remaining(4) == walked.steady


@PROPERTY
@given(pods())
def test_the_effective_request_is_the_fold_over_grants_of_the_same_shape(pod: Pod) -> None:
    # Each container's request, sized, as one grant per device on one shared card: the fold
    # over those grants charges the card what the request fold charges the vendor.
    def as_grants(container: Container) -> Container:
        demand = device_demand(container, NVIDIA_RESOURCES)
        if demand is None:
            return Container(container.name, container.container_class)
        per_pod = demand.per_pod
        grant = DeviceGrant(
            "card", "NVIDIA", per_pod.memory_mib, per_pod.core_percent, per_pod.slots
        )
        return Container(container.name, container.container_class, grants=(grant,))

    requested = effective_request(pod, NVIDIA_RESOURCES)
    [held] = collapse_grants([as_grants(c) for c in pod.containers]) or [None]
    if held is None:
        assert requested.is_empty
        return
    assert (requested.memory_mib, requested.core_percent) == (held.memory_mib, held.core_percent)
    # A collapsed entry holds at least one slot even when every request had count 0.
    assert max(requested.count, 1) == held.slots


def test_size_request_is_the_one_sizing_rule() -> None:
    vendor = VendorResources(memory_factor=4, default_memory_mib=1000)
    assert size_request(req(2, mib=100), vendor).per_pod == Amount(800, 0, 2)
    assert size_request(req(1, percent=30), vendor).on_card(10000) == Amount(3000, 0, 1)
    # A default is not multiplied by the factor (HAMi), nor is one the parser filled in.
    assert size_request(req(1), vendor).per_pod == Amount(1000, 0, 1)
    # Without a default, nothing sizes the card: the whole card.
    plain = NVIDIA_RESOURCES
    assert size_request(req(1, cores=150), plain).on_card(24576) == Amount(24576, 100, 1)
    defaulted = DeviceRequest("NVIDIA", 1, 1000, memory_unscaled=True)
    assert size_request(defaulted, vendor).per_pod == Amount(1000, 0, 1)
