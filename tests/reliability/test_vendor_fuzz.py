"""Every vendor's annotations through the gRPC contract, fuzzed.

The stack of ``tests/services/test_every_vendor_grpc.py`` (one recorder with every vendor of the
table, admission, scheduler, on 127.0.0.1) registers each vendor's node as HAMi writes it. Then
a seeded generator sends requests whose text is one of those vendors' annotations mutated by
``tests/support/mutations.py`` (numbers of 4,301 digits, ``"²"``, other scripts' digits,
separators, long ids):

* ``RegisterNode`` of the vendor's node JSON with its register annotation, a capacity or a label
  mutated, and of a typed inventory whose custom info (what the fit rules read: ``LinkZone``,
  ``maxSlice``, DRS profiles) is mutated, followed by a ``Filter`` of the vendor's pod there;
* ``CheckQuota``, ``Filter``, ``RecordPod`` and ``Reserve`` of the vendor's scheduled pod with an
  allocation annotation or a resource limit mutated.

Every answer must be ``OK`` or ``INVALID_ARGUMENT`` — never ``INTERNAL`` or another code — and
an ``INVALID_ARGUMENT`` must name only fields of the request as it spells them
(``kubernetes_pod_json.metadata.…``, ``kubernetes_node_json.status.…``, ``inventory.devices[…]``,
``node_name``), never ours (``devices[0].uuid``, ``pod.containers[0]…`` of a JSON pod). After a
refusal the pod is unknown to the recorder and the node's figures are unchanged. Every failure
is collected, so a run reports how many of its inputs failed and how, not just the first.
"""

from __future__ import annotations

import copy
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from accounting.kube import node_json
from accounting.vendors import VENDORS
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
)
from services.common.convert import device_to_pb
from services.common.errors import UPSTREAM_NAME
from tests.reliability.sizes import report, sized
from tests.services.test_every_vendor_grpc import Stack, stack
from tests.support.mutations import mutate
from tests.support.pods import to_json
from tests.support.vendor_cases import CASES, Json, VendorCase
from tests.support.vendors import ACME_SPEC

__all__ = ["stack"]  # the fixture, imported for the test below

pytestmark = [pytest.mark.slow, pytest.mark.timeout(sized(900, 5400))]

INPUTS = sized(3_000, 30_000)
SEED = 25_025
TIMEOUT_S = 20.0
RETRIED_METHODS = frozenset({"CheckQuota", "Filter", "RegisterNode+Filter"})
"""The inputs a daemon answers by reading the recorder under its own deadline (two seconds by
default): on a starved machine that read can miss it, and the daemon answers UNAVAILABLE naming
the recorder's deadline. kube-scheduler tries a pod whose Filter failed again, as an API
server's client does a refused admission, so such an input is sent once more and the second
answer is the one checked. Each is a read of the recorder (or a RegisterNode of the same node
again), so sending it twice changes nothing."""
RECORDER_DEADLINE_MISSED = re.compile(
    rf"^{re.escape(UPSTREAM_NAME)} unavailable at \S+ \(DEADLINE_EXCEEDED\)")
MAX_RETRIED_PER_INPUTS = 1_000
"""At most one input in this many may be retried: a recorder that stalls often fails the run."""
FIT_INFO_KEYS = ("LinkZone", "maxSlice", "profiles", "index", "minor", "NetworkID", "AWSNodeType")
"""custom_info keys the vendors' fit rules read."""


@dataclass(frozen=True)
class Input:
    label: str
    method: str
    call: Callable[[], object]
    roots: tuple[str, ...]
    """What every field of a refusal must start with."""
    uid: str = ""
    node_name: str = ""


def _bound_pod(case: VendorCase, uid: str) -> Json:
    node_name = case.node["metadata"]["name"]
    return copy.deepcopy({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": f"fuzz-{case.vendor.lower()}", "uid": uid,
                     "annotations": {**case.pod_annotations, **case.annotations,
                                     "hami.io/vgpu-node": node_name}},
        "spec": {"nodeName": node_name,
                 "initContainers": [{"name": "prepare", "resources": {"limits": case.init}}],
                 "containers": [{"name": "main", "resources": {"limits": case.app}}]},
        "status": {"phase": "Running", "initContainerStatuses": [
            {"name": "prepare", "restartCount": 0, "state": {"running": {}}}]},
    })


