"""Contract tests for the kube-scheduler extender deployment, beside HAMi as released.

deploy/components/kube-scheduler-extender (with kube-scheduler-extender-cert-manager) and the
chart's scheduler.extender / kubeScheduler values turn the scheduler daemon's HTTP extender on
and run a kube-scheduler whose configuration has two extenders: ours for filter, HAMi's
scheduler Service for bind only. Both are rendered as the other deploy tests render (kustomize
v5 from the dev extra's kubectl, Helm's own library), schema-checked strictly
(scripts/validate_manifests.py), and held to what kube-scheduler and the daemon need.

No schema of KubeSchedulerConfiguration ships offline (kubernetes-validate has the API types
only, and no kube-scheduler binary can be had): its keys are checked against the fields of
``k8s.io/kube-scheduler/config/v1`` (types.go: KubeSchedulerConfiguration, Extender,
ExtenderTLSConfig, ExtenderManagedResource, KubeSchedulerProfile, and component-base's
LeaderElectionConfiguration), copied below, and against the rules kube-scheduler's validation
applies to extenders (one binder, a managed resource named by one extender, extended resource
names, a weight with prioritizeVerb).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import re
import shutil
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from deploy_support import (
    CHART_DIR,
    DEPLOY_DIR,
    DOCS_DEPLOY,
    KUBERNETES_VERSION,
    NAMESPACE,
    REPO_ROOT,
    chart_objects,
    env_of,
    find,
    load_renderer,
    load_script,
    recorder_vendors,
    render_chart,
    the_container,
)

from accounting import vendors as vendor_table

renderer = load_renderer()
match = load_script("gen_webhook_match")
Obj = dict[str, Any]

COMPONENT = DEPLOY_DIR / "components" / "kube-scheduler-extender"
EXTENDER_PORT = 8444
DEADLINE_MS = 4000
HAMI_VALUES = DEPLOY_DIR / "hami-values-beside.yaml"
HAMI_SCHEDULER_NAME = "hami-scheduler"
HAMI_URL = "https://hami-scheduler.kube-system.svc:443"
KUBE_SCHEDULER_TAG = "v1.32.0"  # the component's image; the chart's default is the cluster's
EXTENDER_VARIABLES = (
    "HAMI_ACCOUNTING_EXTENDER_ADDR",
    "HAMI_ACCOUNTING_EXTENDER_DEADLINE_MS",
    "HAMI_ACCOUNTING_EXTENDER_CERT_FILE",
    "HAMI_ACCOUNTING_EXTENDER_KEY_FILE",
    "HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE",
    "HAMI_ACCOUNTING_KUBERNETES",
)
# HAMi's NVIDIA task priority: a resource name of a pod that names no device, which
# kube-scheduler must leave to the extender too (scripts/gen_webhook_match.py).
NON_DEVICE_RESOURCES = {"NVIDIA": ("nvidia.com/priority",)}

ON = {"scheduler": {"extender": {"enabled": True}},
      "kubeScheduler": {"enabled": True, "image": {"tag": KUBE_SCHEDULER_TAG}}}


def merged(*parts: Obj) -> Obj:
    out: Obj = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Render:
    """One rendering: kustomize components on deploy/base, or chart values."""

    name: str
    components: tuple[str, ...] = ()
    values: Obj | None = None
    release: str = "hami-accounting"
    namespace: str = NAMESPACE
    tls: bool = True
    mutual: bool = True
    kube_scheduler: bool = True
    cert_manager: bool = False
    network_policy: bool = False

    @property
    def prefix(self) -> str:
        return self.release if "hami-accounting" in self.release else (
            f"{self.release}-hami-accounting")


RENDERS = [
    Render("kustomize: the component", components=("kube-scheduler-extender",)),
    Render(
        # and the gRPC's mutual TLS: the cert-manager component always issues its certificate
        "kustomize: with cert-manager and network policies",
        components=("network-policy", "tls", "cert-manager", "kube-scheduler-extender",
                    "kube-scheduler-extender-cert-manager"),
        cert_manager=True, network_policy=True,
    ),
    Render("chart: extender and kube-scheduler", values=ON),
    Render(
        "chart: with cert-manager and network policies",
        values=merged(ON, {"certManager": {"enabled": True}, "networkPolicy": {"enabled": True},
                           "tls": {"enabled": True}}),
        cert_manager=True, network_policy=True,
    ),
    Render(
        "chart: plain HTTP",
        values=merged(ON, {"scheduler": {"extender": {"tls": {"enabled": False,
                                                              "mutual": False}}}}),
        tls=False, mutual=False,
    ),
    Render(
        "chart: HTTPS without client certificates, cert-manager",
        values=merged(ON, {"scheduler": {"extender": {"tls": {"mutual": False}}},
                           "certManager": {"enabled": True}}),
        mutual=False, cert_manager=True,
    ),
    Render(
        "chart: another release and namespace, every vendor, HAMi's CA pinned",
        values=merged(ON, {
            "devices": {"ascend": {"enabled": True}, "iluvatar": {"enabled": True}},
            "scheduler": {"extender": {"port": 9444, "deadlineMs": 8000}},
            "kubeScheduler": {"extenderHTTPTimeoutSeconds": 10, "schedulerName": "gpu-scheduler",
                              "replicas": 3},
            "hamiScheduler": {"url": "https://hami-scheduler.gpu.svc:443",
                              "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
        }),
        release="gpu", namespace="gpu-accounting",
    ),
    Render(
        "chart: NVIDIA and Ascend only",
        values=merged(ON, {"devices": {
            **{f.name: {"enabled": False} for f in match.families()},
            "nvidia": {"enabled": True}, "ascend": {"enabled": True}}}),
    ),
    Render("chart: the extender alone, for a kube-scheduler of yours",
           values={"scheduler": {"extender": {"enabled": True}}}, kube_scheduler=False),
]
RENDER_IDS = [r.name for r in RENDERS]
CHARTS = [r for r in RENDERS if r.values is not None]


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY_DIR, root)
    return root


def kustomize(root: Path, components: tuple[str, ...], name: str) -> list[Obj]:
    overlay = root / "overlays" / name
    overlay.mkdir(parents=True)
    listed = ", ".join(f"../../components/{c}" for c in components)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [../../base]\ncomponents: [{listed}]\n")
    return renderer.render(overlay)


@pytest.fixture(scope="module")
def rendered(deploy_copy: Path) -> dict[str, list[Obj]]:
    out = {}
    for i, render in enumerate(RENDERS):
        if render.values is None:
            out[render.name] = kustomize(deploy_copy, render.components, f"extender-{i}")
        else:
            out[render.name] = chart_objects(render_chart(
                render.values, release=render.release, namespace=render.namespace))
    return out


def objects_of(rendered: dict[str, list[Obj]], render: Render) -> list[Obj]:
    return rendered[render.name]


def scheduler_of(objects: list[Obj], render: Render) -> Obj:
    return find(objects, "Deployment", f"{render.prefix}-scheduler")


def kube_scheduler_of(objects: list[Obj], render: Render) -> Obj:
    return find(objects, "Deployment", f"{render.prefix}-kube-scheduler")


def configuration(objects: list[Obj], render: Render) -> Obj:
    """The KubeSchedulerConfiguration kube-scheduler reads (its ConfigMap, key config.yaml)."""
    config_map = find(objects, "ConfigMap", f"{render.prefix}-kube-scheduler")
    assert sorted(config_map["data"]) == ["config.yaml"]
    return dict(yaml.safe_load(config_map["data"]["config.yaml"]))


def ours_and_hamis(config: Obj) -> tuple[Obj, Obj]:
    ours, hamis = config["extenders"]
    return ours, hamis


def duration_ms(text: str) -> int:
    """A Go duration of one unit (5s, 30s, 1500ms, 1m), in milliseconds."""
    found = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert found, f"{text!r} is not a duration kube-scheduler reads"
    return int(found[1]) * {"ms": 1, "s": 1000, "m": 60_000}[found[2]]


# --- rendering, schema, lint -----------------------------------------------------------------


@pytest.mark.parametrize("render", RENDERS, ids=RENDER_IDS)
def test_every_object_passes_strict_schema_validation(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    assert renderer.validate(objects_of(rendered, render), KUBERNETES_VERSION) == []


@pytest.mark.parametrize("render", CHARTS, ids=[r.name for r in CHARTS])
def test_helm_lint_finds_nothing_wrong(render: Render) -> None:
    report = helm_python.lint(CHART_DIR, render.values, strict=True, namespace=render.namespace)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_chart_defaults_have_no_extender_no_kube_scheduler_and_no_scheduler_token() -> None:
    objects = chart_objects(render_chart({}))
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not {n for n in names if "kube-scheduler" in n[1]}
    assert ("ClusterRole", "hami-accounting-scheduler") not in names
    scheduler = find(objects, "Deployment", "hami-accounting-scheduler")
    assert scheduler["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert find(objects, "ServiceAccount", "hami-accounting-scheduler")[
        "automountServiceAccountToken"] is False
    env = env_of(the_container(scheduler))
    assert not {name for name in env if name in EXTENDER_VARIABLES}
    service = find(objects, "Service", "hami-accounting-scheduler")
    assert "extender" not in {p["name"] for p in service["spec"]["ports"]}


# --- the same product from kustomize and the chart --------------------------------------------


def _without_instance(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "matchLabels":
                item = {k: v for k, v in item.items() if k != "app.kubernetes.io/instance"}
            elif key == "matchExpressions":
                item = [e for e in item if e["key"] != "app.kubernetes.io/instance"]
            out[key] = _without_instance(item)
        return out
    if isinstance(value, list):
        return [_without_instance(item) for item in value]
    return value


def comparable(objects: list[Obj]) -> dict[tuple[str, ...], Obj]:
    """Objects as the cluster runs them, minus what a chart and a kustomization label
    differently (labels, selectors built from them, the order of env, volumes and mounts,
    comments in kube-scheduler's configuration) and the chart's configuration checksum on
    kube-scheduler's pods."""
    out = {}
    for original in objects:
        if original["kind"] == "Namespace":
            continue
        obj = copy.deepcopy(original)
        obj["metadata"].pop("labels", None)
        spec = obj.get("spec", {})
        if obj["kind"] in ("Deployment", "StatefulSet"):
            spec.pop("selector")
            template = spec["template"]
            template["metadata"].pop("labels")
            annotations = template["metadata"].get("annotations", {})
            annotations.pop("checksum/config", None)
            if not annotations:
                template["metadata"].pop("annotations", None)
            pod = template["spec"]
            for constraint in pod.get("topologySpreadConstraints", []):
                constraint.pop("labelSelector")
            pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
            for container in pod["containers"]:
                for key in ("env", "volumeMounts"):
                    if key in container:
                        container[key] = sorted(container[key], key=lambda e: e["name"])
            for claim in spec.get("volumeClaimTemplates", []):
                claim["metadata"].pop("labels", None)
        elif obj["kind"] in ("Service", "PodDisruptionBudget"):
            spec.pop("selector")
        elif obj["kind"] == "NetworkPolicy":
            obj["spec"] = _without_instance(spec)
        elif obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            # kube-scheduler's configuration as kube-scheduler reads it (comments aside)
            obj["data"]["config.yaml"] = yaml.safe_load(obj["data"]["config.yaml"])
        out[renderer.identity(obj)] = obj
    return out


@pytest.mark.parametrize(
    "kustomized, charted",
    [("kustomize: the component", "chart: extender and kube-scheduler"),
     ("kustomize: with cert-manager and network policies",
      "chart: with cert-manager and network policies")],
    ids=["the component", "with cert-manager and network policies"],
)
def test_the_chart_installs_what_the_components_do(
    kustomized: str, charted: str, rendered: dict[str, list[Obj]]
) -> None:
    chart = comparable(rendered[charted])
    kustomize = comparable(rendered[kustomized])
    assert sorted(chart) == sorted(kustomize)
    for identity, obj in kustomize.items():
        assert chart[identity] == obj, identity


# --- kube-scheduler's configuration ----------------------------------------------------------

# Fields of k8s.io/kube-scheduler/config/v1 (and component-base's LeaderElectionConfiguration),
# by the JSON names kube-scheduler's strict decoder accepts.
CONFIGURATION_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
    "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
    "delayCacheUntilActive",
}
LEADER_ELECTION_FIELDS = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
    "resourceName", "resourceNamespace",
}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_FIELDS = {
    "urlPrefix": str, "filterVerb": str, "preemptVerb": str, "prioritizeVerb": str,
    "weight": int, "bindVerb": str, "enableHTTPS": bool, "tlsConfig": dict,
    "httpTimeout": str, "nodeCacheCapable": bool, "managedResources": list, "ignorable": bool,
}
TLS_FIELDS = {
    "insecure": bool, "serverName": str, "certFile": str, "keyFile": str, "caFile": str,
    "certData": str, "keyData": str, "caData": str,
}
MANAGED_RESOURCE_FIELDS = {"name": str, "ignoredByScheduler": bool}
# apimachinery's qualified name: [prefix/]name, the prefix a DNS subdomain.
_QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_extended_resource_name(name: str) -> bool:
    """What kube-scheduler's validation asks of a managed resource: a domain of its own (not
    kubernetes.io), not a quota's requests. prefix, a valid qualified name."""
    prefix, slash, rest = name.partition("/")
    return bool(
        slash
        and _SUBDOMAIN.fullmatch(prefix) and len(prefix) <= 253
        and _QUALIFIED.fullmatch(rest) and len(rest) <= 63
        and not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"))
        and not name.startswith("requests.")
    )


