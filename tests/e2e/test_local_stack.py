"""``hami-accounting up`` and ``hami-accounting demo``, as a user runs them, in subprocesses.

``up`` starts the three daemons on free ports; ``demo`` walks the seed cases through them twice
(fresh uids each time, its own pods cleaned up); Ctrl-C (SIGINT) on ``up`` stops every daemon
and ``up`` exits 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from services.cli.health import check_health
from tests.e2e.stack import PYTHON, REPO, clean_env, free_port_block

pytestmark = pytest.mark.timeout(90)

UP_TIMEOUT_S = 30.0
DEMO_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class Output:
    """A process's merged stdout/stderr, read in a thread, so a test can wait for a line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cv = threading.Condition()
        assert process.stdout is not None
        self._stream = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()

    def wait_for(self, pattern: str, timeout_s: float) -> bool:
        with self._cv:
            return self._cv.wait_for(
                lambda: any(re.search(pattern, line) for line in self.lines), timeout_s
            )

    @property
    def text(self) -> str:
        with self._cv:
            return "\n".join(self.lines)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after it.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_demo(addrs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "services.cli",
            "demo",
            "--usage-addr",
            addrs["usage"],
            "--admission-addr",
            addrs["admission"],
            "--scheduler-addr",
            addrs["scheduler"],
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_up_runs_the_stack_the_demo_passes_twice_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    base = free_port_block(3)
    metrics_base = free_port_block(3, avoid=range(base, base + 3))
    addrs = {
        "admission": f"127.0.0.1:{base}",
        "scheduler": f"127.0.0.1:{base + 1}",
        "usage": f"127.0.0.1:{base + 2}",
    }
    up = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "services.cli",
            "up",
            "--data-dir",
            str(tmp_path / "data"),
            "--base-port",
            str(base),
            "--metrics-base-port",
            str(metrics_base),
        ],
        cwd=REPO,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(up)
    daemons: list[int] = []
    try:
        assert output.wait_for(r"hami-accounting is up", UP_TIMEOUT_S), (
            f"`up` did not come up:\n{output.text}"
        )
        daemons = children_of(up.pid)
        assert len(daemons) == 3, (daemons, output.text)
        for name, addr in addrs.items():
            assert check_health(addr, timeout_s=2.0) == "SERVING", name
        # The banner says how to run the demo.
        assert f"--usage-addr {addrs['usage']}" in output.text

        for attempt in (1, 2):
            demo = run_demo(addrs)
            report = f"demo run {attempt} (exit {demo.returncode}):\n{demo.stdout}\n{demo.stderr}"
            assert demo.returncode == 0, report
            out = demo.stdout
            assert re.search(r"All \d+ checks matched", out), report
            assert "!!" not in out, report
            # The design's figures, as the demo prints them.
            assert "denied (MemoryQuotaExceeded)" in out, report
            assert "effective request (MiB) = max(4096, 30720): 30720" in out, report
            assert "effective request (MiB) = max(10240, 20480): 20480" in out, report
            assert re.search(r"traceparent 00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", out), report
            assert (
                "annotation hami.io/vgpu-devices-allocated: GPU-demo-node-1-0,NVIDIA,20480" in out
            ), report
            assert "stored (MiB), not 20480 + 10240: 20480" in out, report
            assert "decision: Shrunk" in out, report
            assert "stored (MiB), the app containers only: 10240" in out, report
            assert "allowed (10240 + 12288 <= 24576): True" in out, report
            assert "2048 + 10240): 22528" in out and "2048 + 10240): 20480" in out, report
            assert "memory used on the node (MiB): 0" in out, report
            assert "memory used in the namespace (MiB): 0" in out, report
            assert "cleanup:" not in out, report  # nothing was left to clean up

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=STOP_TIMEOUT_S) == 0, output.text
        deadline = time.monotonic() + 5.0
        while any(map(alive, daemons)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in daemons if alive(pid)], "daemons outlived `up`"
        for name, addr in addrs.items():
            with pytest.raises(grpc.RpcError):
                check_health(addr, timeout_s=0.5)
            assert (tmp_path / "data" / "logs" / f"{name}.log").exists()
    finally:
        if up.poll() is None:
            # `up` stops its own children on SIGTERM; kill is the last resort.
            up.terminate()
            try:
                up.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        # Only if `up` failed to stop them: its daemons, by pid.
        for pid in daemons:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_demo_against_no_stack_fails_with_a_clear_message() -> None:
    base = free_port_block(3)
    demo = run_demo(
        {
            "admission": f"127.0.0.1:{base}",
            "scheduler": f"127.0.0.1:{base + 1}",
            "usage": f"127.0.0.1:{base + 2}",
        }
    )
    # Said up front, on stderr, with how to start the stack; no walk, no "1 of 0 checks".
    assert demo.returncode == 2, demo.stdout + demo.stderr
    assert f"nothing answers: usage at 127.0.0.1:{base + 2}" in demo.stderr
    assert "make up" in demo.stderr
    assert "checks differed" not in demo.stdout + demo.stderr
    assert "Traceback" not in demo.stderr