def _unscheduled_pod(case: VendorCase, uid: str) -> Json:
    pod = _bound_pod(case, uid)
    pod["metadata"]["annotations"] = dict(case.pod_annotations)
    del pod["spec"]["nodeName"]
    pod["status"] = {"phase": "Pending"}
    return pod


POD_ROOTS = ("kubernetes_pod_json.metadata", "kubernetes_pod_json.spec",
             "kubernetes_pod_json.status")
NODE_ROOTS = ("kubernetes_node_json.metadata", "kubernetes_node_json.status", "node_name")


class Fuzzer:
    def __init__(self, stack: Stack, rng: random.Random) -> None:
        self.stack = stack
        self.rng = rng
        self.admission = admission_pb2_grpc.AdmissionStub(stack.admission)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(stack.scheduler)
        self.every_vendor = (*(spec.resources for spec in VENDORS), ACME_SPEC.resources)
        self.retried: list[str] = []
        """Each retried input's first answer."""

    # -- inputs ---------------------------------------------------------------------------------

    def make(self, number: int) -> Input:
        case = self.rng.choice(CASES)
        roll = self.rng.random()
        if roll < 0.3:
            return self.node_json(case, number)
        if roll < 0.4:
            return self.typed_inventory(case, number)
        return self.pod_json(case, number)

    def node_json(self, case: VendorCase, number: int) -> Input:
        obj = copy.deepcopy(case.node)
        name = f"fuzz-node-{number}"
        obj["metadata"]["name"] = name
        texts = [("annotation", obj["metadata"].get("annotations", {})),
                 ("label", obj["metadata"].get("labels", {})),
                 ("capacity", obj.get("status", {}).get("capacity", {}))]
        kind, where = self.rng.choice([(k, w) for k, w in texts if w])
        key = self.rng.choice(sorted(where))
        where[key] = mutate(str(where[key]), self.rng)
        request = usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(obj))
        return Input(f"{case.vendor} node {kind} {key}", "RegisterNode",
                     lambda: self.stack.recorder.RegisterNode(request, timeout=TIMEOUT_S),
                     NODE_ROOTS, node_name=name)

    def typed_inventory(self, case: VendorCase, number: int) -> Input:
        devices = [device_to_pb(d) for d in node_json.parse_node(case.node,
                                                                 self.every_vendor).devices]
        name = f"fuzz-typed-{number}"
        device = self.rng.choice(devices)
        key = self.rng.choice(sorted({*device.custom_info, *FIT_INFO_KEYS}))
        device.custom_info[key] = mutate(device.custom_info.get(key, "1"), self.rng)
        request = usage_pb2.RegisterNodeRequest(
            node_name=name, inventory=types_pb2.NodeInventory(devices=devices))
        pod = to_json(_unscheduled_pod(case, f"uid-fuzz-{number}"))

        def register_then_filter() -> object:
            self.stack.recorder.RegisterNode(request, timeout=TIMEOUT_S)
            return self.scheduler.Filter(scheduler_pb2.FilterRequest(
                kubernetes_pod_json=pod, node_names=[name]), timeout=TIMEOUT_S)

        return Input(f"{case.vendor} typed custom_info {key}", "RegisterNode+Filter",
                     register_then_filter, ("inventory.devices", "node_name"),
                     uid=f"uid-fuzz-{number}", node_name=name)

    def pod_json(self, case: VendorCase, number: int) -> Input:
        uid = f"uid-fuzz-{number}"
        pod = _bound_pod(case, uid)
        if self.rng.random() < 0.7:
            annotations = pod["metadata"]["annotations"]
            key = self.rng.choice(sorted(case.annotations))
            annotations[key] = mutate(annotations[key], self.rng)
            label = f"{case.vendor} pod annotation {key}"
        else:
            container = self.rng.choice((*pod["spec"]["initContainers"],
                                         *pod["spec"]["containers"]))
            limits = container["resources"]["limits"]
            key = self.rng.choice(sorted(limits))
            limits[key] = mutate(str(limits[key]), self.rng)
            label = f"{case.vendor} pod limit {key}"
        raw = to_json(pod)
        node_name = case.node["metadata"]["name"]
        method = self.rng.choice(("CheckQuota", "Filter", "RecordPod", "Reserve"))
        calls: dict[str, Callable[[], object]] = {
            "CheckQuota": lambda: self.admission.CheckQuota(
                admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw), timeout=TIMEOUT_S),
            "Filter": lambda: self.scheduler.Filter(scheduler_pb2.FilterRequest(
                kubernetes_pod_json=raw, node_names=[node_name]), timeout=TIMEOUT_S),
            "RecordPod": lambda: self.stack.recorder.RecordPod(
                usage_pb2.RecordPodRequest(kubernetes_pod_json=raw), timeout=TIMEOUT_S),
            "Reserve": lambda: self.stack.recorder.Reserve(usage_pb2.ReserveRequest(
                kubernetes_pod_json=raw, node_name=node_name), timeout=TIMEOUT_S),
        }
        return Input(label, method, calls[method], POD_ROOTS, uid=uid, node_name=node_name)

    # -- one answer -------------------------------------------------------------------------------

    def node_figures(self, name: str) -> bytes:
        return self.stack.recorder.GetNodeUsage(usage_pb2.GetNodeUsageRequest(
            node_names=[name]), timeout=TIMEOUT_S).SerializeToString(deterministic=True)

    def check(self, item: Input) -> tuple[str, str | None]:
        """(status code name, the failure or None)."""
        before = self.node_figures(item.node_name) if item.node_name else b""
        try:
            self.answer(item)
        except grpc.RpcError as error:
            return self.refused(item, error, before)
        self.clean_up(item)
        return "OK", None

    def answer(self, item: Input) -> None:
        """Sends the input; once more when a daemon missed its deadline on the recorder."""
        try:
            item.call()
        except grpc.RpcError as error:
            details = error.details() or ""
            if not (item.method in RETRIED_METHODS
                    and error.code() == grpc.StatusCode.UNAVAILABLE
                    and RECORDER_DEADLINE_MISSED.match(details)):
                raise
            self.retried.append(f"{item.method} ({item.label}): {details[:200]!r}")
            item.call()

    def refused(self, item: Input, error: grpc.RpcError, before: bytes) -> tuple[str, str | None]:
        code, details = error.code(), error.details() or ""
        if code != grpc.StatusCode.INVALID_ARGUMENT:
            return code.name, f"{code.name} {details[:200]!r}"
        status = rpc_status.from_call(error)
        fields: list[str] = []
        for detail in status.details if status is not None else ():
            bad_request = error_details_pb2.BadRequest()
            if detail.Unpack(bad_request):
                fields.extend(v.field for v in bad_request.field_violations)
        if not fields:
            return code.name, f"no field named: {details[:200]!r}"
        outside = [f for f in fields if not f.startswith(item.roots)]
        if outside:
            return code.name, f"fields not of the request: {outside[:3]} ({details[:160]!r})"
        if item.uid:
            found = self.stack.recorder.GetPodUsage(usage_pb2.GetPodUsageRequest(
                pod_uid=item.uid), timeout=TIMEOUT_S).found
            if found:
                return code.name, "refused, yet the pod is stored"
        if item.node_name and self.node_figures(item.node_name) != before:
            return code.name, "refused, yet the node changed"
        return code.name, None

    def clean_up(self, item: Input) -> None:
        if item.uid:
            self.stack.recorder.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=item.uid),
                                          timeout=TIMEOUT_S)


