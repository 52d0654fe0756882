"""Go interop: kube-scheduler's HTTP extender, in Go, calls the scheduler daemon's extender.

The Go interop client (tests/interop/go/src/hamiclient, ``-mode extender``: extender.go) mirrors
``k8s.io/kube-scheduler/extender/v1``'s ExtenderArgs and ExtenderFilterResult (no JSON tags, as
upstream) and kube-scheduler's HTTPExtender: json.Marshal, ``POST <urlPrefix>/filter`` with
``Content-Type: application/json`` under an httpTimeout, a status other than 200 an error, the
answer read with encoding/json's Decoder, then its Filter's checks (an Error fails the attempt,
every name answered must be a candidate). It prints what it decoded as one JSON document.

The usage recorder and the scheduler daemon with its extender endpoint run as processes
(test_go_client.py's Daemons), plain HTTP and then HTTPS with mutual TLS; the fake API server of
our tests runs in this process, the Go client creates its pods there first, and the extender
patches them there. The test checks what Go decoded, the pods' annotations (what HAMi's Filter
writes, tests/scheduler/test_extender.py's figures) and the recorder's reservations. A missing Go
toolchain is a failure, not a skip (test_go_client.build_client).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common import telemetry
from services.common.server import client_channel
from tests.interop.test_go_client import (
    CLIENT_TIMEOUT_S,
    Daemons,
    Expectations,
    build_client,
    free_port,
)
from tests.reliability.daemons import Pki
from tests.scheduler.extender_support import write_kubeconfig
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import gpu_device, kube_node, to_json

pytestmark = pytest.mark.go

NAMESPACE = "team-a"
QUOTA_NAMESPACE = "team-q"
QUOTA_GPUMEM_MIB = 8192
RPC_TIMEOUT_S = 10.0
# HAMi's chart gives its own extender this httpTimeout; the daemon's deadline stays inside it.
HTTP_TIMEOUT = "30s"
EXTENDER_DEADLINE_MS = 10_000

# The pods of extender.go (their fixed UIDs).
UID_PLACED = "e1a5e001-6f1c-4c2e-9d0a-000000000001"
UID_PLAIN = "e2a5e002-6f1c-4c2e-9d0a-000000000002"
UID_QUOTA = "e3a5e003-6f1c-4c2e-9d0a-000000000003"
UID_SIMULATED = "e4a5e004-6f1c-4c2e-9d0a-000000000004"

# What HAMi's Filter patches for that pod (init 20480 MiB, sidecar 2048, app 10240) on node-a
# (pkg/scheduler/scheduler.go Filter, then the NVIDIA device's PatchAnnotations; the same figures
# as tests/scheduler/test_extender.py's _PLACED_ON_A): one entry per container, init containers
# first, each "<uuid>,NVIDIA,<MiB>,<cores>:" and ";" after each container. hami.io/vgpu-time is
# the daemon's clock here, checked on its own.
PLACED_ON_A = {
    "hami.io/vgpu-node": "node-a",
    "hami.io/vgpu-devices-to-allocate":
        "GPU-a1,NVIDIA,20480,0:;GPU-a1,NVIDIA,2048,0:;GPU-a0,NVIDIA,10240,0:;",
    "hami.io/vgpu-devices-allocated":
        "GPU-a1,NVIDIA,20480,0:;GPU-a1,NVIDIA,2048,0:;GPU-a0,NVIDIA,10240,0:;",
}
VGPU_TIME = "hami.io/vgpu-time"
TRACEPARENT = "hami.io/traceparent"
W3C_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

# What json.Marshal of the Go ExtenderArgs writes at the top level, per form.
NODE_NAMES_FORM = ["NodeNames=array", "Nodes=null", "Pod=object"]
NODES_FORM = ["NodeNames=null", "Nodes=object", "Pod=object"]


@dataclass(frozen=True)
class ExtenderTransport:
    """How the extender serves and the Go client (kube-scheduler) calls it."""

    scheme: str
    server_env: dict[str, str]
    client_flags: list[str]


@pytest.fixture(params=["http", "https-mutual-tls"])
def extender_transport(request: pytest.FixtureRequest, tmp_path: Path) -> ExtenderTransport:
    if request.param == "http":
        return ExtenderTransport("http", {}, [])
    pki = Pki.create(tmp_path / "pki")
    server = pki.leaf("extender")  # names 127.0.0.1, which the Go client dials
    client = pki.leaf("kube-scheduler", server=False)
    assert server.ca_file is not None and client.ca_file is not None
    return ExtenderTransport(
        "https",
        {"HAMI_ACCOUNTING_EXTENDER_CERT_FILE": str(server.cert_file),
         "HAMI_ACCOUNTING_EXTENDER_KEY_FILE": str(server.key_file),
         "HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE": str(server.ca_file)},
        # kube-scheduler's tlsConfig: caFile, certFile, keyFile.
        ["-tls-ca", str(client.ca_file), "-tls-cert", str(client.cert_file),
         "-tls-key", str(client.key_file)],
    )


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    return build_client(tmp_path_factory.mktemp("go-extender") / "hamiclient")


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    group = Daemons(tmp_path)  # gRPC in plaintext: the extender's transport is the subject
    try:
        yield group
    finally:
        group.stop()


class RecorderClient:
    """The recorder process over gRPC: seeding (RegisterNode, SetQuota) and reading back."""

    def __init__(self, address: str) -> None:
        self.channel = client_channel(address)
        self.stub = usage_pb2_grpc.UsageRecorderStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def register_node(self, name: str, gpus: list[dict[str, Any]]) -> None:
        self.stub.RegisterNode(
            usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(kube_node(name, gpus))),
            timeout=RPC_TIMEOUT_S,
        )

    def set_quota(self, namespace: str, limits: dict[str, int]) -> None:
        self.stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=namespace, limits=limits),
                           timeout=RPC_TIMEOUT_S)

    def pod(self, uid: str) -> usage_pb2.GetPodUsageResponse:
        response: usage_pb2.GetPodUsageResponse = self.stub.GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid=uid), timeout=RPC_TIMEOUT_S)
        return response

    def node_memory(self, node: str) -> int:
        response = self.stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(node_names=[node]),
                                          timeout=RPC_TIMEOUT_S)
        return sum(d.memory_used_mib for n in response.nodes for d in n.devices)

    def namespace_used(self, namespace: str) -> int:
        response = self.stub.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S)
        return next((i.used for i in response.items if i.resource == "nvidia.com/gpumem"), 0)


def check_decoded(report: dict[str, Any], *, mutual_tls: bool) -> list[str]:
    """What the Go client decoded, and what kube-scheduler's Filter would make of it."""
    steps = {step["step"]: step for step in report["steps"]}
    expect = Expectations(steps)
    expect.check(report.get("ok") is True,
                 f"client reported unexpected errors: {report.get('unexpected_errors')}")
    for name in ("create_placed", "create_plain", "create_quota"):
        expect.equal(name, "error", "")

    # NodeNames form: the pod with an init container, a sidecar and an app goes to node-a; the
    # 8 GiB card of node-b is too small for the 20480 MiB init container (room: preemption
    # could help, so FailedNodes). Filtered again, the same answer.
    for name, uid in (("placed", UID_PLACED), ("placed_again", UID_PLACED)):
        expect.equal(name, "pod_uid", uid)
        expect.equal(name, "request_fields", NODE_NAMES_FORM)
        expect.equal(name, "status", 200)
        expect.equal(name, "node_names", ["node-a"])
        expect.equal(name, "nodes", None)
        expect.equal(name, "failed_nodes", {"node-b": "1/1 CardInsufficientMemory"})
        expect.equal(name, "failed_and_unresolvable_nodes", {})
        expect.equal(name, "error", "")
        expect.equal(name, "scheduler_kept", ["node-a"])
        expect.equal(name, "scheduler_error", "")

    # No GPU request: every candidate passes, the unregistered node-c too.
    expect.equal("no_gpu", "request_fields", NODE_NAMES_FORM)
    expect.equal("no_gpu", "status", 200)
    expect.equal("no_gpu", "node_names", ["node-a", "node-b", "node-c"])
    expect.equal("no_gpu", "failed_nodes", {})
    expect.equal("no_gpu", "failed_and_unresolvable_nodes", {})
    expect.equal("no_gpu", "scheduler_kept", ["node-a", "node-b", "node-c"])
    expect.equal("no_gpu", "scheduler_error", "")

    # Over the namespace's quota: HAMi's fit checks the quota card by card before the card's
    # room, so every card refuses for the quota, which no preemption lifts.
    expect.equal("quota_refused", "status", 200)
    expect.equal("quota_refused", "node_names", [])
    expect.equal("quota_refused", "failed_nodes", {})
    expect.equal("quota_refused", "failed_and_unresolvable_nodes",
                 {"node-a": "2/2 ResourceQuotaNotFit", "node-b": "1/1 ResourceQuotaNotFit"})
    expect.equal("quota_refused", "error", "")
    expect.equal("quota_refused", "scheduler_kept", [])
    expect.equal("quota_refused", "scheduler_error", "")

    # Nodes form (not nodeCacheCapable; template nodes nobody registered): the best node comes
    # back as the Node object Go sent, the small card is room, the unreadable node unresolvable.
    expect.equal("simulation", "pod_uid", UID_SIMULATED)
    expect.equal("simulation", "request_fields", NODES_FORM)
    expect.equal("simulation", "status", 200)
    expect.equal("simulation", "node_names", None)
    expect.equal("simulation", "nodes", ["template-large"])
    expect.equal("simulation", "node_as_sent", True)
    expect.equal("simulation", "failed_nodes", {"template-small": "1/1 CardInsufficientMemory"})
    unresolvable = expect.step("simulation").get("failed_and_unresolvable_nodes") or {}
    expect.check(set(unresolvable) == {"template-broken"}
                 and "hami.io/node-nvidia-register" in unresolvable["template-broken"],
                 f"simulation: failed_and_unresolvable_nodes {unresolvable!r}")
    expect.equal("simulation", "scheduler_kept", ["template-large"])
    expect.equal("simulation", "scheduler_error", "")

    if mutual_tls:
        # kube-scheduler without its client certificate gets no answer at all.
        expect.equal("no_client_certificate", "status", 0)
        error = expect.step("no_client_certificate").get("scheduler_error") or ""
        expect.check(error != "", "no_client_certificate: the extender answered a client "
                     "without a certificate")
    else:
        expect.check("no_client_certificate" not in steps, "no_client_certificate over HTTP")
    return expect.problems


