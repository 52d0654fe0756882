"""Child processes of the benchmark: the daemons and the no-op server, started and stopped.

Layer: benchmark. Each daemon runs as ``python -m services.cli serve NAME`` (the no-op server as
``python -m bench.noop_server``) on a free 127.0.0.1 port, with metrics off, its JSON log in the
run's work directory, and tracing on or off through the standard OTEL_* variables only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
SERVING_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 30


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tracing_env(otlp_endpoint: str | None) -> dict[str, str]:
    """OTEL_* variables: off, or on with every span sampled and exported to ``otlp_endpoint``."""
    if otlp_endpoint is None:
        return {"OTEL_SDK_DISABLED": "true"}
    return {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }


class DaemonError(RuntimeError):
    """A child did not come up; the message ends with its log."""


@dataclass
class Child:
    name: str
    address: str
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON lines of the child's log (other lines are skipped)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                records.append(value)
        return records

    def rss_kib(self) -> int:
        """Resident memory now (VmRSS), KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise DaemonError(f"{self.name}: no VmRSS for pid {self.pid}")

    def cpu_s(self) -> float:
        """User + system CPU time the process has used so far, seconds."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> float:
        """Polls grpc.health.v1 (overall status) until SERVING; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        last = "no answer"
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise DaemonError(f"{self.name} exited with {self.process.returncode} before "
                                      f"serving; its log ends with:\n{self.log_tail()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - started
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                except grpc.RpcError as error:
                    last = error.code().name
                if time.monotonic() > deadline:
                    raise DaemonError(f"{self.name} at {self.address} not SERVING after "
                                      f"{timeout_s:.0f} s (last: {last}); its log ends "
                                      f"with:\n{self.log_tail()}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(
    name: str,
    work_dir: Path,
    *,
    label: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Starts daemon ``name`` (admission, scheduler, usage, or noop) without waiting for it."""
    label = label or name
    address = f"127.0.0.1:{free_port()}"
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("HAMI_ACCOUNTING_", "OTEL_"))}
    child_env.update({
        "HAMI_ACCOUNTING_LISTEN_ADDR": address,
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    })
    if name == "noop":
        command = [sys.executable, "-m", "bench.noop_server"]
    else:
        command = [sys.executable, "-m", "services.cli", "serve", name]
    log_path = work_dir / f"{label}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=child_env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)
    return Child(label, address, log_path, process)
