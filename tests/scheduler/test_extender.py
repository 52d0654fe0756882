"""The scheduler daemon as a kube-scheduler extender (services/scheduler/extender.py): the JSON
kube-scheduler sends, against a real recorder and the fake API server the extender patches."""

from __future__ import annotations

import dataclasses
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from services.common import telemetry
from services.common.json_endpoint import ServingTls
from services.common.kube_api import KubernetesAccess
from services.scheduler.config import ExtenderConfig
from tests.scheduler.conftest import NS, Recorder, StartScheduler
from tests.scheduler.extender_support import Extender, extender_args, write_kubeconfig
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import (
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    sidecar_container,
)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def start_extender(
    start_scheduler: StartScheduler, apiserver: FakeApiServer, tmp_path: Path
) -> Any:
    """Starts a scheduler daemon serving the extender (plain HTTP unless ``tls`` is given)."""

    def starter(*, tls: Any = None, deadline_ms: int = 10_000, **overrides: Any) -> Extender:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        scheduler = start_scheduler(
            extender=ExtenderConfig(addr="127.0.0.1:0", tls=tls, deadline_ms=deadline_ms),
            kubernetes=KubernetesAccess(mode="kubeconfig", kubeconfig=kubeconfig),
            **overrides,
        )
        assert scheduler.app.extender is not None
        return Extender(scheduler, apiserver, scheduler.app.extender.url("/filter"))

    return starter


@pytest.fixture
def extender(start_extender: Any) -> Extender:
    started: Extender = start_extender()
    return started


def _cluster(recorder: Recorder) -> None:
    recorder.register_node("node-a", [gpu_device("GPU-a0", index=0), gpu_device("GPU-a1", index=1)])
    recorder.register_node("node-b", [gpu_device("GPU-b0", memory_mib=8192)])


def _gpu_pod(name: str, **options: Any) -> dict[str, Any]:
    """Design case 3's shape: an init container, a native sidecar and an app."""
    return kube_pod(
        name, namespace=NS,
        init=[init_container("init", gpumem=20480), sidecar_container("side", gpumem=2048)],
        apps=[app_container("app", gpumem=10240)],
        **options,
    )


# The annotations HAMi's Filter patches for that pod on node-a (pkg/scheduler/scheduler.go
# Filter, then the NVIDIA device's PatchAnnotations): the node, the time, and one entry per
# container in container order, init containers first, each "<uuid>,NVIDIA,<MiB>,<cores>:"
# and ";" after each container.
_PLACED_ON_A = {
    "hami.io/vgpu-node": "node-a",
    "hami.io/vgpu-time": "1767225600",
    "hami.io/vgpu-devices-to-allocate":
        "GPU-a1,NVIDIA,20480,0:;GPU-a1,NVIDIA,2048,0:;GPU-a0,NVIDIA,10240,0:;",
    "hami.io/vgpu-devices-allocated":
        "GPU-a1,NVIDIA,20480,0:;GPU-a1,NVIDIA,2048,0:;GPU-a0,NVIDIA,10240,0:;",
}


