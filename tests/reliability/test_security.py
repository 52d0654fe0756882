"""Security: mutual TLS on every gRPC hop, a TLS-only webhook, message size limits, deadlines,
and no pod specs or secrets in the logs.

The three daemons run as processes configured only by environment variables
(HAMI_ACCOUNTING_TLS_CERT_FILE/_KEY_FILE/_CA_FILE), each with its own certificate, valid as a
TLS server and as a TLS client: admission and scheduler present theirs when they dial the
recorder. Certificates come from a throwaway CA made with openssl; a second, rogue CA signs a
certificate that must be refused. Every daemon logs at DEBUG, so the log check is strict.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from services.common.config import TlsConfig
from services.common.server import client_channel
from tests.reliability.daemons import (
    REPO,
    SERVICE_NAMES,
    Daemon,
    Pki,
    clean_env,
    free_port,
    running_stack,
    tls_env,
)
from tests.reliability.model import (
    APP,
    INIT,
    SIDECAR,
    ContainerSpec,
    GrantSpec,
    PodSpec,
    Snapshot,
    Status,
    device_message,
    pod_json,
    pod_json_object,
    usage_from_pb,
)

pytestmark = pytest.mark.timeout(300)

RPC_TIMEOUT_S = 10.0
NODE, NAMESPACE = "secure-node", "secure-ns"
UUIDS = ("GPU-secure-0", "GPU-secure-1")
# Secret-looking values a pod may carry; none may ever reach a log.
ENV_SECRET = "AKIA" + secrets.token_hex(8).upper()
ANNOTATION_SECRET = "s3cr3t-" + secrets.token_urlsafe(18)
IMAGE = "registry.example/secret-image:" + secrets.token_hex(4)
DAEMONS = ("usage", "admission", "scheduler")


@dataclass
class SecureStack:
    daemons: dict[str, Daemon]
    pki: Pki
    client: TlsConfig
    rogue: TlsConfig
    webhook_port: int


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    workdir = tmp_path_factory.mktemp("secure")
    pki = Pki.create(workdir / "pki")
    server_tls = {name: pki.leaf(name) for name in DAEMONS}
    webhook = pki.leaf("webhook")
    webhook_port = free_port()
    extra = {name: {"HAMI_ACCOUNTING_LOG_LEVEL": "DEBUG"} for name in DAEMONS}
    extra["admission"].update({
        "HAMI_ACCOUNTING_WEBHOOK_ADDR": f"127.0.0.1:{webhook_port}",
        "HAMI_ACCOUNTING_WEBHOOK_CERT_FILE": str(webhook.cert_file),
        "HAMI_ACCOUNTING_WEBHOOK_KEY_FILE": str(webhook.key_file),
    })
    client = pki.leaf("hami-client", server=False)
    rogue = pki.leaf("rogue-client", server=False, rogue=True)
    with running_stack(workdir, server_tls=server_tls, client_tls=client,
                       extra_env=extra) as daemons:
        with client_channel(daemons["usage"].addr, tls=client) as channel:
            usage = usage_pb2_grpc.UsageRecorderStub(channel)
            usage.RegisterNode(usage_pb2.RegisterNodeRequest(
                node_name=NODE, inventory=types_pb2.NodeInventory(
                    devices=[device_message(u, i, memory_mib=24576) for i, u in
                             enumerate(UUIDS)])), timeout=RPC_TIMEOUT_S)
            usage.SetQuota(usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits={
                "limits.nvidia.com/gpumem": 30_000}), timeout=RPC_TIMEOUT_S)
        yield SecureStack(daemons, pki, client, rogue, webhook_port)


# -- pods carrying secrets ---------------------------------------------------------------------


def secret_pod(uid: str, *, init_mib: int = 8192, app_mib: int = 4096) -> PodSpec:
    return PodSpec(uid, NAMESPACE, f"secure-{uid}", NODE, (
        ContainerSpec("warmup", INIT, (GrantSpec(UUIDS[0], init_mib, 10),)),
        ContainerSpec("proxy", SIDECAR, (GrantSpec(UUIDS[0], 1024, 5),)),
        ContainerSpec("server", APP, (GrantSpec(UUIDS[0], app_mib, 10),)),
    ))


def secret_json(pod: PodSpec, *, allocated: bool, phase: str = "Pending") -> dict[str, Any]:
    snapshot = Snapshot(phase, (Status("warmup", "running"), Status("proxy", "waiting")),
                        (Status("server", "waiting"),))
    obj = pod_json_object(
        pod, snapshot, allocated=allocated,
        annotations={"example.com/api-token": ANNOTATION_SECRET},
        env={"AWS_SECRET_ACCESS_KEY": ENV_SECRET, "DB_PASSWORD": ANNOTATION_SECRET})
    for container in [*obj["spec"]["containers"], *obj["spec"].get("initContainers", [])]:
        container["image"] = IMAGE
        if not allocated:
            # Requests for admission and scheduling (an allocated pod keeps its annotation).
            mib = {c.name: c.grants[0].memory_mib for c in pod.containers}[container["name"]]
            container["resources"] = {"limits": {"nvidia.com/gpu": "1",
                                                 "nvidia.com/gpumem": str(mib),
                                                 "nvidia.com/gpucores": "10"}}
    return obj


def _stubs(daemons: dict[str, Daemon], tls: TlsConfig | None, **options: Any) -> dict[str, Any]:
    channels = {name: client_channel(daemons[name].addr, tls=tls, **options) for name in DAEMONS}
    return {
        "channels": channels,
        "usage": usage_pb2_grpc.UsageRecorderStub(channels["usage"]),
        "admission": admission_pb2_grpc.AdmissionStub(channels["admission"]),
        "scheduler": scheduler_pb2_grpc.SchedulerStub(channels["scheduler"]),
    }


def _health(channel: grpc.Channel, service: str) -> Any:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5)


# -- mutual TLS --------------------------------------------------------------------------------


def test_every_daemon_serves_mutual_tls(stack: SecureStack) -> None:
    for name, daemon in stack.daemons.items():
        lines = [json.loads(line) for line in daemon.log_text().splitlines()
                 if line.startswith("{")]
        listening = [line for line in lines if line.get("message") == "gRPC server listening"]
        assert listening and listening[-1]["tls"] == "mutual", (name, listening)


@pytest.mark.parametrize("name", DAEMONS)
def test_a_client_without_a_valid_certificate_is_refused(stack: SecureStack, name: str) -> None:
    daemon = stack.daemons[name]
    ca = stack.pki.ca[0].read_bytes()
    rogue = stack.rogue
    channels = {
        "plaintext": grpc.insecure_channel(daemon.addr),
        "TLS without a client certificate": grpc.secure_channel(
            daemon.addr, grpc.ssl_channel_credentials(root_certificates=ca)),
        "a certificate from another CA": grpc.secure_channel(
            daemon.addr, grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=rogue.read_key(),
                certificate_chain=rogue.read_cert())),
    }
    for how, channel in channels.items():
        with channel, pytest.raises(grpc.RpcError) as refused:
            _health(channel, SERVICE_NAMES[name])
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (name, how)
    # The same call with a certificate from the CA gets an answer.
    with client_channel(daemon.addr, tls=stack.client) as channel:
        assert _health(channel, SERVICE_NAMES[name]).status == 1  # SERVING


def test_a_valid_client_gets_through_the_whole_chain(stack: SecureStack) -> None:
    stubs = _stubs(stack.daemons, stack.client)
    try:
        fits = secret_pod("chain-fits")
        raw = json.dumps(secret_json(fits, allocated=False)).encode()
        # CheckQuota -> admission -> GetNamespaceUsage on the recorder, over mutual TLS.
        checked = stubs["admission"].CheckQuota(
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw), timeout=RPC_TIMEOUT_S)
        assert checked.allowed, checked
        memory = {item.resource: item for item in checked.items}["nvidia.com/gpumem"]
        assert memory.limit_set and memory.limit == 30_000  # read from the recorder
        # Filter -> scheduler -> GetNodeUsage + Reserve on the recorder, over mutual TLS.
        filtered = stubs["scheduler"].Filter(scheduler_pb2.FilterRequest(
            kubernetes_pod_json=raw, node_names=[NODE]), timeout=RPC_TIMEOUT_S)
        assert filtered.node_name == NODE and filtered.reserved, filtered
        stored = stubs["usage"].GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid=fits.uid), timeout=RPC_TIMEOUT_S)
        assert stored.found and stored.node_name == NODE
        assert usage_from_pb(stored.stored) == usage_from_pb(filtered.reserved)
        # A second pod no longer fits the quota: the recorder's usage reached admission. Asked
        # at the reservation's revision: admission's watch cache may trail it by one event
        # otherwise (CheckQuotaRequest.min_usage_revision), as it once did under a full suite.
        too_big = secret_pod("chain-too-big", init_mib=24000)
        refused = stubs["admission"].CheckQuota(admission_pb2.CheckQuotaRequest(
            kubernetes_pod_json=json.dumps(secret_json(too_big, allocated=False)).encode(),
            min_usage_revision=stored.stored_revision), timeout=RPC_TIMEOUT_S)
        assert not refused.allowed and refused.reason == "MemoryQuotaExceeded", refused
        # The informer's view of the bound pod, then its deletion.
        recorded = stubs["usage"].RecordPod(usage_pb2.RecordPodRequest(
            kubernetes_pod_json=pod_json(fits, Snapshot("Running"))), timeout=RPC_TIMEOUT_S)
        assert recorded.tracked
        stubs["usage"].ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=fits.uid),
                                 timeout=RPC_TIMEOUT_S)
    finally:
        for channel in stubs["channels"].values():
            channel.close()


def test_a_daemon_whose_certificate_the_recorder_does_not_trust_is_refused(
    stack: SecureStack, tmp_path: Path
) -> None:
    # An admission daemon whose certificate (which it serves with and dials the recorder with)
    # comes from the rogue CA; it trusts the real CA, so it accepts our client certificate.
    rogue_daemon = stack.pki.leaf("rogue-admission", rogue=True)
    mixed = TlsConfig(cert_file=rogue_daemon.cert_file, key_file=rogue_daemon.key_file,
                      ca_file=stack.pki.ca[0])
    # We trust both CAs, so that the hop to the recorder is the only one that can fail.
    bundle = tmp_path / "both-cas.pem"
    bundle.write_bytes(stack.pki.ca[0].read_bytes() + stack.pki.rogue_ca[0].read_bytes())
    client = TlsConfig(cert_file=stack.client.cert_file, key_file=stack.client.key_file,
                       ca_file=bundle)
    admission = Daemon("admission", tmp_path, clean_env(
        **tls_env(mixed), HAMI_ACCOUNTING_USAGE_ADDR=stack.daemons["usage"].addr), tls=client)
    admission.start()
    try:
        with client_channel(admission.addr, tls=client) as channel, \
                pytest.raises(grpc.RpcError) as refused:
            admission_pb2_grpc.AdmissionStub(channel).CheckQuota(
                admission_pb2.CheckQuotaRequest(kubernetes_pod_json=json.dumps(
                    secret_json(secret_pod("rogue-hop"), allocated=False)).encode()),
                timeout=RPC_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "usage recorder unavailable" in (refused.value.details() or "")
    finally:
        admission.stop()


# -- the webhook -------------------------------------------------------------------------------


def test_the_webhook_serves_tls_only(stack: SecureStack) -> None:
    # Plain HTTP to the HTTPS port gets no HTTP answer.
    with socket.create_connection(("127.0.0.1", stack.webhook_port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            answer = b""
        assert not answer.startswith(b"HTTP/"), answer
    # HTTPS verified against the CA works.
    context = ssl.create_default_context(cafile=str(stack.pki.ca[0]))
    connection = http.client.HTTPSConnection("127.0.0.1", stack.webhook_port, context=context,
                                             timeout=10)
    connection.request("GET", "/healthz")
    assert connection.getresponse().status == 200
    connection.close()


def test_a_webhook_address_without_a_certificate_does_not_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "admission"], cwd=REPO,
        env=clean_env(HAMI_ACCOUNTING_WEBHOOK_ADDR=f"127.0.0.1:{free_port()}",
                      HAMI_ACCOUNTING_LISTEN_ADDR=f"127.0.0.1:{free_port()}",
                      HAMI_ACCOUNTING_METRICS_ADDR="off"),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "HTTPS only" in result.stderr


# -- limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DAEMONS)
def test_an_oversized_message_is_refused(stack: SecureStack, name: str) -> None:
    big = b"x" * (5 * 1024 * 1024)
    stubs = _stubs(stack.daemons, stack.client, max_message_bytes=64 * 1024 * 1024)
    try:
        call, request = {
            "usage": (stubs["usage"].RecordPod,
                      usage_pb2.RecordPodRequest(kubernetes_pod_json=big)),
            "admission": (stubs["admission"].CheckQuota,
                          admission_pb2.CheckQuotaRequest(kubernetes_pod_json=big)),
            "scheduler": (stubs["scheduler"].Filter,
                          scheduler_pb2.FilterRequest(kubernetes_pod_json=big)),
        }[name]
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=RPC_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # ... and the daemon goes on serving. A health check on a new mutual-TLS connection, with
        # the module's call deadline: under load (17 on 2 cores) the 2 s default ran out during
        # the handshake about one run in four, the server logging "Handshake read failed" as the
        # check's client went away.
        assert stack.daemons[name].healthy(timeout_s=RPC_TIMEOUT_S)
    finally:
        for channel in stubs["channels"].values():
            channel.close()


class BlackHole:
    """A TCP listener that accepts connections and never answers (a hung recorder)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            while True:
                connection, _ = self.sock.accept()
                self.held.append(connection)
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for connection in self.held:
            connection.close()


