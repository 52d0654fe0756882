"""One object the recorder's Kubernetes source cannot read never stops it.

Poisoned pods, nodes and ResourceQuotas — ones whose text no reader takes (a number of 4,301
digits in ``hami.io/vgpu-devices-allocated``, a ``"²"`` as an Enflame DRS capacity, a 5,000-digit
``devmem`` in a Hygon DCU register annotation), ones whose metadata is not what Kubernetes
writes, and ones the store fails on with an unexpected exception — are put in the fake API
server's list and in its watch, followed by good objects. Every test checks that the good ones
after them are applied, deletions are released, the first sync completes (so a restarted
recorder becomes ready), and each skip is logged naming the object (never its content) and
counted in ``hami_accounting_source_skips_total`` / ``hami_accounting_source_skipped_objects``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from accounting.model import Pod
from accounting.policy import policy_for
from hami.accounting.v1 import usage_pb2
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    kube_node,
    kube_pod,
    kube_quota,
)
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder
from tests.usage.test_k8s_source import (
    Harness,
    RecordingSink,
    gpu_node,
    gpu_pod,
    harness,
    quota,
    started_and_synced,
    wait_until,
)
from tests.usage.test_store_k8s import (
    SERVING,
    health_status,
    namespace_mib,
    stored_mib,
    wait_for,
    write_kubeconfig,
)

__all__ = ["harness"]  # the fixture, imported for the tests below

Json = dict[str, Any]
MEM = "limits.nvidia.com/gpumem"
NINES = "9" * 4301
DCU_REGISTER = "hami.io/node-dcu-register"
DRS_CAPACITY = "enflame.com/gcu-drs-capacity"


# -- the poisons -------------------------------------------------------------------------------


def _with(obj: Json, edit: Callable[[Json], object]) -> Json:
    edit(obj)
    return obj


POISONED_PODS: dict[str, Callable[[str], Json]] = {
    # The pod: int() refused it with a ValueError, which stopped the list and the watch.
    "4301 nines as the memory of a grant": lambda uid: gpu_pod(
        uid, allocated=f"GPU-node-b-0,NVIDIA,{NINES},0:;", node="node-b"),
    "a grant's memory in superscript digits": lambda uid: gpu_pod(
        uid, allocated="GPU-0,NVIDIA,\u00b2\u00b3,0:;"),
    "a uid that is an object": lambda uid: _with(
        gpu_pod(uid), lambda obj: obj["metadata"].update(uid={"nested": uid})),
    "hami.io/vgpu-node not a string": lambda uid: _with(
        gpu_pod(uid), lambda obj: obj["metadata"]["annotations"].update(
            {"hami.io/vgpu-node": 7})),
    "containers not a list": lambda uid: _with(
        gpu_pod(uid), lambda obj: obj["spec"].update(containers={"main": {}})),
    "a quantity of a hundred thousand digits' magnitude": lambda uid: _with(
        gpu_pod(uid), lambda obj: obj["spec"]["containers"][0]["resources"]["limits"].update(
            {"nvidia.com/gpumem": "1e100000"})),
}

POISONED_NODES: dict[str, Callable[[str], Json]] = {
    "a 5000-digit devmem in a DCU register": lambda name: {"metadata": {
        "name": name, "annotations": {DCU_REGISTER: f"dcu-0,4,{'9' * 5000},100,DCU,0,true:"}}},
    "a superscript two as an Enflame DRS capacity": lambda name: {"metadata": {
        "name": name, "annotations": {DRS_CAPACITY: json.dumps(
            {"devices": [{"index": "0", "capacity": "\u00b2"}], "profiles": {"1g.6gb": "0"}})}}},
    "an NVIDIA register that is not JSON": lambda name: {"metadata": {
        "name": name, "annotations": {"hami.io/node-nvidia-register": "[{"}}},
    "an NVIDIA device id of 100,000 characters": lambda name: gpu_node(name, "G" * 100_000),
}

POISONED_QUOTAS: dict[str, Callable[[str], Json]] = {
    "a limit of 5000 digits": lambda namespace: quota(namespace, "gpu", {MEM: "9" * 5000}),
    "a limit in superscript digits": lambda namespace: quota(namespace, "gpu", {MEM: "\u00b2"}),
    "spec.hard not an object": lambda namespace: _with(
        quota(namespace, "gpu", {}), lambda obj: obj["spec"].update(hard=["limits"])),
}

RECORDER_POLICY = policy_for()
"""The recorder's default: every vendor HAMi's chart turns on (Hygon DCU and Enflame among them)."""


class ExplodingSink(RecordingSink):
    """A sink that fails with an unexpected exception (not an invalid-input one) for objects
    named ``explodes``: the source must survive whatever the store raises."""

    def record_pod(self, pod: Pod) -> object:
        if pod.name == "explodes":
            raise RuntimeError("the store broke")
        return super().record_pod(pod)

    def register_node(self, node_name: str, devices: Any) -> object:
        if node_name == "explodes":
            raise KeyError(node_name)
        return super().register_node(node_name, devices)

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> object:
        if namespace == "explodes":
            raise ZeroDivisionError("a bug")
        return super().set_quota(namespace, limits)


def skips(kind: str, reason: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "hami_accounting_source_skips_total", {"kind": kind, "reason": reason})
    return value or 0.0


def skipped_now(kind: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "hami_accounting_source_skipped_objects", {"kind": kind})
    return value or 0.0


def all_skips() -> float:
    return sum(skips(kind, reason) for kind in ("pod", "node", "resourcequota")
               for reason in ("unreadable", "refused", "failed"))


def poisoned_calls(sink: RecordingSink) -> list[tuple[str, Any]]:
    """What the sink was told about a poisoned object (a namespace whose quotas give no GPU
    limit is cleared, ``set_quota(namespace, {})``, as any such namespace is)."""
    def poisoned(call: tuple[str, Any]) -> bool:
        if call[0] == "set_quota":
            namespace, limits = call[1]
            return "poison" in namespace and bool(limits)
        return "poison" in json.dumps(call, default=str)

    return [call for call in sink.calls if poisoned(call)]


def add_poisons(server: FakeApiServer, tag: str) -> None:
    for index, poisoned in enumerate(POISONED_PODS.values()):
        pod = poisoned(f"uid-{tag}-poison-{index}")
        pod["metadata"]["name"] = f"{tag}-poison-{index}"
        server.add("pods", pod)
    for index, poisoned in enumerate(POISONED_NODES.values()):
        server.add("nodes", poisoned(f"{tag}-poison-node-{index}"))
    for index, poisoned in enumerate(POISONED_QUOTAS.values()):
        server.add("resourcequotas", poisoned(f"{tag}-poison-ns-{index}"))
    server.add("pods", gpu_pod(f"uid-{tag}-explodes", "explodes"))
    server.add("nodes", gpu_node("explodes", f"GPU-{tag}-explodes"))
    server.add("resourcequotas", quota("explodes", f"{tag}-gpu", {MEM: "1024"}))


def add_good(server: FakeApiServer, tag: str) -> None:
    server.add("pods", gpu_pod(f"uid-{tag}-good", f"{tag}-good"))
    server.add("nodes", gpu_node(f"{tag}-good-node", f"GPU-{tag}-good"))
    server.add("resourcequotas", quota(f"{tag}-good-ns", "gpu", {MEM: "2048"}))


def assert_good_applied(sink: RecordingSink, tag: str) -> None:
    wait_until(lambda: f"uid-{tag}-good" in sink.pods, "the good pod after the poisoned ones")
    wait_until(lambda: f"{tag}-good-node" in sink.nodes, "the good node")
    wait_until(lambda: sink.quotas.get(f"{tag}-good-ns") == {MEM: 2048}, "the good quota")


def assert_logged_without_content(records: list[logging.LogRecord]) -> None:
    skipped = [r for r in records if r.getMessage().startswith("skipping ")]
    assert skipped, "no skip was logged"
    for record in skipped:
        message = record.getMessage()
        assert record.__dict__["object_kind"] in ("pod", "node", "resourcequota"), message
        assert NINES[:100] not in message and "9" * 200 not in message, message[:300]
        assert "G" * 400 not in message, message[:300]
        assert "nvidia.com/gpumem" not in message or "resources.limits" in message, message
        assert len(message) < 1500, message[:300]


# -- through the source alone ------------------------------------------------------------------


def test_poisoned_objects_in_the_first_list_are_skipped_and_the_source_syncs(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="services.usage.k8s")
    add_poisons(harness.server, "listed")
    add_good(harness.server, "listed")
    before = all_skips()

    source, sink = started_and_synced(harness, sink=ExplodingSink(), policy=RECORDER_POLICY)

    assert_good_applied(sink, "listed")
    assert source.synced and sink.synced
    # Nothing of a poisoned object reached the sink, and each is counted once.
    assert poisoned_calls(sink) == []
    assert all_skips() - before == len(POISONED_PODS) + len(POISONED_NODES) + 3
    assert skips("pod", "failed") >= 1 and skips("node", "failed") >= 1
    assert skipped_now("pod") == len(POISONED_PODS) + 1
    assert skipped_now("node") == len(POISONED_NODES) + 1
    assert_logged_without_content(caplog.records)
    # The quotas whose limits do not read set no limit.
    assert not any(namespace.startswith("listed-poison-ns") for namespace in sink.quotas)


def test_poisoned_objects_in_the_watch_are_skipped_and_the_watch_goes_on(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="services.usage.k8s")
    _, sink = started_and_synced(harness, sink=ExplodingSink(), policy=RECORDER_POLICY)
    before = all_skips()

    add_poisons(harness.server, "watched")
    add_good(harness.server, "watched")

    assert_good_applied(sink, "watched")
    wait_until(lambda: all_skips() - before == len(POISONED_PODS) + len(POISONED_NODES) + 3,
               "every poisoned object counted")
    # Still the first list: no watch failed on them and none re-listed.
    for kind in ("pods", "nodes", "resourcequotas"):
        assert len(harness.server.list_requests(kind)) == 1, kind
    assert poisoned_calls(sink) == []
    assert_logged_without_content(caplog.records)
    # ... and it keeps watching.
    harness.server.add("pods", gpu_pod("uid-after-all"))
    wait_until(lambda: "uid-after-all" in sink.pods, "a pod after the poisoned ones")


# The API server keeps the uid it gave a pod: an update cannot poison that one.
@pytest.mark.parametrize("poison", sorted(set(POISONED_PODS) - {"a uid that is an object"}),
                         ids=str)
def test_a_pod_poisoned_by_an_update_keeps_its_charge_and_its_deletion_releases_it(
    harness: Harness, poison: str
) -> None:
    server = harness.server
    server.add("pods", gpu_pod("uid-victim", "victim"))
    _, sink = started_and_synced(harness)
    assert "uid-victim" in sink.pods

    poisoned = POISONED_PODS[poison]("uid-victim")
    poisoned["metadata"]["name"] = "victim"
    server.update("pods", poisoned)
    server.add("pods", gpu_pod("uid-marker"))
    wait_until(lambda: "uid-marker" in sink.pods, "the pod after the poisoned update")
    # What it was last charged stays charged: skipping it never releases another's devices.
    assert sink.count("forget_pod", "uid-victim") == 0
    assert skipped_now("pod") == 1

    server.delete("pods", "victim", "team-a")
    wait_until(lambda: "uid-victim" not in sink.pods, "the poisoned pod's deletion released")
    assert skipped_now("pod") == 0


def test_a_poisoned_node_keeps_its_inventory_until_it_reads_again_or_goes(
    harness: Harness,
) -> None:
    server = harness.server
    server.add("nodes", gpu_node("node-x", "GPU-x"))
    _, sink = started_and_synced(harness, policy=RECORDER_POLICY)
    server.update("nodes", POISONED_NODES["a 5000-digit devmem in a DCU register"]("node-x"))
    server.add("nodes", gpu_node("node-marker", "GPU-m"))
    wait_until(lambda: "node-marker" in sink.nodes, "the node after the poisoned update")
    assert [d.uuid for d in sink.nodes["node-x"]] == ["GPU-x"]
    assert skipped_now("node") == 1

    server.update("nodes", gpu_node("node-x", "GPU-x", "GPU-y"))
    wait_until(lambda: len(sink.nodes["node-x"]) == 2, "the node read again")
    assert skipped_now("node") == 0
    server.delete("nodes", "node-x")
    wait_until(lambda: "node-x" not in sink.nodes, "the node forgotten")


def test_a_watch_line_the_client_cannot_decode_relists_once_and_watches_on(
    harness: Harness,
) -> None:
    server = harness.server
    _, sink = started_and_synced(harness)
    # Not JSON: the client yields nothing for it.
    server.send_raw_watch_line("pods", b'{"type": "ADDED", "object": {')
    # JSON with an integer Python's json refuses (over 4,300 digits): the client raises.
    server.send_raw_watch_line(
        "pods", b'{"type":"ADDED","object":{"metadata":{"name":"x","resourceVersion":"1"},'
                b'"n":' + b"9" * 5000 + b"}}")
    server.add("pods", gpu_pod("uid-after-lines"))
    wait_until(lambda: "uid-after-lines" in sink.pods, "the pod after the damaged lines")
    server.add("pods", gpu_pod("uid-later"))
    wait_until(lambda: "uid-later" in sink.pods, "a later pod")
    # One list more for the line the client raised on, not one per resume.
    assert len(server.list_requests("pods")) == 2


# -- the recorder: real store, journal and gRPC health -----------------------------------------


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.start()
    yield server
    server.stop()


def _charged_pod(name: str, uid: str, allocated: str, node: str = "node1") -> Json:
    return kube_pod(name, uid=uid, namespace="team-a", node=node,
                    apps=[app_container("main", gpumem=1024)], allocation=allocated)


def test_a_restarted_recorder_with_poisoned_objects_becomes_ready_and_releases_them(
    apiserver: FakeApiServer, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    apiserver.add("nodes", kube_node("node1", [gpu_device("GPU-0")]))
    apiserver.add("resourcequotas", kube_quota("gpu", "team-a", {MEM: "24576"}))
    apiserver.add("pods", _charged_pod("held", "uid-held", allocation([("GPU-0", 1024, 0)])))
    first = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(first) == SERVING, "the first sync")
    wait_for(lambda: stored_mib(first, "uid-held") == 1024, "the held pod")
    first.stop()

    # While it is down: the held pod is poisoned, poisoned objects of every kind appear.
    apiserver.update("pods", _charged_pod("held", "uid-held", f"GPU-0,NVIDIA,{NINES},0:;"))
    apiserver.add("pods", _charged_pod("new-poison", "uid-new-poison",
                                       "GPU-0,NVIDIA,\u00b2,0:;"))
    apiserver.add("nodes", POISONED_NODES["a 5000-digit devmem in a DCU register"]("node2"))
    apiserver.add("resourcequotas", POISONED_QUOTAS["a limit of 5000 digits"]("team-b"))
    apiserver.add("pods", _charged_pod("fresh", "uid-fresh", allocation([("GPU-0", 2048, 0)])))

    second = start_recorder(kubernetes="kubeconfig", kubeconfig=kubeconfig)
    wait_for(lambda: health_status(second) == SERVING, "ready after the restart")
    wait_for(lambda: stored_mib(second, "uid-fresh") == 2048, "the good pod after the poisons")
    # The poisoned pod keeps what the journal had for it; the new poisoned one holds nothing.
    assert stored_mib(second, "uid-held") == 1024
    assert stored_mib(second, "uid-new-poison") is None
    assert namespace_mib(second) == (3072, 24576)

    apiserver.delete("pods", "held", "team-a")
    wait_for(lambda: stored_mib(second, "uid-held") is None, "the poisoned pod released")
    assert namespace_mib(second) == (2048, 24576)
    nodes = second.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    assert [n.node_name for n in nodes.nodes] == ["node1"]
