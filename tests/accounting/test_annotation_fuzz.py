"""Every vendor's annotation readers, fuzzed: an answer or ``InvalidInputError``, nothing else.

For each vendor of the table (``tests/support/vendor_cases.py``: a node and a scheduled pod as
HAMi writes them), Hypothesis mutates one annotation of the node (its register annotation, a
capacity, a label) or of the pod (its allocation annotations, a resource limit) with the
hostile tokens of ``tests/support/mutations.py`` — numbers of 4,301 digits, ``"²"``, other
scripts' digits, separators, long ids — and reads the result with ``node_json.parse_node`` or
``pod_json.parse_pod`` under every vendor at once. Each read must

* return, or raise ``InvalidInputError`` (Python's ``ValueError`` from ``int()``, a
  ``KeyError`` or a ``TypeError`` is a bug: it reached the services as ``INTERNAL``);
* name only fields of the request itself (``metadata.…``, ``spec.…``, ``status.…``);
* when it returns, hold no device id longer than 320 characters.

Under ``make soak`` (``HAMI_ACCOUNTING_SOAK=1``) each target runs 40 times as many examples.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidInputError
from accounting.kube import node_json, pod_json
from accounting.limits import MAX_DEVICE_ID_CHARS
from accounting.vendor_spec import VendorResources
from accounting.vendors import VENDORS
from tests.reliability.sizes import report, sized
from tests.support.mutations import mutate
from tests.support.vendor_cases import CASES, Json, VendorCase
from tests.support.vendors import ACME_SPEC, registered

pytestmark = pytest.mark.slow

EXAMPLES = sized(100, 2000)
REQUEST_ROOTS = ("metadata", "spec", "status")
READS: Counter[str] = Counter()
"""Inputs read per kind of target, for the figures printed at the end."""


@dataclass(frozen=True)
class Target:
    """One text of one vendor's node or pod that the fuzzer mutates."""

    case: VendorCase
    number: int
    """The case's place in ``CASES`` (NVIDIA has two)."""
    kind: str
    """``register``, ``capacity`` or ``label`` (node); ``allocation`` or ``limit`` (pod)."""
    key: str

    @property
    def name(self) -> str:
        return f"{self.number}: {self.case.vendor} {self.kind} {self.key}"


def bound_pod(case: VendorCase) -> Json:
    """The case's pod as the scheduler left it: placed, with the vendor's annotations."""
    node_name = case.node["metadata"]["name"]
    return copy.deepcopy({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "fuzzed", "namespace": "fuzz", "uid": "uid-fuzzed", "annotations": {
            **case.pod_annotations, **case.annotations, "hami.io/vgpu-node": node_name}},
        "spec": {"nodeName": node_name,
                 "initContainers": [{"name": "prepare", "resources": {"limits": case.init}}],
                 "containers": [{"name": "main", "resources": {"limits": case.app}}]},
        "status": {"phase": "Running"},
    })


def _targets() -> list[Target]:
    found: list[Target] = []
    for number, case in enumerate(CASES):
        metadata = case.node["metadata"]
        keys = {
            "register": metadata.get("annotations", {}),
            "label": metadata.get("labels", {}),
            "capacity": case.node.get("status", {}).get("capacity", {}),
            "allocation": case.annotations,
            "limit": {**case.init, **case.app},
        }
        found += [Target(case, number, kind, key) for kind, texts in keys.items() for key in texts]
    return found


TARGETS = _targets()


@pytest.fixture(scope="module")
def every_vendor() -> Iterator[tuple[VendorResources, ...]]:
    with registered(ACME_SPEC):
        yield (*(spec.resources for spec in VENDORS), ACME_SPEC.resources)
    report("annotation fuzz", targets=len(TARGETS), inputs=sum(READS.values()),
           **{kind: READS[kind] for kind in sorted(READS)})


def mutated(target: Target, rng: random.Random) -> tuple[str, Json]:
    """("node" or "pod", the object with the target's text mutated)."""
    if target.kind in ("register", "label", "capacity"):
        obj = copy.deepcopy(target.case.node)
        where = {"register": obj["metadata"].get("annotations"),
                 "label": obj["metadata"].get("labels"),
                 "capacity": obj.get("status", {}).get("capacity")}[target.kind]
        where[target.key] = mutate(str(where[target.key]), rng)
        return "node", obj
    pod = bound_pod(target.case)
    if target.kind == "allocation":
        annotations = pod["metadata"]["annotations"]
        annotations[target.key] = mutate(annotations[target.key], rng)
    else:
        container = rng.choice([c for c in (*pod["spec"]["initContainers"],
                                            *pod["spec"]["containers"])
                                if target.key in c["resources"]["limits"]])
        limits = container["resources"]["limits"]
        limits[target.key] = mutate(str(limits[target.key]), rng)
    return "pod", pod


def read(what: str, obj: Json, vendors: tuple[VendorResources, ...]) -> Any:
    if what == "node":
        return node_json.parse_node(obj, vendors)
    return pod_json.parse_pod(obj, vendors)


def device_ids(what: str, result: Any) -> list[str]:
    if what == "node":
        return [device.uuid for device in result.devices]
    return [grant.uuid for container in result.containers for grant in container.grants]


@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.name)
@settings(max_examples=EXAMPLES, derandomize=True)
@given(rng=st.randoms(use_true_random=False))
def test_a_mutated_annotation_reads_or_is_refused_naming_its_field(
    every_vendor: tuple[VendorResources, ...], target: Target, rng: random.Random
) -> None:
    what, obj = mutated(target, rng)
    READS[target.kind] += 1
    try:
        result = read(what, obj, every_vendor)
    except InvalidInputError as error:
        for violation in error.violations:
            root = violation.path.split(".", 1)[0].split("[", 1)[0]
            assert root in REQUEST_ROOTS, f"{violation.path} is not a field of the {what}"
        return
    too_long = [len(uuid) for uuid in device_ids(what, result) if len(uuid) > MAX_DEVICE_ID_CHARS]
    assert not too_long, f"device ids of {too_long} characters were read"


def test_every_vendor_has_targets_of_its_node_and_its_pod() -> None:
    vendors = {spec.vendor for spec in VENDORS} | {ACME_SPEC.vendor}
    node_kinds = {t.case.vendor for t in TARGETS if t.kind in ("register", "capacity")}
    pod_kinds = {t.case.vendor for t in TARGETS if t.kind == "allocation"}
    assert vendors - node_kinds == set()
    assert vendors - pod_kinds == set()
