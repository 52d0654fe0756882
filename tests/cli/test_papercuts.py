"""What a newcomer meets at the command line: no daemons running, a closed pipe, a narrow
terminal. Each case is run the way a user runs it."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hami.accounting.v1 import types_pb2
from services.cli import demo, explain, usage_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sidecar-before-init.yaml"
# Long, real-looking identifiers: the kind a narrow table used to cut short.
UUIDS = ("GPU-7f3e9c2a-1b4d-4e8f-9a6b-0c5d2e1f3a4b", "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d")
NODE = "gpu-node-with-a-rather-long-name-17.example.internal"


def closed_ports(count: int) -> list[int]:
    """Ports nothing listens on (bound, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def test_demo_with_no_daemons_says_nothing_answers_and_how_to_start_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    usage, admission, scheduler = (f"127.0.0.1:{p}" for p in closed_ports(3))
    out = io.StringIO()
    code = demo.main(["--usage", usage, "--admission", admission, "--scheduler", scheduler],
                     out=out)
    err = capsys.readouterr().err
    assert code == demo.EXIT_USAGE
    assert (f"nothing answers: usage at {usage}, admission at {admission}, "
            f"scheduler at {scheduler}") in err
    assert "make up" in err and "hami-accounting up" in err
    assert "checks differed" not in out.getvalue() + err
    assert out.getvalue() == ""  # nothing was walked


@pytest.mark.parametrize("output", ["json", "table"])
def test_explain_into_a_closed_pipe_ends_quietly(output: str) -> None:
    """`hami-accounting explain POD --output json | head`, with head gone before the first
    write: no BrokenPipeError traceback, exit code 1 (rich's choice for its tables, kept for
    JSON too)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "services.cli", "explain", str(EXAMPLE), "--output", output],
            cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 1


def test_explain_piped_into_head_prints_its_start_and_nothing_on_stderr() -> None:
    result = subprocess.run(
        f"{sys.executable} -m services.cli explain {EXAMPLE} --output json | head -n 2",
        shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == "{"
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def _report() -> usage_report.Report:
    devices = [
        types_pb2.DeviceState(uuid=uuid, device_type="NVIDIA A100-SXM4-80GB", index=index,
                              memory_used_mib=20480, memory_total_mib=81920, cores_used=30,
                              cores_total=100, slots_used=1, slots_total=10, healthy=True)
        for index, uuid in enumerate(UUIDS)
    ]
    node = types_pb2.NodeUsage(node_name=NODE, devices=devices, pod_uids=["uid-1"])
    quota = (types_pb2.QuotaItem(resource="limits.nvidia.com/gpumem", used=20480, limit=24576,
                                 limit_set=True),)
    return usage_report.Report(nodes=(node,), unknown_nodes=(),
                               namespaces=(("a-team-with-a-long-namespace-name", quota),))


@pytest.mark.parametrize("columns", ["40", "80", "200"])
def test_the_usage_table_never_cuts_an_identifier(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()
    usage_report.print_tables(_report(), "127.0.0.1:50053", out)
    text = out.getvalue()
    assert "…" not in text, text
    for identifier in (*UUIDS, NODE, "a-team-with-a-long-namespace-name",
                       "limits.nvidia.com/gpumem"):
        assert identifier in text, f"{identifier} cut at COLUMNS={columns}:\n{text}"
    assert "20480/81920" in text


def test_explain_tables_never_cut_a_device_uuid_or_a_container_name(tmp_path: Path) -> None:
    pod = EXAMPLE.read_text()
    for uuid in UUIDS:
        pod = pod.replace("GPU-0", uuid, 1) if "GPU-0" in pod else pod
    manifest = tmp_path / "pod.json"
    allocated = (ROOT / "examples" / "allocated.json").read_text()
    manifest.write_text(allocated.replace("GPU-0", UUIDS[0]).replace("GPU-1", UUIDS[1]))
    env = {**os.environ, "COLUMNS": "50"}
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "explain", str(manifest)], cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )
    assert result.returncode == 0, result.stderr
    containers = result.stdout.split("\n\n")[0]
    for uuid in UUIDS:
        assert uuid in containers, containers
    for name in ("log-shipper", "convert-weights"):
        assert name in containers, containers


def test_explain_on_requests_fits_an_80_column_terminal() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "explain", str(EXAMPLE)], cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, result.stdout
    # Each figure and each request whole on its line, not broken across rows.
    row = next(line for line in lines if "convert-weights" in line)
    assert "1 × 20480 MiB" in row and "22528 = 20480 + 2048" in row, result.stdout
    assert any("log-shipper" in line and "1 × 2048 MiB" in line for line in lines)
    # The policy line, the longest of all, is wrapped too, and its words all there.
    policy = result.stdout[result.stdout.index("Policy: "):]
    assert "GPU count enforced" in " ".join(policy.split())


def test_explain_at_its_default_width_keeps_every_column(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    code = explain.main([str(EXAMPLE)], stdin=io.StringIO(), stdout=out, stderr=io.StringIO())
    assert code == 0
    header = next(line for line in out.getvalue().splitlines() if " Container " in line)
    assert header.split()[:8] == ["#", "Container", "Class", "Request", "Device", "MiB",
                                  "Cores", "%"]
