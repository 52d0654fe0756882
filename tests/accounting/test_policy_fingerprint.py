"""The policy's fingerprint across releases: the ids releases 0.2.0 and 0.3.0 compute, and
what a field added after a release does to the id (nothing at its default, a new id away from
it).

Each table of ids was computed by that release's own code (releases.toml's commit), so a daemon
of the release and one of this build take the same policy for the same policy; the
rolling-update test (tests/e2e/test_rolling_update.py) runs them side by side.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping

import pytest

from accounting import vendor_spec, vendors
from accounting.policy import DEFAULT_POLICY, AccountingPolicy, policy_for
from accounting.policy_fingerprint import (
    FINGERPRINTED_AT_V0_2_0,
    fingerprint_content,
    policy_fingerprint,
)
from accounting.vendors import NVIDIA_RESOURCES


def _policies() -> dict[str, AccountingPolicy]:
    cases = {
        "default": DEFAULT_POLICY,
        "chart": policy_for(),
        "every vendor": AccountingPolicy(vendors.ALL_VENDORS),
        "nvidia factor 2": policy_for(["NVIDIA"], memory_factor=2),
        "count not enforced": policy_for(["NVIDIA"], enforce_gpu_count=False),
        "nvidia defaults": AccountingPolicy((dataclasses.replace(
            NVIDIA_RESOURCES, default_memory_mib=4096, default_core_percent=30,
            default_gpu_count=2,
        ),)),
    }
    for spec in vendors.VENDORS:
        cases["only " + spec.vendor] = AccountingPolicy((spec.resources,))
    return cases


IDS_AT_RELEASE: Mapping[str, Mapping[str, str]] = {
    "0.2.0": {
        "default": "p-767be18d3024",
        "chart": "p-482bc385fd8c",
        "every vendor": "p-20ab7b89ebd4",
        "nvidia factor 2": "p-1ad6a421df4b",
        "count not enforced": "p-cce491e50ba0",
        "nvidia defaults": "p-9b26e1218edd",
        "only NVIDIA": "p-767be18d3024",
        "only Ascend910A": "p-6756f82ba088",
        "only Ascend910B2": "p-0b4e52fc03a3",
        "only Ascend910B3": "p-927b8df78a59",
        "only Ascend910B4-1": "p-f054e9d5f17e",
        "only Ascend910B4": "p-be34e2cfb523",
        "only Ascend310P": "p-2bd64a287252",
        "only Ascend910C": "p-851eed57ba76",
        "only DCU": "p-edd75bf78684",
        "only MLU": "p-c7f54c590336",
        "only MR-V100": "p-e267b366b308",
        "only MR-V50": "p-d62bff7937b0",
        "only BI-V150": "p-a80ffbc84f30",
        "only BI-V100": "p-f082487d35b1",
        "only Metax-GPU": "p-6b0d386ca603",
        "only Metax-SGPU": "p-df815df96f81",
        "only Mthreads": "p-d69d2a10ab8e",
        "only GCU": "p-5ee6ed7d120f",
        "only Enflame": "p-6e2d26e5eff5",
        "only kunlun": "p-01e2d8d45bd2",
        "only XPU": "p-cb0b30ac75cc",
        "only AWSNeuron": "p-163948df1b07",
        "only AMD": "p-69195122c5a0",
        "only Vastai": "p-7b14400e0b9f",
        "only Biren": "p-d06d57f2a691",
    },
}
# 0.3.0 changed no vendor table entry and no fingerprinted setting: its code computes the
# same ids as 0.2.0's (this test passed on 0.3.0's own commit).
IDS_AT_RELEASE = {**IDS_AT_RELEASE, "0.3.0": dict(IDS_AT_RELEASE["0.2.0"])}
"""Each release's ids of ``_policies()``, computed by that release's code."""


@pytest.mark.parametrize(
    ("release", "case"),
    [(release, case) for release, ids in IDS_AT_RELEASE.items() for case in ids],
)
def test_the_id_is_the_one_each_side_by_side_release_computes(release: str, case: str) -> None:
    policy = _policies()[case]
    assert policy.policy_id == IDS_AT_RELEASE[release][case], (
        f"{case}: this build's id differs from release {release}'s, so the two refuse each "
        "other's policy; docs/upgrades.md says which changes keep them side by side"
    )


def test_every_case_of_the_table_is_a_case_today() -> None:
    for ids in IDS_AT_RELEASE.values():
        assert set(ids) == set(_policies())


def _asdict_id(policy: AccountingPolicy, *, dropped: Mapping[str, str] = {}) -> str:
    """The id as release 0.2.0 wrote it (``asdict`` of every table entry), with the keys in
    ``dropped`` (key: the class it belongs to) left out, as a build without them computes it."""

    def strip(value: object, owner: str) -> object:
        if isinstance(value, dict):
            return {
                key: strip(item, owner=_owner(key, owner))
                for key, item in value.items()
                if dropped.get(key) != owner
            }
        if isinstance(value, (list, tuple)):
            return [strip(item, owner) for item in value]
        return value

    content = {
        "vendors": [
            strip(dataclasses.asdict(spec), "VendorSpec") for spec in policy.specs
        ],
        "enforce_gpu_count": policy.enforce_gpu_count,
    }
    canonical = json.dumps(
        content, sort_keys=True, separators=(",", ":"), default=lambda value: value.value
    )
    return "p-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


_NESTED = {"resources": "VendorResources", "capacity": "CapacityDevices",
           "selection": "Selection", "memory_templates": "MemoryTemplate"}


def _owner(key: str, owner: str) -> str:
    return _NESTED.get(key, owner) if owner == "VendorSpec" else owner


@pytest.mark.parametrize("case", sorted(_policies()))
def test_the_walk_is_asdict_for_the_fields_of_0_2_0(case: str) -> None:
    policy = _policies()[case]
    assert policy_fingerprint(policy) == _asdict_id(policy)


def _without(counted: Mapping[str, frozenset[str]], owner: str, name: str) -> dict[
    str, frozenset[str]
]:
    return {**counted, owner: counted[owner] - {name}}


@pytest.mark.parametrize(
    ("owner", "name", "changed"),
    [
        ("VendorResources", "default_memory_mib",
         lambda: AccountingPolicy((dataclasses.replace(NVIDIA_RESOURCES,
                                                       default_memory_mib=4096),))),
        ("AccountingPolicy", "enforce_gpu_count",
         lambda: policy_for(["NVIDIA"], enforce_gpu_count=False)),
    ],
    ids=["a vendor's setting", "a policy's setting"],
)
def test_a_field_added_after_a_release_counts_only_away_from_its_default(
    owner: str, name: str, changed: Callable[[], AccountingPolicy]
) -> None:
    """As if ``name`` were added after a release that had every other field: the release's
    build computes the id without it."""
    newer = _without(FINGERPRINTED_AT_V0_2_0, owner, name)
    older_id = (
        _asdict_id(DEFAULT_POLICY, dropped={name: owner})
        if owner != "AccountingPolicy"
        else _policy_id_without_count(DEFAULT_POLICY)
    )
    # At its default: the older build's id, so the two answer under the same policy.
    assert policy_fingerprint(DEFAULT_POLICY, counted=newer) == older_id
    # Away from it: an id the older build cannot reproduce from what it reads.
    set_away = changed()
    older_of_changed = (
        _asdict_id(set_away, dropped={name: owner})
        if owner != "AccountingPolicy"
        else _policy_id_without_count(set_away)
    )
    assert policy_fingerprint(set_away, counted=newer) != older_of_changed
    assert policy_fingerprint(set_away, counted=newer) == policy_fingerprint(set_away)


def _policy_id_without_count(policy: AccountingPolicy) -> str:
    content = {"vendors": [dataclasses.asdict(spec) for spec in policy.specs]}
    canonical = json.dumps(
        content, sort_keys=True, separators=(",", ":"), default=lambda value: value.value
    )
    return "p-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def test_a_class_newer_than_the_table_counts_whole() -> None:
    @dataclasses.dataclass(frozen=True)
    class Partitioning:
        slices: int = 0
        label: str = ""

    assert fingerprint_content(Partitioning()) == {"slices": 0, "label": ""}


_FINGERPRINTED_CLASSES = {
    "AccountingPolicy": AccountingPolicy,
    "VendorResources": vendor_spec.VendorResources,
    "VendorSpec": vendor_spec.VendorSpec,
    "CapacityDevices": vendor_spec.CapacityDevices,
    "MemoryTemplate": vendor_spec.MemoryTemplate,
    "Selection": vendor_spec.Selection,
}


@pytest.mark.parametrize("name", sorted(_FINGERPRINTED_CLASSES))
def test_fields_are_only_added_and_each_new_one_has_a_default(name: str) -> None:
    fields = {item.name: item for item in dataclasses.fields(_FINGERPRINTED_CLASSES[name])}
    removed = FINGERPRINTED_AT_V0_2_0[name] - set(fields) - {"policy_id"}
    assert not removed, f"{name} lost {sorted(removed)}: every release beside it changes ids"
    for field_name, item in fields.items():
        if field_name in FINGERPRINTED_AT_V0_2_0[name] or not item.init:
            continue
        assert (
            item.default is not dataclasses.MISSING
            or item.default_factory is not dataclasses.MISSING
        ), f"{name}.{field_name} is newer than 0.2.0 and has no default: it would always count"


def test_the_table_names_every_class_the_fingerprint_reaches() -> None:
    assert set(FINGERPRINTED_AT_V0_2_0) == set(_FINGERPRINTED_CLASSES)
