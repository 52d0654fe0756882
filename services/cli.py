"""The ``hami-accounting`` command: run a daemon, run all three locally, probe health, demo.

Layer: services (entry point). Subcommands:

* ``serve {admission,scheduler,usage} [args...]``: runs one daemon in this process.
* ``up``: runs the three daemons as child processes on localhost until Ctrl-C.
* ``health ADDR [--service NAME]``: prints the gRPC health status; exit 0 only when SERVING
  (the container HEALTHCHECK and compose use it).
* ``demo``, ``explain``, ``usage``, ``what-if``, ``journal``: forwarded with their arguments to
  ``services.demo``, ``services.explain``, ``services.usage_report``, ``services.what_if`` and
  ``services.usage.journal_tool``.
"""

from __future__ import annotations

import os

# gRPC's C core, left to itself, prints INFO lines on stderr (a failed TLS handshake, say)
# beside the sentence the CLI prints about the same failure. ERROR is what gRPC documents as
# its default; it must be set before grpc is imported. An operator's own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import importlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import (
    DEFAULT_PORTS,
    ConfigError,
    TlsConfig,
    env_name,
    parse_host_port,
)
from services.common.ports import listen_problem
from services.common.reachability import unreachable_reason
from services.common.server import client_channel

DAEMONS = ("admission", "scheduler", "usage")

# Subcommands implemented in their own modules; they parse their own arguments.
_FORWARDED = {
    "demo": ("services.demo", "walk through the accounting against running daemons"),
    "explain": ("services.explain", "explain a pod's accounting step by step"),
    "usage": ("services.usage_report", "show what the usage recorder has charged"),
    "what-if": ("services.what_if", "replay a workload under each GPU accounting rule"),
    "journal": ("services.usage.journal_tool", "back up, restore or check the recorder's journal"),
}

_SERVICE_NAMES = {
    "admission": "hami.accounting.v1.Admission",
    "scheduler": "hami.accounting.v1.Scheduler",
    "usage": "hami.accounting.v1.UsageRecorder",
}

# How `up` runs one daemon: this CLI's `serve NAME` in a fresh interpreter. Tests replace it
# with a stand-in daemon.
SERVE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "services.cli", "serve")

# `up` starts the recorder first: the other two read usage from it.
_START_ORDER = ("usage", "admission", "scheduler")
_LOG_TAIL_LINES = 20

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 1
"""When the reader of stdout went away; rich ends its own table output the same way."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the process exit code."""
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly. stdout is pointed at /dev/null so
        # the interpreter's last flush cannot raise again on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _dispatch(args: list[str]) -> int:
    # Forwarded subcommands and `serve NAME` keep their arguments verbatim (including --help),
    # so they are dispatched before argparse sees them.
    if args and args[0] in _FORWARDED:
        module_name, _ = _FORWARDED[args[0]]
        return _run_module_main(module_name, args[0], args[1:])
    if len(args) >= 2 and args[0] == "serve" and args[1] in DAEMONS:
        return _run_module_main(f"services.{args[1]}.__main__", f"serve {args[1]}", args[2:])

    parser = _parser()
    namespace = parser.parse_args(args)
    command: Callable[[argparse.Namespace], int] = namespace.command
    return command(namespace)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami-accounting",
        description="GPU accounting for Kubernetes pods with init containers and sidecars.",
    )
    sub = parser.add_subparsers(metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run one daemon in this process")
    serve.add_argument("name", choices=DAEMONS)
    serve.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the daemon")
    serve.set_defaults(command=lambda ns: _run_module_main(
        f"services.{ns.name}.__main__", f"serve {ns.name}", ns.args))

    up = sub.add_parser("up", help="run the three daemons on localhost until Ctrl-C")
    up.add_argument("--data-dir", type=Path, default=Path("data"),
                    help="journal and logs (default: ./data)")
    up.add_argument("--base-port", type=int, default=DEFAULT_PORTS["admission"].grpc,
                    help="gRPC port of admission; scheduler and usage take the next two "
                         "(default: %(default)s)")
    up.add_argument("--metrics-base-port", type=int, default=DEFAULT_PORTS["admission"].metrics,
                    help="metrics port of admission; scheduler and usage take the next two "
                         "(default: %(default)s)")
    up.add_argument("--start-timeout-s", type=float, default=30.0,
                    help="how long each daemon may take to report SERVING (default: 30)")
    up.set_defaults(command=_up)

    check = sub.add_parser("health", help="print a daemon's gRPC health; exit 0 when SERVING")
    check.add_argument("addr", help="host:port")
    check.add_argument("--service", default="",
                       help='full service name, e.g. hami.accounting.v1.UsageRecorder '
                            '(default: "" = the whole server)')
    check.add_argument("--timeout-s", type=float, default=3.0)
    check.set_defaults(command=_health)

    for name, (_module, summary) in _FORWARDED.items():
        # Listed for --help only; main() forwards these before argparse runs.
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def _run_module_main(module_name: str, command: str, args: Sequence[str]) -> int:
    module = _import_optional(module_name)
    if module is None:
        print(f"hami-accounting {command}: {module_name} is not part of this build yet",
              file=sys.stderr)
        return EXIT_USAGE
    entry = getattr(module, "main", None)
    if not callable(entry):
        print(f"hami-accounting {command}: {module_name} has no main(argv)", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = entry(list(args))
    except ConfigError as error:
        print(f"hami-accounting {command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    return int(result or 0)


def _import_optional(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # Only the module itself (or its package) being absent counts as "not there"; a missing
        # dependency inside it is a real error and propagates.
        parts = module_name.split(".")
        absent = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        if error.name in absent:
            return None
        raise


# --- health ------------------------------------------------------------------------------------


def check_health(target: str, service: str = "", *, timeout_s: float = 3.0,
                 tls: TlsConfig | None = None) -> str:
    """The health status name of ``service`` at ``target`` (SERVING, NOT_SERVING, ...).

    Raises grpc.RpcError when the server cannot be reached or does not know the service.
    """
    with client_channel(target, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _health_failure(addr: str, service: str, code: grpc.StatusCode, details: str) -> str:
    """What went wrong, in words: grpcio's NOT_FOUND comes with no details at all."""
    if code == grpc.StatusCode.NOT_FOUND:
        known = ", ".join(_SERVICE_NAMES[name] for name in DAEMONS)
        return (f"the server at {addr} reports no health for service {service!r}; a daemon "
                f'reports "" (the whole server, the default) and its own service: {known}')
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"nothing answers at {addr} ({details or 'no details'})"
    return details or "(no details)"


def _health(namespace: argparse.Namespace) -> int:
    try:
        tls = TlsConfig.from_env(os.environ)
    except ConfigError as error:
        print(f"hami-accounting health: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        status = check_health(namespace.addr, namespace.service,
                              timeout_s=namespace.timeout_s, tls=tls)
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = (error.details() if hasattr(error, "details") else str(error)) or ""
        reason = None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            reason = unreachable_reason(namespace.addr, tls, namespace.timeout_s)
        if reason is None:
            reason = _health_failure(namespace.addr, namespace.service, code, details)
        print(f"{code.name}: {reason}")
        return EXIT_FAILED
    print(status)
    return EXIT_OK if status == "SERVING" else EXIT_FAILED


# --- up ----------------------------------------------------------------------------------------


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
            last = check_health(plan.grpc_addr, _SERVICE_NAMES[plan.name], timeout_s=1.0, tls=tls)
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
        (f"{command} health {usage.grpc_addr} --service {_SERVICE_NAMES['usage']}",
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


def _up(namespace: argparse.Namespace) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
