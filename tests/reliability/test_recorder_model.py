"""Model-based test of the usage recorder through gRPC: random histories of random pods, checked
after every step against an independent reference model (tests/reliability/model.py).

One in-process recorder on 127.0.0.1:0 with a journal in a temporary directory serves every
sequence; each sequence works on its own nodes, namespaces and pod uids, and forgets all its
pods at the end. A restart stops the server and starts a new one on the same journal.

Rules: a pod appears (first sight at any point of its life: "an update before its add"), its
status advances (sometimes skipping statuses, as an informer coalesces), is replayed
(duplicate), or an older status arrives after a newer one; pods are forgotten, and a late update
of a forgotten pod arrives; unknown uids are forgotten and such a uid may appear afterwards ("a
delete before its add"); quotas and node inventories change; the recorder restarts. Invariants
after every step: each pod's stored usage equals the reference (a forgotten uid is never
charged again: Kubernetes never reuses one); node and namespace totals equal the sum of the
stored per-pod usage; nothing is negative. At the end, with every pod forgotten, every total is
zero.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from services.common.config import CommonConfig
from services.usage.__main__ import UsageRecorder, start
from services.usage.config import UsageConfig
from tests.reliability.model import (
    QUOTA_KEYS,
    ContainerSpec,
    GrantSpec,
    PodSpec,
    ReferencePod,
    Snapshot,
    Usage,
    device_message,
    namespace_totals,
    node_totals,
    pod_json,
    pod_message,
    random_pod,
    timeline,
    usage_from_pb,
)
from tests.reliability.sizes import report, sized, sized_s

RPC_TIMEOUT_S = sized_s(10.0, 60.0)
"""What a call may take before the recorder is taken to have hung. One process holds the test,
Hypothesis and the recorder, and at the soak size its heap keeps growing: a full garbage
collection stops every thread of it, and on two starved cores the process gets a small share of
a CPU, so a collection that costs a fraction of a second of CPU can stop the recorder for
seconds. A deadline is a hang detector here, not a latency goal (those are in bench/);
docs/security.md has the measurements."""
# The soak size is bounded by time: a 40-step sequence makes about 9 RPCs per step (the
# invariant reads every live and forgotten pod back), and the one recorder serving every
# sequence keeps growing (nodes, namespaces, tombstones, a longer journal to recover on each
# restart). Measured on 2 cores: 5,000 sequences ran over 35 minutes without finishing; in
# `make soak`, 2,000 took 15 minutes at a load average of 1.7 and 16 at 5.
MAX_EXAMPLES = sized(150, 2000)
STEPS = sized(15, 40)
MAX_LIVE_PODS = 4
MAX_RESTARTS_PER_SEQUENCE = 1
LIFECYCLE_PATHS = (
    "Recorded", "RecordedSteadyState", "PartiallyReleased", "Shrunk", "Held",
    "InitRerunRestored", "Released", "Unchanged", "NotTracked",
)
"""The RecordPod decisions the model run must have seen answered at least once."""
MAX_TOP_UP_BATCHES = 4
"""Further batches run, at most, while a lifecycle path has not been taken."""


class RecorderDidNotAnswer(BaseException):
    """A call that ended DEADLINE_EXCEEDED or UNAVAILABLE: the recorder, or the machine under it,
    stalled. That says nothing about the history drawn, and a replay answers in time, so
    Hypothesis would report it as FlakyStrategyDefinition, hiding the call that stalled. Not an
    ``Exception``: Hypothesis neither shrinks nor replays it, and the test ends with this error
    and the seed to run the history again."""


STALLED_CODES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)


class Recorder:
    """An in-process recorder on 127.0.0.1:0 that can be restarted on the same journal."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        common = CommonConfig(
            listen_addr="127.0.0.1:0", metrics_addr=None, tls=None, log_level="WARNING"
        )
        self.app: UsageRecorder = start(
            UsageConfig(common=common, data_dir=self.data_dir, identity="model"), max_workers=4
        )
        self.channel = grpc.insecure_channel(self.app.target)
        self.stub = usage_pb2_grpc.UsageRecorderStub(self.channel)

    def restart(self) -> None:
        self.stop()
        self._start()
        self.restarts += 1

    def stop(self) -> None:
        self.channel.close()
        self.app.stop(grace_s=0)


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorder]:
    started = Recorder(tmp_path_factory.mktemp("model") / "data")
    yield started
    started.stop()


