"""Go interop: a HAMi-style Go client drives the three daemons through seed cases 1–4.

Builds tests/interop/go/src/hamiclient with Debian's Go toolchain in GOPATH mode; it calls every
daemon through the Go module in clients/go (the checked-in generated code and the hamiaccounting
client package: its Dial, call policy, traceparent and pod JSON). Starts the usage, admission
and scheduler daemons as separate processes on free 127.0.0.1 ports, plaintext and then with
mutual TLS, runs the client and checks the exact seed figures it prints as one JSON document,
and the attempts its call policy made (INVALID_ARGUMENT once, an unreachable daemon three
times). A missing Go toolchain is a failure, not a skip: `make test` installs it first
(scripts/system_setup.py, as root).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import TlsConfig
from services.common.server import client_channel
from tests.reliability.daemons import Pki, tls_env

pytestmark = pytest.mark.go

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_go_client.py"
TOOLCHAIN_MISSING_EXIT = 2

NAMESPACE = "team-a"
GPU_MIB = 24576
NODE_GPUS = {"node-1": "GPU-seed-0", "node-2": "GPU-seed-1"}
UID_CASE2 = "c2a5e002-6f1c-4c2e-9d0a-000000000002"
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
CHECK_QUOTA_ATTEMPTS = 3
"""The attempts the package's default policy makes for CheckQuota (clients/go/hamiaccounting)."""

SERVING_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
CLIENT_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 60


def free_port() -> int:
    """A port nothing listens on now: bind port 0, read the number, release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    name: str
    address: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"


@dataclass
class Daemons:
    """The three daemons as child processes; logs go to files kept for failure messages."""

    work_dir: Path
    started: dict[str, Daemon] = field(default_factory=dict)
    server_tls: TlsConfig | None = None
    """The certificate every daemon serves and dials the recorder with (None: plaintext)."""
    client_tls: TlsConfig | None = None
    """What this test presents when it checks health."""

    def start(self, name: str, extra_env: dict[str, str]) -> Daemon:
        address = f"127.0.0.1:{free_port()}"
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("HAMI_ACCOUNTING_")}
        env.update({
            "HAMI_ACCOUNTING_LISTEN_ADDR": address,
            "HAMI_ACCOUNTING_METRICS_ADDR": "off",
            "PYTHONUNBUFFERED": "1",
            **(tls_env(self.server_tls) if self.server_tls else {}),
            **extra_env,
        })
        log_path = self.work_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", name],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        daemon = Daemon(name, address, log_path, process)
        self.started[name] = daemon
        return daemon

    def wait_serving(self, deadline_s: float = SERVING_TIMEOUT_S) -> None:
        """Polls grpc.health.v1 until every daemon says SERVING; fails with its log otherwise."""
        deadline = time.monotonic() + deadline_s
        for daemon in self.started.values():
            last = "no answer"
            with client_channel(daemon.address, tls=self.client_tls) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while True:
                    if daemon.process.poll() is not None:
                        pytest.fail(f"{daemon.name} exited with {daemon.process.returncode} "
                                    f"before serving\n{self.logs()}")
                    try:
                        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                        last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.RpcError as error:
                        last = f"{error.code().name}: {error.details()}"
                    if time.monotonic() > deadline:
                        pytest.fail(f"{daemon.name} at {daemon.address} not SERVING after "
                                    f"{deadline_s:.0f} s (last: {last})\n{self.logs()}")
                    time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM every daemon, then SIGKILL what is still alive after the grace period."""
        for daemon in self.started.values():
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for daemon in self.started.values():
            try:
                daemon.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                daemon.process.kill()
                daemon.process.wait()

    def logs(self) -> str:
        return "\n".join(
            f"----- {daemon.name} ({daemon.address}) log, last {LOG_TAIL_LINES} lines -----\n"
            f"{daemon.log_tail()}"
            for daemon in self.started.values()
        )


