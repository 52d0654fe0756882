"""The hami-accounting CLI: health probe, dispatch to daemons and tools, and `up`."""

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
from common_runtime_support import DEAD_TARGET, USAGE_SERVICE, ServeFn

from services import cli

FAKE_DAEMON = Path(__file__).with_name("common_fake_daemon.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("serving", "service", "want_exit", "want_output"),
    [
        (True, "", 0, "SERVING"),
        (True, USAGE_SERVICE, 0, "SERVING"),
        (False, USAGE_SERVICE, 1, "NOT_SERVING"),
    ],
    ids=["whole server serving", "named service serving", "not serving fails the probe"],
)
def test_health_prints_the_status_and_exits_0_only_when_serving(
    serve: ServeFn, capsys: pytest.CaptureFixture[str],
    serving: bool, service: str, want_exit: int, want_output: str,
) -> None:
    handle = serve(serving=serving)
    args = ["health", handle.target] + (["--service", service] if service else [])
    assert cli.main(args) == want_exit
    assert capsys.readouterr().out.strip() == want_output


def test_health_of_an_unreachable_daemon_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["health", DEAD_TARGET, "--timeout-s", "2"]) == 1
    assert capsys.readouterr().out.startswith("UNAVAILABLE: ")


def test_health_of_an_unknown_service_fails_naming_it_and_the_known_ones(
    serve: ServeFn, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = serve()
    assert cli.main(["health", handle.target, "--service", "x.Unknown"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT_FOUND: ")
    # grpcio's own NOT_FOUND has empty details: the line must say what was not found.
    assert "'x.Unknown'" in out and handle.target in out
    for service in ("hami.accounting.v1.Admission", "hami.accounting.v1.Scheduler", USAGE_SERVICE):
        assert service in out


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, exit_code: int) -> list[list[str]]:
    calls: list[list[str]] = []
    module = types.ModuleType(name)

    def main(argv: list[str]) -> int:
        calls.append(argv)
        return exit_code

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_serve_runs_the_daemon_main_with_the_remaining_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake_module(monkeypatch, "services.scheduler.__main__", exit_code=5)
    assert cli.main(["serve", "scheduler", "--help", "extra"]) == 5
    assert calls == [["--help", "extra"]]


def test_forwarded_tools_get_their_arguments_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_module(monkeypatch, "services.demo", exit_code=0)
    assert cli.main(["demo", "--usage", "127.0.0.1:1", "--help"]) == 0
    assert calls == [["--usage", "127.0.0.1:1", "--help"]]


def test_a_tool_that_is_not_built_yet_gives_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli._FORWARDED, "explain", ("services.not_written_yet", "x"))
    assert cli.main(["explain", "pod.json"]) == 2
    assert "services.not_written_yet is not part of this build yet" in capsys.readouterr().err


def test_unknown_daemon_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["serve", "billing"])
    assert caught.value.code == 2
    assert "invalid choice: 'billing'" in capsys.readouterr().err


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "up", "health", "demo", "explain", "usage"):
        assert command in out


# --- up, with stand-in daemons -----------------------------------------------------------------


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
            "from services import cli\n"
            f"cli.SERVE_COMMAND = (sys.executable, {str(FAKE_DAEMON)!r})\n"
            f"raise SystemExit(cli.main(['up', '--data-dir', {str(tmp_path / 'data')!r},"
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
        assert cli.check_health(f"127.0.0.1:{run.base + offset}", timeout_s=5) == "SERVING"
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
