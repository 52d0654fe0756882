"""Who may write a pod's scheduler-owned annotations (accounting.owned_annotations): HAMi's cases
as data (tests/support/owned_annotation_cases.py names where they come from), the key list
against the vendor table, and the two verdicts as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounting import owned_annotations, reasons, vendors
from accounting.owned_annotations import (
    DEFAULT_ANNOTATION_WRITERS,
    FIXED_OWNED_ANNOTATIONS,
    on_create,
    on_update,
    scheduler_owned_annotations,
)
from tests.support.owned_annotation_cases import CREATE_CASES, UPDATE_CASES, CreateCase, UpdateCase
from tests.support.vendors import ACME_SPEC, registered


@pytest.mark.parametrize("case", CREATE_CASES, ids=lambda case: case.id)
def test_a_pod_created_with_a_scheduler_owned_annotation_is_refused_naming_it(
    case: CreateCase,
) -> None:
    verdict = on_create(case.annotations)

    assert verdict.allowed is (case.refused_for is None)
    if case.refused_for is None:
        assert verdict == owned_annotations.ALLOWED
        return
    assert verdict.reason == reasons.SCHEDULER_OWNED_ANNOTATION
    assert verdict.annotation == case.refused_for
    assert verdict.message == (
        f"annotation {case.refused_for} is written by the scheduler and cannot be set when "
        "creating a pod"
    )


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda case: case.id)
def test_an_update_may_change_them_only_from_a_writer(case: UpdateCase) -> None:
    writers = case.writers or DEFAULT_ANNOTATION_WRITERS

    verdict = on_update(case.old, case.new, case.username, writers)

    assert verdict.allowed is (case.refused_for is None)
    if case.refused_for is not None:
        assert verdict.reason == reasons.SCHEDULER_OWNED_ANNOTATION
        assert verdict.annotation == case.refused_for
        who = f'"{case.username}"' if case.username else "a caller without a user name"
        assert verdict.message == (
            f"annotation {case.refused_for} is written by the scheduler and cannot be set by "
            f"{who}"
        )


def test_the_keys_are_hamis_three_ours_and_every_vendors_allocation_keys() -> None:
    keys = scheduler_owned_annotations()

    assert keys[:3] == ("hami.io/vgpu-node", "hami.io/bind-time", "hami.io/bind-phase")
    assert set(keys[3:5]) == {"hami.io/vgpu-time", "hami.io/vgpu-mig-allocations"}
    expected = set(FIXED_OWNED_ANNOTATIONS)
    for spec in vendors.VENDORS:
        assert spec.allocated_annotation in keys, spec.vendor
        if spec.to_allocate_annotation:
            assert spec.to_allocate_annotation in keys, spec.vendor
        expected |= set(spec.annotation_keys)
    assert set(keys) == expected
    assert len(keys) == len(set(keys))
    # What the quota check and the fit read from pods a user writes stays writable.
    assert "hami.io/node-scheduler-policy" not in keys
    assert "hami.io/traceparent" not in keys
    assert "nvidia.com/use-gpuuuid" not in keys


def test_a_vendor_added_to_the_table_has_its_keys_guarded_too() -> None:
    assert ACME_SPEC.allocated_annotation not in scheduler_owned_annotations()
    with registered():
        assert on_create({ACME_SPEC.to_allocate_annotation: "NPU-0,Acme,1,0:;"}).annotation == (
            ACME_SPEC.to_allocate_annotation
        )
    assert on_create({ACME_SPEC.allocated_annotation: "x"}).allowed


def test_a_long_user_name_is_quoted_short() -> None:
    verdict = on_update({}, {"hami.io/vgpu-node": "n"}, "u" * 10_000, ())

    assert not verdict.allowed
    assert len(verdict.message) < 200
    assert "(10000 characters)" in verdict.message


_KEYS = st.sampled_from(scheduler_owned_annotations())
_OTHER_KEYS = st.text(min_size=1, max_size=30).filter(
    lambda key: key not in scheduler_owned_annotations()
)
_VALUES = st.text(max_size=20)
_USERS = st.sampled_from((*DEFAULT_ANNOTATION_WRITERS, "kubernetes-admin", "", "alice"))


@given(st.dictionaries(_OTHER_KEYS, _VALUES), st.dictionaries(_KEYS, _VALUES, min_size=1))
def test_create_refuses_exactly_when_an_owned_key_is_present(
    other: dict[str, str], owned: dict[str, str]
) -> None:
    assert on_create(other).allowed
    verdict = on_create({**other, **owned})
    assert not verdict.allowed
    assert verdict.annotation in owned


@given(
    st.dictionaries(_KEYS, _VALUES),
    st.dictionaries(_OTHER_KEYS, _VALUES),
    st.dictionaries(_OTHER_KEYS, _VALUES),
    st.dictionaries(_KEYS, _VALUES, min_size=1),
    _USERS,
)
def test_update_refuses_exactly_a_change_to_an_owned_key_by_a_non_writer(
    owned: dict[str, str],
    other_before: dict[str, str],
    other_after: dict[str, str],
    change: dict[str, str],
    username: str,
) -> None:
    before = {**other_before, **owned}
    # Anything else may change, whoever sends it.
    assert on_update(before, {**other_after, **owned}, username, DEFAULT_ANNOTATION_WRITERS).allowed
    after = {**other_after, **owned, **change}
    changed = {key for key in change if owned.get(key) != change[key]}
    verdict = on_update(before, after, username, DEFAULT_ANNOTATION_WRITERS)
    if not changed or username in DEFAULT_ANNOTATION_WRITERS:
        assert verdict.allowed
    else:
        assert not verdict.allowed
        assert verdict.annotation in changed
    # Dropping every owned key is a change too.
    dropped = on_update(before, other_after, username, DEFAULT_ANNOTATION_WRITERS)
    assert dropped.allowed is (not owned or username in DEFAULT_ANNOTATION_WRITERS)