class DataChooser:
    """Choices drawn from Hypothesis, so failing histories shrink."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return low if low >= high else self.data.draw(st.integers(low, high))

    def boolean(self, percent_true: int = 50) -> bool:
        return self.data.draw(st.integers(0, 99)) < percent_true


@dataclass
class LivePod:
    spec: PodSpec
    statuses: tuple[Snapshot, ...]
    newest: int
    """Index of the newest status delivered."""
    reference: ReferencePod


_sequence_ids = itertools.count()


class RecorderMachine(RuleBasedStateMachine):
    recorder: ClassVar[Recorder]
    decisions: ClassVar[Counter[str]] = Counter()
    sequences: ClassVar[int] = 0
    steps: ClassVar[int] = 0
    rpcs: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        sequence = next(_sequence_ids)
        type(self).sequences += 1
        self.prefix = f"s{sequence}"
        self.devices = {
            f"{self.prefix}-node-a": (f"GPU-{self.prefix}-a0", f"GPU-{self.prefix}-a1"),
            f"{self.prefix}-node-b": (f"GPU-{self.prefix}-b0", f"GPU-{self.prefix}-b1"),
        }
        self.registered: set[str] = set()
        self.namespaces = (f"{self.prefix}-ns-x", f"{self.prefix}-ns-y")
        self.limits: dict[str, dict[str, int]] = {ns: {} for ns in self.namespaces}
        self.pods: dict[str, LivePod] = {}
        self.gone: dict[str, LivePod] = {}
        """Forgotten pods: late updates of theirs may still arrive."""
        self.forgotten_first: list[str] = []
        """Uids forgotten before they were ever recorded (their add may still arrive)."""
        self.uids = itertools.count()
        self.restarts = 0
        self.stalled = False
        """A call found the recorder stalled: the history stops there, unchecked."""

    # -- helpers -------------------------------------------------------------------------------

    @property
    def stub(self) -> usage_pb2_grpc.UsageRecorderStub:
        return self.recorder.stub

    def call(self, method: str, request: object) -> object:
        type(self).rpcs += 1
        started = time.perf_counter()
        try:
            return getattr(self.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() not in STALLED_CODES:  # type: ignore[attr-defined]
                raise
            self.stalled = True
            raise RecorderDidNotAnswer(
                f"{method} ended {error.code().name} after "  # type: ignore[attr-defined]
                f"{time.perf_counter() - started:.1f} s (deadline {RPC_TIMEOUT_S} s, "
                f"{self.recorder.restarts} restarts so far, load average "
                f"{os.getloadavg()[0]:.1f}): {error.details()}"  # type: ignore[attr-defined]
            ) from error

    def deliver(self, pod: LivePod, index: int, as_json: bool) -> None:
        """Sends the pod's status ``index`` and checks the answer against the reference."""
        snapshot = pod.statuses[index]
        if as_json:
            request = usage_pb2.RecordPodRequest(kubernetes_pod_json=pod_json(pod.spec, snapshot))
        else:
            request = usage_pb2.RecordPodRequest(pod=pod_message(pod.spec, snapshot))
        response = self.call("RecordPod", request)
        type(self).decisions[response.decision] += 1
        pod.reference.apply(snapshot)
        expected = pod.reference
        assert response.tracked == expected.tracked, (response, expected)
        assert usage_from_pb(response.stored) == expected.usage, (response, expected)

    def pick(self, data: st.DataObject) -> LivePod:
        return self.pods[data.draw(st.sampled_from(sorted(self.pods)), label="pod")]

    def inventory(self, node: str, data: st.DataObject | None) -> types_pb2.NodeInventory:
        devices = [device_message(uuid, index) for index, uuid in enumerate(self.devices[node])]
        if data is not None:
            for device in devices:
                device.memory_total_mib = data.draw(st.sampled_from([8192, 24576, 81920]))
                device.slots_total = data.draw(st.integers(1, 64))
            if data.draw(st.booleans(), label="extra device"):
                devices.append(device_message(f"{node}-extra", len(devices)))
        return types_pb2.NodeInventory(devices=devices)

    # -- rules ---------------------------------------------------------------------------------

    @initialize()
    def register_first_node(self) -> None:
        node = f"{self.prefix}-node-a"
        self.call("RegisterNode", usage_pb2.RegisterNodeRequest(
            node_name=node, inventory=self.inventory(node, None)))
        self.registered.add(node)

    @precondition(lambda self: len(self.pods) < MAX_LIVE_PODS)
    @rule(data=st.data())
    def pod_appears(self, data: st.DataObject) -> None:
        choose = DataChooser(data)
        uid = f"{self.prefix}-uid-{next(self.uids)}"
        # "A delete before its add": the add of a uid already forgotten.
        deleted_first = bool(self.forgotten_first) and choose.boolean(30)
        if deleted_first:
            uid = self.forgotten_first.pop(choose.integer(0, len(self.forgotten_first) - 1))
        namespace = self.namespaces[choose.integer(0, 1)]
        node = sorted(self.devices)[choose.integer(0, 1)]
        spec = random_pod(choose, uid, namespace, node, self.devices[node])
        statuses = timeline(choose, spec)
        # Usually the add; sometimes the first thing seen is a later update.
        first = 0 if choose.boolean(60) else choose.integer(0, len(statuses) - 1)
        pod = LivePod(spec, statuses, first, ReferencePod(spec))
        if deleted_first:
            pod.reference.forget()
        self.pods[uid] = pod
        self.deliver(pod, first, data.draw(st.booleans(), label="as json"))

    @precondition(lambda self: any(p.newest < len(p.statuses) - 1 for p in self.pods.values()))
    @rule(data=st.data())
    def status_advances(self, data: st.DataObject) -> None:
        candidates = sorted(u for u, p in self.pods.items() if p.newest < len(p.statuses) - 1)
        pod = self.pods[data.draw(st.sampled_from(candidates), label="pod")]
        # An informer may coalesce updates: the next status seen can skip a few.
        pod.newest = min(len(pod.statuses) - 1, pod.newest + data.draw(st.integers(1, 3)))
        self.deliver(pod, pod.newest, data.draw(st.booleans(), label="as json"))

    @precondition(lambda self: any(p.newest < len(p.statuses) - 1 for p in self.pods.values()))
    @rule(data=st.data())
    def informer_catches_up(self, data: st.DataObject) -> None:
        # An informer back from a pause: the rest of one pod's life arrives in order in one step,
        # a few updates coalesced. Each status is checked as it lands, and long lives (init
        # containers released one by one, a re-created sandbox) are walked to their end within
        # the steps of one sequence.
        candidates = sorted(u for u, p in self.pods.items() if p.newest < len(p.statuses) - 1)
        pod = self.pods[data.draw(st.sampled_from(candidates), label="pod")]
        as_json = data.draw(st.booleans(), label="as json")
        while pod.newest < len(pod.statuses) - 1:
            pod.newest = min(len(pod.statuses) - 1, pod.newest + data.draw(st.integers(1, 2)))
            self.deliver(pod, pod.newest, as_json)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def status_replayed(self, data: st.DataObject) -> None:
        pod = self.pick(data)
        self.deliver(pod, pod.newest, data.draw(st.booleans(), label="as json"))

    @precondition(lambda self: any(p.newest > 0 for p in self.pods.values()))
    @rule(data=st.data())
    def older_status_arrives_late(self, data: st.DataObject) -> None:
        candidates = sorted(u for u, p in self.pods.items() if p.newest > 0)
        pod = self.pods[data.draw(st.sampled_from(candidates), label="pod")]
        index = data.draw(st.integers(0, pod.newest - 1), label="older status")
        self.deliver(pod, index, data.draw(st.booleans(), label="as json"))

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def pod_forgotten(self, data: st.DataObject) -> None:
        pod = self.pick(data)
        response = self.call("ForgetPod", usage_pb2.ForgetPodRequest(pod_uid=pod.spec.uid))
        assert response.found == pod.reference.tracked, (response, pod.reference)
        assert usage_from_pb(response.released) == pod.reference.usage
        del self.pods[pod.spec.uid]
        pod.reference.forget()
        self.gone[pod.spec.uid] = pod

    @precondition(lambda self: bool(self.gone))
    @rule(data=st.data())
    def late_update_of_a_forgotten_pod(self, data: st.DataObject) -> None:
        # A retried or reordered update after the delete: Kubernetes never reuses a uid, so it
        # charges nothing.
        pod = self.gone[data.draw(st.sampled_from(sorted(self.gone)), label="forgotten pod")]
        index = data.draw(st.integers(0, len(pod.statuses) - 1), label="status")
        self.deliver(pod, index, data.draw(st.booleans(), label="as json"))

    @rule(data=st.data(), change=st.sampled_from(
        ["quota", "node", "unknown pod forgotten", "recorder restarts"]))
    def environment_changes(self, data: st.DataObject, change: str) -> None:
        # One rule for the four, so that pod events make up most of each sequence.
        if change == "quota":
            self.quota_changes(data)
        elif change == "node":
            self.node_changes(data)
        elif change == "unknown pod forgotten":
            self.unknown_pod_forgotten()
        elif self.restarts < MAX_RESTARTS_PER_SEQUENCE:
            self.recorder.restart()
            self.restarts += 1

    def unknown_pod_forgotten(self) -> None:
        # "A delete before its add": nothing is stored, nothing changes.
        uid = f"{self.prefix}-uid-{next(self.uids)}"
        response = self.call("ForgetPod", usage_pb2.ForgetPodRequest(pod_uid=uid))
        assert not response.found and not response.released
        self.forgotten_first.append(uid)

    def quota_changes(self, data: st.DataObject) -> None:
        namespace = data.draw(st.sampled_from(self.namespaces), label="namespace")
        keys = data.draw(st.lists(st.sampled_from(sorted(QUOTA_KEYS)), unique=True, max_size=3))
        limits = {key: data.draw(st.integers(0, 200_000), label=key) for key in keys}
        response = self.call("SetQuota", usage_pb2.SetQuotaRequest(namespace=namespace,
                                                                   limits=limits))
        self.limits[namespace] = {QUOTA_KEYS[key]: value for key, value in limits.items()}
        got = {item.resource: item.limit for item in response.items if item.limit_set}
        assert got == self.limits[namespace]

    def node_changes(self, data: st.DataObject) -> None:
        # Registers node b late (pods may already be charged there) or changes an inventory.
        node = data.draw(st.sampled_from(sorted(self.devices)), label="node")
        self.call("RegisterNode", usage_pb2.RegisterNodeRequest(
            node_name=node, inventory=self.inventory(node, data)))
        self.registered.add(node)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def totals_match_the_stored_pods_and_the_reference(self) -> None:
        type(self).steps += 1
        stored: dict[str, Usage] = {}
        for uid, pod in self.pods.items():
            response = self.call("GetPodUsage", usage_pb2.GetPodUsageRequest(pod_uid=uid))
            expected = pod.reference
            assert response.found == expected.tracked, (uid, response, expected)
            usage = usage_from_pb(response.stored)
            assert usage == expected.usage, (uid, usage, expected)
            if response.found:
                assert (response.namespace, response.node_name) == (
                    pod.spec.namespace, pod.spec.node)
                stored[uid] = usage
        for uid in [*self.gone, *self.forgotten_first]:
            response = self.call("GetPodUsage", usage_pb2.GetPodUsageRequest(pod_uid=uid))
            assert not response.found, (uid, response)
        self.check_totals(stored)

    def check_totals(self, stored: dict[str, Usage]) -> None:
        for namespace in self.namespaces:
            response = self.call("GetNamespaceUsage",
                                 usage_pb2.GetNamespaceUsageRequest(namespace=namespace))
            used = {item.resource: item.used for item in response.items if item.used}
            assert all(item.used >= 0 for item in response.items), response
            mine = [u for uid, u in stored.items() if self.pods[uid].spec.namespace == namespace]
            assert used == namespace_totals(mine), (namespace, used, mine)
            limits = {item.resource: item.limit for item in response.items if item.limit_set}
            assert limits == self.limits[namespace]
        response = self.call("GetNodeUsage",
                             usage_pb2.GetNodeUsageRequest(node_names=sorted(self.devices)))
        assert set(response.unknown_node_names) == set(self.devices) - self.registered
        for node in response.nodes:
            on_node = [uid for uid in stored if self.pods[uid].spec.node == node.node_name]
            assert sorted(node.pod_uids) == sorted(on_node), node
            charged = {
                d.uuid: (d.memory_used_mib, d.cores_used, d.slots_used) for d in node.devices
                if (d.memory_used_mib, d.cores_used, d.slots_used) != (0, 0, 0)
            }
            assert all(min(v) >= 0 for v in charged.values()), node
            assert charged == node_totals(stored[uid] for uid in on_node), node

    def teardown(self) -> None:
        if self.stalled:
            # The step in flight was cut off: its pod's reference may be ahead of the recorder,
            # and a failed assertion here would stand in for the stall.
            return
        # Every pod forgotten: every total is zero.
        for uid in list(self.pods):
            self.call("ForgetPod", usage_pb2.ForgetPodRequest(pod_uid=uid))
        self.pods.clear()
        self.check_totals({})


