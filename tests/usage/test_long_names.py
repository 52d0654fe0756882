"""A namespace, a pod name or a pod uid longer than Kubernetes allows is refused at the door.

Each is stored with what it names and sent in every watch event of its usage, so a value of a
hundred thousand characters (a caller trusted by the CA may send one; the API server never
does) would cost every reader. The bounds are Kubernetes' own: a namespace is a DNS label (63
characters), a pod's name a DNS subdomain (253); a uid gets as much room as a name.
"""

from __future__ import annotations

import grpc
import pytest

from accounting.limits import MAX_NAMESPACE_CHARS, MAX_POD_NAME_CHARS, MAX_POD_UID_CHARS
from hami.accounting.v1 import usage_pb2
from tests.support.pods import allocation, app_container, gpu_device, kube_node, kube_pod, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder

LONG = "n" * 100_000


def _pod_json(*, namespace: str = "ns", name: str = "p", uid: str = "uid-1") -> str:
    return to_json(kube_pod(name, uid=uid, namespace=namespace, node="node-a",
                            apps=[app_container("main", gpumem=1024)],
                            allocation=allocation([("GPU-1", 1024, 0)])))


def _refused(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=RPC_TIMEOUT_S)  # type: ignore[operator]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return refused.value


@pytest.mark.parametrize(("field", "fields", "wanted"), [
    ("namespace", {"namespace": LONG}, f"at most {MAX_NAMESPACE_CHARS} characters"),
    ("name", {"name": LONG}, f"at most {MAX_POD_NAME_CHARS} characters"),
    ("uid", {"uid": LONG}, f"at most {MAX_POD_UID_CHARS} characters"),
])
def test_a_pod_with_an_overlong_identity_is_refused_naming_the_field_and_nothing_is_stored(
    start_recorder: StartRecorder, field: str, fields: dict[str, str], wanted: str,
) -> None:
    stub = start_recorder().stub
    stub.RegisterNode(usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(
        kube_node("node-a", [gpu_device("GPU-1")]))), timeout=RPC_TIMEOUT_S)
    error = _refused(stub.RecordPod,
                     usage_pb2.RecordPodRequest(kubernetes_pod_json=_pod_json(**fields)))
    assert f".{field}: {wanted}" in (error.details() or "")
    assert len(error.details() or "") <= 1_500
    nodes = stub.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S).nodes
    assert [(n.node_name, list(n.pod_uids)) for n in nodes] == [("node-a", [])]


def test_the_longest_allowed_identity_is_recorded(start_recorder: StartRecorder) -> None:
    stub = start_recorder().stub
    stub.RegisterNode(usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(
        kube_node("node-a", [gpu_device("GPU-1")]))), timeout=RPC_TIMEOUT_S)
    namespace = "n" * MAX_NAMESPACE_CHARS
    stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=_pod_json(
        namespace=namespace, name="p" * MAX_POD_NAME_CHARS, uid="u" * MAX_POD_UID_CHARS)),
        timeout=RPC_TIMEOUT_S)
    used = stub.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(namespace=namespace),
                                  timeout=RPC_TIMEOUT_S)
    assert {item.resource: item.used for item in used.items if item.used}


def test_a_quota_for_an_overlong_namespace_is_refused_and_nothing_is_set(
    start_recorder: StartRecorder,
) -> None:
    stub = start_recorder().stub
    error = _refused(stub.SetQuota, usage_pb2.SetQuotaRequest(
        namespace=LONG, limits={"limits.nvidia.com/gpumem": 1024}))
    assert f"namespace: at most {MAX_NAMESPACE_CHARS} characters" in (error.details() or "")
    used = stub.GetNamespaceUsage(usage_pb2.GetNamespaceUsageRequest(namespace=LONG),
                                  timeout=RPC_TIMEOUT_S)
    assert not [item for item in used.items if item.limit_set]