def test_calls_to_a_hung_recorder_end_at_their_deadline(
    stack: SecureStack, tmp_path: Path
) -> None:
    hole = BlackHole()
    daemons: list[Daemon] = []
    try:
        for name in ("admission", "scheduler"):
            tls = stack.pki.leaf(f"{name}-deadline")
            daemon = Daemon(name, tmp_path, clean_env(
                **tls_env(tls), HAMI_ACCOUNTING_USAGE_ADDR=f"127.0.0.1:{hole.port}"),
                tls=stack.client)
            daemons.append(daemon.start(wait=False))
        for daemon in daemons:
            daemon.wait_serving()
        raw = json.dumps(secret_json(secret_pod("deadline"), allocated=False)).encode()
        for daemon in daemons:
            with client_channel(daemon.addr, tls=stack.client) as channel:
                if daemon.name == "admission":
                    call = admission_pb2_grpc.AdmissionStub(channel).CheckQuota
                    request: Any = admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw)
                else:
                    call = scheduler_pb2_grpc.SchedulerStub(channel).Filter
                    request = scheduler_pb2.FilterRequest(kubernetes_pod_json=raw,
                                                          node_names=[NODE])
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as failed:
                    call(request, timeout=30)
                elapsed = time.monotonic() - started
                # The recorder call's own deadline (2 s by default), well before ours (30 s).
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, daemon.name
                assert elapsed < 10, (daemon.name, elapsed)
    finally:
        for daemon in daemons:
            daemon.stop()
        hole.close()


