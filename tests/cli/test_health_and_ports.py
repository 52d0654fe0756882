"""What the command line says when a daemon cannot be reached or a port is taken: the TLS
mismatch named (not "nothing answers"), a second ``up`` refused before it starts anything,
and a busy port refused in one sentence with no line of gRPC's own on stderr."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.daemons import REPO, Daemon, Pki, clean_env, free_port, tls_env

TIMEOUT_S = 60


def hami(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_recorder(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("tls-recorder")
    server = pki.leaf("usage")
    daemon = Daemon("usage", workdir,
                    clean_env(HAMI_ACCOUNTING_DATA_DIR=str(workdir / "data"), **tls_env(server)),
                    tls=server).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def plain_recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("plain-recorder")
    daemon = Daemon("usage", workdir,
                    clean_env(HAMI_ACCOUNTING_DATA_DIR=str(workdir / "data"))).start()
    yield daemon
    daemon.stop()


def test_health_of_a_tls_daemon_without_tls_names_the_variables(tls_recorder: Daemon) -> None:
    result = hami("health", tls_recorder.addr, env=clean_env())

    assert result.returncode == 1
    assert result.stdout == (
        f"UNAVAILABLE: the daemon at {tls_recorder.addr} speaks TLS and this client does not: "
        "set HAMI_ACCOUNTING_TLS_CERT_FILE, HAMI_ACCOUNTING_TLS_KEY_FILE and "
        "HAMI_ACCOUNTING_TLS_CA_FILE as the daemon's clients do (docs/security.md)\n")
    assert result.stderr == ""


def test_health_with_a_certificate_of_another_ca_says_it_was_refused(
    tls_recorder: Daemon, pki: Pki
) -> None:
    rogue = pki.leaf("rogue-client", server=False, rogue=True)

    result = hami("health", tls_recorder.addr, env=clean_env(**tls_env(rogue)))

    assert result.returncode == 1
    assert f"the daemon at {tls_recorder.addr} refused this client's certificate" in result.stdout
    assert "signed by the CA the daemon trusts" in result.stdout
    assert result.stderr == ""


def test_health_with_the_right_certificate_is_serving(tls_recorder: Daemon, pki: Pki) -> None:
    client = pki.leaf("client", server=False)

    result = hami("health", tls_recorder.addr, env=clean_env(**tls_env(client)))

    assert (result.returncode, result.stdout) == (0, "SERVING\n")


def test_health_set_for_tls_at_a_plaintext_daemon_says_so(
    plain_recorder: Daemon, pki: Pki
) -> None:
    client = pki.leaf("client", server=False)

    result = hami("health", plain_recorder.addr, env=clean_env(**tls_env(client)))

    assert result.returncode == 1
    assert result.stdout.startswith(
        f"UNAVAILABLE: the daemon at {plain_recorder.addr} speaks plaintext, and this client is "
        "set for TLS")
    assert result.stderr == ""  # no handshake line of gRPC's own


def test_health_of_a_daemon_whose_certificate_this_client_does_not_trust(
    pki: Pki, tmp_path: Path
) -> None:
    # The recorder's certificate comes from the rogue CA; the client trusts the real one.
    server = pki.leaf("rogue-usage", rogue=True)
    daemon = Daemon("usage", tmp_path,
                    clean_env(HAMI_ACCOUNTING_DATA_DIR=str(tmp_path / "data"),
                              **tls_env(server)))
    daemon.start(wait=False)
    try:
        client = pki.leaf("client", server=False)
        # Ready once the port accepts connections (its own health needs its own CA).
        for _ in range(600):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", daemon.port)) == 0:
                    break
            assert daemon.alive, daemon.log_tail()
            subprocess.run(["sleep", "0.05"], check=True)

        result = hami("health", daemon.addr, env=clean_env(**tls_env(client)))
    finally:
        daemon.stop()

    assert result.returncode == 1
    assert (f"the certificate of the daemon at {daemon.addr} is not trusted by "
            "HAMI_ACCOUNTING_TLS_CA_FILE") in result.stdout


def test_health_where_nothing_listens_says_so() -> None:
    addr = f"127.0.0.1:{free_port()}"

    result = hami("health", addr, "--timeout-s", "1", env=clean_env())

    assert (result.returncode, result.stdout) == (1, f"UNAVAILABLE: nothing listens on {addr}\n")


def test_a_daemon_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"

        result = hami("serve", "admission", env=clean_env(
            HAMI_ACCOUNTING_LISTEN_ADDR=addr, HAMI_ACCOUNTING_METRICS_ADDR="off"))

    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    records = [json.loads(line) for line in lines]  # all JSON: no line of gRPC's C core
    errors = [r["message"] for r in records if r["level"] == "ERROR"]
    assert errors == [
        f"cannot start the admission daemon: cannot listen on {addr}: the address is already in use"
    ]


def test_a_second_up_on_the_same_ports_refuses_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The gRPC ports start at the busy one (admission's); metrics elsewhere.
        metrics_port = free_port()

        result = hami("up", "--data-dir", str(tmp_path / "data"), "--base-port", str(port),
                      "--metrics-base-port", str(metrics_port), env=clean_env())

    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (the address is already in use)" in result.stderr
    assert "Is another `hami-accounting up` running?" in result.stderr
    assert "--base-port" in result.stderr
    assert "is up" not in result.stdout
    assert not (tmp_path / "data").exists()  # nothing was started