def configuration_problems(config: Obj) -> list[str]:
    """Unknown or mistyped keys, and what kube-scheduler's extender validation refuses."""
    problems = [f"unknown field {key}" for key in config if key not in CONFIGURATION_FIELDS]
    if config.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        problems.append(f"apiVersion {config.get('apiVersion')!r}")
    if config.get("kind") != "KubeSchedulerConfiguration":
        problems.append(f"kind {config.get('kind')!r}")
    problems += [f"leaderElection: unknown field {key}"
                 for key in config.get("leaderElection", {}) if key not in LEADER_ELECTION_FIELDS]
    for i, profile in enumerate(config.get("profiles", [])):
        problems += [f"profiles[{i}]: unknown field {key}"
                     for key in profile if key not in PROFILE_FIELDS]
    binders, managed = 0, set()

    def typed(where: str, given: Obj, fields: dict[str, type]) -> None:
        for key, value in given.items():
            if key not in fields:
                problems.append(f"{where}: unknown field {key}")
            elif not isinstance(value, fields[key]) or (fields[key] is int
                                                        and isinstance(value, bool)):
                problems.append(f"{where}.{key}: {value!r} is not a {fields[key].__name__}")

    for i, extender in enumerate(config.get("extenders", [])):
        where = f"extenders[{i}]"
        typed(where, extender, EXTENDER_FIELDS)
        typed(f"{where}.tlsConfig", extender.get("tlsConfig", {}), TLS_FIELDS)
        if not extender.get("urlPrefix"):
            problems.append(f"{where}.urlPrefix is required")
        if "httpTimeout" in extender:
            try:
                duration_ms(extender["httpTimeout"])
            except AssertionError as error:
                problems.append(f"{where}.httpTimeout: {error}")
        if extender.get("prioritizeVerb") and not extender.get("weight", 0) > 0:
            problems.append(f"{where}: a prioritizeVerb needs a positive weight")
        binders += bool(extender.get("bindVerb"))
        for j, resource in enumerate(extender.get("managedResources", [])):
            typed(f"{where}.managedResources[{j}]", resource, MANAGED_RESOURCE_FIELDS)
            name = resource.get("name", "")
            if not is_extended_resource_name(name):
                problems.append(f"{where}: {name!r} is not an extended resource name")
            if name in managed:
                problems.append(f"{where}: {name} is managed by two extenders (or twice)")
            managed.add(name)
    if binders > 1:
        problems.append("only one extender can implement bind")
    return problems


