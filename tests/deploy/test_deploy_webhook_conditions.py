"""The webhooks' CEL matchConditions (deploy/base/webhook.yaml), evaluated with a CEL
interpreter (cel-python) on the variables the API server gives them (``object``, ``oldObject``,
``request``): the quota webhook gets the pods that ask for an NVIDIA resource, and the
annotation guard every review the endpoint would refuse, and nothing a tenant's ordinary
update sends."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from accounting.owned_annotations import DEFAULT_ANNOTATION_WRITERS, on_create, on_update
from tests.support.owned_annotation_cases import CREATE_CASES, UPDATE_CASES

WEBHOOK_YAML = Path(__file__).resolve().parents[2] / "deploy" / "base" / "webhook.yaml"


@cache
def _programs(webhook: str) -> tuple[celpy.Runner, ...]:
    (config,) = yaml.safe_load_all(WEBHOOK_YAML.read_text())
    (entry,) = [w for w in config["webhooks"] if w["name"] == webhook]
    environment = celpy.Environment()
    return tuple(
        environment.program(environment.compile(condition["expression"]))
        for condition in entry["matchConditions"]
    )


def sent(webhook: str, operation: str, new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """Whether the API server sends the review: every matchCondition is true."""
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation}),
    }
    return all(bool(program.evaluate(activation)) for program in _programs(webhook))


def pod(annotations: dict[str, str] | None = None, *, gpu: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"containers": [container]}}


GUARD = "annotations.accounting.hami.io"
QUOTA = "quota.accounting.hami.io"


@pytest.mark.parametrize("case", CREATE_CASES, ids=lambda case: case.id)
def test_the_guard_gets_every_create_the_endpoint_refuses(case: Any) -> None:
    refused = not on_create(case.annotations).allowed

    if refused:
        assert sent(GUARD, "CREATE", pod(case.annotations), None)
    # Only hami.io/ annotations send a create at all.
    assert sent(GUARD, "CREATE", pod(case.annotations), None) == any(
        key.startswith("hami.io/") for key in case.annotations
    )


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda case: case.id)
def test_the_guard_gets_every_update_the_endpoint_refuses(case: Any) -> None:
    old, new = pod(case.old or None), pod(case.new or None)
    writers = case.writers or DEFAULT_ANNOTATION_WRITERS

    if not on_update(case.old, case.new, case.username, writers).allowed:
        assert sent(GUARD, "UPDATE", new, old)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({"hami.io/vgpu-node": "a"}, {"hami.io/vgpu-node": "b"}, True),
        ({"hami.io/vgpu-node": "a"}, {}, True),
        ({"hami.io/vgpu-node": "a"}, None, True),
        (None, {"hami.io/vgpu-node": "a"}, True),
        ({"hami.io/vgpu-node": "a"}, {"hami.io/vgpu-node": "a", "team": "x"}, False),
        (None, {"team": "x"}, False),
        (None, None, False),
        ({"team": "x"}, {"team": "y"}, False),
    ],
    ids=["changed", "dropped-to-empty", "dropped-with-the-map", "added-with-the-map",
         "unrelated-change", "unrelated-added", "no-annotations", "unrelated-only"],
)
def test_the_guard_gets_an_update_only_when_a_hami_annotation_moves(
    old: dict[str, str] | None, new: dict[str, str] | None, expected: bool
) -> None:
    assert sent(GUARD, "UPDATE", pod(new), pod(old)) is expected


def test_the_quota_webhook_gets_creates_asking_for_nvidia_resources() -> None:
    assert sent(QUOTA, "CREATE", pod(gpu=True), None)
    assert not sent(QUOTA, "CREATE", pod(), None)
    init = copy.deepcopy(pod())
    init["spec"]["initContainers"] = pod(gpu=True)["spec"]["containers"]
    assert sent(QUOTA, "CREATE", init, None)