def check_cluster(apiserver: FakeApiServer, recorder: RecorderClient,
                  started_s: int, ended_s: int) -> list[str]:
    """The pods on the fake API server and the reservations in the recorder."""
    problems: list[str] = []

    def check(condition: bool, message: str) -> None:
        if not condition:
            problems.append(message)

    placed = apiserver.get("Pod", "ext-placed", NAMESPACE)
    annotations = dict((placed or {}).get("metadata", {}).get("annotations") or {})
    written = {k: v for k, v in annotations.items() if k not in (VGPU_TIME, TRACEPARENT)}
    check(written == PLACED_ON_A, f"ext-placed annotations {annotations!r}")
    # HAMi's PatchPodAnnotations also labels the pod with its node.
    labels = (placed or {}).get("metadata", {}).get("labels")
    check(labels == {"hami.io/vgpu-node": "node-a"}, f"ext-placed labels {labels!r}")
    vgpu_time = annotations.get(VGPU_TIME, "")
    check(vgpu_time.isdigit() and started_s <= int(vgpu_time) <= ended_s,
          f"ext-placed {VGPU_TIME} {vgpu_time!r} not in [{started_s}, {ended_s}]")
    # The extender writes the pod's trace, the one its uid names (no webhook wrote one).
    expected_trace = trace.get_current_span(telemetry.pod_uid_trace(UID_PLACED)) \
        .get_span_context().trace_id
    found = W3C_TRACEPARENT.match(annotations.get(TRACEPARENT, ""))
    check(found is not None and found[1] == f"{expected_trace:032x}",
          f"ext-placed {TRACEPARENT} {annotations.get(TRACEPARENT)!r}: not the trace "
          f"{expected_trace:032x} of its uid")

    for name, namespace in (("ext-plain", NAMESPACE), ("ext-quota", QUOTA_NAMESPACE)):
        pod = apiserver.get("Pod", name, namespace)
        metadata = (pod or {}).get("metadata", {})
        check(pod is not None and not metadata.get("annotations") and not metadata.get("labels"),
              f"{namespace}/{name}: {metadata!r}")
    check(apiserver.get("Pod", "ext-simulated", NAMESPACE) is None,
          "ext-simulated: a simulation's pod appeared on the API server")
    patched = [f"{r.namespace}/{r.name}" for r in apiserver.requests
               if r.method == "PATCH" and r.plural == "pods"]
    check(patched == [f"{NAMESPACE}/ext-placed"] * 2, f"pods patched: {patched!r}")

    stored = recorder.pod(UID_PLACED)
    devices = sorted((d.uuid, d.memory_mib) for d in stored.stored)
    check((stored.found, stored.node_name, stored.namespace, stored.name)
          == (True, "node-a", NAMESPACE, "ext-placed"),
          f"GetPodUsage(ext-placed): {stored}")
    check(devices == [("GPU-a0", 10240), ("GPU-a1", 20480)],
          f"GetPodUsage(ext-placed) devices {devices!r}")
    # Filtered twice, reserved once: the second Filter replaced the first reservation.
    used = {"node-a": recorder.node_memory("node-a"), "node-b": recorder.node_memory("node-b"),
            NAMESPACE: recorder.namespace_used(NAMESPACE),
            QUOTA_NAMESPACE: recorder.namespace_used(QUOTA_NAMESPACE)}
    check(used == {"node-a": 30720, "node-b": 0, NAMESPACE: 30720, QUOTA_NAMESPACE: 0},
          f"memory used (MiB): {used!r}")
    for uid in (UID_PLAIN, UID_QUOTA, UID_SIMULATED):
        check(not recorder.pod(uid).found, f"GetPodUsage({uid}) found a reservation")
    return problems


