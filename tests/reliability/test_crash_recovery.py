"""Crash test: a stream of events against a recorder process that is SIGKILLed at random
moments; after every restart the state equals the replay of every acknowledged event.

The test keeps its own model (tests/reliability/model.py), applying an event only when its RPC
returned OK. The one event whose RPC failed because of the kill may or may not have been
applied: the restarted recorder must equal the model without it or the model with it — nothing
half-applied, nothing acknowledged lost. Every acknowledged RecordPod answer is also checked
against the reference model as it arrives.

Events: pods appear (RecordPod, typed or Kubernetes JSON, or Reserve of their grants), their
statuses advance, are replayed or arrive late; pods and unknown uids are forgotten, and late
updates of forgotten pods (or the add of a uid forgotten first) arrive, which must charge
nothing, also after a restart; quotas and node inventories change. Kills are planned at random
event indices and land a random 0-2 ms later, so some hit an RPC in flight (before, during or
after its journal commit) and some hit an idle recorder.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from tests.reliability.daemons import Daemon, clean_env
from tests.reliability.model import (
    QUOTA_KEYS,
    PodSpec,
    RandomChooser,
    ReferencePod,
    Snapshot,
    device_message,
    namespace_totals,
    node_totals,
    pod_json,
    pod_message,
    random_pod,
    remaining_usage,
    timeline,
    usage_from_pb,
)
from tests.reliability.sizes import report, sized

pytestmark = [pytest.mark.slow, pytest.mark.timeout(sized(300, 1800))]

EVENTS = sized(1_000, 10_000)
KILLS = sized(12, 60)
SEED = 20260901
RPC_TIMEOUT_S = 10.0
NODES = {f"crash-node-{n}": (f"GPU-crash-{n}-0", f"GPU-crash-{n}-1") for n in range(3)}
NAMESPACES = ("crash-a", "crash-b", "crash-c")
MAX_LIVE_PODS = 40
RECENTLY_FORGOTTEN = 50


@dataclass(frozen=True)
class Event:
    kind: str
    uid: str = ""
    index: int = 0
    as_json: bool = False
    namespace: str = ""
    limits: tuple[tuple[str, int], ...] = ()
    node: str = ""
    memory_mib: tuple[int, ...] = ()


@dataclass
class Track:
    spec: PodSpec
    statuses: tuple[Snapshot, ...]
    newest: int
    ref: ReferencePod


@dataclass
class Model:
    """What the recorder must hold: the replay of every acknowledged event."""

    pods: dict[str, Track] = field(default_factory=dict)
    gone: dict[str, Track] = field(default_factory=dict)
    """Recently forgotten pods (late updates of theirs may arrive), oldest first."""
    forgotten_first: list[str] = field(default_factory=list)
    """Uids forgotten before any record, acknowledged (their add may arrive)."""
    limbo: list[str] = field(default_factory=list)
    """Uids whose forget was in flight at a kill and is undecidable from the answers (an
    untracked pod leaves no trace but its tombstone): checked as not stored, never used again."""
    frozen: set[str] = field(default_factory=set)
    """Live pods whose last update was in flight at a kill and left no visible difference
    (it may still have moved, say, the restart counts seen): no more updates are sent for them,
    so the model cannot drift; they are still checked, and forgotten."""
    limits: dict[str, dict[str, int]] = field(default_factory=dict)
    nodes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """node -> memory total of each of its devices."""

    def copy(self) -> Model:
        return Model(
            {uid: replace(t, ref=t.ref.copy()) for uid, t in self.pods.items()},
            {uid: replace(t, ref=t.ref.copy()) for uid, t in self.gone.items()},
            list(self.forgotten_first),
            list(self.limbo),
            set(self.frozen),
            {ns: dict(limits) for ns, limits in self.limits.items()},
            dict(self.nodes),
        )

    def track(self, uid: str) -> Track:
        return self.pods[uid] if uid in self.pods else self.gone[uid]

    def apply(self, event: Event, response: Any = None) -> None:
        """Applies an event; ``response`` (when acknowledged) is checked against the model."""
        if event.kind == "record":
            track = self.track(event.uid)
            track.ref.apply(track.statuses[event.index])
            if response is not None:
                assert response.tracked == track.ref.tracked, (event, response, track.ref)
                assert usage_from_pb(response.stored) == track.ref.usage, (event, response)
        elif event.kind == "reserve":
            ref = self.pods[event.uid].ref
            # In flight (no response) the only state that differs from "not applied" is the
            # reserved one; a refusal changes nothing. A forgotten uid is never reserved.
            if not ref.forgotten and (response is None or response.reserved):
                ref.tracked, ref.finished, ref.restarts_seen = True, 0, 0
                ref.usage = remaining_usage(ref.spec, 0)
                if response is not None:
                    assert usage_from_pb(response.stored) == ref.usage, (event, response)
        elif event.kind == "forget":
            track = self.pods.pop(event.uid)
            self.frozen.discard(event.uid)
            if response is not None:
                assert response.found == track.ref.tracked, (event, response, track.ref)
                assert usage_from_pb(response.released) == track.ref.usage, (event, response)
            track.ref.forget()
            self.gone[event.uid] = track
            while len(self.gone) > RECENTLY_FORGOTTEN:
                self.limbo = [*self.limbo, next(iter(self.gone))][-RECENTLY_FORGOTTEN:]
                del self.gone[next(iter(self.gone))]
        elif event.kind == "forget-unknown":
            if response is not None:
                assert not response.found, (event, response)
                self.forgotten_first = [*self.forgotten_first, event.uid][-RECENTLY_FORGOTTEN:]
        elif event.kind == "quota":
            self.limits[event.namespace] = {QUOTA_KEYS[k]: v for k, v in event.limits}
        elif event.kind == "node":
            self.nodes[event.node] = event.memory_mib
        else:
            raise AssertionError(event)

    def view(self) -> dict[str, Any]:
        """Everything the recorder answers, as the model predicts it."""
        tracked = {uid: t for uid, t in self.pods.items() if t.ref.tracked}
        view: dict[str, Any] = {}
        for uid, track in self.pods.items():
            view[f"pod {uid}"] = (track.ref.tracked, track.ref.usage)
        for uid in [*self.gone, *self.forgotten_first, *self.limbo]:
            view[f"pod {uid}"] = (False, {})
        for namespace in NAMESPACES:
            used = namespace_totals(
                t.ref.usage for t in tracked.values() if t.spec.namespace == namespace)
            view[f"namespace {namespace}"] = (used, self.limits.get(namespace, {}))
        for node, memory in self.nodes.items():
            on_node = sorted(uid for uid, t in tracked.items() if t.spec.node == node)
            charged = node_totals(tracked[uid].ref.usage for uid in on_node)
            view[f"node {node}"] = (
                dict(zip(NODES[node], memory, strict=True)), charged, on_node)
        return view


def observed(stub: usage_pb2_grpc.UsageRecorderStub, model: Model) -> dict[str, Any]:
    """What the recorder answers, in the shape of ``Model.view``."""
    view: dict[str, Any] = {}
    for uid in [*model.pods, *model.gone, *model.forgotten_first, *model.limbo]:
        response = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                    timeout=RPC_TIMEOUT_S)
        view[f"pod {uid}"] = (response.found, usage_from_pb(response.stored))
    for namespace in NAMESPACES:
        response = stub.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S)
        assert all(item.used >= 0 for item in response.items), response
        view[f"namespace {namespace}"] = (
            {item.resource: item.used for item in response.items if item.used},
            {item.resource: item.limit for item in response.items if item.limit_set},
        )
    response = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=sorted(NODES)),
                                 timeout=RPC_TIMEOUT_S)
    for node in response.nodes:
        view[f"node {node.node_name}"] = (
            {d.uuid: d.memory_total_mib for d in node.devices},
            {d.uuid: (d.memory_used_mib, d.cores_used, d.slots_used) for d in node.devices
             if (d.memory_used_mib, d.cores_used, d.slots_used) != (0, 0, 0)},
            sorted(node.pod_uids),
        )
    return view


def _difference(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    keys = sorted(set(expected) | set(actual))
    return "\n".join(f"  {key}: expected {expected.get(key)!r}, got {actual.get(key)!r}"
                     for key in keys if expected.get(key) != actual.get(key))


class EventSource:
    """Generates the next event from the model's state (seeded, reproducible)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.choose = RandomChooser(rng)
        self.next_uid = 0

    def new_uid(self) -> str:
        self.next_uid += 1
        return f"crash-uid-{self.next_uid}"

    def next(self, model: Model) -> tuple[Event, Track | None]:
        """The next event, and the new pod it introduces (added to the model by the caller)."""
        rng = self.rng
        roll = rng.randrange(100)
        live = sorted(model.pods)
        active = [uid for uid in live if uid not in model.frozen]
        if live and (not active or len(active) < len(live) // 2) and roll >= 12:
            return Event("forget", rng.choice(sorted(model.frozen))), None
        if not live or (roll < 12 and len(live) < MAX_LIVE_PODS):
            uid = self.new_uid()
            deleted_first = bool(model.forgotten_first) and rng.randrange(5) == 0
            if deleted_first:
                # "A delete before its add": the add of a uid already forgotten.
                uid = model.forgotten_first.pop(rng.randrange(len(model.forgotten_first)))
            namespace = rng.choice(NAMESPACES)
            node = rng.choice(sorted(NODES))
            spec = random_pod(self.choose, uid, namespace, node, NODES[node])
            statuses = timeline(self.choose, spec)
            ref = ReferencePod(spec)
            if deleted_first:
                ref.forget()
            if rng.randrange(4) == 0:
                return Event("reserve", uid), Track(spec, statuses, 0, ref)
            first = 0 if rng.randrange(3) else rng.randrange(len(statuses))
            return Event("record", uid, first, rng.random() < 0.5), Track(spec, statuses, first,
                                                                          ref)
        if roll < 60:
            track = model.pods[rng.choice(active)]
            track.newest = min(len(track.statuses) - 1, track.newest + rng.randint(1, 2))
            return Event("record", track.spec.uid, track.newest, rng.random() < 0.5), None
        if roll < 68:
            track = model.pods[rng.choice(active)]
            return Event("record", track.spec.uid, track.newest, rng.random() < 0.5), None
        if roll < 76:
            track = model.pods[rng.choice(active)]
            return Event("record", track.spec.uid, rng.randint(0, track.newest),
                         rng.random() < 0.5), None
        if roll < 87:
            return Event("forget", rng.choice(live)), None
        if roll < 90 and model.gone:
            track = model.gone[rng.choice(sorted(model.gone))]
            return Event("record", track.spec.uid, rng.randrange(len(track.statuses)),
                         rng.random() < 0.5), None
        if roll < 93:
            return Event("forget-unknown", self.new_uid()), None
        if roll < 97:
            keys = rng.sample(sorted(QUOTA_KEYS), rng.randint(0, 3))
            limits = tuple((key, rng.randrange(0, 400_000)) for key in sorted(keys))
            return Event("quota", namespace=rng.choice(NAMESPACES), limits=limits), None
        node = rng.choice(sorted(NODES))
        memory = tuple(rng.choice((24576, 49152, 81920)) for _ in NODES[node])
        return Event("node", node=node, memory_mib=memory), None


def request_for(event: Event, model: Model) -> tuple[str, Any]:
    if event.kind in ("record", "reserve"):
        track = model.track(event.uid)
        snapshot = track.statuses[event.index]
        if event.kind == "reserve":
            return "Reserve", usage_pb2.ReserveRequest(
                pod=pod_message(track.spec, snapshot), node_name=track.spec.node)
        if event.as_json:
            return "RecordPod", usage_pb2.RecordPodRequest(
                kubernetes_pod_json=pod_json(track.spec, snapshot))
        return "RecordPod", usage_pb2.RecordPodRequest(pod=pod_message(track.spec, snapshot))
    if event.kind in ("forget", "forget-unknown"):
        return "ForgetPod", usage_pb2.ForgetPodRequest(pod_uid=event.uid)
    if event.kind == "quota":
        return "SetQuota", usage_pb2.SetQuotaRequest(namespace=event.namespace,
                                                     limits=dict(event.limits))
    devices = [device_message(uuid, index, memory_mib=memory)
               for index, (uuid, memory) in enumerate(zip(NODES[event.node], event.memory_mib,
                                                           strict=True))]
    return "RegisterNode", usage_pb2.RegisterNodeRequest(
        node_name=event.node, inventory=types_pb2.NodeInventory(devices=devices))


class Recorder:
    """The recorder process and a client to its current incarnation."""

    def __init__(self, workdir: Path) -> None:
        # Random grants overcommit cards on purpose: only errors are worth a log line here.
        self.daemon = Daemon("usage", workdir, clean_env(
            HAMI_ACCOUNTING_DATA_DIR=str(workdir / "data"), HAMI_ACCOUNTING_LOG_LEVEL="ERROR"))
        self.channel: grpc.Channel | None = None
        self.stub: usage_pb2_grpc.UsageRecorderStub

    def start(self) -> None:
        self.daemon.start()
        self.channel = grpc.insecure_channel(self.daemon.addr)
        self.stub = usage_pb2_grpc.UsageRecorderStub(self.channel)

    def close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    started = Recorder(tmp_path)
    yield started
    started.close_channel()
    started.daemon.kill()


def test_every_acknowledged_event_survives_sigkill(recorder: Recorder) -> None:
    rng = random.Random(SEED)
    source = EventSource(rng)
    model = Model()
    kill_at = sorted(rng.sample(range(10, EVENTS), KILLS))
    kills = in_flight_applied = in_flight_not_applied = in_flight_no_difference = 0
    restart_s = 0.0
    started = time.perf_counter()
    recorder.start()
    for node, uuids in NODES.items():
        event = Event("node", node=node, memory_mib=(81920,) * len(uuids))
        method, request = request_for(event, model)
        model.apply(event, getattr(recorder.stub, method)(request, timeout=RPC_TIMEOUT_S))

    def verify(candidates: list[Model]) -> list[int]:
        matching = []
        for number, candidate in enumerate(candidates):
            # Each candidate names its own pods (a forget moves a uid to `gone`).
            if candidate.view() == observed(recorder.stub, candidate):
                matching.append(number)
        if matching:
            return matching
        raise AssertionError(
            f"after restart {recorder.daemon.starts - 1} the recorder matches neither the "
            "model without the in-flight event nor the model with it:\n"
            + _difference(candidates[-1].view(), observed(recorder.stub, candidates[-1]))
            + f"\nlog:\n{recorder.daemon.log_tail()}")

    killer: threading.Timer | None = None
    for index in range(EVENTS):
        if killer is None and kill_at and index >= kill_at[0]:
            kill_at.pop(0)
            process = recorder.daemon.process
            assert process is not None
            killer = threading.Timer(rng.uniform(0, 0.002), process.kill)
            killer.start()
        event, new_pod = source.next(model)
        if new_pod is not None:
            model.pods[new_pod.spec.uid] = new_pod
        method, request = request_for(event, model)
        try:
            response = getattr(recorder.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            if killer is not None:
                killer.join()
            process = recorder.daemon.process
            assert process is not None
            try:
                process.wait(timeout=10)
            except Exception:
                raise AssertionError(
                    f"event {index} {event} failed without a kill: {error.code()} "
                    f"{error.details()}\n{recorder.daemon.log_tail()}") from None
            kills += 1
            recorder.close_channel()
            restart_started = time.perf_counter()
            recorder.start()
            restart_s += time.perf_counter() - restart_started
            with_event = model.copy()
            with_event.apply(event)
            matching = verify([model, with_event])
            if matching == [1]:
                model = with_event
                in_flight_applied += 1
            elif matching == [0]:
                in_flight_not_applied += 1
            else:
                in_flight_no_difference += 1
                if event.uid in model.pods and event.kind == "record":
                    model.frozen.add(event.uid)
                if event.kind in ("forget", "forget-unknown"):
                    # Whether its tombstone was written leaves no other trace: retire the uid.
                    model = with_event
                    model.gone.pop(event.uid, None)
                    if event.uid in model.forgotten_first:
                        model.forgotten_first.remove(event.uid)
                    model.limbo = [*model.limbo, event.uid][-RECENTLY_FORGOTTEN:]
            killer = None
            continue
        model.apply(event, response)

    if killer is not None:
        killer.join()
    if not recorder.daemon.alive:
        kills += 1
        recorder.close_channel()
        recorder.start()
    verify([model])
    # A clean stop and start changes nothing either.
    recorder.close_channel()
    assert recorder.daemon.stop() == 0
    recorder.start()
    verify([model])
    # Every pod forgotten: every total is zero.
    for uid in list(model.pods):
        model.apply(Event("forget", uid),
                    recorder.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=uid),
                                            timeout=RPC_TIMEOUT_S))
    verify([model])
    report(
        "crash recovery",
        events=EVENTS,
        kills_survived=kills,
        in_flight_applied=in_flight_applied,
        in_flight_not_applied=in_flight_not_applied,
        in_flight_no_difference=in_flight_no_difference,
        mean_restart_s=round(restart_s / max(kills, 1), 2),
        seconds=round(time.perf_counter() - started, 1),
    )
    assert kills >= KILLS
