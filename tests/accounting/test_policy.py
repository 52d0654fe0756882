"""The accounting policy value: what it holds, what it refuses, and its fingerprint."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accounting.errors import InvalidInputError
from accounting.kube import pod_json
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.vendors import HYGON_SPEC, NVIDIA_RESOURCES, VendorResources
from hami.accounting.v1 import types_pb2
from services.common.convert import policy_messages

OTHER_VENDOR = HYGON_SPEC.resources


def test_the_default_policy_is_hamis_defaults() -> None:
    assert DEFAULT_POLICY.vendors == (NVIDIA_RESOURCES,)
    assert DEFAULT_POLICY.enforce_gpu_count is True
    assert DEFAULT_POLICY.vendor("NVIDIA") is NVIDIA_RESOURCES
    assert DEFAULT_POLICY.vendor("DCU") is None
    assert DEFAULT_POLICY.describe() == "NVIDIA (memory factor 1), GPU count enforced"


@pytest.mark.parametrize(
    "changed",
    [
        AccountingPolicy((VendorResources(memory_factor=2),)),
        AccountingPolicy(enforce_gpu_count=False),
        AccountingPolicy((VendorResources(default_memory_mib=1024),)),
        AccountingPolicy((VendorResources(count_resource="example.com/gpu"),)),
        AccountingPolicy((NVIDIA_RESOURCES, OTHER_VENDOR)),
    ],
    ids=["memory factor", "count enforcement", "default memory", "resource name", "a vendor"],
)
def test_every_setting_changes_the_fingerprint(changed: AccountingPolicy) -> None:
    assert changed.policy_id != DEFAULT_POLICY.policy_id
    assert changed != DEFAULT_POLICY


def test_equal_policies_have_equal_fingerprints() -> None:
    again = AccountingPolicy([VendorResources()], enforce_gpu_count=True)  # type: ignore[arg-type]
    assert again == DEFAULT_POLICY and again.policy_id == DEFAULT_POLICY.policy_id
    assert isinstance(again.vendors, tuple)


def test_a_policy_the_rules_cannot_run_under_is_refused_naming_every_field() -> None:
    with pytest.raises(InvalidInputError) as caught:
        AccountingPolicy(
            (
                VendorResources(memory_factor=0, default_core_percent=101),
                replace(NVIDIA_RESOURCES, count_resource="gpu"),
            )
        )
    paths = {violation.path for violation in caught.value.violations}
    assert {
        "vendors[0].memory_factor",
        "vendors[0].default_core_percent",
        "vendors[1].vendor",
        "vendors[1].count_resource",
        "vendors[1].memory_resource",
    } <= paths
    with pytest.raises(InvalidInputError, match="at least one vendor"):
        AccountingPolicy(())


def test_the_wire_form_round_trips_and_is_checked_against_its_fingerprint() -> None:
    policy = AccountingPolicy((NVIDIA_RESOURCES, OTHER_VENDOR), enforce_gpu_count=False)
    pb = policy_messages.policy_to_pb(policy)

    assert pb.policy_id == policy.policy_id
    assert policy_messages.policy_from_pb(pb) == policy
    pb.vendors[0].memory_factor = 3  # a setting the fingerprint does not account for
    with pytest.raises(InvalidInputError, match="does not match"):
        policy_messages.policy_from_pb(pb)
    with pytest.raises(InvalidInputError) as caught:
        policy_messages.policy_from_pb(types_pb2.AccountingPolicy())
    assert caught.value.violations[0].path == "policy.vendors"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({"containers": [{"name": "web"}]}, False),
        ({"containers": [{"name": "web", "resources": {"limits": {"cpu": "1"}}}]}, False),
        ({"containers": [{"name": "a", "resources": {"requests": {"hugepages-2Mi": "1"}}}]},
         False),
        ({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, True),
        ({"initContainers": [{"name": "i", "resources": {"requests": {"x.io/y": "1"}}}],
          "containers": []}, True),
        ({"containers": "not a list"}, False),
    ],
    ids=["no resources", "cpu only", "hugepages", "a gpu", "any vendor in an init", "malformed"],
)
def test_a_pod_naming_no_extended_resource_asks_for_no_device_under_any_policy(
    spec: dict[str, object], names: bool
) -> None:
    assert pod_json.names_extended_resources({"spec": spec}) is names
    if not names and isinstance(spec.get("containers"), list):
        document = {"metadata": {"uid": "u", "namespace": "n", "name": "p"}, "spec": spec}
        for vendors in ((), DEFAULT_POLICY.vendors, (OTHER_VENDOR,)):
            parsed = pod_json.parse_pod(document, vendors)
            assert not any(c.requests for c in parsed.containers)
