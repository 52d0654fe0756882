"""``hami-accounting demo``: walks the design's seed cases through a running stack.

Layer: services/cli (a subcommand, a client tool). Talks to the three daemons over gRPC only,
exactly as HAMi would: registers the node ``demo-node-1`` with one 24 GiB GPU, sets the quota of
namespace ``demo`` to 24576 MiB, then

1. CheckQuota of init 30720 + app 4096 MiB: denied (the init container alone exceeds the quota);
2. CheckQuota of init 20480 + app 10240 MiB: allowed (effective 20480), with the pod's
   traceparent, which goes into the annotation ``hami.io/traceparent``; Filter places it;
3. RecordPod of the bound pod: 20480 MiB stored, not 30720;
4. RecordPod once the init container finished with exit code 0: shrunk to 10240 MiB, so a new
   12288 MiB pod passes CheckQuota and Filter;
5. native sidecars: a 2048 MiB sidecar declared before the 20480 MiB init container runs beside
   it (effective 22528); declared after it, it does not (effective 20480);
6. ForgetPod of both pods: the node and the namespace are back to 0.

Every run uses fresh pod uids and forgets the pods it created (also when a step fails), so it
can be run again and again; pods an interrupted earlier run left on ``demo-node-1`` are forgotten
first. The node and the quota stay (they are set again on each run). Before the walk, each
daemon's gRPC health is asked: when one does not answer, the demo says which and how to start
the stack, and walks nothing. Exit code 0 when every figure matched, 1 otherwise (the differing
checks, or the call the walk stopped at, are listed), 2 on bad arguments or a daemon that does
not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.cli.options import add_addr_option
from services.common.config import DEFAULT_PORTS, ConfigError, TlsConfig
from services.common.server import client_channel

NODE = "demo-node-1"
NAMESPACE = "demo"
GPU_UUID = "GPU-demo-node-1-0"
GPU_MIB = 24576
QUOTA_MIB = 24576
GPUMEM = "nvidia.com/gpumem"
TRACEPARENT = "hami.io/traceparent"
NODE_REGISTER = "hami.io/node-nvidia-register"
CALL_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0
"""How long each daemon's health check may take before the demo calls it silent."""

EXIT_OK = 0
EXIT_DIFFERED = 1
EXIT_USAGE = 2

Json = dict[str, Any]
_T = TypeVar("_T")


# -- Kubernetes objects, as Go's json.Marshal writes them ---------------------------------------


def _container(name: str, gpumem: int, *, sidecar: bool = False) -> Json:
    container: Json = {
        "name": name,
        "image": "busybox",
        "resources": {"limits": {"nvidia.com/gpu": "1", GPUMEM: str(gpumem)}},
    }
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


def _status(name: str, state: str, exit_code: int = 0) -> Json:
    states: Mapping[str, Json] = {
        "waiting": {"waiting": {"reason": "PodInitializing"}},
        "running": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        "terminated": {"terminated": {"exitCode": exit_code, "reason": "Completed"}},
    }
    return {
        "name": name,
        "state": dict(states[state]),
        "restartCount": 0,
        "ready": state == "running",
    }


@dataclass
class DemoPod:
    """A pod of the demo: its spec, and the annotations and status it gathers on the way."""

    name: str
    uid: str
    init: list[Json]
    apps: list[Json]
    annotations: dict[str, str] = field(default_factory=dict)
    node: str = ""
    phase: str = "Pending"
    init_statuses: list[Json] = field(default_factory=list)
    app_statuses: list[Json] = field(default_factory=list)

    def to_json(self) -> bytes:
        spec: Json = {"containers": self.apps}
        if self.init:
            spec["initContainers"] = self.init
        if self.node:
            spec["nodeName"] = self.node
        status: Json = {"phase": self.phase}
        if self.init_statuses:
            status["initContainerStatuses"] = self.init_statuses
        if self.app_statuses:
            status["containerStatuses"] = self.app_statuses
        document = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": NAMESPACE,
                "uid": self.uid,
                "annotations": dict(self.annotations),
            },
            "spec": spec,
            "status": status,
        }
        return json.dumps(document, separators=(",", ":")).encode()


