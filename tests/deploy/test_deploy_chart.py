"""Contract tests for charts/hami-accounting, with Helm itself.

helm-python-sdk (PyPI) bundles Helm v4's library: Chart.load(...).render(values) is `helm
template`, lint() is `helm lint`, and the chart's values.schema.json is enforced by Helm as it
renders. Every object of every value set below must pass the same strict schema check as the
kustomize manifests (scripts/validate_manifests.py: kubernetes-validate, and cert-manager's and
Prometheus Operator's CRD models for their objects), and the chart must install the same
product as deploy/: with the release name hami-accounting in hami-system, its defaults render
deploy/base's objects field for field except labels and label selectors, and each option
renders what the matching kustomize component does.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from deploy_support import (
    CHART_DIR,
    DAEMON_PORTS,
    DEPLOY_DIR,
    IMAGE_NAME,
    KIND_IS_NAMESPACED,
    KUBERNETES_VERSION,
    NAMESPACE,
    NOTES,
    RELEASE,
    RUN_AS_USER,
    chart_objects,
    condition_problems,
    daemon_of,
    env_of,
    find,
    load_renderer,
    load_script,
    recorder_vendors,
    render_chart,
    the_container,
    webhook_condition,
    workloads,
)

from accounting import vendors as vendor_table
from services.usage.k8s_pod_label import LEADER_LABEL

renderer = load_renderer()
match = load_script("gen_webhook_match")
Obj = dict[str, Any]

ALL_FAMILIES_OFF = {family.name: {"enabled": False} for family in match.families()}


@dataclass(frozen=True)
class ValueSet:
    name: str
    values: dict[str, Any] = field(default_factory=dict)
    release: str = RELEASE
    namespace: str = NAMESPACE


VALUE_SETS = [
    ValueSet("defaults"),
    ValueSet(
        "mutual TLS with certificates from cert-manager and the chart's own CA",
        {"tls": {"enabled": True}, "certManager": {"enabled": True}},
    ),
    ValueSet(
        "cert-manager with a ClusterIssuer of yours, gRPC in plaintext",
        {
            "certManager": {
                "enabled": True,
                "issuerRef": {
                    "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"
                },
            }
        },
    ),
    ValueSet(
        "HAMi's own webhook calls CheckQuota: no validating webhook",
        {"admission": {"admissionWebhook": {"enabled": False}}},
    ),
    ValueSet(
        "a recorder fed by HAMi alone: no Kubernetes source, one replica, no claim",
        {
            "usage": {
                "kubernetes": "off",
                "leaderElect": False,
                "replicas": 1,
                "persistence": {"enabled": False},
            }
        },
    ),
    ValueSet(
        "every vendor, memory factor 4, GPU count not enforced",
        {
            "devices": {
                "ascend": {"enabled": True},
                "iluvatar": {"enabled": True},
                "nvidia": {"memoryFactor": 4},
            },
            "accounting": {"enforceGPUCount": False},
        },
    ),
    ValueSet(
        "NVIDIA and Ascend only",
        {"devices": {**ALL_FAMILIES_OFF, "nvidia": {"enabled": True}, "ascend": {"enabled": True}}},
    ),
    ValueSet(
        "network policies, a ServiceMonitor and tracing",
        {
            "networkPolicy": {
                "enabled": True,
                "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
            },
            "prometheus": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prom"}}},
            "tracing": {
                "otlpEndpoint": "http://otel-collector.observability:4317",
                "sampler": "parentbased_traceidratio",
                "samplerArg": "0.1",
            },
        },
    ),
    ValueSet(
        "another release and namespace, a private registry, placement and extra settings",
        {
            "global": {
                "imageRegistry": "registry.example.com",
                "imagePullSecrets": ["regcred"],
                "labels": {"team": "gpu"},
            },
            "image": {"repository": "hami/hami-accounting", "tag": "0.1.0-rc1"},
            "usage": {
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                                 "operator": "Exists", "effect": "NoSchedule"}],
                "extraEnv": [{"name": "HAMI_ACCOUNTING_JOURNAL_SYNC", "value": "full"}],
                "priorityClassName": "system-cluster-critical",
                "persistence": {"storageClassName": "fast", "size": "5Gi"},
            },
            "admission": {
                "podAnnotations": {"example.com/owner": "gpu-team"},
                "admissionWebhook": {
                    "failurePolicy": "Ignore",
                    "whitelistNamespaces": ["monitoring"],
                    "namespaceSelector": {"matchLabels": {"gpu": "on"}},
                    "objectSelector": {"matchExpressions": [
                        {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
                    "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
                },
            },
            "scheduler": {
                "replicas": 3,
                "defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread",
                                           "gpuSchedulerPolicy": "binpack"},
            },
        },
        release="gpu",
        namespace="gpu-accounting",
    ),
    ValueSet(
        "the alert rules and the Grafana dashboard",
        {
            "prometheus": {"prometheusRule": {"enabled": True,
                                              "labels": {"release": "kube-prom"}}},
            "grafana": {"dashboards": {"enabled": True,
                                       "annotations": {"grafana_folder": "GPU"}}},
        },
    ),
    ValueSet("metrics off", {"metrics": {"enabled": False}}),
    ValueSet(
        "no webhook at all",
        {"admission": {"admissionWebhook": {"enabled": False},
                       "annotationWebhook": {"enabled": False}}},
    ),
]
VALUE_SET_IDS = [v.name for v in VALUE_SETS]


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, str]]:
    return {
        v.name: render_chart(v.values, release=v.release, namespace=v.namespace)
        for v in VALUE_SETS
    }


def objects_of(rendered: dict[str, dict[str, str]], value_set: ValueSet) -> list[Obj]:
    return chart_objects(rendered[value_set.name])


def name_of(value_set: ValueSet, daemon: str) -> str:
    prefix = value_set.release if IMAGE_NAME in value_set.release else (
        f"{value_set.release}-{IMAGE_NAME}")
    return f"{prefix}-{daemon}"


# --- Helm: lint, schema, render ------------------------------------------------------------


def test_helm_is_the_real_library() -> None:
    assert helm_python.helm_sdk_version().startswith("v4.")


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=VALUE_SET_IDS)
def test_helm_lint_finds_nothing_wrong(value_set: ValueSet) -> None:
    report = helm_python.lint(
        CHART_DIR, value_set.values, strict=True, namespace=value_set.namespace
    )
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); 2 warning, 3 error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=VALUE_SET_IDS)
def test_every_rendered_object_passes_strict_schema_validation(
    value_set: ValueSet, rendered: dict[str, dict[str, str]]
) -> None:
    objects = objects_of(rendered, value_set)
    assert objects
    assert renderer.validate(objects, KUBERNETES_VERSION) == []


def test_the_defaults_validate_for_every_supported_kubernetes_version(
    rendered: dict[str, dict[str, str]],
) -> None:
    objects = objects_of(rendered, VALUE_SETS[0])
    for version in SUPPORTED_KUBERNETES_VERSIONS:
        assert renderer.validate(objects, version) == [], version


SUPPORTED_KUBERNETES_VERSIONS = [f"1.{minor}" for minor in range(30, 38)]


def test_the_supported_versions_are_the_charts_and_the_docs() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={SUPPORTED_KUBERNETES_VERSIONS[0]}.0-0"
    docs = (DEPLOY_DIR.parent / "docs" / "deploy.md").read_text()
    listed = ", ".join(SUPPORTED_KUBERNETES_VERSIONS)
    assert f"Kubernetes {listed}" in docs


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=VALUE_SET_IDS)
def test_everything_lands_in_the_release_namespace(
    value_set: ValueSet, rendered: dict[str, dict[str, str]]
) -> None:
    for obj in objects_of(rendered, value_set):
        if KIND_IS_NAMESPACED.get(obj["kind"], True):
            assert obj["metadata"]["namespace"] == value_set.namespace, renderer.identity(obj)
        else:
            assert "namespace" not in obj["metadata"], renderer.identity(obj)
    kinds = {obj["kind"] for obj in objects_of(rendered, value_set)}
    assert "Namespace" not in kinds, "helm install --create-namespace makes it; the chart does not"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"admission": {"admissionWebhook": {"failurePolicy": "Sometimes"}}},
         "at '/admission/admissionWebhook/failurePolicy'"),
        ({"devices": {"nvidia": {"memoryFactor": 0}}}, "at '/devices/nvidia/memoryFactor'"),
        ({"devices": {"nvidia": {"memoryFactor": 65537}}}, "at '/devices/nvidia/memoryFactor'"),
        ({"resourceMem": "nvidia.com/vgpu-memory"}, "at '/resourceMem'"),
        ({"usage": {"replica": 3}}, "additional properties 'replica' not allowed"),
        ({"devices": {"tpu": {"enabled": True}}}, "additional properties 'tpu' not allowed"),
        ({"scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "random"}}},
         "at '/scheduler/defaultSchedulerPolicy/nodeSchedulerPolicy'"),
        ({"usage": {"kubernetes": "kubeconfig"}}, "at '/usage/kubernetes'"),
        ({"certManager": {"duration": "90 days"}}, "at '/certManager/duration'"),
    ],
    ids=[
        "a failure policy Kubernetes does not have",
        "a memory factor of 0",
        "a memory factor past the recorder's limit",
        "a resource name the daemons do not account",
        "a misspelt key",
        "a device family the vendor table does not have",
        "a node policy the scheduler does not have",
        "a kubeconfig the pod does not have",
        "a duration cert-manager cannot read",
    ],
)
def test_the_schema_refuses_bad_values_naming_the_key(values: Obj, message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render_chart(values)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"usage": {"leaderElect": False}}, "usage.replicas > 1 needs usage.leaderElect=true"),
        ({"usage": {"kubernetes": "off"}},
         "usage.leaderElect=true needs usage.kubernetes=in-cluster"),
        ({"devices": ALL_FAMILIES_OFF}, "every vendor family is disabled"),
        ({"metrics": {"enabled": False}, "prometheus": {"serviceMonitor": {"enabled": True}}},
         "prometheus.serviceMonitor.enabled=true needs metrics.enabled=true"),
        ({"admission": {"admissionWebhook": {"caBundle": "-----BEGIN CERTIFICATE-----"}}},
         "caBundle must be the base64 of the PEM CA"),
    ],
    ids=[
        "two recorders without a Lease",
        "a Lease without the API",
        "no vendor at all",
        "a ServiceMonitor with nothing to scrape",
        "a PEM where base64 is due",
    ],
)
def test_values_that_cannot_work_together_fail_the_install_saying_why(
    values: Obj, message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render_chart(values)


# --- the same product as deploy/ -----------------------------------------------------------


def _without_instance(selector: Any) -> Any:
    """A label selector without the release's instance label (kustomize has no release)."""
    if isinstance(selector, dict):
        out = {}
        for key, value in selector.items():
            if key == "matchLabels":
                value = {k: v for k, v in value.items() if k != "app.kubernetes.io/instance"}
            elif key == "matchExpressions":
                value = [e for e in value if e["key"] != "app.kubernetes.io/instance"]
            out[key] = _without_instance(value)
        return out
    if isinstance(selector, list):
        return [_without_instance(item) for item in selector]
    return selector