def test_the_configuration_check_refuses_what_kube_scheduler_refuses() -> None:
    config = yaml.safe_load((COMPONENT / "kube-scheduler-config.yaml").read_text())
    assert configuration_problems(config) == []
    broken = copy.deepcopy(config)
    ours, hamis = broken["extenders"]
    ours["bindVerb"] = "bind"
    ours["httpTimout"] = "5s"
    ours["nodeCacheCapable"] = "true"
    hamis["managedResources"] = [{"name": "nvidia.com/gpu", "ignoredByScheduler": True},
                                 {"name": "kubernetes.io/gpu"}]
    hamis["tlsConfig"]["insecureSkipVerify"] = True
    hamis["prioritizeVerb"] = "prioritize"
    broken["leaderElection"]["leaseName"] = "x"
    assert sorted(configuration_problems(broken)) == sorted([
        "extenders[0]: unknown field httpTimout",
        "extenders[0].nodeCacheCapable: 'true' is not a bool",
        "extenders[1].tlsConfig: unknown field insecureSkipVerify",
        "extenders[1]: a prioritizeVerb needs a positive weight",
        "extenders[1]: nvidia.com/gpu is managed by two extenders (or twice)",
        "extenders[1]: 'kubernetes.io/gpu' is not an extended resource name",
        "leaderElection: unknown field leaseName",
        "only one extender can implement bind",
    ])