def _node_json() -> bytes:
    devices = [
        {
            "id": GPU_UUID,
            "index": 0,
            "count": 10,
            "devmem": GPU_MIB,
            "devcore": 100,
            "type": "NVIDIA A10",
            "numa": 0,
            "mode": "hami-core",
            "health": True,
        }
    ]
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "annotations": {NODE_REGISTER: json.dumps(devices)}},
        "spec": {},
        "status": {},
    }
    return json.dumps(node, separators=(",", ":")).encode()


# -- reading responses ---------------------------------------------------------------------------


def _stored_mib(usages: Iterable[types_pb2.DeviceUsage]) -> int:
    return sum(u.memory_mib for u in usages)


def _effective_mib(response: admission_pb2.CheckQuotaResponse) -> int:
    return sum(v.memory_mib for v in response.effective)


def _gpumem_used(items: Iterable[types_pb2.QuotaItem]) -> int:
    return sum(i.used for i in items if i.resource == GPUMEM)


# -- the walk ------------------------------------------------------------------------------------


class StepFailed(Exception):
    """A call failed; the steps after it depend on it, so the walk stops."""


@dataclass
class Stubs:
    usage: usage_pb2_grpc.UsageRecorderStub
    admission: admission_pb2_grpc.AdmissionStub
    scheduler: scheduler_pb2_grpc.SchedulerStub


_RECORDER_WRITES = (
    usage_pb2.RecordPodResponse,
    usage_pb2.ForgetPodResponse,
    usage_pb2.RegisterNodeResponse,
    usage_pb2.SetQuotaResponse,
)