def substance(objects: list[Obj]) -> dict[tuple[str, ...], Obj]:
    """Objects as the cluster runs them, minus what a chart and a kustomization label
    differently: labels, selectors built from labels, and the order of env and volumes."""
    out = {}
    for original in objects:
        if original["kind"] == "Namespace":
            continue  # the chart leaves the namespace to `helm install --create-namespace`
        obj = copy.deepcopy(original)
        obj["metadata"].pop("labels", None)
        spec = obj.get("spec", {})
        if obj["kind"] in ("Deployment", "StatefulSet"):
            spec.pop("selector")
            template = spec["template"]
            template["metadata"].pop("labels")
            pod = template["spec"]
            for constraint in pod.get("topologySpreadConstraints", []):
                constraint.pop("labelSelector")
            pod["volumes"] = sorted(pod["volumes"], key=lambda v: v["name"])
            for container in pod["containers"]:
                container["env"] = sorted(container["env"], key=lambda e: e["name"])
                container["volumeMounts"] = sorted(container["volumeMounts"],
                                                   key=lambda m: m["name"])
            for claim in spec.get("volumeClaimTemplates", []):
                claim["metadata"].pop("labels", None)
        elif obj["kind"] in ("Service", "PodDisruptionBudget"):
            spec.pop("selector")
        elif obj["kind"] == "NetworkPolicy":
            obj["spec"] = _without_instance(spec)
        out[renderer.identity(obj)] = obj
    return out