WITH_KUBE_SCHEDULER = [r for r in RENDERS if r.kube_scheduler]


@pytest.mark.parametrize("render", WITH_KUBE_SCHEDULER, ids=[r.name for r in WITH_KUBE_SCHEDULER])
def test_the_configuration_is_one_kube_scheduler_reads(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    config = configuration(objects_of(rendered, render), render)
    assert configuration_problems(config) == []
    name = (render.values or {}).get("kubeScheduler", {}).get("schedulerName",
                                                               HAMI_SCHEDULER_NAME)
    assert config["profiles"] == [{"schedulerName": name}]
    election = config["leaderElection"]
    assert election == {"leaderElect": True, "resourceName": f"{render.prefix}-kube-scheduler",
                        "resourceNamespace": render.namespace}


@pytest.mark.parametrize("render", WITH_KUBE_SCHEDULER, ids=[r.name for r in WITH_KUBE_SCHEDULER])
def test_ours_filters_and_hamis_binds(render: Render, rendered: dict[str, list[Obj]]) -> None:
    objects = objects_of(rendered, render)
    ours, hamis = ours_and_hamis(configuration(objects, render))
    # Ours: filter only, on the Service's extender port, sent node names, never skipped.
    service = find(objects, "Service", f"{render.prefix}-scheduler")
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "extender"]
    scheme = "https" if render.tls else "http"
    assert ours["urlPrefix"] == (
        f"{scheme}://{render.prefix}-scheduler.{render.namespace}.svc:{port['port']}")
    assert ours["filterVerb"] == "filter"
    assert not {"bindVerb", "prioritizeVerb", "preemptVerb", "weight"} & set(ours)
    assert ours["nodeCacheCapable"] is True
    assert ours["ignorable"] is False
    assert ours.get("enableHTTPS", False) is render.tls
    # HAMi's: bind only, nothing managed (kube-scheduler refuses a resource two extenders name).
    hami_url = (render.values or {}).get("hamiScheduler", {}).get("url", HAMI_URL)
    assert hamis["urlPrefix"] == hami_url
    assert hamis["bindVerb"] == "bind"
    assert not {"filterVerb", "prioritizeVerb", "preemptVerb", "managedResources",
                "weight"} & set(hamis)
    assert hamis["ignorable"] is False
    assert hamis["enableHTTPS"] is True
    ca = (render.values or {}).get("hamiScheduler", {}).get("caBundle")
    assert hamis["tlsConfig"] == ({"caData": ca} if ca else {"insecure": True})
    assert duration_ms(hamis["httpTimeout"]) == 30_000  # HAMi's chart's, past its 28s lock retry