class Demo:
    """The walk, its output and the checks that differed."""

    def __init__(self, stubs: Stubs, out: TextIO) -> None:
        self.stubs = stubs
        self.out = out
        self.checks = 0
        self.differed: list[str] = []
        self.stopped = ""
        """The failed call the walk stopped at, if it stopped."""
        self.created: dict[str, str] = {}  # uid -> pod name, forgotten at the end
        self._step = ""
        self._step_number = 0
        self.newcomer: DemoPod | None = None
        self.usage_revision = 0
        """The revision of the demo's last write to the recorder: checks read at least that."""
        run = uuid.uuid4().hex[:6]
        self.suffix = f"-{run}"

    # -- output ------------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def step(self, title: str) -> None:
        self._step_number += 1
        self._step = f"{self._step_number}. {title}"
        self.say()
        self.say(f"[{self._step_number}] {title}")

    def detail(self, text: str) -> None:
        self.say(f"      {text}")

    def expect(self, label: str, actual: object, expected: object) -> bool:
        self.checks += 1
        if actual == expected:
            self.say(f"   ok {label}: {actual}")
            return True
        self.say(f"   !! {label}: {actual} (expected {expected})")
        self.differed.append(f"step {self._step}: {label} was {actual}, expected {expected}")
        return False

    def call(self, what: str, rpc: Callable[..., _T], request: Any) -> _T:
        try:
            response = rpc(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "UNKNOWN"
            details = error.details() if hasattr(error, "details") else str(error)
            raise StepFailed(f"{what} failed: {code}: {details}") from None
        if isinstance(response, _RECORDER_WRITES):
            # Read-your-writes: the admission daemon's cache may trail the recorder by an event.
            self.usage_revision = max(self.usage_revision, response.revision)
        return response

    # -- reads -------------------------------------------------------------------------------

    def node_used(self) -> int:
        response = self.call(
            "GetNodeUsage",
            self.stubs.usage.GetNodeUsage,
            usage_pb2.GetNodeUsageRequest(node_names=[NODE]),
        )
        return sum(d.memory_used_mib for n in response.nodes for d in n.devices)

    def namespace_used(self) -> int:
        response = self.call(
            "GetNamespaceUsage",
            self.stubs.usage.GetNamespaceUsage,
            usage_pb2.GetNamespaceUsageRequest(namespace=NAMESPACE),
        )
        return _gpumem_used(response.items)

    def check_quota(self, pod: DemoPod) -> admission_pb2.CheckQuotaResponse:
        response = self.call(
            "CheckQuota",
            self.stubs.admission.CheckQuota,
            admission_pb2.CheckQuotaRequest(
                kubernetes_pod_json=pod.to_json(), min_usage_revision=self.usage_revision
            ),
        )
        verdict = "allowed" if response.allowed else "denied"
        self.detail(f"CheckQuota {pod.name}: {verdict} ({response.reason}): {response.message}")
        return response

    def filter(self, pod: DemoPod) -> scheduler_pb2.FilterResponse:
        response = self.call(
            "Filter",
            self.stubs.scheduler.Filter,
            scheduler_pb2.FilterRequest(kubernetes_pod_json=pod.to_json(), node_names=[NODE]),
        )
        self.detail(
            f"Filter {pod.name}: node {response.node_name or '(none)'} "
            f"({response.reason}): {response.message}"
        )
        for node, reason in sorted(response.failed_nodes.items()):
            self.detail(f"  failed node {node}: {reason}")
        if response.node_name:
            # What HAMi's scheduler would patch onto the pod at bind time.
            for key, value in sorted(response.annotations.items()):
                self.detail(f"  annotation {key}: {value}")
            self.created[pod.uid] = pod.name
            pod.annotations.update(response.annotations)
            pod.node = response.node_name
        return response

    def record(self, pod: DemoPod) -> usage_pb2.RecordPodResponse:
        response = self.call(
            "RecordPod",
            self.stubs.usage.RecordPod,
            usage_pb2.RecordPodRequest(kubernetes_pod_json=pod.to_json()),
        )
        if response.tracked:
            self.created[pod.uid] = pod.name
        self.detail(f"RecordPod {pod.name}: {response.decision}: {response.message}")
        return response

    def forget(self, uid: str) -> usage_pb2.ForgetPodResponse:
        response = self.call(
            "ForgetPod", self.stubs.usage.ForgetPod, usage_pb2.ForgetPodRequest(pod_uid=uid)
        )
        self.created.pop(uid, None)
        return response

    def new_pod(self, name: str, init: Sequence[Json] = (), apps: Sequence[Json] = ()) -> DemoPod:
        return DemoPod(
            name=name + self.suffix, uid=str(uuid.uuid4()), init=list(init), apps=list(apps)
        )

    # -- the steps ---------------------------------------------------------------------------

    def run(self) -> None:
        self.say(
            f"Cluster of the design's cases: node {NODE} with one {GPU_MIB} MiB GPU, "
            f"namespace {NAMESPACE!r} with a quota of {QUOTA_MIB} MiB of GPU memory."
        )
        self.setup()
        self.case1()
        trainer = self.case2()
        self.case3(trainer)
        self.case4(trainer)
        self.sidecars()
        self.forget_all(trainer)

    def setup(self) -> None:
        self.step(f"Register node {NODE} and set the quota of namespace {NAMESPACE}")
        nodes = self.call(
            "GetNodeUsage",
            self.stubs.usage.GetNodeUsage,
            usage_pb2.GetNodeUsageRequest(node_names=[NODE]),
        )
        leftovers = [uid for n in nodes.nodes for uid in n.pod_uids]
        for uid in leftovers:
            self.forget(uid)
        if leftovers:
            self.detail(f"forgot {len(leftovers)} pod(s) an earlier run left on {NODE}")
        registered = self.call(
            "RegisterNode",
            self.stubs.usage.RegisterNode,
            usage_pb2.RegisterNodeRequest(node_name=NODE, kubernetes_node_json=_node_json()),
        )
        devices = registered.node.devices
        for d in devices:
            self.detail(
                f"device {d.uuid} {d.device_type}: {d.memory_total_mib} MiB, "
                f"{d.cores_total}% cores, {d.slots_total} slots"
            )
        self.expect("GPUs on the node", len(devices), 1)
        self.expect("GPU memory (MiB)", sum(d.memory_total_mib for d in devices), GPU_MIB)
        self.expect("memory used on the node (MiB)", self.node_used(), 0)
        quota = self.call(
            "SetQuota",
            self.stubs.usage.SetQuota,
            usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits={f"limits.{GPUMEM}": QUOTA_MIB}),
        )
        limits = {i.resource: i.limit for i in quota.items if i.limit_set}
        self.expect(f"quota limit of {GPUMEM} (MiB)", limits.get(GPUMEM), QUOTA_MIB)
        self.expect("memory used in the namespace (MiB)", _gpumem_used(quota.items), 0)

    def case1(self) -> None:
        self.step("Case 1: admission sees the init container (init 30720 + app 4096 MiB)")
        pod = self.new_pod(
            "convert-30g",
            init=[_container("convert-weights", 30720)],
            apps=[_container("server", 4096)],
        )
        response = self.check_quota(pod)
        self.expect("effective request (MiB) = max(4096, 30720)", _effective_mib(response), 30720)
        self.expect("allowed", response.allowed, False)
        self.expect("reason", response.reason, "MemoryQuotaExceeded")

    def case2(self) -> DemoPod:
        self.step("Case 2: a pod that fits is no longer rejected (init 20480 + app 10240 MiB)")
        pod = self.new_pod(
            "trainer",
            init=[_container("convert-weights", 20480)],
            apps=[_container("server", 10240)],
        )
        response = self.check_quota(pod)
        self.expect("effective request (MiB) = max(10240, 20480)", _effective_mib(response), 20480)
        self.expect("allowed", response.allowed, True)
        self.detail(
            f"traceparent {response.traceparent or '(none: tracing is off)'} "
            f"-> annotation {TRACEPARENT}"
        )
        if response.traceparent:
            pod.annotations[TRACEPARENT] = response.traceparent
        placed = self.filter(pod)
        self.expect("node", placed.node_name, NODE)
        self.expect("reserved on the node (MiB)", _stored_mib(placed.reserved), 20480)
        self.expect("memory used on the node (MiB), 4096 MiB headroom", self.node_used(), 20480)
        return pod

    def case3(self, pod: DemoPod) -> None:
        self.step("Case 3: recorded usage matches reality (bound, init container running)")
        pod.init_statuses = [_status("convert-weights", "running")]
        pod.app_statuses = [_status("server", "waiting")]
        response = self.record(pod)
        self.expect("stored (MiB), not 20480 + 10240", _stored_mib(response.stored), 20480)
        self.expect("init share released", response.init_released, False)
        self.expect("memory used in the namespace (MiB)", self.namespace_used(), 20480)

    def case4(self, pod: DemoPod) -> None:
        self.step("Case 4: usage shrinks once the init container finished with exit code 0")
        pod.phase = "Running"
        pod.init_statuses = [_status("convert-weights", "terminated", 0)]
        pod.app_statuses = [_status("server", "running")]
        response = self.record(pod)
        self.expect("decision", response.decision, "Shrunk")
        self.expect("stored (MiB), the app containers only", _stored_mib(response.stored), 10240)
        self.expect("init share released", response.init_released, True)
        self.expect("memory used on the node (MiB), 14336 free", self.node_used(), 10240)
        self.expect("memory used in the namespace (MiB)", self.namespace_used(), 10240)
        newcomer = self.new_pod("inference", apps=[_container("server", 12288)])
        self.detail(f"a new {newcomer.name} pod asks for 12288 MiB")
        checked = self.check_quota(newcomer)
        self.expect("allowed (10240 + 12288 <= 24576)", checked.allowed, True)
        if checked.traceparent:
            newcomer.annotations[TRACEPARENT] = checked.traceparent
        placed = self.filter(newcomer)
        self.expect("node", placed.node_name, NODE)
        self.expect("memory used on the node (MiB)", self.node_used(), 22528)
        self.newcomer = newcomer

    def sidecars(self) -> None:
        self.step("Native sidecars: what runs beside the init container counts")
        first = self.new_pod(
            "sidecar-first",
            init=[
                _container("log-shipper", 2048, sidecar=True),
                _container("convert-weights", 20480),
            ],
            apps=[_container("server", 10240)],
        )
        response = self.check_quota(first)
        self.expect(
            "sidecar before init: effective (MiB) = max(2048 + 20480, 2048 + 10240)",
            _effective_mib(response),
            22528,
        )
        after = self.new_pod(
            "init-first",
            init=[
                _container("convert-weights", 20480),
                _container("log-shipper", 2048, sidecar=True),
            ],
            apps=[_container("server", 10240)],
        )
        response = self.check_quota(after)
        self.expect(
            "init before sidecar: effective (MiB) = max(20480, 2048 + 10240)",
            _effective_mib(response),
            20480,
        )

    def forget_all(self, trainer: DemoPod) -> None:
        self.step("ForgetPod: exactly what is stored is released")
        pods = [(trainer, 10240)]
        if self.newcomer is not None:
            pods.append((self.newcomer, 12288))
        for pod, stored in pods:
            response = self.forget(pod.uid)
            self.expect(f"{pod.name} released (MiB)", _stored_mib(response.released), stored)
        self.expect("memory used on the node (MiB)", self.node_used(), 0)
        self.expect("memory used in the namespace (MiB)", self.namespace_used(), 0)

    def cleanup(self) -> None:
        """Forgets the pods this run created and has not forgotten yet."""
        for uid, name in list(self.created.items()):
            try:
                self.forget(uid)
                self.say(f"cleanup: forgot {name}")
            except StepFailed as error:
                self.say(f"cleanup: {name}: {error}")


