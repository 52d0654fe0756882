"""Durability: the recorder as a real process, killed with SIGKILL after acknowledged writes,
comes back with exactly the same pods, nodes, quotas and revision.

The first process runs ``python -m services.usage`` configured by environment variables; the
restart runs ``hami-accounting serve usage`` with the equivalent flags, so both entry points are
exercised.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from services.common.config import ConfigError
from services.usage import __main__ as usage_main
from services.usage.config import UsageConfig
from services.usage.journal import SCHEMA_VERSION, Journal
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    running,
    sidecar_container,
    terminated,
    to_json,
)
from tests.usage.conftest import RPC_TIMEOUT_S, free_port

START_TIMEOUT_S = 60.0
GPU = "GPU-0"
NODE = "node1"
UIDS = ("uid-trainer", "uid-sidecar", "uid-warmup", "uid-done", "uid-forgotten", "uid-never",
        "uid-finished-first")
NAMESPACES = ("team-a", "team-b", "team-none")


class RecorderProcess:
    """One recorder process and a client to it."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log: Path, port: int) -> None:
        self.port = port
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                list(command), env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd=log.parent,
            )
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = usage_pb2_grpc.UsageRecorderStub(self.channel)

    def wait_serving(self) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"recorder exited with {self.process.returncode}:\n"
                            f"{self.log.read_text()}")
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
            except grpc.RpcError:
                status = None
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
        pytest.fail(f"recorder not SERVING within {START_TIMEOUT_S} s:\n{self.log.read_text()}")

    def kill(self) -> None:
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.fixture
def processes() -> Iterator[list[RecorderProcess]]:
    started: list[RecorderProcess] = []
    yield started
    for process in started:
        process.kill()


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAMI_ACCOUNTING_")}
    env.update({"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1", **values})
    return env


def _acknowledged_writes(stub: usage_pb2_grpc.UsageRecorderStub) -> None:
    """Every kind of state: two nodes (JSON and typed), quotas, pods at peak, shrunk, reserved,
    terminal, and forgotten."""
    def call(method: str, request: object) -> object:
        return getattr(stub, method)(request, timeout=RPC_TIMEOUT_S)

    call("RegisterNode", usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(
        kube_node(NODE, [gpu_device(GPU), gpu_device("GPU-1", index=1, memory_mib=81920)]))))
    call("RegisterNode", usage_pb2.RegisterNodeRequest(
        node_name="node2", inventory=types_pb2.NodeInventory(devices=[types_pb2.Device(
            uuid="GPU-T", device_type="NVIDIA T4", memory_total_mib=15360, slots_total=4,
            cores_total=100, numa=1, healthy=True)])))
    call("SetQuota", usage_pb2.SetQuotaRequest(namespace="team-a", limits={
        "limits.nvidia.com/gpumem": 200000, "limits.nvidia.com/gpucores": 300}))
    call("SetQuota", usage_pb2.SetQuotaRequest(namespace="team-b", limits={
        "limits.nvidia.com/gpumem": 0}))

    def record(pod: dict[str, object]) -> None:
        call("RecordPod", usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)))

    trainer = {"uid": "uid-trainer", "namespace": "team-a", "node": NODE,
               "init": [init_container("convert", gpumem=20480, gpucores=30)],
               "apps": [app_container("server", gpumem=10240, gpucores=10)],
               "allocation": allocation([(GPU, 20480, 30)], [(GPU, 10240, 10)])}
    record(kube_pod("trainer", init_statuses=[running("convert")], **trainer))
    record(kube_pod("trainer", phase="Running", init_statuses=[terminated("convert")],
                    **trainer))

    record(kube_pod(
        "sidecar", uid="uid-sidecar", namespace="team-a", node=NODE,
        init=[sidecar_container("proxy", gpumem=2048), init_container("warm", gpumem=40000)],
        apps=[app_container("app", gpumem=8192)],
        allocation=allocation([("GPU-1", 2048, 0)], [("GPU-1", 40000, 0)], [("GPU-1", 8192, 0)]),
        init_statuses=[running("proxy"), running("warm")]))

    call("Reserve", usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(kube_pod("warmup", uid="uid-warmup", namespace="team-a",
                                             apps=[app_container("w", gpumem=4096)])),
        node_name="node2",
        container_grants=[types_pb2.ContainerGrants(grants=[types_pb2.DeviceGrant(
            uuid="GPU-T", device_type="NVIDIA", memory_mib=4096, core_percent=25)])]))

    done = {"uid": "uid-done", "namespace": "team-b", "node": NODE,
            "apps": [app_container("job", gpumem=1024)], "allocation": allocation([(GPU, 1024, 0)])}
    record(kube_pod("done", **done))
    record(kube_pod("done", phase="Succeeded", app_statuses=[terminated("job")], **done))

    record(FORGOTTEN_POD)
    call("ForgetPod", usage_pb2.ForgetPodRequest(pod_uid="uid-forgotten"))
    # A delete seen before the pod's add.
    call("ForgetPod", usage_pb2.ForgetPodRequest(pod_uid="uid-never"))
    # A pod whose first update is already Succeeded: charged nothing, and remembered.
    first_seen = stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(
        FINISHED_FIRST_POD | {"status": {"phase": "Succeeded"}})), timeout=RPC_TIMEOUT_S)
    assert (first_seen.decision, first_seen.tracked) == ("NotTracked", False)


