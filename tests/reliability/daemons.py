"""The daemons as real processes for the reliability tests, and throwaway certificates.

* ``Daemon``: ``python -m services.cli serve usage|admission|scheduler`` on a free port,
  configured only by ``HAMI_ACCOUNTING_*`` variables, its output (stdout and stderr) in a log
  file; health checked with the same TLS settings a client would use; its RSS read from /proc.
* ``start_stack``: the three daemons, admission and scheduler pointed at the recorder.
* ``Pki``: a CA, per-daemon certificates valid as TLS server *and* client (each daemon serves
  and dials the recorder with the same pair), a client certificate, and a rogue CA's client
  certificate, all made with the openssl command line (as tests/services/common does).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.cli.health import check_health
from services.common.config import TlsConfig
from services.common.server import client_channel

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
SERVICE_NAMES = {
    "usage": "hami.accounting.v1.UsageRecorder",
    "admission": "hami.accounting.v1.Admission",
    "scheduler": "hami.accounting.v1.Scheduler",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without HAMI_ACCOUNTING_* and OTEL_* settings, tracing off."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HAMI_ACCOUNTING_", "OTEL_"))}
    env.update({"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def tls_env(tls: TlsConfig) -> dict[str, str]:
    env = {"HAMI_ACCOUNTING_TLS_CERT_FILE": str(tls.cert_file),
           "HAMI_ACCOUNTING_TLS_KEY_FILE": str(tls.key_file)}
    if tls.ca_file is not None:
        env["HAMI_ACCOUNTING_TLS_CA_FILE"] = str(tls.ca_file)
    return env


@dataclass
class Daemon:
    """One daemon process."""

    name: str
    workdir: Path
    env: Mapping[str, str]
    tls: TlsConfig | None = None
    """The certificate a client of this daemon presents (health checks included)."""
    webhook_ca: Path | None = None
    """The CA that signed the AdmissionReview endpoint's certificate, when it serves one."""
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.workdir / f"{self.name}.log"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True) -> Daemon:
        """Starts the process on a new free port (each start, so a killed predecessor's socket
        never matters) and waits until it reports SERVING."""
        self.port = free_port()
        env = {**self.env, "HAMI_ACCOUNTING_LISTEN_ADDR": self.addr,
               "HAMI_ACCOUNTING_METRICS_ADDR": "off"}
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", self.name],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        self.starts += 1
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise AssertionError(f"{self.name} exited with {code}:\n{self.log_tail()}")
            if self.healthy(timeout_s=0.5):
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not SERVING after {timeout_s} s:\n"
                             f"{self.log_tail()}")

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return check_health(self.addr, SERVICE_NAMES[self.name], timeout_s=timeout_s,
                                tls=self.tls) == "SERVING"
        except grpc.RpcError:
            return False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def channel(self, **options: object) -> grpc.Channel:
        return client_channel(self.addr, tls=self.tls, **options)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL, then reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait (SIGKILL if it does not stop); returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def rss_bytes(self) -> int:
        """Resident set size of the process, from /proc."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@contextmanager
def running_stack(
    workdir: Path,
    *,
    server_tls: Mapping[str, TlsConfig] | None = None,
    client_tls: TlsConfig | None = None,
    extra_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[dict[str, Daemon]]:
    """The three daemons, started (recorder first) and stopped at the end.

    ``server_tls`` maps a daemon to the certificate it serves and dials with; ``client_tls`` is
    what the test presents when it checks health or calls.
    """
    extra = extra_env or {}

    def env(name: str, **values: str) -> dict[str, str]:
        own = tls_env(server_tls[name]) if server_tls else {}
        return clean_env(**own, **extra.get(name, {}), **values)

    daemons: dict[str, Daemon] = {}
    try:
        usage = Daemon("usage", workdir, env("usage", HAMI_ACCOUNTING_DATA_DIR=str(
            workdir / "data")), tls=client_tls).start()
        daemons["usage"] = usage
        for name in ("admission", "scheduler"):
            daemons[name] = Daemon(name, workdir, env(name, HAMI_ACCOUNTING_USAGE_ADDR=usage.addr),
                                   tls=client_tls).start(wait=False)
        for name in ("admission", "scheduler"):
            daemons[name].wait_serving()
        yield daemons
    finally:
        for daemon in reversed(list(daemons.values())):
            daemon.stop()


# -- certificates ------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    """Certificates in ``directory``; every TlsConfig carries the CA it trusts."""

    directory: Path
    ca: tuple[Path, Path]
    rogue_ca: tuple[Path, Path]

    @classmethod
    def create(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory, cls._make_ca(directory, "ca"), cls._make_ca(directory, "rogue-ca"))

    @staticmethod
    def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
        key, cert = directory / f"{name}.key", directory / f"{name}.pem"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
                 "-days", "2")
        return cert, key

    def leaf(self, name: str, *, server: bool = True, rogue: bool = False) -> TlsConfig:
        """A certificate for ``name``: server and client auth (a daemon), or client only."""
        ca = self.rogue_ca if rogue else self.ca
        key, csr, cert = (self.directory / f"{name}.key", self.directory / f"{name}.csr",
                          self.directory / f"{name}.pem")
        extensions = self.directory / f"{name}.ext"
        lines = ["extendedKeyUsage=" + ("serverAuth,clientAuth" if server else "clientAuth")]
        if server:
            lines.append("subjectAltName=DNS:localhost,IP:127.0.0.1")
        extensions.write_text("\n".join(lines) + "\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
                 "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions))
        # Whoever holds this certificate trusts the real CA (a rogue client would accept the
        # real server; it is its own certificate that must be refused).
        return TlsConfig(cert_file=cert, key_file=key, ca_file=self.ca[0])