def _annotations(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    pod = apiserver.get("Pod", name, NS)
    assert pod is not None
    return dict(pod["metadata"].get("annotations", {}))


def test_node_names_form_places_patches_and_reserves(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    answer = extender.filter(pod, ["node-a", "node-b"])
    assert answer == {
        "Nodes": None,
        "NodeNames": ["node-a"],
        "FailedNodes": {"node-b": "1/1 CardInsufficientMemory"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    written = _annotations(extender.apiserver, "p1")
    assert {k: v for k, v in written.items() if k != "hami.io/traceparent"} == _PLACED_ON_A
    # The patch is what the gRPC Filter returns, to the byte.
    stored = recorder.stored(pod["metadata"]["uid"])
    assert (stored.found, stored.node_name) == (True, "node-a")
    assert sorted((d.uuid, d.memory_mib) for d in stored.stored) == [
        ("GPU-a0", 10240), ("GPU-a1", 20480)
    ]
    assert extender.patches() == [f"{NS}/p1"]
    # HAMi's PatchPodAnnotations also labels the pod with its node.
    labels = extender.apiserver.get("Pod", "p1", NS)["metadata"]["labels"]
    assert labels == {"hami.io/vgpu-node": "node-a"}


def test_the_patch_matches_the_grpc_filter_byte_for_byte(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    extender.filter(pod, ["node-a", "node-b"])
    written = _annotations(extender.apiserver, "p1")
    # The same pod filtered again over gRPC replaces its own reservation with the same
    # placement, and returns the annotations the caller would patch.
    response = extender.scheduler.filter(pod, ["node-a", "node-b"])
    assert dict(response.annotations) == {
        k: v for k, v in written.items() if k != "hami.io/traceparent"
    }


def test_go_decodes_field_names_case_insensitively_the_later_key_winning(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    body = b'{"pod": %s, "NODENAMES": ["node-b"], "nodeNames": ["node-a"], "nodes": null}' % (
        json.dumps(pod).encode()
    )
    answer = extender.post(body)
    assert (answer.status, answer.body["NodeNames"]) == (200, ["node-a"])


def test_a_pod_filtered_again_replaces_its_reservation(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    assert extender.filter(pod, ["node-a"])["NodeNames"] == ["node-a"]
    assert extender.filter(pod, ["node-a"])["NodeNames"] == ["node-a"]
    assert recorder.node_memory("node-a") == 30720
    assert recorder.namespace_used(NS) == 30720


def test_a_pod_without_gpus_passes_with_every_candidate(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = kube_pod("plain", namespace=NS, apps=[app_container("app")])
    extender.apiserver.add("Pod", pod)
    answer = extender.filter(pod, ["node-a", "node-b", "node-c"])
    assert answer["NodeNames"] == ["node-a", "node-b", "node-c"]
    assert (answer["FailedNodes"], answer["Error"]) == ({}, "")
    assert extender.patches() == []
    assert not recorder.stored(pod["metadata"]["uid"]).found


def test_a_quota_refusal_is_unresolvable(extender: Extender, recorder: Recorder) -> None:
    _cluster(recorder)
    recorder.set_quota(NS, {"limits.nvidia.com/gpumem": 8192})
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    answer = extender.filter(pod, ["node-a", "node-b"])
    # HAMi's fit checks the quota card by card before the card's room: every card refuses.
    assert (answer["NodeNames"], answer["FailedNodes"]) == ([], {})
    assert answer["FailedAndUnresolvableNodes"] == {
        "node-a": "2/2 ResourceQuotaNotFit", "node-b": "1/1 ResourceQuotaNotFit"
    }
    assert extender.patches() == []
    assert recorder.namespace_used(NS) == 0


def test_unregistered_candidates_are_unresolvable(extender: Extender, recorder: Recorder) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    answer = extender.filter(pod, ["node-a", "cpu-only"])
    assert answer["NodeNames"] == ["node-a"]
    assert answer["FailedAndUnresolvableNodes"] == {"cpu-only": "node unregistered"}


def test_a_pod_whose_request_cannot_be_read_is_unresolvable_everywhere_naming_the_field(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    answer = extender.filter(pod, ["node-a", "node-b"])
    assert answer["NodeNames"] == []
    reasons = answer["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"node-a", "node-b"}
    assert "Pod.spec.containers[0].resources.limits" in reasons["node-a"], reasons
    assert "lots" in reasons["node-a"]
    assert extender.patches() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"NodeNames": ["node-a"]}', "Pod: extender args missing pod"),
        (b'{"Pod": null, "NodeNames": ["node-a"]}', "Pod: extender args missing pod"),
        (b'{"Pod": "p", "NodeNames": ["node-a"]}', "Pod: must be a Pod object"),
        (b'{"Pod": {}, "NodeNames": "node-a"}', "NodeNames: must be an array"),
        (b'{"Pod": {}, "NodeNames": ["node-a", 7]}', "NodeNames[1]: must be a string"),
        (b'{"Pod": {}, "Nodes": {"items": {}}}', "Nodes.items: must be an array"),
        (b'{"Pod": {}}', "NodeNames: one of NodeNames"),
        (b'{"Pod": {}, "NodeNames": ["node-a", ""]}', "NodeNames[1]: must not be empty"),
    ],
)
def test_a_malformed_body_is_400_naming_the_field(
    extender: Extender, recorder: Recorder, body: bytes, field: str
) -> None:
    answer = extender.post(body)
    assert answer.status == 400
    assert field in answer.body["Error"], answer.body
    assert answer.body["NodeNames"] is None and answer.body["Nodes"] is None
    assert extender.patches() == []


def test_an_oversized_body_is_413_and_other_paths_404(extender: Extender) -> None:
    huge = b'{"Pod": {}, "NodeNames": ["' + b"n" * (9 * 1024 * 1024) + b'"]}'
    answer = extender.post(huge)
    assert answer.status == 413
    assert "exceeds the limit" in answer.body["Error"]
    assert extender.post(b"{}", path="/bind").status == 404
    assert extender.post(b"", method="GET").status == 405
    assert extender.post(b"", method="GET", path="/healthz").body == {"status": "ok"}


def test_a_failing_patch_leaves_nothing_reserved(extender: Extender, recorder: Recorder) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")  # never created on the API server: the patch is a 404
    answer = extender.filter(pod, ["node-a", "node-b"])
    assert answer["NodeNames"] is None and answer["Nodes"] is None
    assert "cannot annotate pod team-a/p1: 404" in answer["Error"]
    assert "reservation was released" in answer["Error"]
    assert not recorder.stored(pod["metadata"]["uid"]).found
    assert recorder.node_memory("node-a") == 0
    assert recorder.namespace_used(NS) == 0


def test_a_pod_recreated_under_the_same_name_is_not_annotated(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", _gpu_pod("p1", uid="another-uid"))
    answer = extender.filter(pod, ["node-a"])
    assert "409" in answer["Error"] and "Precondition failed" in answer["Error"]
    assert "hami.io/vgpu-node" not in _annotations(extender.apiserver, "p1")
    assert recorder.node_memory("node-a") == 0


def test_simulation_nodes_fit_on_the_objects_given_and_reserve_nothing(
    extender: Extender, recorder: Recorder
) -> None:
    # Cluster Autoscaler's template nodes: not registered anywhere (HAMi v2.10 #2046).
    small = kube_node("template-small", [gpu_device("GPU-s0", memory_mib=8192)])
    large = kube_node("template-large", [gpu_device("GPU-l0"), gpu_device("GPU-l1", index=1)])
    broken = kube_node("template-broken")
    broken["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[{"
    pod = _gpu_pod("p1")
    answer = extender.post(extender_args(pod, nodes=[small, large, broken]))
    assert answer.status == 200
    body = answer.body
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["template-large"]
    assert body["Nodes"]["items"][0] == large
    assert body["FailedNodes"] == {"template-small": "1/1 CardInsufficientMemory"}
    assert set(body["FailedAndUnresolvableNodes"]) == {"template-broken"}
    assert extender.patches() == []
    assert not recorder.stored(pod["metadata"]["uid"]).found


def test_simulation_without_gpus_keeps_every_node(extender: Extender) -> None:
    nodes = [kube_node("t1"), kube_node("t2")]
    pod = kube_pod("plain", namespace=NS, apps=[app_container("app")])
    body = extender.post(extender_args(pod, nodes=nodes)).body
    assert body["Nodes"]["items"] == nodes


def test_an_unreachable_recorder_is_an_error(
    start_extender: Any, recorder: Recorder
) -> None:
    extender: Extender = start_extender(deadline_ms=1500, usage_timeout_ms=500,
                                        node_cache="off")
    recorder.stop()
    pod = _gpu_pod("p1")
    answer = extender.post(extender_args(pod, ["node-a"]))
    assert answer.status == 200
    assert answer.body["Error"] and answer.body["NodeNames"] is None


def test_the_extender_needs_a_kubernetes_api() -> None:
    from services.common.config import ConfigError
    from services.scheduler.config import SchedulerConfig

    with pytest.raises(ConfigError, match="EXTENDER_ADDR needs a Kubernetes API"):
        SchedulerConfig.from_env({"HAMI_ACCOUNTING_EXTENDER_ADDR": "127.0.0.1:0"})
    with pytest.raises(ConfigError, match="EXTENDER_CLIENT_CA_FILE needs HTTPS"):
        SchedulerConfig.from_env({"HAMI_ACCOUNTING_EXTENDER_ADDR": "127.0.0.1:0",
                                  "HAMI_ACCOUNTING_KUBERNETES": "in-cluster",
                                  "HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE": __file__})
    config = SchedulerConfig.from_env({"HAMI_ACCOUNTING_EXTENDER_ADDR": "127.0.0.1:8444",
                                       "HAMI_ACCOUNTING_KUBERNETES": "in-cluster"})
    assert config.extender is not None and config.extender.tls is None
    assert config.extender.deadline_ms == 4000
    assert SchedulerConfig.from_env({}).extender is None


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _mutual_tls(directory: Path) -> tuple[ServingTls, tuple[Path, Path], tuple[Path, Path]]:
    """A CA, the extender's certificate for 127.0.0.1 signed by it, a client certificate signed
    by it, and a client certificate signed by nobody the extender trusts."""
    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=test-ca",
             "-days", "2")

    def signed(name: str, extension: str) -> tuple[Path, Path]:
        key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        extfile = directory / f"{name}.ext"
        extfile.write_text(extension)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                 "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extfile))
        return cert, key

    server = signed("extender", "subjectAltName=IP:127.0.0.1\n")
    client = signed("kube-scheduler", "extendedKeyUsage=clientAuth\n")
    stranger = directory / "stranger.pem", directory / "stranger.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(stranger[1]), "-out", str(stranger[0]),
             "-subj", "/CN=stranger", "-days", "2")
    return ServingTls(server[0], server[1], ca), client, stranger


def test_https_with_mutual_tls(start_extender: Any, recorder: Recorder, tmp_path: Path) -> None:
    _cluster(recorder)
    tls, client, stranger = _mutual_tls(tmp_path)
    extender: Extender = start_extender(tls=tls)
    assert extender.url.startswith("https://127.0.0.1:")
    pod = kube_pod("plain", namespace=NS, apps=[app_container("app")])
    trusted = dataclasses.replace(extender, cafile=tls.client_ca_file, client_cert=client)
    assert trusted.filter(pod, ["node-a"])["NodeNames"] == ["node-a"]
    for who in (None, stranger):
        untrusted = dataclasses.replace(extender, cafile=tls.client_ca_file, client_cert=who)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            untrusted.post(extender_args(pod, ["node-a"]))


def test_the_span_is_on_the_pod_trace_its_uid_names_and_the_patch_writes_it(
    extender: Extender, recorder: Recorder
) -> None:
    _cluster(recorder)
    pod = _gpu_pod("p1")
    extender.apiserver.add("Pod", pod)
    extender.filter(pod, ["node-a"])
    spans = extender.scheduler.spans.get_finished_spans()
    by_name = {span.name: span for span in spans}
    root = by_name["extender.filter"]
    expected = telemetry.pod_uid_trace(pod["metadata"]["uid"])
    parent = trace.get_current_span(expected).get_span_context()
    assert root.context.trace_id == parent.trace_id
    assert root.parent is not None and root.parent.span_id == parent.span_id
    assert by_name["scheduler.filter"].context.trace_id == parent.trace_id
    written = _annotations(extender.apiserver, "p1")["hami.io/traceparent"]
    assert written.split("-")[1:3] == [f"{parent.trace_id:032x}", f"{root.context.span_id:016x}"]