FORGOTTEN_POD = kube_pod("forgotten", uid="uid-forgotten", namespace="team-b", node=NODE,
                         apps=[app_container("x", gpumem=512)],
                         allocation=allocation([(GPU, 512, 0)]))
FINISHED_FIRST_POD = kube_pod("finished-first", uid="uid-finished-first", namespace="team-b",
                              node=NODE, apps=[app_container("x", gpumem=512)],
                              allocation=allocation([(GPU, 512, 0)]))
"""Pending, as a stale update shows it; first recorded as Succeeded."""
NEVER_POD = kube_pod("never", uid="uid-never", namespace="team-b", node=NODE,
                     apps=[app_container("x", gpumem=512)], allocation=allocation([(GPU, 512, 0)]))


def _figures(stub: usage_pb2_grpc.UsageRecorderStub) -> dict[str, bytes]:
    """Everything readable, serialized deterministically so equality is exact."""
    figures: dict[str, bytes] = {}
    for uid in UIDS:
        response = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                    timeout=RPC_TIMEOUT_S)
        figures[f"pod {uid}"] = response.SerializeToString(deterministic=True)
    nodes = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    figures["nodes"] = nodes.SerializeToString(deterministic=True)
    for namespace in NAMESPACES:
        response = stub.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S)
        figures[f"namespace {namespace}"] = response.SerializeToString(deterministic=True)
    return figures


def _revision(stub: usage_pb2_grpc.UsageRecorderStub) -> int:
    stream = stub.WatchUsage(usage_pb2.WatchUsageRequest(send_initial_state=True),
                             timeout=RPC_TIMEOUT_S)
    first = next(iter(stream))
    stream.cancel()
    return int(first.revision)


def test_sigkill_after_acknowledged_writes_loses_nothing(
    tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    first = RecorderProcess(
        [sys.executable, "-m", "services.usage"],
        _env(HAMI_ACCOUNTING_LISTEN_ADDR=f"127.0.0.1:{port}",
             HAMI_ACCOUNTING_DATA_DIR=str(data_dir), HAMI_ACCOUNTING_METRICS_ADDR="off"),
        tmp_path / "first.log", port,
    )
    processes.append(first)
    first.wait_serving()
    _acknowledged_writes(first.stub)
    before = _figures(first.stub)
    revision = _revision(first.stub)
    first.kill()
    assert first.process.returncode == -signal.SIGKILL

    port = free_port()
    second = RecorderProcess(
        [str(Path(sys.executable).parent / "hami-accounting"), "serve", "usage",
         "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir), "--metrics", "off"],
        _env(), tmp_path / "second.log", port,
    )
    processes.append(second)
    second.wait_serving()
    after = _figures(second.stub)
    for key in before:
        assert after[key] == before[key], key
    assert _revision(second.stub) == revision

    # The figures that matter, spelled out, so a test of equality cannot pass on emptiness.
    trainer = usage_pb2.GetPodUsageResponse.FromString(after["pod uid-trainer"])
    assert (trainer.found, trainer.init_released, trainer.stored[0].memory_mib) == (
        True, True, 10240)
    sidecar = usage_pb2.GetPodUsageResponse.FromString(after["pod uid-sidecar"])
    assert (sidecar.init_released, sidecar.stored[0].memory_mib) == (False, 42048)
    assert not usage_pb2.GetPodUsageResponse.FromString(after["pod uid-forgotten"]).found
    assert usage_pb2.GetPodUsageResponse.FromString(after["pod uid-done"]).found
    nodes = usage_pb2.GetNodeUsageResponse.FromString(after["nodes"]).nodes
    assert [(n.node_name, [(d.uuid, d.memory_used_mib) for d in n.devices]) for n in nodes] == [
        (NODE, [(GPU, 10240), ("GPU-1", 42048)]), ("node2", [("GPU-T", 4096)])]
    team_b = usage_pb2.GetNamespaceUsageResponse.FromString(after["namespace team-b"]).items
    assert [(i.resource, i.limit, i.limit_set) for i in team_b] == [
        ("nvidia.com/gpumem", 0, True)]

    # Later updates continue from the journal: the shrunk pod is not re-charged at its peak.
    again = second.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(
        kube_pod("trainer", uid="uid-trainer", namespace="team-a", node=NODE,
                 init=[init_container("convert", gpumem=20480, gpucores=30)],
                 apps=[app_container("server", gpumem=10240, gpucores=10)],
                 allocation=allocation([(GPU, 20480, 30)], [(GPU, 10240, 10)]),
                 init_statuses=[running("convert")]))), timeout=RPC_TIMEOUT_S)
    assert (again.decision, again.stored[0].memory_mib) == ("Unchanged", 10240)
    # The forgotten uids stay forgotten across the SIGKILL, and so does the pod first seen
    # finished: late (staler) updates charge nothing.
    for pod in (FORGOTTEN_POD, NEVER_POD, FINISHED_FIRST_POD):
        late = second.stub.RecordPod(usage_pb2.RecordPodRequest(
            kubernetes_pod_json=to_json(pod)), timeout=RPC_TIMEOUT_S)
        assert (late.decision, late.tracked) == ("Forgotten", False), late
    refused = second.stub.Reserve(usage_pb2.ReserveRequest(
        kubernetes_pod_json=to_json(NEVER_POD), node_name=NODE), timeout=RPC_TIMEOUT_S)
    assert (refused.reserved, refused.reason) == (False, "PodForgotten")
    assert _figures(second.stub) == after

    # A graceful stop exits 0.
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=30) == 0


