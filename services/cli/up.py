"""``hami-accounting up``: the three daemons on localhost, as child processes, until Ctrl-C.

Layer: services/cli (a subcommand). Each daemon is this CLI's ``serve NAME`` in a fresh
interpreter (``SERVE_COMMAND``), its output in ``DATA_DIR/logs/NAME.log``. The recorder starts
first (the other two read usage from it); each must report SERVING within ``--start-timeout-s``
or ``up`` stops them all and shows the end of the failed one's log. The addresses are checked
before anything starts, so a second ``up`` on the same ports is refused instead of answering
the health checks of the first. Once up, a banner lists the addresses and commands to try.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc

from services.cli.health import (
    DAEMONS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    SERVICE_NAMES,
    check_health,
)
from services.common.config import DEFAULT_PORTS, ConfigError, TlsConfig, env_name, parse_host_port
from services.common.ports import listen_problem

# How `up` runs one daemon: this CLI's `serve NAME` in a fresh interpreter. Tests replace it
# with a stand-in daemon.
SERVE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "services.cli", "serve")

# `up` starts the recorder first: the other two read usage from it.
_START_ORDER = ("usage", "admission", "scheduler")
_LOG_TAIL_LINES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``up``."""
    parser.add_argument("--data-dir", type=Path, default=Path("data"),
                        help="journal and logs (default: ./data)")
    parser.add_argument("--base-port", type=int, default=DEFAULT_PORTS["admission"].grpc,
                        help="gRPC port of admission; scheduler and usage take the next two "
                             "(default: %(default)s)")
    parser.add_argument("--metrics-base-port", type=int,
                        default=DEFAULT_PORTS["admission"].metrics,
                        help="metrics port of admission; scheduler and usage take the next two "
                             "(default: %(default)s)")
    parser.add_argument("--start-timeout-s", type=float, default=30.0,
                        help="how long each daemon may take to report SERVING (default: 30)")


@dataclass(frozen=True)
class _DaemonPlan:
    name: str
    grpc_addr: str
    metrics_addr: str
    log_file: Path

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_addr}/metrics"


class UpError(Exception):
    """A daemon started by ``up`` did not come up."""


def _plan(data_dir: Path, base_port: int, metrics_base_port: int) -> dict[str, _DaemonPlan]:
    plans = {}
    for offset, name in enumerate(DAEMONS):
        plans[name] = _DaemonPlan(
            name=name,
            grpc_addr=f"127.0.0.1:{base_port + offset}",
            metrics_addr=f"127.0.0.1:{metrics_base_port + offset}",
            log_file=data_dir / "logs" / f"{name}.log",
        )
    return plans


