"""The certificate recipes of docs/deploy.md ("TLS"), run as written, then used.

Each recipe is the fenced block after a ``<!-- recipe: NAME -->`` line of the doc; it runs in
bash (``set -euo pipefail``) in an empty folder with the real openssl, and with ``kubectl``
answering ``--dry-run=client -o yaml`` (the real kubectl of the dev extra, no cluster), so the
Secrets it would create are read back. The daemons are then started with what it made: the
gRPC certificate must carry the three daemons' mutual TLS, the admission daemon's hop to the
recorder, each Service name and 127.0.0.1 (and no other name), and HAMi's client certificate;
the webhook's certificate must serve HTTPS verified against its CA under the Service name.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from deploy_support import DOCS_DEPLOY, NAMESPACE, kubectl
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hami.accounting.v1 import admission_pb2, admission_pb2_grpc, usage_pb2, usage_pb2_grpc
from services.common.config import TlsConfig
from services.common.server import client_channel
from tests.reliability.daemons import REPO, Daemon, clean_env, free_port, running_stack

pytestmark = pytest.mark.timeout(300)

RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```sh\n(.*?)\n```", re.DOTALL)
SERVICES = tuple(f"hami-accounting-{daemon}" for daemon in ("usage", "admission", "scheduler"))
RPC_TIMEOUT_S = 10.0


def recipes() -> dict[str, str]:
    return dict(RECIPE.findall(DOCS_DEPLOY.read_text()))


@dataclass(frozen=True)
class Ran:
    directory: Path
    secrets: list[dict[str, Any]]

    def secret(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        (found,) = [s for s in self.secrets if s["metadata"]["name"] == name
                    and s["metadata"]["namespace"] == namespace]
        return found

    def tls(self, cert: str, key: str, ca: str = "ca.crt") -> TlsConfig:
        return TlsConfig(cert_file=self.directory / cert, key_file=self.directory / key,
                         ca_file=self.directory / ca)


def run_recipe(name: str, directory: Path) -> Ran:
    """Runs the doc's recipe in ``directory``; kubectl prints the objects it would create."""
    directory.mkdir(parents=True)
    shims = directory / ".bin"
    shims.mkdir()
    created = directory / ".created.yaml"
    shim = shims / "kubectl"
    shim.write_text(
        "#!/bin/sh\n"
        f'"{kubectl()}" "$@" --dry-run=client -o yaml >> "{created}"\n'
        f'echo --- >> "{created}"\n'
    )
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "KUBECONFIG": "/nonexistent"}
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + recipes()[name]],
        cwd=directory, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    objects = [o for o in yaml.safe_load_all(created.read_text()) if o] if created.exists() else []
    return Ran(directory, objects)


def test_the_doc_has_its_recipes() -> None:
    # extender-tls is run by test_deploy_extender.py
    assert sorted(recipes()) == ["extender-tls", "grpc-tls", "webhook-tls"]


# -- the gRPC certificate ------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_recipe(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run_recipe("grpc-tls", tmp_path_factory.mktemp("grpc-tls") / "certs")


def test_the_grpc_recipe_creates_the_secrets_the_manifests_mount(grpc_recipe: Ran) -> None:
    secret = grpc_recipe.secret("hami-accounting-grpc-tls")
    assert secret["kind"] == "Secret"
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    for key, value in secret["data"].items():
        assert base64.b64decode(value) == (grpc_recipe.directory / key).read_bytes()
    client = grpc_recipe.secret("hami-accounting-client-tls", namespace="kube-system")
    assert base64.b64decode(client["data"]["tls.crt"]) == (
        grpc_recipe.directory / "hami-client.crt").read_bytes()
    assert sorted(client["data"]) == ["ca.crt", "tls.crt", "tls.key"]


@pytest.fixture(scope="module")
def grpc_stack(
    grpc_recipe: Ran, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Daemon]]:
    # Every daemon with the recipe's one certificate, as the tls component mounts it; the test
    # calls as HAMi would, with HAMi's client certificate.
    daemon_tls = grpc_recipe.tls("tls.crt", "tls.key")
    hami = grpc_recipe.tls("hami-client.crt", "hami-client.key")
    workdir = tmp_path_factory.mktemp("grpc-stack")
    with running_stack(workdir, server_tls=dict.fromkeys(("usage", "admission", "scheduler"),
                                                         daemon_tls),
                       client_tls=hami) as daemons:
        yield daemons


def _health(channel: grpc.Channel) -> str:
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _answer(address: str, credentials: grpc.ChannelCredentials, name: str | None = None) -> str:
    """The overall health status, or the code of the refusal, under the TLS name ``name``."""
    options = (("grpc.ssl_target_name_override", name),) if name else ()
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            return _health(channel)
        except grpc.RpcError as refused:
            return str(refused.code().name)


def _credentials(ran: Ran, cert: str | None, key: str | None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ran.directory / "ca.crt").read_bytes(),
        private_key=(ran.directory / key).read_bytes() if key else None,
        certificate_chain=(ran.directory / cert).read_bytes() if cert else None,
    )


def test_the_daemons_serve_mutual_tls_with_it(
    grpc_recipe: Ran, grpc_stack: dict[str, Daemon]
) -> None:
    for name, daemon in grpc_stack.items():
        listening = [json.loads(line) for line in daemon.log_text().splitlines()
                     if line.startswith("{") and "gRPC server listening" in line]
        assert listening[-1]["tls"] == "mutual", name
        # HAMi's certificate gets through; TLS without a client certificate does not.
        hami = _credentials(grpc_recipe, "hami-client.crt", "hami-client.key")
        assert _answer(daemon.addr, hami) == "SERVING", name
        assert _answer(daemon.addr, _credentials(grpc_recipe, None, None)) == "UNAVAILABLE"