@dataclass(frozen=True)
class Transport:
    """How the daemons serve and the Go client dials: plaintext, or mutual TLS."""

    server_tls: TlsConfig | None
    client_tls: TlsConfig | None

    def client_flags(self) -> list[str]:
        tls = self.client_tls
        if tls is None:
            return []
        assert tls.ca_file is not None
        return ["-tls-ca", str(tls.ca_file), "-tls-cert", str(tls.cert_file),
                "-tls-key", str(tls.key_file)]


@pytest.fixture(params=["plaintext", "mutual-tls"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Transport:
    if request.param == "plaintext":
        return Transport(None, None)
    pki = Pki.create(tmp_path / "pki")
    # The daemons' certificate names 127.0.0.1, which the Go client dials; the client's own
    # certificate is signed by the CA the daemons require.
    return Transport(pki.leaf("daemons"), pki.leaf("hami-scheduler", server=False))


@pytest.fixture
def daemons(tmp_path: Path, transport: Transport) -> Iterator[Daemons]:
    group = Daemons(tmp_path, server_tls=transport.server_tls, client_tls=transport.client_tls)
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The client, built once for both transports."""
    return build_client(tmp_path_factory.mktemp("go-client") / "hamiclient")


def build_client(binary: Path) -> tuple[Path, float]:
    """Builds the client (with go vet and gofmt); fails the test when the toolchain is missing."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--output", str(binary), "--vet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    elapsed = time.monotonic() - started
    if result.returncode == TOOLCHAIN_MISSING_EXIT:
        pytest.fail(f"the Go toolchain is required for the interop test (`make test` installs "
                    f"it as root: scripts/system_setup.py):\n"
                    f"{result.stderr}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(f"building the Go client failed ({result.returncode}):\n"
                    f"{result.stdout}\n{result.stderr}", pytrace=False)
    return binary, elapsed


# --- the checks --------------------------------------------------------------------------------


class Expectations:
    """Collects every mismatch so one run reports all of them."""

    def __init__(self, steps: dict[str, dict[str, Any]]) -> None:
        self.steps = steps
        self.problems: list[str] = []

    def step(self, name: str) -> dict[str, Any]:
        if name not in self.steps:
            self.problems.append(f"{name}: step missing from the client's report")
            return {}
        return self.steps[name]

    def equal(self, name: str, key: str, expected: Any) -> Any:
        actual = self.step(name).get(key)
        if actual != expected:
            self.problems.append(f"{name}.{key}: expected {expected!r}, got {actual!r}")
        return actual

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            self.problems.append(message)


def grants_by_position(annotation: str) -> list[list[tuple[str, str, int, int]]]:
    """Decodes hami.io/vgpu-devices-allocated into positions of (uuid, type, mem, cores)."""
    positions = []
    for piece in annotation.split(";")[:-1]:
        devices = []
        for device in piece.split(":"):
            if "," not in device:
                continue
            fields = device.split(",")
            devices.append((fields[0], fields[1], int(fields[2]), int(fields[3])))
        positions.append(devices)
    return positions


def memory_of(vendor_requests: list[dict[str, Any]] | None) -> int | None:
    for vendor in vendor_requests or []:
        if vendor.get("vendor") == "NVIDIA":
            return int(vendor["memory_mib"])
    return None


def check_seed_figures(report: dict[str, Any], *, tls: bool) -> list[str]:
    steps = {step["step"]: step for step in report["steps"]}
    expect = Expectations(steps)
    expect.check(report.get("ok") is True,
                 f"client reported unexpected errors: {report.get('unexpected_errors')}")

    for daemon in ("admission", "scheduler", "usage"):
        expect.equal(f"health_{daemon}", "status", "SERVING")
        expect.equal(f"health_{daemon}", "tls", tls)

    node1 = expect.step("register_node_json").get("node") or {}
    expect.check(node1.get("node_name") == "node-1", f"register_node_json: node {node1!r}")
    expect.check([
        (d.get("uuid"), d.get("memory_total_mib"), d.get("slots_total"), d.get("cores_total"),
         d.get("healthy"), d.get("device_type")) for d in node1.get("devices", [])
    ] == [("GPU-seed-0", GPU_MIB, 10, 100, True, "NVIDIA A10")],
        f"register_node_json: devices {node1.get('devices')!r}")
    node2 = expect.step("register_node_inventory").get("node") or {}
    expect.check(node2.get("node_name") == "node-2"
                 and [(d.get("uuid"), d.get("memory_total_mib")) for d in node2.get("devices", [])]
                 == [("GPU-seed-1", GPU_MIB)], f"register_node_inventory: node {node2!r}")
    quota = {item["resource"]: item for item in expect.step("set_quota").get("items") or []}
    expect.check(quota.get("nvidia.com/gpumem", {}).get("limit") == GPU_MIB
                 and quota["nvidia.com/gpumem"].get("limit_set") is True,
                 f"set_quota: items {quota!r}")

    # Case 1: init 30720 + app 4096 -> effective 30720 > 24576: denied.
    expect.equal("case1_check_quota", "allowed", False)
    expect.equal("case1_check_quota", "reason", "MemoryQuotaExceeded")
    expect.equal("case1_check_quota", "webhook_allowed", False)
    effective = expect.step("case1_check_quota").get("effective")
    expect.check(memory_of(effective) == 30720, f"case1_check_quota: effective {effective!r}")
    message = expect.step("case1_check_quota").get("message") or ""
    expect.check("30720" in message and "24576" in message,
                 f"case1_check_quota: message should carry 30720 and 24576: {message!r}")

    # Case 2: init 20480 + app 10240 -> effective 20480: allowed, with a traceparent.
    expect.equal("case2_check_quota", "allowed", True)
    expect.equal("case2_check_quota", "reason", "QuotaFits")
    expect.equal("case2_check_quota", "namespace", NAMESPACE)
    effective = expect.step("case2_check_quota").get("effective")
    expect.check(memory_of(effective) == 20480, f"case2_check_quota: effective {effective!r}")
    traceparent = expect.step("case2_check_quota").get("traceparent") or ""
    expect.check(bool(TRACEPARENT.match(traceparent)),
                 f"case2_check_quota: traceparent {traceparent!r} is not W3C")
    # Read-your-writes: the checks carry the newest revision the client's own writes got.
    expect.check((expect.step("case2_check_quota").get("min_usage_revision") or 0) > 0,
                 "case2_check_quota: sent no min_usage_revision after the quota was set")

    # Case 2 placed: a node chosen, node-missing failed, grants 20480 (init) and 10240 (app).
    chosen = expect.step("case2_filter").get("node_name")
    expect.check(chosen in NODE_GPUS, f"case2_filter: node_name {chosen!r} not node-1/node-2")
    uuid = NODE_GPUS.get(chosen or "", "?")
    expect.equal("case2_filter", "reason", "Scheduled")
    expect.equal("case2_filter", "pod_source", "typed")
    expect.equal("case2_filter", "traceparent_sent", traceparent)
    expect.check("node-missing" in (expect.step("case2_filter").get("failed_nodes") or {}),
                 f"case2_filter: failed_nodes {expect.step('case2_filter').get('failed_nodes')!r}")
    grants = [(g.get("container_name"), g.get("container_class"), g.get("memory_mib"),
               [d.get("uuid") for d in g.get("grants") or []])
              for g in expect.step("case2_filter").get("container_grants") or []]
    expect.check(grants == [("convert-weights", "CONTAINER_CLASS_INIT", 20480, [uuid]),
                            ("server", "CONTAINER_CLASS_APP", 10240, [uuid])],
                 f"case2_filter: container_grants {grants!r}")
    allocated = expect.step("case2_filter").get("devices_allocated") or ""
    try:
        positions = grants_by_position(allocated)
    except (ValueError, IndexError):
        positions = []
    expect.check([[(d[0], d[1], d[2]) for d in p] for p in positions]
                 == [[(uuid, "NVIDIA", 20480)], [(uuid, "NVIDIA", 10240)]],
                 f"case2_filter: hami.io/vgpu-devices-allocated {allocated!r}")
    expect.equal("case2_filter", "devices_to_allocate", allocated)
    expect.equal("case2_filter", "vgpu_node_annotation", chosen)
    expect.equal("case2_filter", "reserved_memory_mib", 20480)

    # Case 3: recorded 20480 (the effective peak), not 30720; a replay changes nothing.
    expect.equal("case3_record_pod", "stored_memory_mib", 20480)
    expect.equal("case3_record_pod", "tracked", True)
    expect.equal("case3_record_pod", "init_released", False)
    expect.equal("case3_record_pod", "traceparent_sent", traceparent)
    expect.equal("case3_record_pod_replayed", "stored_memory_mib", 20480)
    expect.equal("case3_record_pod_replayed", "decision", "Unchanged")
    nodes = expect.step("case3_node_usage").get("nodes") or [{}]
    expect.check(nodes[0].get("node_name") == chosen and nodes[0].get("memory_used_mib") == 20480
                 and UID_CASE2 in (nodes[0].get("pod_uids") or []),
                 f"case3_node_usage: nodes {nodes!r}")
    expect.equal("case3_node_usage", "unknown_node_names", ["node-missing"])
    expect.equal("case3_namespace_usage", "gpumem_used", 20480)

    # Case 4: 12288 more does not fit before the shrink; the shrink stores 10240; then it fits.
    expect.equal("case4_check_quota_before_shrink", "allowed", False)
    expect.equal("case4_check_quota_before_shrink", "reason", "MemoryQuotaExceeded")
    expect.equal("case4_record_pod", "stored_memory_mib", 10240)
    expect.equal("case4_record_pod", "init_released", True)
    expect.equal("case4_record_pod", "decision", "Shrunk")
    nodes = expect.step("case4_node_usage").get("nodes") or [{}]
    expect.check(nodes[0].get("memory_used_mib") == 10240, f"case4_node_usage: nodes {nodes!r}")
    expect.equal("case4_namespace_usage", "gpumem_used", 10240)
    expect.equal("case4_check_quota_after_shrink", "allowed", True)
    expect.equal("case4_check_quota_after_shrink", "reason", "QuotaFits")
    expect.equal("case4_filter_newcomer", "node_name", chosen)
    expect.equal("case4_filter_newcomer", "pod_source", "kubernetes_pod_json")
    expect.equal("case4_filter_newcomer", "traceparent_sent",
                 expect.step("case4_check_quota_after_shrink").get("traceparent"))
    expect.equal("case4_filter_newcomer", "reserved_memory_mib", 12288)
    expect.check([u.get("uuid") for u in expect.step("case4_filter_newcomer").get("reserved") or []]
                 == [uuid], "case4_filter_newcomer: not reserved on the case 2 GPU")

    # Reserve: 22528 + 4096 is over the card and the quota; 22528 + 2048 fills both exactly.
    expect.equal("reserve_over_capacity", "reserved", False)
    reason = expect.step("reserve_over_capacity").get("reason")
    expect.check(reason in ("CardInsufficientMemory", "MemoryQuotaExceeded"),
                 f"reserve_over_capacity: reason {reason!r}")
    expect.equal("reserve_exact_fit", "reserved", True)
    expect.equal("reserve_exact_fit", "reason", "Reserved")
    expect.equal("reserve_exact_fit", "stored_memory_mib", 2048)
    expect.equal("full_namespace_usage", "gpumem_used", GPU_MIB)

    expect.equal("case4_pod_usage", "found", True)
    expect.equal("case4_pod_usage", "stored_memory_mib", 10240)
    expect.equal("case4_pod_usage", "init_released", True)
    expect.equal("case4_pod_usage", "node_name", chosen)
    expect.equal("case4_pod_usage", "namespace", NAMESPACE)
    expect.equal("case4_pod_usage", "name", "llm-server")

    # Delete: exactly what is stored is released; everything ends at 0.
    expect.equal("forget_probe", "released_memory_mib", 2048)
    expect.equal("forget_newcomer", "released_memory_mib", 12288)
    expect.equal("forget_case2", "found", True)
    expect.equal("forget_case2", "released_memory_mib", 10240)
    expect.equal("final_namespace_usage", "gpumem_used", 0)
    final_nodes = {n.get("node_name"): n.get("memory_used_mib")
                   for n in expect.step("final_node_usage").get("nodes") or []}
    expect.check(final_nodes == {"node-1": 0, "node-2": 0},
                 f"final_node_usage: {final_nodes!r}")

    watch = expect.step("watch_usage")
    expect.equal("watch_usage", "code", "OK")
    expect.check((watch.get("kinds") or {}).get("USAGE_EVENT_KIND_SNAPSHOT", 0) >= 1,
                 f"watch_usage: no SNAPSHOT event (kinds {watch.get('kinds')!r})")
    expect.equal("watch_usage", "saw_forgotten", True)

    # Errors: malformed input is INVALID_ARGUMENT, sent once; a dead daemon is UNAVAILABLE after
    # the policy's attempts, and denies.
    expect.equal("malformed_record_pod_without_pod", "code", "InvalidArgument")
    expect.equal("malformed_record_pod_without_pod", "attempts", 1)
    expect.equal("malformed_check_quota_bad_json", "code", "InvalidArgument")
    expect.equal("malformed_check_quota_bad_json", "attempts", 1)
    expect.equal("malformed_check_quota_bad_json", "webhook_allowed", False)
    expect.equal("unreachable_check_quota", "code", "Unavailable")
    expect.equal("unreachable_check_quota", "policy_attempts", CHECK_QUOTA_ATTEMPTS)
    expect.equal("unreachable_check_quota", "attempts", CHECK_QUOTA_ATTEMPTS)
    expect.equal("unreachable_check_quota", "webhook_allowed", False)

    # MIG, read from Go: the card's profiles, the instance on the grant, the annotation HAMi's
    # device plugin reads, and the placement held until the pod is forgotten.
    expect.equal("mig_register_node", "mig_profiles", [
        {"name": "1g.5gb", "memory_mib": 5120, "core_percent": 14, "placements": 1}])
    expect.equal("mig_filter", "reason", "Scheduled")
    expect.equal("mig_filter", "devices_allocated", "GPU-mig-0,NVIDIA,5120,14:;")
    expect.equal("mig_instances", "instances", [
        {"uuid": "GPU-mig-0", "profile": "1g.5gb", "start": 6, "size": 1}])
    expect.equal("mig_instances", "mig_allocations", (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-0","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'))
    expect.equal("mig_instances", "mig_in_use", [{"start": 6, "size": 1}])
    expect.equal("mig_forget", "released_memory_mib", 5120)
    expect.equal("mig_released", "mig_in_use", [])
    return expect.problems


@pytest.mark.timeout(360)
def test_go_client_walks_the_seed_cases(daemons: Daemons, transport: Transport,
                                        go_client: tuple[Path, float], tmp_path: Path) -> None:
    usage = daemons.start("usage", {"HAMI_ACCOUNTING_DATA_DIR": str(tmp_path / "data")})
    upstream = {"HAMI_ACCOUNTING_USAGE_ADDR": usage.address}
    admission = daemons.start("admission", upstream)
    scheduler = daemons.start("scheduler", upstream)

    binary, build_s = go_client
    print(f"go client built in {build_s:.1f} s")
    daemons.wait_serving()

    command = [
        str(binary),
        "-admission-addr", admission.address,
        "-scheduler-addr", scheduler.address,
        "-usage-addr", usage.address,
        "-unreachable-addr", f"127.0.0.1:{free_port()}",
        "-namespace", NAMESPACE,
        "-watch-timeout", "10s",
        *transport.client_flags(),
    ]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    print(f"go client ran in {time.monotonic() - started:.1f} s")
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"the Go client (exit {result.returncode}) printed no JSON document:\n"
                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{daemons.logs()}",
                    pytrace=False)

    problems = check_seed_figures(report, tls=transport.client_tls is not None)
    if problems:
        pytest.fail(
            "the Go client's figures differ from the seed cases:\n  - " + "\n  - ".join(problems)
            + f"\n\nclient exit {result.returncode}, stderr:\n{result.stderr}"
            + f"\nclient report:\n{json.dumps(report, indent=1)}\n\n{daemons.logs()}",
            pytrace=False,
        )
    assert result.returncode == 0, result.stderr
