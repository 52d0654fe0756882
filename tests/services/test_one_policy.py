"""One accounting policy: the recorder's, and every daemon answers under it (docs/design.md,
"One policy").

Real gRPC servers on 127.0.0.1: a usage recorder, an admission daemon and a scheduler daemon,
with their WatchUsage caches on or off. The recorder is restarted on the same address and
journal with another policy (memory factor 2, the GPU count not enforced), the way a changed
configuration is rolled out; the admission and scheduler daemons, untouched, must answer the
same pods differently and in the same way, name the new policy in their answers and metrics,
and never answer under the old one once the recorder has the new one.
"""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import prometheus_client
import pytest

from accounting.vendors import DEFAULT_VENDORS
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)
from services.admission.__main__ import AdmissionDaemon
from services.admission.__main__ import start as start_admission
from services.admission.config import AdmissionConfig
from services.cli import explain
from services.common.server import client_channel
from services.scheduler.__main__ import SchedulerDaemon
from services.scheduler.__main__ import start as start_scheduler
from services.scheduler.config import SchedulerConfig
from services.usage.__main__ import UsageRecorder
from services.usage.__main__ import start as start_usage
from services.usage.config import UsageConfig
from tests.support.pods import app_container, gpu_device, kube_node, kube_pod, to_json

NAMESPACE = "team-policy"
CARD_MIB = 24576
TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Stack:
    """The three daemons; the recorder can be replaced on its address and journal."""

    usage_addr: str
    data_dir: Path
    recorder: UsageRecorder
    admission: AdmissionDaemon
    scheduler: SchedulerDaemon

    def restart_recorder(self, **policy: str) -> None:
        self.recorder.stop(grace_s=0)
        self.recorder = _recorder(self.usage_addr, self.data_dir, **policy)

    def check(self, pod: dict[str, object]) -> admission_pb2.CheckQuotaResponse:
        with client_channel(self.admission.target) as channel:
            response: admission_pb2.CheckQuotaResponse = admission_pb2_grpc.AdmissionStub(
                channel
            ).CheckQuota(
                admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)),
                timeout=TIMEOUT_S,
            )
        return response

    def filter(self, pod: dict[str, object]) -> scheduler_pb2.FilterResponse:
        with client_channel(self.scheduler.target) as channel:
            response: scheduler_pb2.FilterResponse = scheduler_pb2_grpc.SchedulerStub(
                channel
            ).Filter(
                scheduler_pb2.FilterRequest(
                    kubernetes_pod_json=to_json(pod), node_names=["node1"]
                ),
                timeout=TIMEOUT_S,
            )
        return response

    def recorder_policy(self) -> usage_pb2.GetPolicyResponse:
        with client_channel(self.usage_addr) as channel:
            response: usage_pb2.GetPolicyResponse = usage_pb2_grpc.UsageRecorderStub(
                channel
            ).GetPolicy(usage_pb2.GetPolicyRequest(), timeout=TIMEOUT_S)
        return response

    def forget(self, pod: dict[str, object]) -> None:
        metadata = pod["metadata"]
        assert isinstance(metadata, dict)
        with client_channel(self.usage_addr) as channel:
            usage_pb2_grpc.UsageRecorderStub(channel).ForgetPod(
                usage_pb2.ForgetPodRequest(pod_uid=metadata["uid"]), timeout=TIMEOUT_S
            )


def _recorder(usage_addr: str, data_dir: Path, **policy: str) -> UsageRecorder:
    return start_usage(UsageConfig.from_env({
        "HAMI_ACCOUNTING_LISTEN_ADDR": usage_addr,
        "HAMI_ACCOUNTING_DATA_DIR": str(data_dir),
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        **{f"HAMI_ACCOUNTING_{key.upper()}": value for key, value in policy.items()},
    }), max_workers=8)