@pytest.mark.timeout(360)
def test_kube_scheduler_in_go_filters_through_the_extender(
    daemons: Daemons, apiserver: FakeApiServer, extender_transport: ExtenderTransport,
    go_client: tuple[Path, float], tmp_path: Path,
) -> None:
    usage = daemons.start("usage", {"HAMI_ACCOUNTING_DATA_DIR": str(tmp_path / "data")})
    daemons.wait_serving()
    recorder = RecorderClient(usage.address)
    try:
        # Seeded before the scheduler starts: its node cache's initial state holds all of it.
        recorder.register_node("node-a", [gpu_device("GPU-a0", index=0),
                                          gpu_device("GPU-a1", index=1)])
        recorder.register_node("node-b", [gpu_device("GPU-b0", memory_mib=8192)])
        recorder.set_quota(QUOTA_NAMESPACE, {"limits.nvidia.com/gpumem": QUOTA_GPUMEM_MIB})

        extender_addr = f"127.0.0.1:{free_port()}"
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        daemons.start("scheduler", {
            "HAMI_ACCOUNTING_USAGE_ADDR": usage.address,
            "HAMI_ACCOUNTING_EXTENDER_ADDR": extender_addr,
            "HAMI_ACCOUNTING_EXTENDER_DEADLINE_MS": str(EXTENDER_DEADLINE_MS),
            "HAMI_ACCOUNTING_USAGE_TIMEOUT_MS": str(EXTENDER_DEADLINE_MS),
            "HAMI_ACCOUNTING_KUBERNETES": "kubeconfig",
            "HAMI_ACCOUNTING_KUBECONFIG": str(kubeconfig),
            **extender_transport.server_env,
        })
        binary, build_s = go_client
        print(f"go client built in {build_s:.1f} s")
        daemons.wait_serving()  # the extender listens before the gRPC server starts

        command = [
            str(binary), "-mode", "extender",
            "-extender-url", f"{extender_transport.scheme}://{extender_addr}",
            "-kube-api-url", apiserver.url,
            "-extender-namespace", NAMESPACE,
            "-quota-namespace", QUOTA_NAMESPACE,
            "-http-timeout", HTTP_TIMEOUT,
            *extender_transport.client_flags,
        ]
        started_s = int(time.time())
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=CLIENT_TIMEOUT_S)
        ended_s = int(time.time()) + 1
        try:
            report = json.loads(result.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"the Go client (exit {result.returncode}) printed no JSON document:\n"
                        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{daemons.logs()}",
                        pytrace=False)

        problems = check_decoded(report, mutual_tls=extender_transport.scheme == "https")
        problems += check_cluster(apiserver, recorder, started_s, ended_s)
    finally:
        recorder.close()
    if problems:
        pytest.fail(
            "kube-scheduler's view through the Go client differs:\n  - " + "\n  - ".join(problems)
            + f"\n\nclient exit {result.returncode}, stderr:\n{result.stderr}"
            + f"\nclient report:\n{json.dumps(report, indent=1)}\n\n{daemons.logs()}",
            pytrace=False,
        )
    assert result.returncode == 0, result.stderr
