"""The health contract the probes in deploy/ rely on, checked against the real daemons.

Each daemon runs as the manifests run it (``hami-accounting serve NAME`` with the container's
variables, on free loopback ports). readinessProbe asks for the overall ("") status (the
recorder's for its "readiness" service, which also counts a standby that can take over);
livenessProbe asks for the "liveness" health service, which must be SERVING from start-up to
shutdown, so a healthy standby recorder, or a daemon waiting for a dependency, is never
restarted by the kubelet. compose and the image HEALTHCHECK run ``hami-accounting health``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from deploy_support import REPO_ROOT
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 30.0
LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = "readiness"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def health(addr: str, service: str) -> str:
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_for(addr: str, service: str, process: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"daemon exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            last = health(addr, service)
            if last == "SERVING":
                return last
        except grpc.RpcError as error:
            last = error.code().name
        time.sleep(0.2)
    return last


class Daemon:
    def __init__(self, name: str, tmp_path: Path, extra_env: dict[str, str]) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        inherited = os.environ.items()
        env = {k: v for k, v in inherited if not k.startswith(("HAMI_ACCOUNTING_", "OTEL_"))}
        env.update(
            {
                "HAMI_ACCOUNTING_LISTEN_ADDR": self.addr,
                "HAMI_ACCOUNTING_METRICS_ADDR": "off",
                "HAMI_ACCOUNTING_LOG_LEVEL": "info",
                "OTEL_SDK_DISABLED": "true",
                **extra_env,
            }
        )
        self.log = tmp_path / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", name],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def daemon_written(name: str) -> bool:
    return (REPO_ROOT / "services" / name / "__main__.py").is_file()


@pytest.fixture(scope="module")
def usage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not daemon_written("usage"):
        pytest.skip("the usage daemon is not written yet")
    tmp_path = tmp_path_factory.mktemp("usage")
    daemon = Daemon(
        "usage",
        tmp_path,
        {"HAMI_ACCOUNTING_DATA_DIR": str(tmp_path / "data"), "HAMI_ACCOUNTING_KUBERNETES": "off"},
    )
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.mark.parametrize("name", ["usage", "admission", "scheduler"])
def test_daemon_is_alive_and_ready_under_its_container_settings(
    name: str, usage: Daemon, tmp_path: Path
) -> None:
    if name == "usage":
        daemon = usage
    else:
        if not daemon_written(name):
            pytest.skip(f"the {name} daemon is not written yet")
        daemon = Daemon(name, tmp_path, {"HAMI_ACCOUNTING_USAGE_ADDR": usage.addr})
    try:
        assert wait_for(daemon.addr, LIVENESS_SERVICE, daemon.process, daemon.log) == "SERVING"
        assert wait_for(daemon.addr, "", daemon.process, daemon.log) == "SERVING"
        if name == "usage":
            # The recorder's readinessProbe asks its "readiness" service (SERVING on a
            # stand-alone recorder as soon as the overall status is).
            assert wait_for(daemon.addr, READINESS_SERVICE, daemon.process,
                            daemon.log) == "SERVING"
        # What compose's healthcheck and the image HEALTHCHECK run.
        check = subprocess.run(
            [sys.executable, "-m", "services.cli", "health", daemon.addr],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.strip() == "SERVING"
    finally:
        if daemon is not usage:
            daemon.stop()