def _child_env(plan: _DaemonPlan, usage_addr: str, data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[env_name("LISTEN_ADDR")] = plan.grpc_addr
    env[env_name("METRICS_ADDR")] = plan.metrics_addr
    env[env_name("DATA_DIR")] = str(data_dir)
    env[env_name("USAGE_ADDR")] = usage_addr
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _log_tail(path: Path, start: int = 0) -> str:
    """The last lines written to ``path`` from byte ``start`` on (this run's, not earlier ones)."""
    try:
        with path.open("rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log written)"
    return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(nothing logged in this run)"


class _Children:
    """The daemons `up` started, stopped together."""

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.log_starts: dict[str, int] = {}
        """Where this run's lines begin in each log (earlier runs' lines are kept above)."""

    def start(self, plan: _DaemonPlan, env: dict[str, str]) -> None:
        plan.log_file.parent.mkdir(parents=True, exist_ok=True)
        with plan.log_file.open("ab") as log:
            log.write(f"--- hami-accounting up: {plan.name} starting at "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n".encode())
            log.flush()
            self.log_starts[plan.name] = log.tell()
            # A new session: Ctrl-C reaches only `up`, which then stops the daemons in order.
            self.processes[plan.name] = subprocess.Popen(
                [*SERVE_COMMAND, plan.name],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, plan: _DaemonPlan) -> str:
        return _log_tail(plan.log_file, self.log_starts.get(plan.name, 0))

    def exited(self) -> list[tuple[str, int]]:
        return [(name, code) for name, process in self.processes.items()
                if (code := process.poll()) is not None]

    def stop(self, grace_s: float) -> None:
        # Reverse start order: the recorder goes last so the others drain calls to it.
        for process in reversed(self.processes.values()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in reversed(self.processes.values()):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_serving(plan: _DaemonPlan, children: _Children, timeout_s: float,
                  tls: TlsConfig | None, stop_requested: threading.Event) -> None:
    process = children.processes[plan.name]
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline and not stop_requested.is_set():
        code = process.poll()
        if code is not None:
            raise UpError(f"{plan.name} exited with code {code} before serving; "
                          f"its log ({plan.log_file}) ends with:\n{children.log_tail(plan)}")
        try:
            last = check_health(plan.grpc_addr, SERVICE_NAMES[plan.name], timeout_s=1.0, tls=tls)
            if last == "SERVING":
                return
        except grpc.RpcError as error:
            last = error.code().name if hasattr(error, "code") else str(error)
        stop_requested.wait(0.2)
    if stop_requested.is_set():
        return
    raise UpError(f"{plan.name} did not report SERVING on {plan.grpc_addr} within "
                  f"{timeout_s:g} s (last: {last}); its log ({plan.log_file}) ends with:\n"
                  f"{children.log_tail(plan)}")


def _busy_addresses(plans: dict[str, _DaemonPlan]) -> list[str]:
    """The planned gRPC and metrics addresses that cannot be listened on, with why."""
    busy = []
    for plan in plans.values():
        for addr in (plan.grpc_addr, plan.metrics_addr):
            problem = listen_problem(*parse_host_port(addr))
            if problem is not None:
                busy.append(f"{addr} ({problem})")
    return busy


def _own_command() -> str:
    """How to run this CLI from the user's shell: ``hami-accounting`` when that is the one on
    PATH, else the path of this environment's script (``.venv/bin/hami-accounting`` after
    ``make up``, relative to the current folder when inside it)."""
    script = Path(sys.executable).parent / "hami-accounting"
    if not script.is_file():
        return f"{sys.executable} -m services.cli"
    on_path = shutil.which("hami-accounting")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "hami-accounting"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script)


EXAMPLE_POD = Path("examples") / "sidecar-before-init.yaml"
"""The pod the banner suggests explaining, when the checkout's examples/ is at hand."""


def _print_banner(plans: dict[str, _DaemonPlan], data_dir: Path, tls: TlsConfig | None) -> None:
    usage, admission, scheduler = plans["usage"], plans["admission"], plans["scheduler"]
    command = _own_command()
    tries = [
        (f"{command} demo --usage-addr {usage.grpc_addr} --admission-addr "
         f"{admission.grpc_addr} --scheduler-addr {scheduler.grpc_addr}",
         "walk the design's cases through the stack"),
        (f"{command} usage --usage-addr {usage.grpc_addr}", "what the recorder charges"),
        (f"{command} health {usage.grpc_addr} --service {SERVICE_NAMES['usage']}",
         "SERVING?"),
    ]
    if EXAMPLE_POD.is_file():
        tries.append((f"{command} explain {EXAMPLE_POD}", "how one pod is charged (no daemon)"))
    lines = [
        f"hami-accounting is up (data in {data_dir}, logs in {data_dir / 'logs'}):",
        *(f"  {p.name:<10} {p.grpc_addr:<17} metrics {p.metrics_url}"
          for p in (usage, admission, scheduler)),
        "",
        "Try, in another terminal" + (" with the same HAMI_ACCOUNTING_TLS_* variables:"
                                      if tls is not None else ":"),
        *(f"  # {why}\n  {line}" for line, why in tries),
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def run(namespace: argparse.Namespace) -> int:
    """Runs ``up`` with the parsed arguments; returns the exit code."""
    data_dir: Path = namespace.data_dir
    grace_s = 10.0
    try:
        tls = TlsConfig.from_env(os.environ)
    except ConfigError as error:
        print(f"hami-accounting up: {error}", file=sys.stderr)
        return EXIT_USAGE
    plans = _plan(data_dir, namespace.base_port, namespace.metrics_base_port)
    usage_addr = plans["usage"].grpc_addr
    busy = _busy_addresses(plans)
    if busy:
        # Checked before anything starts: a stack already running on these ports would
        # otherwise answer the health checks of this one, which then failed to bind.
        print(f"hami-accounting up: cannot listen on {'; '.join(busy)}. Is another "
              "`hami-accounting up` running? Stop it, or choose other ports with "
              "--base-port and --metrics-base-port.", file=sys.stderr)
        return EXIT_FAILED

    stop_requested = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    watched = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, on_signal) for signum in watched}
    children = _Children()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        for name in _START_ORDER:
            plan = plans[name]
            children.start(plan, _child_env(plan, usage_addr, data_dir))
            if name == "usage":
                _wait_serving(plan, children, namespace.start_timeout_s, tls, stop_requested)
        for name in _START_ORDER[1:]:
            _wait_serving(plans[name], children, namespace.start_timeout_s, tls, stop_requested)
        if not stop_requested.is_set():
            _print_banner(plans, data_dir, tls)
        while not stop_requested.wait(0.5):
            exited = children.exited()
            if exited:
                name, code = exited[0]
                raise UpError(f"{name} exited with code {code}; its log "
                              f"({plans[name].log_file}) ends with:\n"
                              f"{children.log_tail(plans[name])}")
        print("stopping...", flush=True)
        return EXIT_OK
    except UpError as error:
        print(f"hami-accounting up: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        children.stop(grace_s)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