# -- command line ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    def default(name: str) -> str:
        return f"127.0.0.1:{DEFAULT_PORTS[name].grpc}"

    parser = argparse.ArgumentParser(
        prog="hami-accounting demo",
        description="Walks the init-container and sidecar cases through running daemons "
        "(start them with `hami-accounting up`). Exit code 0 when every figure matched.",
    )
    for daemon, what in (("usage", "usage recorder"), ("admission", "admission daemon"),
                         ("scheduler", "scheduler daemon")):
        add_addr_option(parser, daemon, default=default(daemon),
                        help_text=f"{what} (default: %(default)s)")
    return parser


def silent_daemons(channels: Mapping[str, tuple[str, grpc.Channel]]) -> list[str]:
    """``name at address`` of each daemon whose gRPC health check gets no answer at all (a
    NOT_SERVING answer is an answer: the walk then says what failed)."""
    silent = []
    for name, (addr, channel) in channels.items():
        try:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S
            )
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                silent.append(f"{name} at {addr}")
    return silent


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the demo; returns the exit code."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    try:
        tls = TlsConfig.from_env(os.environ)
    except ConfigError as error:
        print(f"hami-accounting demo: {error}", file=sys.stderr)
        return EXIT_USAGE
    channels = [
        client_channel(addr, tls=tls) for addr in (args.usage, args.admission, args.scheduler)
    ]
    try:
        silent = silent_daemons({
            "usage": (args.usage, channels[0]),
            "admission": (args.admission, channels[1]),
            "scheduler": (args.scheduler, channels[2]),
        })
        if silent:
            print(
                f"hami-accounting demo: nothing answers: {', '.join(silent)}.\n"
                "Start the three daemons first, in another terminal: `make up` in the "
                "checkout (or `hami-accounting up`); for daemons elsewhere, pass --usage, "
                "--admission-addr and --scheduler-addr.",
                file=sys.stderr,
            )
            return EXIT_USAGE
        stubs = Stubs(
            usage_pb2_grpc.UsageRecorderStub(channels[0]),
            admission_pb2_grpc.AdmissionStub(channels[1]),
            scheduler_pb2_grpc.SchedulerStub(channels[2]),
        )
        demo = Demo(stubs, out)
        demo.say(
            f"hami-accounting demo: usage {args.usage}, admission {args.admission}, "
            f"scheduler {args.scheduler}"
        )
        try:
            demo.run()
        except StepFailed as error:
            demo.say(f"   !! {error}")
            demo.stopped = f"step {demo._step}: {error}"
        finally:
            demo.cleanup()
    finally:
        for channel in channels:
            channel.close()
    demo.say()
    if demo.stopped:
        demo.say(f"The walk stopped at {demo.stopped}")
    if demo.differed:
        demo.say(f"{len(demo.differed)} of {demo.checks} checks differed:")
        for line in demo.differed:
            demo.say(f"  {line}")
    if demo.stopped or demo.differed:
        return EXIT_DIFFERED
    demo.say(f"All {demo.checks} checks matched the design's figures.")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