@pytest.mark.parametrize("render", WITH_KUBE_SCHEDULER, ids=[r.name for r in WITH_KUBE_SCHEDULER])
def test_the_managed_resources_are_the_vendor_tables_for_the_vendors_accounted(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    ours, _ = ours_and_hamis(configuration(objects, render))
    expected: list[str] = []
    for keyword in recorder_vendors(objects):
        spec = vendor_table.spec_for(keyword)
        names = [spec.resources.count_resource, spec.resources.memory_resource,
                 spec.resources.memory_percentage_resource, spec.resources.core_resource]
        if spec.capacity is not None:
            names += [spec.capacity.count_resource, spec.capacity.memory_resource,
                      spec.capacity.cores_per_device_resource]
        names += NON_DEVICE_RESOURCES.get(keyword, ())
        for name in names:
            if name and name not in expected:
                expected.append(name)
    assert [r["name"] for r in ours["managedResources"]] == expected
    assert all(r["ignoredByScheduler"] is True for r in ours["managedResources"])
    assert len(expected) > len(recorder_vendors(objects))  # memory and cores too, not counts only


def test_a_vendor_added_to_the_table_makes_the_config_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = dataclasses.replace(
        vendor_table.BIREN_SPEC,
        resources=dataclasses.replace(vendor_table.BIREN_SPEC.resources, vendor="Example-NPU",
                                      count_resource="example-npu.io/npu"),
        title="Example NPU", source="pkg/device/examplenpu",
    )
    vendor_table.register(spec)
    try:
        monkeypatch.setattr(vendor_table, "DEFAULT_VENDORS",
                            (*vendor_table.DEFAULT_VENDORS, spec.resources))
        assert match.EXTENDER_CONFIG_FILE in match.stale()
        assert "example-npu.io/npu" in match.render_extender_config(
            match.EXTENDER_CONFIG_FILE.read_text())
    finally:
        monkeypatch.undo()
        vendor_table.unregister(spec.vendor)
    assert match.EXTENDER_CONFIG_FILE not in match.stale()


@pytest.mark.parametrize("render", RENDERS, ids=RENDER_IDS)
def test_kube_scheduler_waits_longer_than_the_daemon_answers(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    env = env_of(the_container(scheduler_of(objects, render)))
    deadline_ms = int(env["HAMI_ACCOUNTING_EXTENDER_DEADLINE_MS"])
    expected = (render.values or {}).get("scheduler", {}).get("extender", {}).get(
        "deadlineMs", DEADLINE_MS)
    assert deadline_ms == expected
    if render.kube_scheduler:
        ours, _ = ours_and_hamis(configuration(objects, render))
        assert duration_ms(ours["httpTimeout"]) > deadline_ms


# --- the scheduler daemon --------------------------------------------------------------------


@pytest.mark.parametrize("render", RENDERS, ids=RENDER_IDS)
def test_the_scheduler_serves_the_extender_with_a_kubernetes_client(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    scheduler = scheduler_of(objects, render)
    container = the_container(scheduler)
    env = env_of(container)
    port = (render.values or {}).get("scheduler", {}).get("extender", {}).get(
        "port", EXTENDER_PORT)
    assert env["HAMI_ACCOUNTING_EXTENDER_ADDR"] == f"0.0.0.0:{port}"
    assert env["HAMI_ACCOUNTING_KUBERNETES"] == "in-cluster"
    assert {"name": "extender", "containerPort": port, "protocol": "TCP"} in container["ports"]
    service = find(objects, "Service", f"{render.prefix}-scheduler")
    assert {"name": "extender", "port": port, "targetPort": "extender", "protocol": "TCP"} in (
        service["spec"]["ports"])
    # TLS: the files are those of the mounted Secret; the client CA only with mutual TLS.
    files = {k: v for k, v in env.items() if k.startswith("HAMI_ACCOUNTING_EXTENDER_")
             and k.endswith("_FILE")}
    expected = {"HAMI_ACCOUNTING_EXTENDER_CERT_FILE": "tls.crt",
                "HAMI_ACCOUNTING_EXTENDER_KEY_FILE": "tls.key"} if render.tls else {}
    if render.mutual:
        expected["HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE"] = "ca.crt"
    assert {k: Path(v).name for k, v in files.items()} == expected
    pod = scheduler["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if render.tls:
        assert {str(Path(v).parent) for v in files.values()} == {
            mounts["extender-tls"]["mountPath"]}
        assert volumes["extender-tls"]["secret"]["secretName"] == (
            f"{render.prefix}-scheduler-extender-tls")
    else:
        assert "extender-tls" not in volumes


@pytest.mark.parametrize("render", RENDERS, ids=RENDER_IDS)
def test_the_scheduler_may_get_and_patch_pods_and_nothing_else(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    name = f"{render.prefix}-scheduler"
    role = find(objects, "ClusterRole", name)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "patch"]}]
    binding = find(objects, "ClusterRoleBinding", name)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": name}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": render.namespace}]
    # ... with a token, now that it calls the API server.
    scheduler = scheduler_of(objects, render)
    assert scheduler["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert scheduler["spec"]["template"]["spec"]["serviceAccountName"] == name
    account = find(objects, "ServiceAccount", name)
    assert account.get("automountServiceAccountToken", True) is True
    # No other role names the scheduler's ServiceAccount.
    for obj in objects:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and obj is not binding:
            assert {"kind": "ServiceAccount", "name": name,
                    "namespace": render.namespace} not in obj.get("subjects", [])


# --- kube-scheduler --------------------------------------------------------------------------


@pytest.mark.parametrize("render", WITH_KUBE_SCHEDULER, ids=[r.name for r in WITH_KUBE_SCHEDULER])
def test_kube_scheduler_has_its_usual_rbac_and_a_lease_of_its_own(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    name = f"{render.prefix}-kube-scheduler"
    subject = {"kind": "ServiceAccount", "name": name, "namespace": render.namespace}
    deployment = kube_scheduler_of(objects, render)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert find(objects, "ServiceAccount", name).get("automountServiceAccountToken", True)
    granted = {}
    for obj in objects:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in obj["subjects"]:
            granted[(obj["kind"], obj["metadata"].get("namespace", ""),
                     obj["roleRef"]["kind"], obj["roleRef"]["name"])] = obj
    assert sorted(granted) == sorted([
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
        ("RoleBinding", render.namespace, "Role", f"{name}-leader-election"),
    ])
    role = find(objects, "Role", f"{name}-leader-election")
    assert role["metadata"]["namespace"] == render.namespace
    election = configuration(objects, render)["leaderElection"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": [election["resourceName"]], "verbs": ["get", "update"]},
    ]
    assert election["resourceNamespace"] == render.namespace
    assert election["resourceName"] != HAMI_SCHEDULER_NAME  # HAMi's scheduler elects under it


@pytest.mark.parametrize("render", WITH_KUBE_SCHEDULER, ids=[r.name for r in WITH_KUBE_SCHEDULER])
def test_kube_scheduler_reads_its_configuration_and_certificates_from_its_volumes(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    deployment = kube_scheduler_of(objects, render)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["kube-scheduler"]
    (config_flag,) = [a for a in container["args"] if a.startswith("--config=")]
    config_path = Path(config_flag.removeprefix("--config="))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = volumes[mounts[str(config_path.parent)]]
    assert config_volume["configMap"]["name"] == f"{render.prefix}-kube-scheduler"
    assert config_path.name == "config.yaml"
    ours, _ = ours_and_hamis(configuration(objects, render))
    tls = ours.get("tlsConfig", {})
    files = {key: Path(tls[key]) for key in ("certFile", "keyFile", "caFile") if key in tls}
    assert sorted(files) == (["caFile", "certFile", "keyFile"] if render.mutual
                             else ["caFile"] if render.tls else [])
    for path in files.values():
        secret = volumes[mounts[str(path.parent)]]["secret"]
        if render.mutual:
            assert secret["secretName"] == f"{render.prefix}-kube-scheduler-tls"
        else:  # the serving certificate's CA alone: never the extender's key
            assert secret["secretName"] == f"{render.prefix}-scheduler-extender-tls"
            assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # kube-scheduler runs locked down like the daemons, and its healthz port is probed.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "/tmp" in mounts and "--cert-dir=/tmp" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 10259,
                                                     "scheme": "HTTPS"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "kube-scheduler"  # no daemon option touches it
    replicas = (render.values or {}).get("kubeScheduler", {}).get("replicas", 2)
    assert deployment["spec"]["replicas"] == replicas


def test_kube_schedulers_image_defaults_to_the_clusters_version() -> None:
    objects = chart_objects(render_chart({"scheduler": {"extender": {"enabled": True}},
                                          "kubeScheduler": {"enabled": True}}))
    image = the_container(find(objects, "Deployment", "hami-accounting-kube-scheduler"))["image"]
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", image), image
    component = yaml.safe_load_all((COMPONENT / "kube-scheduler.yaml").read_text())
    (deployment,) = [o for o in component if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.k8s.io/kube-scheduler:{KUBE_SCHEDULER_TAG}")


CERT_MANAGER = [r for r in RENDERS if r.cert_manager]


@pytest.mark.parametrize("render", CERT_MANAGER, ids=[r.name for r in CERT_MANAGER])
def test_cert_manager_issues_the_extenders_certificates_from_one_ca(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    certificates = {o["spec"]["secretName"]: o for o in objects if o["kind"] == "Certificate"}
    serving = certificates[f"{render.prefix}-scheduler-extender-tls"]["spec"]
    ours, _ = ours_and_hamis(configuration(objects, render))
    host = ours["urlPrefix"].removeprefix("https://").rsplit(":", 1)[0]
    assert host in serving["dnsNames"]
    assert serving["usages"] == ["digital signature", "key encipherment", "server auth"]
    client = certificates.get(f"{render.prefix}-kube-scheduler-tls")
    if render.mutual:
        assert client is not None
        assert client["spec"]["usages"] == ["digital signature", "key encipherment",
                                            "client auth"]
        assert client["spec"]["issuerRef"] == serving["issuerRef"]
    else:
        assert client is None
    # A CA of their own: the gRPC CA's certificates may call every RPC of every daemon.
    assert serving["issuerRef"]["name"] == f"{render.prefix}-extender-ca"
    (ca,) = [o for o in objects if o["kind"] == "Certificate"
             and o["metadata"]["name"] == f"{render.prefix}-extender-ca"]
    assert ca["spec"]["isCA"] is True
    issuer = find(objects, "Issuer", f"{render.prefix}-extender-ca")
    assert issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}


NETWORK_POLICY = [r for r in RENDERS if r.network_policy]


@pytest.mark.parametrize("render", NETWORK_POLICY, ids=[r.name for r in NETWORK_POLICY])
def test_the_network_policy_lets_kube_scheduler_reach_the_extender(
    render: Render, rendered: dict[str, list[Obj]]
) -> None:
    objects = objects_of(rendered, render)
    policy = find(objects, "NetworkPolicy", f"{render.prefix}-scheduler")
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "extender"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # its own namespace only
    labels = kube_scheduler_of(objects, render)["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()


# --- values that cannot work -----------------------------------------------------------------


@pytest.mark.parametrize(
    "values, message",
    [
        ({"kubeScheduler": {"enabled": True}},
         "kubeScheduler.enabled=true needs scheduler.extender.enabled=true"),
        (merged(ON, {"scheduler": {"extender": {"deadlineMs": 5000}}}),
         "scheduler.extender.deadlineMs must be below kubeScheduler.extenderHTTPTimeoutSeconds"),
        (merged(ON, {"scheduler": {"extender": {"tls": {"enabled": False}}}}),
         "scheduler.extender.tls.mutual=true needs scheduler.extender.tls.enabled=true"),
        (merged(ON, {"hamiScheduler": {"caBundle": "-----BEGIN CERTIFICATE-----"}}),
         "hamiScheduler.caBundle must be the base64 of the PEM CA"),
    ],
    ids=["kube-scheduler without our filter", "a deadline kube-scheduler does not wait for",
         "client certificates over plain HTTP", "a PEM where base64 is due"],
)
def test_values_that_cannot_work_fail_the_install_saying_why(values: Obj, message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render_chart(values)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"scheduler": {"extender": {"port": 0}}}, "at '/scheduler/extender/port'"),
        ({"hamiScheduler": {"url": "hami-scheduler.kube-system.svc:443"}},
         "at '/hamiScheduler/url'"),
        ({"kubeScheduler": {"image": {"pullPolicy": "Sometimes"}}},
         "at '/kubeScheduler/image/pullPolicy'"),
    ],
    ids=["no port", "a URL without its scheme", "a pull policy Kubernetes does not have"],
)
def test_the_schema_refuses_bad_extender_values_naming_the_key(values: Obj, message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render_chart(values)


# --- HAMi's chart, the variables, the docs ---------------------------------------------------

# The keys the values file sets, as HAMi v2.10.0's charts/hami/values.yaml has them (line:
# default), and the Service name HAMi's templates give release hami (templates/_helpers.tpl,
# hami-vgpu.fullname: the release name when it contains the chart's, then "-scheduler").
HAMI_V2_10_VALUES = {
    "schedulerName": (63, "hami-scheduler"),
    "scheduler.livenessProbe": (82, False),
    "scheduler.kubeScheduler.enabled": (88, True),
    "scheduler.service.httpPort": (268, 443),
}


def leaves(values: Obj, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        where = f"{prefix}.{key}" if prefix else key
        out.update(leaves(value, where) if isinstance(value, dict) else {where: value})
    return out


def test_the_hami_values_set_only_hamis_keys_and_turn_its_kube_scheduler_off() -> None:
    values = leaves(yaml.safe_load(HAMI_VALUES.read_text()))
    assert set(values) <= set(HAMI_V2_10_VALUES), set(values) - set(HAMI_V2_10_VALUES)
    assert values["scheduler.kubeScheduler.enabled"] is False
    assert values["scheduler.livenessProbe"] is False
    # Our kube-scheduler serves HAMi's profile, and binds through HAMi's Service port.
    assert values["schedulerName"] == HAMI_SCHEDULER_NAME
    chart_values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert chart_values["kubeScheduler"]["schedulerName"] == HAMI_SCHEDULER_NAME
    assert chart_values["hamiScheduler"]["url"] == HAMI_URL
    assert HAMI_URL.endswith(f":{values['scheduler.service.httpPort']}")
    config = yaml.safe_load((COMPONENT / "kube-scheduler-config.yaml").read_text())
    assert config["profiles"][0]["schedulerName"] == HAMI_SCHEDULER_NAME
    assert config["extenders"][1]["urlPrefix"] == HAMI_URL
    # The chart ships the same file (a symbolic link, which Helm follows).
    shipped = CHART_DIR / "files" / HAMI_VALUES.name
    assert shipped.is_symlink() and shipped.resolve() == HAMI_VALUES.resolve()


def scheduler_sources() -> str:
    roots = [REPO_ROOT / "services" / "scheduler", REPO_ROOT / "services" / "common"]
    return "\n".join(p.read_text() for root in roots for p in root.rglob("*.py"))


@pytest.mark.parametrize("name", EXTENDER_VARIABLES)
def test_the_extenders_variables_are_documented_and_read_by_the_scheduler(name: str) -> None:
    assert f"`{name}`" in DOCS_DEPLOY.read_text(), f"{name} is not in docs/deploy.md"
    sources = scheduler_sources()
    if '"EXTENDER_ADDR"' not in sources and '"HAMI_ACCOUNTING_EXTENDER_ADDR"' not in sources:
        pytest.skip("the scheduler daemon does not serve the extender yet")
    key = name.removeprefix("HAMI_ACCOUNTING_")
    assert f'"{key}"' in sources or f'"{name}"' in sources, f"the scheduler never reads {name}"


def test_docs_deploy_walks_through_beside_hami_as_released() -> None:
    docs = DOCS_DEPLOY.read_text()
    (section,) = re.findall(r"^## Beside HAMi as released\n(.*?)(?=^## )", docs, re.S | re.M)
    for text in (
        "components/kube-scheduler-extender", "kube-scheduler-extender-cert-manager",
        "deploy/hami-values-beside.yaml", "scheduler.extender.enabled", "kubeScheduler.enabled",
        "hami.io/bind-phase", "hami.io/bind-time", "hami.io/vgpu-node", "hami.io/vgpu-time",
        "hami.io/vgpu-devices-to-allocate", "FailedScheduling", "kubectl describe pod",
        "hami-accounting usage", "extender.md",
    ):
        assert text in section, text


# --- the certificate recipe of docs/deploy.md -------------------------------------------------


def _handshake(ran_dir: Path, client_cert: tuple[str, str] | None, server_name: str) -> str:
    """A TLS handshake between the extender's serving certificate (requiring client
    certificates of the extender CA, as HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE does) and a
    client that trusts the CA as kube-scheduler's caFile: "ok" or the refusal."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(ran_dir / "extender.crt", ran_dir / "extender.key")
    server.load_verify_locations(ran_dir / "extender-ca.crt")
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(ran_dir / "extender-ca.crt")
    if client_cert is not None:
        client.load_cert_chain(ran_dir / client_cert[0], ran_dir / client_cert[1])
    left, right = socket.socketpair()
    served: list[str] = []

    def serve() -> None:
        try:
            with server.wrap_socket(right, server_side=True) as tls:
                tls.sendall(b"x")
                served.append("ok")
        except (ssl.SSLError, OSError) as error:
            served.append(type(error).__name__)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(left, server_hostname=server_name) as tls:
            answer = tls.recv(1)
            return "ok" if answer == b"x" and served != ["SSLError"] else f"refused {served}"
    except (ssl.SSLError, OSError) as error:
        return f"refused: {type(error).__name__}"
    finally:
        left.close()
        thread.join(timeout=10)


def test_the_extender_certificate_recipe_makes_the_secrets_for_mutual_tls(
    tmp_path: Path,
) -> None:
    from test_deploy_tls_recipes import run_recipe

    ran = run_recipe("extender-tls", tmp_path / "certs")
    for name, files in (
        ("hami-accounting-scheduler-extender-tls", ("extender.crt", "extender.key")),
        ("hami-accounting-kube-scheduler-tls", ("kube-scheduler.crt", "kube-scheduler.key")),
    ):
        secret = ran.secret(name)
        assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
        assert base64.b64decode(secret["data"]["tls.crt"]) == (
            ran.directory / files[0]).read_bytes()
        assert base64.b64decode(secret["data"]["ca.crt"]) == (
            ran.directory / "extender-ca.crt").read_bytes()
    # kube-scheduler's view: the Service name of the urlPrefix, its client certificate.
    service = f"hami-accounting-scheduler.{NAMESPACE}.svc"
    assert _handshake(ran.directory, ("kube-scheduler.crt", "kube-scheduler.key"), service) == "ok"
    assert _handshake(ran.directory, None, service).startswith("refused")
    assert _handshake(ran.directory, ("kube-scheduler.crt", "kube-scheduler.key"),
                      "hami-accounting-usage.hami-system.svc").startswith("refused")


def test_your_issuer_issues_the_extenders_certificates_and_no_ca_is_made() -> None:
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = chart_objects(render_chart(merged(ON, {"certManager": {"enabled": True,
                                                                     "issuerRef": issuer}})))
    assert [o for o in objects if o["kind"] == "Issuer"] == []
    certificates = {o["metadata"]["name"]: o["spec"] for o in objects
                    if o["kind"] == "Certificate"}
    assert sorted(certificates) == ["hami-accounting-admission-webhook",
                                    "hami-accounting-kube-scheduler",
                                    "hami-accounting-scheduler-extender"]
    assert all(spec["issuerRef"] == issuer for spec in certificates.values())


@pytest.mark.parametrize(
    "values, expected, absent",
    [
        ({"scheduler": {"extender": {"enabled": True}}},
         ["kube-scheduler extender https://hami-accounting-scheduler.hami-system.svc:8444/filter",
          "Secret hami-system/hami-accounting-scheduler-extender-tls",
          "hami-system/hami-accounting-kube-scheduler-tls", "files/hami-values-beside.yaml",
          "kubeScheduler.enabled=true"],
         ["profile hami-scheduler"]),
        (merged(ON, {"certManager": {"enabled": True}}),
         ["profile hami-scheduler: our filter, bind by https://hami-scheduler.kube-system.svc:443",
          "HAMi must run without its own\nkube-scheduler"],
         ["Secret hami-system/hami-accounting-scheduler-extender-tls"]),
        ({}, [], ["kube-scheduler extender", "hami-values-beside", "profile hami-scheduler"]),
    ],
    ids=["the extender: its Secrets and the next steps", "with kube-scheduler", "defaults"],
)
def test_notes_say_what_the_extender_still_needs(
    values: Obj, expected: list[str], absent: list[str]
) -> None:
    notes = next(text for path, text in render_chart(values).items() if path.endswith("NOTES.txt"))
    for text in expected:
        assert text in notes
    for text in absent:
        assert text not in notes


def test_the_managed_resources_an_overlay_for_every_vendor_prints_are_the_charts() -> None:
    printed = yaml.safe_load(match.managed_resources_list("all"))
    render = next(r for r in RENDERS if "every vendor" in r.name)
    objects = chart_objects(render_chart(render.values, release=render.release,
                                         namespace=render.namespace))
    ours, _ = ours_and_hamis(configuration(objects, render))
    assert printed == ours["managedResources"]
    assert match.main(["--managed-resources", "default"]) == 0


def test_the_docs_overlay_renders_valid_objects_with_your_kube_scheduler_version(
    deploy_copy: Path,
) -> None:
    docs = DOCS_DEPLOY.read_text()
    (block,) = re.findall(
        r"```yaml\n\s*# deploy/overlays/beside-hami/kustomization.yaml\n(.*?)```", docs, re.S)
    overlay = deploy_copy / "overlays" / "beside-hami"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "\n".join(line.removeprefix("   ") for line in block.splitlines()) + "\n")
    objects = renderer.render(overlay)
    assert renderer.validate(objects, KUBERNETES_VERSION) == []
    deployment = find(objects, "Deployment", "hami-accounting-kube-scheduler")
    assert the_container(deployment)["image"] == "registry.k8s.io/kube-scheduler:v1.32.4"
    binding = find(objects, "RoleBinding",
                   "hami-accounting-kube-scheduler-authentication-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
