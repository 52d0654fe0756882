"""Test support for the admission daemon: pods as Kubernetes JSON and typed messages, a real
usage recorder to read from, throwaway certificates, and an HTTPS client for AdmissionReviews.

A uniquely named module (not conftest) so test files can import it without clashing with other
test folders' modules.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from accounting.model import Pod
from hami.accounting.v1 import admission_pb2, admission_pb2_grpc, usage_pb2, usage_pb2_grpc
from services.admission.__main__ import AdmissionDaemon
from services.common import convert as common
from services.usage.__main__ import UsageRecorder
from tests.builders import PodBuilder, gpu

TRACEPARENT = re.compile(r"^00-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})-[0-9a-f]{2}$")
MEMORY = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
COUNT = "nvidia.com/gpu"
WAIT_S = 15.0

StartRecorder = Callable[..., UsageRecorder]
StartAdmission = Callable[..., AdmissionDaemon]

# -- pods as Kubernetes JSON -------------------------------------------------------------------


def container(
    name: str,
    mib: int | None = None,
    *,
    count: int | None = 1,
    cores: int | None = None,
    percent: int | None = None,
    sidecar: bool = False,
) -> dict[str, Any]:
    """A container spec asking ``count`` NVIDIA GPUs with ``mib`` MiB / ``cores`` % each, in
    limits as users write them; ``count=None`` with nothing else asks for no GPU."""
    limits: dict[str, str] = {}
    if count is not None:
        limits[COUNT] = str(count)
    if mib is not None:
        limits[MEMORY] = str(mib)
    if cores is not None:
        limits[CORES] = str(cores)
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = str(percent)
    spec: dict[str, Any] = {"name": name, "image": "busybox"}
    if limits:
        spec["resources"] = {"limits": limits}
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def no_gpu(name: str) -> dict[str, Any]:
    return container(name, count=None)


def kube_pod(
    name: str,
    namespace: str,
    *,
    init: list[dict[str, Any]] | None = None,
    apps: list[dict[str, Any]] | None = None,
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
) -> dict[str, Any]:
    """A Pod object as Go's json.Marshal(pod) writes it."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid != "":
        metadata["uid"] = uid or f"uid-{namespace}-{name}"
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": apps if apps is not None else [no_gpu("main")]}
    if init:
        spec["initContainers"] = init
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": {"phase": "Pending"}}


def json_request(pod: Mapping[str, Any]) -> admission_pb2.CheckQuotaRequest:
    return admission_pb2.CheckQuotaRequest(kubernetes_pod_json=json.dumps(pod).encode())


def typed_request(pod: Pod) -> admission_pb2.CheckQuotaRequest:
    return admission_pb2.CheckQuotaRequest(pod=common.pod_to_pb(pod))


# -- the recorder: quotas and "already used" -----------------------------------------------------


@dataclass
class Recorder:
    """A client of the real usage recorder under test."""

    target: str
    stub: usage_pb2_grpc.UsageRecorderStub
    _counter: list[int] = field(default_factory=lambda: [0])
    _revision: list[int] = field(default_factory=lambda: [0])

    @property
    def revision(self) -> int:
        """The read-your-writes token of the last write made through this client."""
        return self._revision[0]

    def set_quota(self, namespace: str, mib: int | None = None, cores: int | None = None,
                  count: int | None = None) -> None:
        limits = {}
        if mib is not None:
            limits[f"limits.{MEMORY}"] = mib
        if cores is not None:
            limits[f"limits.{CORES}"] = cores
        if count is not None:
            limits[f"limits.{COUNT}"] = count
        response = self.stub.SetQuota(
            usage_pb2.SetQuotaRequest(namespace=namespace, limits=limits), timeout=5
        )
        self._revision[0] = response.revision

    def use(self, namespace: str, mib: int, cores: int = 0) -> str:
        """Charges the namespace ``mib``/``cores`` with a running pod; returns its uid."""
        self._counter[0] += 1
        name = f"running-{self._counter[0]}"
        pod = PodBuilder(name, namespace=namespace).app(
            "main", gpu(f"GPU-{namespace}-{self._counter[0]}", mib=mib, cores=cores)
        ).build()
        response = self.stub.RecordPod(
            usage_pb2.RecordPodRequest(pod=common.pod_to_pb(pod)), timeout=5
        )
        self._revision[0] = response.revision
        return pod.uid

    def namespace_items(self, namespace: str) -> list[tuple[str, int, int, bool]]:
        response = self.stub.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=5
        )
        return sorted((i.resource, i.used, i.limit, i.limit_set) for i in response.items)


CheckFn = Callable[[admission_pb2.CheckQuotaRequest], admission_pb2.CheckQuotaResponse]


def checker(channel: grpc.Channel, after: Recorder | None = None) -> CheckFn:
    """CheckQuota; with ``after``, on usage at least as new as that client's last write."""
    stub = admission_pb2_grpc.AdmissionStub(channel)

    def check(request: admission_pb2.CheckQuotaRequest) -> admission_pb2.CheckQuotaResponse:
        if after is not None:
            request = admission_pb2.CheckQuotaRequest.FromString(request.SerializeToString())
            request.min_usage_revision = after.revision
        return stub.CheckQuota(request, timeout=10)

    return check


def item(response: admission_pb2.CheckQuotaResponse, resource: str) -> admission_pb2.QuotaCheckItem:
    for entry in response.items:
        if entry.resource == resource:
            return entry
    raise AssertionError(f"no item {resource} in {response}")


# -- processes, ports, waiting -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# -- TLS and AdmissionReviews ---------------------------------------------------------------------


def make_serving_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made with the openssl CLI."""
    cert, key = directory / "webhook.pem", directory / "webhook.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=admission-test",
         "-days", "2", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]


def post(url: str, cafile: Path, body: bytes | Mapping[str, Any], *, method: str = "POST",
         path: str | None = None, headers: Mapping[str, str] | None = None) -> HttpAnswer:
    """Sends one request over HTTPS, verifying the server against ``cafile``."""
    context = ssl.create_default_context(cafile=str(cafile))
    host_port, _, default_path = url.removeprefix("https://").partition("/")
    host, _, port = host_port.rpartition(":")
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        connection.request(method, path or "/" + default_path, body=data if method == "POST"
                           else None, headers={"Content-Type": "application/json",
                                               **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        return HttpAnswer(response.status, json.loads(raw) if raw else {},
                          dict(response.getheaders()))
    finally:
        connection.close()


def review(pod: Mapping[str, Any] | None, *, version: str = "v1", uid: str = "review-1",
           operation: str = "CREATE", kind: str = "Pod", namespace: str | None = None,
           sub_resource: str = "") -> dict[str, Any]:
    """An AdmissionReview request as the API server sends it."""
    pod_namespace = (pod or {}).get("metadata", {}).get("namespace", "default")
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "" if kind == "Pod" else "apps", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1",
                     "resource": "pods" if kind == "Pod" else kind.lower() + "s"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": (pod or {}).get("metadata", {}).get("name", ""),
        "namespace": namespace or pod_namespace,
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview",
            "request": request}