@pytest.fixture(scope="module")
def kustomized(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[Obj]]:
    """Renders deploy/base with the given components (kubectl kustomize, as deploy tests do)."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY_DIR, root)
    cache: dict[str, list[Obj]] = {}

    def render(kustomization: str) -> list[Obj]:
        if kustomization not in cache:
            overlay = root / "overlays" / f"chart-{len(cache)}"
            overlay.mkdir()
            (overlay / "kustomization.yaml").write_text(kustomization)
            cache[kustomization] = renderer.render(overlay)
        return cache[kustomization]

    return render


def test_the_defaults_install_deploy_base(
    rendered: dict[str, dict[str, str]], kustomized: Callable[[str], list[Obj]]
) -> None:
    chart = substance(objects_of(rendered, VALUE_SETS[0]))
    base = substance(kustomized("resources: [../../base]\n"))
    assert sorted(chart) == sorted(base)
    for identity, obj in base.items():
        assert chart[identity] == obj, identity


EQUIVALENT_OPTIONS = [
    (
        "tls and tracing to Jaeger and a registry image = the example overlay, Jaeger aside",
        {
            "tls": {"enabled": True},
            "tracing": {"otlpEndpoint": "http://jaeger:4317", "sampler": "parentbased_always_on"},
            "image": {"registry": "registry.example.com", "repository": "hami/hami-accounting"},
        },
        "resources: [../example]\n",
        ("jaeger",),
    ),
    (
        "tls and certManager = the tls and cert-manager components",
        {"tls": {"enabled": True}, "certManager": {"enabled": True}},
        "resources: [../../base]\n"
        "components: [../../components/tls, ../../components/cert-manager]\n",
        (),
    ),
    (
        "networkPolicy = the network-policy component",
        {"networkPolicy": {"enabled": True}},
        "resources: [../../base]\ncomponents: [../../components/network-policy]\n",
        (),
    ),
]


@pytest.mark.parametrize(
    "values, kustomization, left_out", [o[1:] for o in EQUIVALENT_OPTIONS],
    ids=[o[0] for o in EQUIVALENT_OPTIONS],
)
def test_each_option_installs_what_its_kustomize_component_does(
    values: Obj,
    kustomization: str,
    left_out: tuple[str, ...],
    kustomized: Callable[[str], list[Obj]],
) -> None:
    chart = substance(chart_objects(render_chart(values)))
    kustomize = {
        identity: obj
        for identity, obj in substance(kustomized(kustomization)).items()
        if identity[3] not in left_out
    }
    assert sorted(chart) == sorted(kustomize)
    for identity, obj in kustomize.items():
        assert chart[identity] == obj, identity


def test_every_vendor_accounted_installs_the_all_vendors_overlay(
    kustomized: Callable[[str], list[Obj]], tmp_path: Path
) -> None:
    # The overlay docs/deploy.md describes: the recorder's variable and the webhook's patch.
    values = {"devices": {"ascend": {"enabled": True}, "iluvatar": {"enabled": True}}}
    chart = chart_objects(render_chart(values))
    recorder = find(chart, "StatefulSet", f"{IMAGE_NAME}-usage")
    setting = env_of(the_container(recorder))["HAMI_ACCOUNTING_VENDORS"]
    assert setting.split(",") == list(vendor_table.known())  # every keyword, in table order
    # ... which is what `all` is to the recorder, and so the overlay's webhook patch:
    assert recorder_vendors(chart) == match.recorder_vendors("all")
    patch = yaml.safe_load(match.overlay_patch("all"))
    (webhook,) = [o for o in chart if o["kind"] == "ValidatingWebhookConfiguration"]
    assert webhook["webhooks"][0]["matchConditions"][0]["expression"] == patch[0]["value"]


# --- what each option renders --------------------------------------------------------------


def test_without_either_webhook_the_endpoint_is_not_served(
    rendered: dict[str, dict[str, str]],
) -> None:
    objects = objects_of(rendered, next(v for v in VALUE_SETS if v.name == "no webhook at all"))
    assert [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"] == []
    admission = find(objects, "Deployment", f"{IMAGE_NAME}-admission")
    assert "HAMI_ACCOUNTING_WEBHOOK_ADDR" not in env_of(the_container(admission))
    service = find(objects, "Service", f"{IMAGE_NAME}-admission")
    assert "webhook" not in {p["name"] for p in service["spec"]["ports"]}


WITH_WEBHOOK = [v for v in VALUE_SETS if v.name != "no webhook at all"]


@pytest.mark.parametrize("value_set", WITH_WEBHOOK, ids=[v.name for v in WITH_WEBHOOK])
def test_the_webhook_sends_the_pods_of_exactly_the_vendors_the_recorder_accounts(
    value_set: ValueSet, rendered: dict[str, dict[str, str]]
) -> None:
    objects = objects_of(rendered, value_set)
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    names = [w["name"] for w in config["webhooks"]]
    if not value_set.values.get("admission", {}).get("admissionWebhook", {}).get("enabled", True):
        # HAMi's webhook checks the quota; the annotation guard stays, and so the endpoint.
        assert names == ["annotations.accounting.hami.io"]
        admission = find(objects, "Deployment", name_of(value_set, "admission"))
        assert env_of(the_container(admission))["HAMI_ACCOUNTING_WEBHOOK_ADDR"] == "0.0.0.0:8443"
        return
    assert names == ["quota.accounting.hami.io", "annotations.accounting.hami.io"]
    assert condition_problems(webhook_condition(objects), recorder_vendors(objects)) == []


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=VALUE_SET_IDS)
def test_workloads_keep_the_deploy_contract(
    value_set: ValueSet, rendered: dict[str, dict[str, str]]
) -> None:
    objects = objects_of(rendered, value_set)
    tls = value_set.values.get("tls", {}).get("enabled", False)
    metrics = value_set.values.get("metrics", {}).get("enabled", True)
    assert sorted(daemon_of(w) for w in workloads(objects)) == sorted(DAEMON_PORTS)
    for workload in workloads(objects):
        daemon = daemon_of(workload)
        grpc_port, metrics_port = DAEMON_PORTS[daemon]
        name = name_of(value_set, daemon)
        assert workload["metadata"]["name"] == name
        pod = workload["spec"]["template"]
        service = find(objects, "Service", name)
        selector = dict(service["spec"]["selector"])
        # The recorder's Service selects the leader's pod, labelled at run time.
        leader = selector.pop(LEADER_LABEL, None)
        elects = daemon == "usage" and value_set.values.get("usage", {}).get("leaderElect", True)
        assert leader == ("true" if elects else None)
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= (
            pod["metadata"]["labels"].items())
        assert pod["spec"]["serviceAccountName"] == name
        container = the_container(workload)
        assert container["args"] == ["serve", daemon]
        env = env_of(container)
        assert env["HAMI_ACCOUNTING_LISTEN_ADDR"] == f"0.0.0.0:{grpc_port}"
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert ports["grpc"] == grpc_port
        metrics_services = [o for o in objects if o["kind"] == "Service"
                            and o["metadata"]["name"] == f"{name}-metrics"]
        if metrics:
            assert env["HAMI_ACCOUNTING_METRICS_ADDR"] == f"0.0.0.0:{metrics_port}"
            if elects:
                # The leader's Service shows the leader alone; every replica's metrics are
                # served by a headless Service of their own, ready or not.
                assert "metrics" not in ports
                (metrics_service,) = metrics_services
                spec = metrics_service["spec"]
                assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
                assert LEADER_LABEL not in spec["selector"]
                assert spec["selector"].items() <= pod["metadata"]["labels"].items()
                ports = {p["name"]: p["port"] for p in spec["ports"]}
            else:
                assert metrics_services == []
            assert ports["metrics"] == metrics_port
        else:
            assert metrics_services == []
            assert env["HAMI_ACCOUNTING_METRICS_ADDR"] == "off"
            assert "metrics" not in ports
            assert "prometheus.io/scrape" not in pod["metadata"].get("annotations", {})
        if daemon != "usage":
            assert env["HAMI_ACCOUNTING_USAGE_ADDR"] == f"{name_of(value_set, 'usage')}:50053"
        # Locked down whatever the values.
        security = container["securityContext"]
        assert security["runAsUser"] == RUN_AS_USER
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        readiness, liveness = container["readinessProbe"], container["livenessProbe"]
        # The recorder's readiness counts a standby that can take over (a drain may evict the
        # leader); its overall status is the leader's alone.
        readiness_service = {"service": "readiness"} if daemon == "usage" else {}
        if tls:
            assert readiness["exec"]["command"] == [
                "hami-accounting", "health", f"127.0.0.1:{grpc_port}",
                *(["--service", "readiness"] if readiness_service else []),
            ]
            assert liveness["tcpSocket"]["port"] == "grpc"
            assert env["HAMI_ACCOUNTING_TLS_CA_FILE"] == "/etc/hami-accounting/grpc-tls/ca.crt"
        else:
            assert readiness["grpc"] == {"port": grpc_port, **readiness_service}
            assert liveness["grpc"] == {"port": grpc_port, "service": "liveness"}
            assert "HAMI_ACCOUNTING_TLS_CERT_FILE" not in env


def test_a_recorder_without_kubernetes_gets_no_rbac_and_no_token(
    rendered: dict[str, dict[str, str]],
) -> None:
    value_set = next(v for v in VALUE_SETS if "no Kubernetes source" in v.name)
    objects = objects_of(rendered, value_set)
    assert [o for o in objects if o["kind"] in
            ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")] == []
    recorder = find(objects, "StatefulSet", f"{IMAGE_NAME}-usage")
    assert recorder["spec"]["replicas"] == 1
    assert recorder["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert find(objects, "ServiceAccount", f"{IMAGE_NAME}-usage")[
        "automountServiceAccountToken"] is False
    env = env_of(the_container(recorder))
    assert env["HAMI_ACCOUNTING_KUBERNETES"] == "off"
    assert env["HAMI_ACCOUNTING_LEADER_ELECTION"] == "false"
    assert "HAMI_ACCOUNTING_LEASE_NAME" not in env
    assert "volumeClaimTemplates" not in recorder["spec"]
    volumes = {v["name"]: v for v in recorder["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}


def test_the_policy_values_reach_the_recorder_and_only_it(
    rendered: dict[str, dict[str, str]],
) -> None:
    value_set = next(v for v in VALUE_SETS if "memory factor 4" in v.name)
    objects = objects_of(rendered, value_set)
    by_daemon = {daemon_of(w): env_of(the_container(w)) for w in workloads(objects)}
    assert by_daemon["usage"]["HAMI_ACCOUNTING_MEMORY_FACTOR"] == "4"
    assert by_daemon["usage"]["HAMI_ACCOUNTING_ENFORCE_GPU_COUNT"] == "false"
    assert recorder_vendors(objects) == tuple(vendor_table.known())
    for daemon in ("admission", "scheduler"):
        assert not {k for k in by_daemon[daemon] if k.endswith(
            ("MEMORY_FACTOR", "ENFORCE_GPU_COUNT", "VENDORS"))}
    nvidia_ascend = objects_of(rendered, next(v for v in VALUE_SETS if "Ascend only" in v.name))
    assert recorder_vendors(nvidia_ascend) == (
        "NVIDIA", *(spec.vendor for spec in vendor_table.ASCEND_SPECS))


def test_another_release_and_namespace_is_named_and_gated_by_them(
    rendered: dict[str, dict[str, str]],
) -> None:
    value_set = next(v for v in VALUE_SETS if "another release" in v.name)
    objects = objects_of(rendered, value_set)
    usage = f"gpu-{IMAGE_NAME}-usage"
    recorder = find(objects, "StatefulSet", usage)
    pod = recorder["spec"]["template"]["spec"]
    assert the_container(recorder)["image"] == "registry.example.com/hami/hami-accounting:0.1.0-rc1"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    env = env_of(the_container(recorder))
    assert env["HAMI_ACCOUNTING_JOURNAL_SYNC"] == "full"
    assert env["HAMI_ACCOUNTING_LEASE_NAME"] == usage
    role = find(objects, "Role", f"{usage}-leader-election")
    assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [[usage]]
    binding = find(objects, "ClusterRoleBinding", usage)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": usage, "namespace": "gpu-accounting"}]
    (claim,) = recorder["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert find(objects, "Deployment", f"gpu-{IMAGE_NAME}-scheduler")["spec"]["replicas"] == 3
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "gpu"
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    webhook, guard = config["webhooks"]
    assert guard["namespaceSelector"] == webhook["namespaceSelector"]
    assert "objectSelector" not in guard  # no pod label bypasses the annotation guard
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["clientConfig"]["service"]["namespace"] == "gpu-accounting"
    assert webhook["clientConfig"]["caBundle"] == "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
    # The release's own namespace is never gated, whatever it is called.
    (first, *more) = webhook["namespaceSelector"]["matchExpressions"]
    assert first == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                     "values": ["gpu-accounting", "kube-system", "monitoring"]}
    assert more == []
    assert webhook["namespaceSelector"]["matchLabels"] == {"gpu": "on"}
    assert webhook["objectSelector"] == {"matchExpressions": [
        {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
    admission = find(objects, "Deployment", f"gpu-{IMAGE_NAME}-admission")
    annotations = admission["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"example.com/owner": "gpu-team", "prometheus.io/scrape": "true",
                           "prometheus.io/port": "9101"}


def test_cert_manager_with_your_issuer_issues_from_it_and_makes_no_ca(
    rendered: dict[str, dict[str, str]],
) -> None:
    value_set = next(v for v in VALUE_SETS if "ClusterIssuer" in v.name)
    objects = objects_of(rendered, value_set)
    assert [o for o in objects if o["kind"] == "Issuer"] == []
    (certificate,) = [o for o in objects if o["kind"] == "Certificate"]
    assert certificate["metadata"]["name"] == f"{IMAGE_NAME}-admission-webhook"
    assert certificate["spec"]["issuerRef"] == {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{IMAGE_NAME}-admission-webhook"}
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_observability_options_render_a_service_monitor_and_otlp_export(
    rendered: dict[str, dict[str, str]],
) -> None:
    value_set = next(v for v in VALUE_SETS if "ServiceMonitor" in v.name)
    objects = objects_of(rendered, value_set)
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prom"
    # It selects the daemons' Services and scrapes those with a metrics port: the admission
    # daemon's, the scheduler's and the recorders' metrics Service (every replica, so the
    # standby too), never the recorder's leader-only Service (which would show the leader
    # twice, or a second leader not at all).
    services = [o for o in objects if o["kind"] == "Service"]
    for service in services:
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            service["metadata"]["labels"].items())
    scraped = sorted(o["metadata"]["name"] for o in services
                     if "metrics" in {p["name"] for p in o["spec"]["ports"]})
    assert scraped == [f"{IMAGE_NAME}-admission", f"{IMAGE_NAME}-scheduler",
                       f"{IMAGE_NAME}-usage-metrics"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    for workload in workloads(objects):
        env = env_of(the_container(workload))
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4317"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
    assert sorted(policies) == sorted(f"{IMAGE_NAME}-{d}" for d in DAEMON_PORTS)
    webhook_rule = next(r for r in policies[f"{IMAGE_NAME}-admission"]["spec"]["ingress"]
                        if r["ports"][0]["port"] == "webhook")
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]


MONITORING = DEPLOY_DIR / "monitoring"
RULES_FILE = "hami-accounting-rules.yaml"
DASHBOARD_FILE = "hami-accounting-dashboard.json"


def test_the_chart_ships_deploy_monitorings_own_files() -> None:
    """Symbolic links, which Helm follows: the chart cannot carry other rules or another
    dashboard than those promtool and the Prometheus test checked."""
    for name in (RULES_FILE, DASHBOARD_FILE):
        shipped = CHART_DIR / "files" / name
        assert shipped.is_symlink(), name
        assert shipped.resolve() == (MONITORING / name).resolve()


def test_the_alert_rules_and_the_dashboard_are_deploy_monitorings(
    rendered: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    value_set = next(v for v in VALUE_SETS if "Grafana dashboard" in v.name)
    objects = objects_of(rendered, value_set)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prom"
    assert rule["spec"] == {"groups": yaml.safe_load((MONITORING / RULES_FILE).read_text())[
        "groups"]}
    # The rendered rules are still Prometheus's: promtool checks them and runs the unit tests
    # of deploy/monitoring on them.
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    shutil.copy(MONITORING / "hami-accounting-rules.test.yaml", tmp_path)
    promtool = shutil.which("promtool")
    assert promtool, "make test installs Debian's prometheus (scripts/system_setup.py)"
    for command in (["check", "rules", RULES_FILE],
                    ["test", "rules", "hami-accounting-rules.test.yaml"]):
        done = subprocess.run([promtool, *command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    (config,) = [o for o in objects if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"].endswith("-dashboard")]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's default
    assert config["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert config["data"] == {DASHBOARD_FILE: (MONITORING / DASHBOARD_FILE).read_text().rstrip()}


def test_the_dashboard_configmap_goes_where_the_sidecar_searches() -> None:
    objects = chart_objects(render_chart(
        {"grafana": {"dashboards": {"enabled": True, "namespace": "monitoring",
                                    "labels": {"dashboards": "hami",
                                               "grafana_dashboard": None}}},
         "prometheus": {"prometheusRule": {"enabled": True, "namespace": "monitoring"}}},
        release=RELEASE, namespace=NAMESPACE))
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"].endswith("-dashboard")]
    assert config["metadata"]["namespace"] == "monitoring"
    assert config["metadata"]["labels"]["dashboards"] == "hami"
    # Helm merges labels with the default; null takes the default's away.
    assert "grafana_dashboard" not in config["metadata"]["labels"]
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "monitoring"


def test_by_default_no_rules_and_no_dashboard(rendered: dict[str, dict[str, str]]) -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects_of(rendered, VALUE_SETS[0])]
    assert not [k for k in kinds if k[0] == "PrometheusRule" or k[1].endswith("-dashboard")]


# --- NOTES ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value_set_name, expected, absent",
    [
        ("defaults", ["HAMI_ACCOUNTING_VENDORS=default",
                      "Secret\nhami-system/hami-accounting-admission-webhook-tls",
                      "admission.admissionWebhook.caBundle", "docs/upgrades.md"],
         ["Mutual TLS is on"]),
        ("mutual TLS with certificates from cert-manager and the chart's own CA",
         ["cert-manager issues the certificates from a CA of this release",
          "kubectl -n hami-system rollout restart statefulset/hami-accounting-usage"],
         ["admission.admissionWebhook.caBundle", "Mutual TLS is on"]),
        ("another release and namespace, a private registry, placement and extra settings",
         ["gpu-hami-accounting-usage.gpu-accounting.svc:50053",
          "failurePolicy Ignore"], ["admission.admissionWebhook.caBundle"]),
    ],
    ids=["defaults: what the webhook still needs", "cert-manager: restart after a renewal",
         "another release: its addresses"],
)
def test_notes_say_what_is_left_to_do(
    rendered: dict[str, dict[str, str]], value_set_name: str, expected: list[str],
    absent: list[str],
) -> None:
    notes = next(text for path, text in rendered[value_set_name].items() if path.endswith(NOTES))
    for text in expected:
        assert text in notes
    for text in absent:
        assert text not in notes


# --- the values are documented -------------------------------------------------------------


def test_the_schema_has_a_device_family_for_every_family_of_the_vendor_table() -> None:
    import json

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    families = schema["properties"]["devices"]["properties"]
    assert sorted(families) == sorted(f.name for f in match.families())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for family in match.families():
        assert values["devices"][family.name]["enabled"] is family.enabled_by_default
    # HAMi's NVIDIA resource names are the vendor table's.
    nvidia = vendor_table.NVIDIA_SPEC.resources
    assert (values["resourceName"], values["resourceMem"], values["resourceMemPercentage"],
            values["resourceCores"]) == (nvidia.count_resource, nvidia.memory_resource,
                                         nvidia.memory_percentage_resource,
                                         nvidia.core_resource)
    for key in ("resourceName", "resourceMem", "resourceMemPercentage", "resourceCores"):
        assert schema["properties"][key]["const"] == values[key]


def test_the_values_table_follows_the_schema_and_the_defaults() -> None:
    docs = load_script("gen_chart_docs")
    assert docs.main(["--check"]) == 0
    readme = docs.README.read_text()
    for key in ("devices.ascend.enabled", "admission.admissionWebhook.failurePolicy",
                "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy", "certManager.issuerRef"):
        assert f"| `{key}` |" in readme


def test_a_value_without_a_description_cannot_be_documented(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    docs = load_script("gen_chart_docs")
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    with (chart / "values.yaml").open("a") as values:
        values.write("\nundocumented: 1\n")
    monkeypatch.setattr(docs, "CHART_DIR", chart)
    expected = re.escape("values.yaml keys without a schema: undocumented")
    with pytest.raises(ValueError, match=expected):
        docs.table()