@pytest.fixture
def quiet_recorder_logs() -> Iterator[None]:
    # Random grants overcommit small cards on purpose; the warning per record is expected.
    logger = logging.getLogger("services")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


_MODEL_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # Explaining a failure traces every line (sys.settrace on 3.11): far too slow here.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)


def _paths_not_taken() -> list[str]:
    return [path for path in LIFECYCLE_PATHS if not RecorderMachine.decisions[path]]


@pytest.mark.slow
@pytest.mark.timeout(sized(300, 2700))
@pytest.mark.usefixtures("quiet_recorder_logs")
def test_recorder_matches_the_reference_model(recorder: Recorder) -> None:
    RecorderMachine.recorder = recorder
    RecorderMachine.sequences = RecorderMachine.steps = RecorderMachine.rpcs = 0
    RecorderMachine.decisions = Counter()
    started = time.perf_counter()
    run_state_machine_as_test(RecorderMachine, settings=_MODEL_SETTINGS)
    batches = 1
    # Hypothesis draws the sequences at random, and a few lifecycle paths (a shrink released in
    # part, an init re-run restored) come up only a handful of times in a CI-sized batch, now
    # and then not at all: further batches run until each has been taken, a few at most.
    while _paths_not_taken() and batches <= MAX_TOP_UP_BATCHES:
        run_state_machine_as_test(RecorderMachine, settings=_MODEL_SETTINGS)
        batches += 1
    report(
        "model-based recorder",
        sequences=RecorderMachine.sequences,
        batches=batches,
        steps=RecorderMachine.steps,
        rpcs=RecorderMachine.rpcs,
        restarts=recorder.restarts,
        seconds=round(time.perf_counter() - started, 1),
        decisions=dict(sorted(RecorderMachine.decisions.items())),
    )
    assert RecorderMachine.sequences >= MAX_EXAMPLES
    # Every lifecycle path was taken, not just the easy ones.
    assert not _paths_not_taken(), (_paths_not_taken(), RecorderMachine.decisions)


