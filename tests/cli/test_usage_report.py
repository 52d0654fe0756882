"""``hami-accounting usage`` against a real usage recorder started in this process: node and
namespace tables, JSON output, namespace discovery through WatchUsage, filters, environment,
and an unreachable recorder (exit 2)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from hami.accounting.v1 import usage_pb2
from services.cli import app, usage_report
from tests.support.pods import (
    allocation,
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    sidecar_container,
    to_json,
)
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, free_port

# The recorder fixtures of tests/usage, re-exported so pytest finds them here.
from tests.usage.conftest import recorder as recorder
from tests.usage.conftest import start_recorder as start_recorder

Json = dict[str, Any]

NODE = "node1"
GPU = "GPU-0"
NS = "team-a"


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def charged(recorder: RunningRecorder) -> RunningRecorder:
    """node1 with one 24576 MiB GPU, team-a's quota 24576 MiB, and the seed's sidecar pod
    recorded on it (22528 MiB while its init container runs)."""
    stub = recorder.stub
    stub.RegisterNode(
        usage_pb2.RegisterNodeRequest(
            kubernetes_node_json=to_json(kube_node(NODE, [gpu_device(GPU, memory_mib=24576)]))
        ),
        timeout=RPC_TIMEOUT_S,
    )
    stub.SetQuota(
        usage_pb2.SetQuotaRequest(namespace=NS, limits={"limits.nvidia.com/gpumem": 24576}),
        timeout=RPC_TIMEOUT_S,
    )
    pod = kube_pod(
        "trainer",
        namespace=NS,
        init=[
            sidecar_container("log-shipper", gpumem=2048, gpucores=10),
            init_container("convert-weights", gpumem=20480, gpucores=30),
        ],
        apps=[app_container("server", gpumem=10240, gpucores=20)],
        allocation=allocation([(GPU, 2048, 10)], [(GPU, 20480, 30)], [(GPU, 10240, 20)]),
        node=NODE,
        phase="Pending",
    )
    response = stub.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)), timeout=RPC_TIMEOUT_S
    )
    assert response.tracked
    return recorder


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = usage_report.main(args, env=env or {}, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_tables_show_the_recorded_figures(charged: RunningRecorder) -> None:
    code, out, err = run(["--usage", charged.app.target])

    assert code == 0, err
    lines = out.splitlines()
    device = next(line for line in lines if GPU in line)
    assert device.split()[0] == NODE
    assert "22528/24576" in device  # memory
    assert "40/100" in device  # cores: max(10 + 30, 10 + 20)
    assert "2/10" in device  # slots: the sidecar beside the init container
    assert "yes" in device
    rows = [line.split() for line in lines[lines.index(next(x for x in lines if NS in x)) :]]
    assert rows[0] == [NS, "nvidia.com/gpu", "1", "-"]
    assert ["nvidia.com/gpucores", "40", "-"] in rows
    assert ["nvidia.com/gpumem", "22528", "24576"] in rows


def test_json_parses_and_discovers_the_namespaces(charged: RunningRecorder) -> None:
    code, out, err = run(["--usage", charged.app.target, "--output", "json"])

    assert code == 0, err
    report: Json = json.loads(out)
    assert list(report) == ["usage_addr", "nodes", "unknown_nodes", "namespaces"]
    (node,) = report["nodes"]
    assert node["name"] == NODE
    assert node["pod_uids"] == [f"uid-{NS}-trainer"]
    (device,) = node["devices"]
    assert device == {
        "uuid": GPU,
        "type": "NVIDIA A10",
        "index": 0,
        "memory_used_mib": 22528,
        "memory_total_mib": 24576,
        "cores_used": 40,
        "cores_total": 100,
        "slots_used": 2,
        "slots_total": 10,
        "healthy": True,
    }
    (namespace,) = report["namespaces"]
    assert namespace["name"] == NS
    items = {item["resource"]: item for item in namespace["items"]}
    assert items["nvidia.com/gpumem"] == {
        "resource": "nvidia.com/gpumem",
        "used": 22528,
        "limit": 24576,
    }
    assert all(item["limit"] is None for r, item in items.items() if r != "nvidia.com/gpumem")


def test_every_namespace_of_a_large_recorder_is_discovered(recorder: RunningRecorder) -> None:
    # Discovery reads WatchUsage's whole initial state, up to its completion marker: every
    # namespace with a quota is listed, however many there are.
    names = [f"team-{n:03d}" for n in range(150)]
    for name in names:
        recorder.stub.SetQuota(
            usage_pb2.SetQuotaRequest(namespace=name, limits={"limits.nvidia.com/gpumem": 1024}),
            timeout=RPC_TIMEOUT_S,
        )

    assert usage_report.discover_namespaces(recorder.stub) == names


def test_namespace_and_node_filters(charged: RunningRecorder) -> None:
    code, out, err = run(
        [
            "--usage",
            charged.app.target,
            "--output",
            "json",
            "--namespace",
            "other",
            "--node",
            NODE,
            "--node",
            "node9",
        ]
    )

    assert code == 0, err
    report: Json = json.loads(out)
    assert [n["name"] for n in report["nodes"]] == [NODE]
    assert report["unknown_nodes"] == ["node9"]
    assert report["namespaces"] == [{"name": "other", "items": []}]
    code, out, _ = run(["--usage", charged.app.target, "--namespace", "other", "--node", "node9"])
    assert "Node node9 is not registered." in out
    assert "(nothing charged, no limit set)" in out


def test_an_empty_recorder(recorder: RunningRecorder) -> None:
    code, out, _ = run(["--usage", recorder.app.target])

    assert code == 0
    assert "No node is registered." in out
    assert "No namespace has usage or a quota." in out


def test_address_from_the_environment(charged: RunningRecorder) -> None:
    code, out, err = run(
        ["--output", "json"], env={"HAMI_ACCOUNTING_USAGE_ADDR": charged.app.target}
    )

    assert code == 0, err
    assert json.loads(out)["usage_addr"] == charged.app.target


def test_through_the_cli_dispatcher(
    charged: RunningRecorder, capsys: pytest.CaptureFixture[str]
) -> None:
    assert app.main(["usage", "--usage", charged.app.target, "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["name"] == NODE


def test_unreachable_recorder_exits_2() -> None:
    target = f"127.0.0.1:{free_port()}"

    code, out, err = run(["--usage", target, "--timeout-s", "2"])

    assert code == 2
    assert out == ""
    assert f"cannot reach the usage recorder at {target}" in err


def test_invalid_tls_environment_exits_2(tmp_path: Any) -> None:
    env = {"HAMI_ACCOUNTING_TLS_CERT_FILE": str(tmp_path / "absent.pem")}

    code, _, err = run(["--usage", "127.0.0.1:1"], env=env)

    assert code == 2
    assert "HAMI_ACCOUNTING_TLS_CERT_FILE" in err
