"""``hami-accounting up`` with stand-in daemons: three started, the banner, a clean stop on
Ctrl-C, and a daemon that fails named with its log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.health import check_health

STAND_IN_DAEMON = Path(__file__).with_name("stand_in_daemon.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports (checked by binding each)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                candidate = socket.socket()
                sockets.append(candidate)
                candidate.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for candidate in sockets:
                candidate.close()
    raise RuntimeError("no run of free ports found")


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[types.SimpleNamespace]:
    """Starts `hami-accounting up` in a child process with stand-in daemons."""
    processes: list[subprocess.Popen[str]] = []

    def start(env_extra: dict[str, str] | None = None) -> types.SimpleNamespace:
        base = _free_port_run(3)
        script = (
            "import sys\n"
            "from services.cli import app, up\n"
            f"up.SERVE_COMMAND = (sys.executable, {str(STAND_IN_DAEMON)!r})\n"
            f"raise SystemExit(app.main(['up', '--data-dir', {str(tmp_path / 'data')!r},"
            f" '--base-port', '{base}', '--start-timeout-s', '20']))\n"
        )
        env = {**os.environ, **(env_extra or {})}
        process = subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        processes.append(process)
        return types.SimpleNamespace(process=process, base=base, data=tmp_path / "data")

    yield types.SimpleNamespace(start=start, data=tmp_path / "data")
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_up_starts_three_daemons_and_stops_them_cleanly_on_ctrl_c(
    start_up: types.SimpleNamespace,
) -> None:
    run = start_up.start()
    assert run.process.stdout is not None
    banner = []
    for line in run.process.stdout:
        banner.append(line)
        if line.startswith("Press Ctrl-C"):
            break
    text = "".join(banner)
    for offset, name in enumerate(("admission", "scheduler", "usage")):
        assert f"{name}" in text and f"127.0.0.1:{run.base + offset}" in text
        assert check_health(f"127.0.0.1:{run.base + offset}", timeout_s=5) == "SERVING"
    assert "hami-accounting demo --usage" in text
    # Only the project's own commands, spelled so they run from here (no grpcurl, no curl).
    tries = text.split("Try, in another terminal:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    commands = [line.strip() for line in tries if not line.strip().startswith("#")]
    assert {c.split(" ")[1] for c in commands} == {"demo", "usage", "health", "explain"}, tries
    assert "grpcurl" not in text and "curl " not in text
    health = next(c for c in commands if c.split(" ")[1] == "health")
    probed = subprocess.run(health, shell=True, cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False)
    assert (probed.returncode, probed.stdout.strip()) == (0, "SERVING"), (health, probed)

    run.process.send_signal(signal.SIGINT)
    assert run.process.wait(timeout=20) == 0
    for name in ("admission", "scheduler", "usage"):
        log = (run.data / "logs" / f"{name}.log").read_text()
        assert f"fake {name} stopped cleanly" in log


def test_up_names_the_daemon_that_failed_and_its_log(start_up: types.SimpleNamespace) -> None:
    log = start_up.data / "logs" / "scheduler.log"
    log.parent.mkdir(parents=True)
    log.write_text("an earlier run's line: Traceback (most recent call last)\n")
    run = start_up.start({"FAKE_DAEMON_FAIL": "scheduler"})
    _out, err = run.process.communicate(timeout=30)
    # The failure shows this run's lines only; the earlier ones stay in the file.
    assert "an earlier run's line" not in err
    assert "an earlier run's line" in log.read_text()
    assert run.process.returncode == 1
    assert "scheduler exited with code 3 before serving" in err
    assert str(run.data / "logs" / "scheduler.log") in err
    assert "fake scheduler: failing on purpose" in err
    # The daemons that did start were stopped through their graceful path.
    assert "fake usage stopped cleanly" in (run.data / "logs" / "usage.log").read_text()