def test_a_forgotten_uid_is_never_charged_again(recorder: Recorder) -> None:
    stub = recorder.stub
    node, uuid = "tombstone-node", "GPU-tombstone"
    stub.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name=node, inventory=types_pb2.NodeInventory(devices=[device_message(uuid, 0)])),
        timeout=RPC_TIMEOUT_S)
    running = Snapshot("Running")
    late = PodSpec("uid-late", "tombstone-ns", "late", node,
                   (ContainerSpec("app", "app", (GrantSpec(uuid, 4096, 10),)),))
    early_delete = PodSpec("uid-early-delete", "tombstone-ns", "early", node, late.containers)

    # A late update after the delete.
    stub.RecordPod(usage_pb2.RecordPodRequest(pod=pod_message(late, running)),
                   timeout=RPC_TIMEOUT_S)
    stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=late.uid), timeout=RPC_TIMEOUT_S)
    stub.RecordPod(usage_pb2.RecordPodRequest(pod=pod_message(late, running)),
                   timeout=RPC_TIMEOUT_S)
    # A delete seen before its add.
    stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=early_delete.uid), timeout=RPC_TIMEOUT_S)
    stub.RecordPod(usage_pb2.RecordPodRequest(pod=pod_message(early_delete, running)),
                   timeout=RPC_TIMEOUT_S)
    try:
        for uid in (late.uid, early_delete.uid):
            found = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                     timeout=RPC_TIMEOUT_S).found
            assert not found, f"deleted pod {uid} is charged again"
    finally:
        for uid in (late.uid, early_delete.uid):
            stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S)


class _StallsOnce:
    """The recorder's stub (its current one: a restart replaces it) with one call, the
    ``at``-th, given a deadline already past: a stall that a replay of the history does not
    meet."""

    def __init__(self, recorder: Recorder, at: int) -> None:
        self._recorder = recorder
        self._at = at
        self.calls = 0

    def __getattr__(self, method: str) -> Callable[..., object]:
        send = getattr(self._recorder.stub, method)

        def call(request: object, timeout: float) -> object:
            self.calls += 1
            return send(request, timeout=-1.0 if self.calls == self._at else timeout)

        return call


def test_a_stalled_call_ends_the_run_as_itself(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = _StallsOnce(recorder, at=12)
    monkeypatch.setattr(RecorderMachine, "recorder", recorder, raising=False)
    monkeypatch.setattr(RecorderMachine, "stub", property(lambda _self: stub))
    quick = settings(_MODEL_SETTINGS, max_examples=5, stateful_step_count=5)
    with pytest.raises(RecorderDidNotAnswer, match=r"ended DEADLINE_EXCEEDED after"):
        run_state_machine_as_test(RecorderMachine, settings=quick)
    assert stub.calls >= 12
