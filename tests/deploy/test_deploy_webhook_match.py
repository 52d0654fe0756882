"""The webhook's matchConditions follow the vendor table and the recorder's vendors.

scripts/gen_webhook_match.py writes the condition into deploy/base/webhook.yaml and the vendor
families into the chart's files/vendors.yaml from accounting/vendors.py; these tests hold both to
the table and run the condition itself with a CEL interpreter (cel-python), so a vendor the
recorder accounts can never bypass the quota by not being sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import (
    MatchCondition,
    condition_problems,
    load_script,
)

from accounting import vendors as vendor_table

match = load_script("gen_webhook_match")


def test_the_generated_files_follow_the_vendor_table() -> None:
    assert match.stale() == []
    assert match.main(["--check"]) == 0


@pytest.fixture
def new_default_vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A vendor line added to the table (on by default, a domain of its own)."""
    spec = dataclasses.replace(
        vendor_table.BIREN_SPEC,
        resources=dataclasses.replace(
            vendor_table.BIREN_SPEC.resources,
            vendor="Example-NPU",
            count_resource="example-npu.io/npu",
        ),
        title="Example NPU",
        source="pkg/device/examplenpu",
    )
    vendor_table.register(spec)
    monkeypatch.setattr(
        vendor_table, "DEFAULT_VENDORS", (*vendor_table.DEFAULT_VENDORS, spec.resources)
    )
    yield spec.vendor
    vendor_table.unregister(spec.vendor)


def test_a_vendor_added_without_regenerating_makes_the_check_fail(
    new_default_vendor: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sorted(path.name for path in match.stale()) == [
        "kube-scheduler-config.yaml", "vendors.yaml", "webhook.yaml"]
    assert match.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "deploy/base/webhook.yaml does not follow accounting/vendors.py" in out
    assert "charts/hami-accounting/files/vendors.yaml does not follow" in out
    # What it would write sends the new vendor's pods; what is checked in does not.
    written = match.expression(match.default_prefixes())
    assert "'example-npu.io/'" in written
    assert "example-npu.io" not in match.WEBHOOK_FILE.read_text()
    accounted = tuple(v.vendor for v in vendor_table.DEFAULT_VENDORS)
    assert new_default_vendor in accounted
    assert condition_problems(MatchCondition(written), accounted) == []
    checked_in = MatchCondition(match.expression(match.prefixes_of(
        vendor_table.spec_for(k) for k in accounted if k != new_default_vendor)))
    assert condition_problems(checked_in, accounted) == [
        f"{new_default_vendor} is accounted but example-npu.io/npu in {where} is not sent to "
        "the webhook"
        for where in ("a container's limits", "an init container's limits",
                      "a sidecar's requests only")
    ]


def test_a_condition_missing_a_vendor_is_caught_by_running_it() -> None:
    # The property the deploy tests check on every rendered webhook, shown failing: the
    # condition of the old manifests (NVIDIA only) under the default policy.
    nvidia_only = MatchCondition(match.expression(("nvidia.com/",)))
    default = tuple(v.vendor for v in vendor_table.DEFAULT_VENDORS)
    problems = condition_problems(nvidia_only, default)
    assert "DCU is accounted but hygon.com/dcunum in a container's limits is not sent" in (
        "\n".join(problems)
    )
    assert not [p for p in problems if p.startswith("NVIDIA")]
    # And one that sends too much: every vendor's pods under a policy of NVIDIA alone.
    everything = MatchCondition(match.expression(match.policy_prefixes(vendor_table.known())))
    problems = condition_problems(everything, ("NVIDIA",))
    assert "DCU is not accounted but hygon.com/dcunum in a container's limits is sent" in (
        "\n".join(problems)
    )


@pytest.mark.parametrize(
    "vendors",
    [
        ("NVIDIA",),
        tuple(v.vendor for v in vendor_table.DEFAULT_VENDORS),
        tuple(vendor_table.known()),
        ("NVIDIA", "Ascend910B3"),
    ],
    ids=["NVIDIA alone", "the default vendors", "every vendor", "NVIDIA and one Ascend chip"],
)
def test_the_generated_condition_sends_exactly_the_accounted_vendors(
    vendors: tuple[str, ...],
) -> None:
    condition = MatchCondition(match.expression(match.policy_prefixes(vendors)))
    assert condition_problems(condition, vendors) == []


def test_the_webhook_file_folds_back_to_the_expression() -> None:
    # The base writes the condition as a folded YAML scalar; folding it back must give the
    # expression byte for byte (a double space would be lost).
    import yaml

    (config,) = [
        d for d in yaml.safe_load_all(match.WEBHOOK_FILE.read_text())
        if d and d["kind"] == "ValidatingWebhookConfiguration"
    ]
    (quota,) = [w for w in config["webhooks"] if w["name"] == "quota.accounting.hami.io"]
    (condition,) = quota["matchConditions"]
    assert condition["name"] == match.CONDITION_NAME
    assert condition["expression"] == match.expression(match.default_prefixes())
    chart = yaml.safe_load(match.CHART_VENDOR_FILE.read_text())
    assert chart["expression"] == match.EXPRESSION_PATTERN
    assert [f["name"] for f in chart["families"]] == [f.name for f in match.families()]


def test_every_family_is_one_of_hamis_device_packages() -> None:
    families = {f.name: f for f in match.families()}
    assert {name for name, f in families.items() if not f.enabled_by_default} == {
        "ascend",
        "iluvatar",
    }
    assert [k for f in families.values() for k in f.keywords] == list(vendor_table.known())
    # No two families share a prefix: turning one off never sends another's pods.
    prefixes = [p for f in families.values() for p in f.prefixes]
    assert len(prefixes) == len(set(prefixes))
    assert Path(match.REPO_ROOT, "accounting", "vendors.py").is_file()