# -- configuration and the entry point ---------------------------------------------------------


def test_config_defaults_run_stand_alone(tmp_path: Path) -> None:
    config = UsageConfig.from_env({}, namespace_file=tmp_path / "absent")
    assert (config.common.listen_addr, config.common.metrics_addr) == (
        "127.0.0.1:50053", "127.0.0.1:9103")
    assert (config.data_dir, config.kubernetes, config.kubeconfig) == (Path("data"), "off", None)
    assert (config.leader_election, config.lease_name, config.lease_namespace) == (
        False, "hami-accounting-usage", "default")
    assert (config.memory_factor, config.journal_sync) == (1, "normal")
    assert config.identity  # the hostname


def test_config_reads_every_variable(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("hami-system\n")
    config = UsageConfig.from_env({
        "HAMI_ACCOUNTING_LISTEN_ADDR": "0.0.0.0:7000",
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        "HAMI_ACCOUNTING_DATA_DIR": "/var/lib/x",
        "HAMI_ACCOUNTING_KUBERNETES": "kubeconfig",
        "KUBECONFIG": "/home/me/.kube/a:/home/me/.kube/b",
        "HAMI_ACCOUNTING_LEADER_ELECTION": "true",
        "HAMI_ACCOUNTING_LEASE_NAME": "lease-x",
        "HAMI_ACCOUNTING_POD_NAME": "usage-0",
        "HAMI_ACCOUNTING_MEMORY_FACTOR": "4",
        "HAMI_ACCOUNTING_JOURNAL_SYNC": "FULL",
    }, namespace_file=namespace_file)
    assert (config.common.listen_addr, config.common.metrics_addr) == ("0.0.0.0:7000", None)
    assert (config.data_dir, config.kubernetes, config.kubeconfig) == (
        Path("/var/lib/x"), "kubeconfig", Path("/home/me/.kube/a"))
    assert (config.leader_election, config.lease_name, config.lease_namespace) == (
        True, "lease-x", "hami-system")
    assert (config.identity, config.memory_factor, config.journal_sync) == ("usage-0", 4, "full")
    explicit = UsageConfig.from_env({"HAMI_ACCOUNTING_KUBECONFIG": "/k", "KUBECONFIG": "/other",
                                     "HAMI_ACCOUNTING_LEASE_NAMESPACE": "ns-x"})
    assert (explicit.kubeconfig, explicit.lease_namespace) == (Path("/k"), "ns-x")


def test_config_lists_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        UsageConfig.from_env({
            "HAMI_ACCOUNTING_KUBERNETES": "sometimes",
            "HAMI_ACCOUNTING_LEADER_ELECTION": "maybe",
            "HAMI_ACCOUNTING_MEMORY_FACTOR": "0",
            "HAMI_ACCOUNTING_JOURNAL_SYNC": "never",
            "HAMI_ACCOUNTING_LISTEN_ADDR": "nowhere",
        })
    names = " ".join(caught.value.problems)
    for name in ("KUBERNETES", "LEADER_ELECTION", "MEMORY_FACTOR", "JOURNAL_SYNC", "LISTEN_ADDR"):
        assert f"HAMI_ACCOUNTING_{name}" in names
    with pytest.raises(ConfigError, match="needs a Kubernetes API"):
        UsageConfig.from_env({"HAMI_ACCOUNTING_LEADER_ELECTION": "true"})


def test_main_reports_a_bad_configuration_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HAMI_ACCOUNTING_MEMORY_FACTOR", "zero")
    assert usage_main.main(["--metrics", "off"]) == 2
    assert "HAMI_ACCOUNTING_MEMORY_FACTOR must be an integer" in capsys.readouterr().err


def test_main_refuses_a_journal_of_another_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    Journal.in_data_dir(data_dir).close()
    with sqlite3.connect(data_dir / "usage.sqlite3") as db:
        # A version from a newer build (the previous one, 1, is migrated instead).
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                   (SCHEMA_VERSION + 1,))
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    code = usage_main.main(["--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data_dir),
                            "--metrics", "off"])
    assert code == 1