def test_the_certificate_is_valid_for_each_service_name_and_no_other(
    grpc_recipe: Ran, grpc_stack: dict[str, Daemon]
) -> None:
    usage = grpc_stack["usage"]
    credentials = _credentials(grpc_recipe, "hami-client.crt", "hami-client.key")
    names = [f"{service}{suffix}" for service in SERVICES
             for suffix in ("", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local")]
    for name in names:
        assert _answer(usage.addr, credentials, name) == "SERVING", name
    for name in ("hami-accounting-other.hami-system.svc", "hami-accounting-usage.default.svc"):
        assert _answer(usage.addr, credentials, name) == "UNAVAILABLE", name


def test_the_admission_daemon_reaches_the_recorder_with_it(
    grpc_recipe: Ran, grpc_stack: dict[str, Daemon]
) -> None:
    # The hop admission -> recorder presents the recipe's certificate as a client (clientAuth),
    # and verifies the recorder's (serverAuth, 127.0.0.1 here). A quota makes the check read
    # the recorder's usage: the limit in the answer can only have come from there.
    hami = grpc_recipe.tls("hami-client.crt", "hami-client.key")
    with client_channel(grpc_stack["usage"].addr, tls=hami) as channel:
        usage_pb2_grpc.UsageRecorderStub(channel).SetQuota(usage_pb2.SetQuotaRequest(
            namespace="tls-recipe", limits={"limits.nvidia.com/gpumem": 12_000}),
            timeout=RPC_TIMEOUT_S)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "p", "namespace": "tls-recipe", "uid": "tls-recipe-1"}, "spec": {"containers": [
            {"name": "app", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}]}}
    with client_channel(grpc_stack["admission"].addr, tls=hami) as channel:
        checked = admission_pb2_grpc.AdmissionStub(channel).CheckQuota(
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=json.dumps(pod).encode()),
            timeout=RPC_TIMEOUT_S)
    assert checked.allowed, checked
    memory = {item.resource: item for item in checked.items}["nvidia.com/gpumem"]
    assert memory.limit_set and memory.limit == 12_000


def test_the_readiness_probe_command_passes_with_it(
    grpc_recipe: Ran, grpc_stack: dict[str, Daemon]
) -> None:
    # What the tls component's readiness probe runs in the pod, with the pod's variables.
    for name, daemon in grpc_stack.items():
        env = clean_env(
            HAMI_ACCOUNTING_TLS_CERT_FILE=str(grpc_recipe.directory / "tls.crt"),
            HAMI_ACCOUNTING_TLS_KEY_FILE=str(grpc_recipe.directory / "tls.key"),
            HAMI_ACCOUNTING_TLS_CA_FILE=str(grpc_recipe.directory / "ca.crt"),
        )
        # The probe's command exactly: the console script the image puts on PATH.
        command = str(Path(sys.executable).parent / "hami-accounting")
        probe = subprocess.run(
            [command, "health", f"127.0.0.1:{daemon.port}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert probe.returncode == 0, (name, probe.stdout, probe.stderr)


# -- the webhook's certificate --------------------------------------------------------------


def wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    """The webhook listens a moment after gRPC reports SERVING: wait for its port."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def webhook_recipe(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run_recipe("webhook-tls", tmp_path_factory.mktemp("webhook-tls") / "certs")


def test_the_webhook_recipe_creates_the_tls_secret_the_admission_pods_mount(
    webhook_recipe: Ran,
) -> None:
    secret = webhook_recipe.secret("hami-accounting-admission-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.crt"]) == (
        webhook_recipe.directory / "webhook.crt").read_bytes()
    assert base64.b64decode(secret["data"]["tls.key"]) == (
        webhook_recipe.directory / "webhook.key").read_bytes()


def test_the_webhook_serves_https_verified_under_its_service_name(
    webhook_recipe: Ran, tmp_path: Path
) -> None:
    port = free_port()
    admission = Daemon("admission", tmp_path, clean_env(
        HAMI_ACCOUNTING_USAGE_ADDR=f"127.0.0.1:{free_port()}",
        HAMI_ACCOUNTING_WEBHOOK_ADDR=f"127.0.0.1:{port}",
        HAMI_ACCOUNTING_WEBHOOK_CERT_FILE=str(webhook_recipe.directory / "webhook.crt"),
        HAMI_ACCOUNTING_WEBHOOK_KEY_FILE=str(webhook_recipe.directory / "webhook.key"),
    )).start()
    try:
        wait_for_port(port)
        # As the API server calls it: verified against caBundle, under the Service's name.
        ca = webhook_recipe.directory / "webhook-ca.crt"
        context = ssl.create_default_context(cafile=str(ca))
        for name, accepted in [(f"hami-accounting-admission.{NAMESPACE}.svc", True),
                               (f"hami-accounting-admission.{NAMESPACE}.svc.cluster.local", True),
                               ("hami-accounting-usage.hami-system.svc", False)]:
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            if not accepted:
                with pytest.raises(ssl.SSLCertVerificationError):
                    context.wrap_socket(raw, server_hostname=name)
                raw.close()
                continue
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.sock = context.wrap_socket(raw, server_hostname=name)
            connection.request("GET", "/healthz")
            assert connection.getresponse().status == 200, name
            connection.close()
    finally:
        admission.stop()