@pytest.fixture(params=["watch", "off"], ids=["caches", "direct-reads"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    # Bound by the recorder itself (port 0): a port picked beforehand can be taken by another
    # process before the bind. A policy change restarts it on the port it got.
    recorder = _recorder("127.0.0.1:0", tmp_path)
    usage_addr = recorder.target
    common = {
        "HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0",
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        "HAMI_ACCOUNTING_USAGE_ADDR": usage_addr,
    }
    admission = start_admission(
        AdmissionConfig.from_env({**common, "HAMI_ACCOUNTING_USAGE_CACHE": request.param}),
        max_workers=4,
    )
    scheduler = start_scheduler(
        SchedulerConfig.from_env({**common, "HAMI_ACCOUNTING_NODE_CACHE": request.param}),
        max_workers=4,
    )
    built = Stack(usage_addr, tmp_path, recorder, admission, scheduler)
    with client_channel(usage_addr) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        stub.RegisterNode(usage_pb2.RegisterNodeRequest(
            kubernetes_node_json=to_json(kube_node("node1", [gpu_device("GPU-0")]))
        ), timeout=TIMEOUT_S)
        stub.SetQuota(usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits={
            "limits.nvidia.com/gpumem": 8192, "limits.nvidia.com/gpu": 1,
        }), timeout=TIMEOUT_S)
    yield built
    admission.stop(grace_s=0)
    scheduler.stop(grace_s=0)
    built.recorder.stop(grace_s=0)


def _pod(name: str, *, gpumem: int = 4096, gpus: int = 1) -> dict[str, object]:
    return kube_pod(
        name, namespace=NAMESPACE, apps=[app_container("main", gpumem=gpumem, gpus=gpus)]
    )


def _memory_item(response: admission_pb2.CheckQuotaResponse) -> admission_pb2.QuotaCheckItem:
    [item] = [i for i in response.items if i.resource == "nvidia.com/gpumem"]
    return item


def _granted_mib(response: scheduler_pb2.FilterResponse) -> int:
    return sum(g.memory_mib for c in response.container_grants for g in c.grants)


def _policy_gauge(service: str, policy_id: str, enforced: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(
        "hami_accounting_policy_info",
        {"service": service, "policy_id": policy_id, "enforce_gpu_count": enforced},
    )


def test_a_policy_change_on_the_recorder_changes_every_daemons_answer_the_same_way(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    before = stack.recorder_policy().policy
    pod = _pod("quota-check")
    checked = stack.check(pod)
    placed = stack.filter(_pod("placed-before"))

    # Under the default policy: 4096 MiB is charged as 4096 against the 8192 limit.
    assert checked.allowed and checked.policy_id == before.policy_id
    assert (_memory_item(checked).requested, _memory_item(checked).limit) == (4096, 8192)
    assert placed.reason == "Scheduled" and placed.policy_id == before.policy_id
    assert _granted_mib(placed) == 4096
    two_gpus = stack.check(_pod("two-gpus", gpumem=1000, gpus=2))
    assert (two_gpus.allowed, two_gpus.reason) == (False, "GpuCountQuotaExceeded")
    stack.forget(_pod("placed-before"))

    # The configuration changes: the recorder restarts with it, the other daemons do not.
    stack.restart_recorder(memory_factor="2", enforce_gpu_count="false")
    after = stack.recorder_policy().policy
    assert after.policy_id != before.policy_id
    factors = {v.vendor: v.memory_factor for v in after.vendors}
    # The factor is NVIDIA's (HAMi's memoryFactor); the others keep their vendor's unit.
    assert (factors["NVIDIA"], factors["MLU"], after.enforce_gpu_count) == (2, 256, False)

    # The first answers after the change are already under the new policy, in both daemons.
    checked = stack.check(pod)
    placed = stack.filter(_pod("placed-after"))
    assert checked.policy_id == placed.policy_id == after.policy_id
    assert (_memory_item(checked).requested, _memory_item(checked).limit) == (8192, 16384)
    assert checked.effective[0].memory_mib == 8192
    assert placed.reason == "Scheduled" and _granted_mib(placed) == 8192
    two_gpus = stack.check(_pod("two-gpus", gpumem=1000, gpus=2))
    assert two_gpus.allowed, two_gpus.message

    # The policy in force shows in every daemon's metrics...
    for service in ("usage", "admission", "scheduler"):
        assert _policy_gauge(service, after.policy_id, "false") == 1, service
        assert _policy_gauge(service, before.policy_id, "true") is None, service
    # ...and explain, reading it from the recorder, charges what the daemons charge.
    out = io.StringIO()
    code = explain.main(
        ["-", "--usage-addr", stack.usage_addr, "--output", "json"],
        stdin=io.StringIO(json.dumps(pod)),
        stdout=out,
        stderr=io.StringIO(),
    )
    assert code == 0
    document = json.loads(out.getvalue())
    assert document["policy"]["policy_id"] == after.policy_id
    assert document["memory_factor"] == 2
    assert document["effective"]["memory_mib"] == checked.effective[0].memory_mib


def test_a_reservation_fitted_under_another_policy_is_refused(stack: Stack) -> None:
    pod = _pod("stale-fit")
    with client_channel(stack.usage_addr) as channel:
        response = usage_pb2_grpc.UsageRecorderStub(channel).Reserve(
            usage_pb2.ReserveRequest(
                kubernetes_pod_json=to_json(pod),
                node_name="node1",
                policy_id="p-000000000000",
            ),
            timeout=TIMEOUT_S,
        )
    assert (response.reserved, response.reason) == (False, "PolicyChanged")
    assert "p-000000000000" in response.message
    assert not stack.recorder.store.pods()


def test_the_policy_starts_every_cache_stream_and_answers_getpolicy(stack: Stack) -> None:
    policy = stack.recorder_policy().policy
    with client_channel(stack.usage_addr) as channel:
        stream = usage_pb2_grpc.UsageRecorderStub(channel).WatchUsage(
            usage_pb2.WatchUsageRequest(
                send_initial_state=True,
                send_policy=True,
                content=usage_pb2.WATCH_CONTENT_NAMESPACES,
            ),
            timeout=TIMEOUT_S,
        )
        first = next(stream)
        stream.cancel()
    assert first.kind == usage_pb2.USAGE_EVENT_KIND_POLICY
    assert first.policy == policy
    assert policy.policy_id.startswith("p-")
    # HAMi's chart default: every vendor but Ascend and Iluvatar.
    assert [v.vendor for v in policy.vendors] == [v.vendor for v in DEFAULT_VENDORS]
    assert policy.vendors[0].memory_resource == "nvidia.com/gpumem"


def test_a_gpu_less_pod_needs_neither_recorder_nor_policy(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    admission = start_admission(AdmissionConfig.from_env({
        "HAMI_ACCOUNTING_LISTEN_ADDR": "127.0.0.1:0",
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        "HAMI_ACCOUNTING_USAGE_ADDR": dead,
    }), max_workers=2)
    try:
        with client_channel(admission.target) as channel:
            stub = admission_pb2_grpc.AdmissionStub(channel)
            web = kube_pod("web", namespace=NAMESPACE, apps=[{"name": "nginx", "image": "x"}])
            allowed = stub.CheckQuota(
                admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(web)),
                timeout=TIMEOUT_S,
            )
            with pytest.raises(grpc.RpcError) as caught:
                stub.CheckQuota(
                    admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(_pod("gpu"))),
                    timeout=TIMEOUT_S,
                )
    finally:
        admission.stop(grace_s=0)
    assert (allowed.allowed, allowed.reason, allowed.policy_id) == (True, "NoGpuRequest", "")
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "the accounting policy is unknown" in (caught.value.details() or "")