# -- logs --------------------------------------------------------------------------------------


def test_no_pod_spec_or_secret_reaches_a_log(stack: SecureStack) -> None:
    stubs = _stubs(stack.daemons, stack.client)
    try:
        pod = secret_pod("logged")
        unallocated = json.dumps(secret_json(pod, allocated=False)).encode()
        allocated = json.dumps(secret_json(pod, allocated=True, phase="Running")).encode()
        broken = secret_json(pod, allocated=False)
        broken["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "12Zi"
        broken_raw = json.dumps(broken).encode()
        for raw in (unallocated, broken_raw):
            try:
                stubs["admission"].CheckQuota(admission_pb2.CheckQuotaRequest(
                    kubernetes_pod_json=raw), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            try:
                stubs["scheduler"].Filter(scheduler_pb2.FilterRequest(
                    kubernetes_pod_json=raw, node_names=[NODE]), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        for raw in (allocated, broken_raw):
            try:
                stubs["usage"].RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=raw),
                                         timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        stubs["usage"].ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=pod.uid),
                                 timeout=RPC_TIMEOUT_S)
        # The AdmissionReview endpoint, with the same pod and with a broken one.
        context = ssl.create_default_context(cafile=str(stack.pki.ca[0]))
        for obj in (json.loads(unallocated), broken, "not a pod"):
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": "r1", "kind": {"group": "", "version": "v1",
                                                        "kind": "Pod"},
                                  "operation": "CREATE", "namespace": NAMESPACE,
                                  "object": obj}}
            connection = http.client.HTTPSConnection("127.0.0.1", stack.webhook_port,
                                                     context=context, timeout=10)
            connection.request("POST", "/validate", body=json.dumps(review).encode())
            assert connection.getresponse().status == 200
            connection.close()
    finally:
        for channel in stubs["channels"].values():
            channel.close()
    time.sleep(0.5)  # let the last lines reach the files
    for name, daemon in stack.daemons.items():
        log = daemon.log_text()
        assert '"level": "DEBUG"' in log or '"level": "INFO"' in log, (name, log[:500])
        for secret in (ENV_SECRET, ANNOTATION_SECRET, IMAGE, "AWS_SECRET_ACCESS_KEY",
                       "example.com/api-token"):
            assert secret not in log, f"{name} logged {secret!r}"
        # No pod spec either: none of its distinctive keys appear.
        for fragment in ('"initContainers"', '"restartPolicy"', "vgpu-devices-allocated"):
            assert fragment not in log, f"{name} logged a pod spec ({fragment})"