def test_every_vendors_mutated_annotations_answer_ok_or_invalid_argument_naming_the_field(
    stack: Stack,
) -> None:
    for case in CASES:
        stack.recorder.RegisterNode(usage_pb2.RegisterNodeRequest(
            kubernetes_node_json=to_json(case.node)), timeout=TIMEOUT_S)
    fuzzer = Fuzzer(stack, random.Random(SEED))
    codes: Counter[str] = Counter()
    failures: list[str] = []
    kinds: Counter[str] = Counter()
    for number in range(INPUTS):
        item = fuzzer.make(number)
        code, failure = fuzzer.check(item)
        codes[f"{item.method} {code}"] += 1
        if failure is not None:
            failures.append(f"#{number} {item.method} ({item.label}): {failure}")
            kinds[f"{item.method} {failure.split(' ', 1)[0]}"] += 1
    report("vendor fuzz", inputs=INPUTS, failures=len(failures), retried=len(fuzzer.retried),
           **{key: value for key, value in sorted(codes.items())})
    assert len(fuzzer.retried) <= INPUTS // MAX_RETRIED_PER_INPUTS, fuzzer.retried[:25]
    assert not failures, (
        f"{len(failures)} of {INPUTS} inputs failed ({dict(kinds)}); the first ones:\n"
        + "\n".join(failures[:25]))
