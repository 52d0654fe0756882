"""Versions: one version everywhere this build reports it, and releases.toml's releases found
by their commit on this checkout's history (tags are not needed; ``make tags`` makes them).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from services.cli import app
from services.common.version import VERSION

REPO = Path(__file__).resolve().parents[2]
RELEASES = tomllib.loads((REPO / "releases.toml").read_text())


def _version_key(version: str) -> tuple[int, ...]:
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    return tuple(int(part) for part in version.split("."))


def test_the_version_is_one_everywhere() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "charts/hami-accounting/Chart.yaml").read_text())
    overlay = yaml.safe_load((REPO / "deploy/overlays/example/kustomization.yaml").read_text())
    images = {
        match
        for path in sorted((REPO / "deploy/base").glob("*.yaml"))
        for match in re.findall(r"image: hami-accounting:(\S+)", path.read_text())
    }
    assert pyproject == VERSION
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert images == {VERSION}
    assert {image["newTag"] for image in overlay["images"]} == {VERSION}


def test_version_flag_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        app.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"hami-accounting {VERSION}\n"


def test_releases_are_older_than_this_build_and_in_order() -> None:
    versions = [release["version"] for release in RELEASES["release"]]
    assert versions == sorted(versions, key=_version_key)
    assert len(set(versions)) == len(versions)
    assert all(_version_key(v) < _version_key(VERSION) for v in versions), (
        f"releases.toml lists {versions}; this build is {VERSION}: bump pyproject.toml's version "
        "(and services/common/version.py) after recording a release"
    )
    assert set(RELEASES["side_by_side"]) <= set(versions)


@pytest.mark.parametrize(
    "release", RELEASES["release"], ids=[r["version"] for r in RELEASES["release"]]
)
def test_each_release_is_a_commit_of_this_history(release: dict[str, str]) -> None:
    commit = release["commit"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{commit}: a release is its full sha"
    present = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True
    )
    assert present.returncode == 0, (
        f"release {release['version']}'s commit {commit} is not in this clone: a shallow "
        "clone has no history; run git fetch --unshallow"
    )
    ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=REPO, capture_output=True
    )
    assert ancestor.returncode == 0, f"{commit} is not on this checkout's history"


def test_the_tag_script_tags_each_release_on_its_commit() -> None:
    shown = subprocess.run(
        [sys.executable, str(REPO / "scripts/tag_releases.py"), "--dry-run"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    for release, line in zip(RELEASES["release"], shown, strict=True):
        tag = f"v{release['version']}"
        assert line in (
            f"git tag -a {tag} {release['commit']} -m 'hami-accounting {release['version']}'",
            f"{tag}: already on {release['commit']}",
        )


def _descriptors(protos: Path, out: Path) -> dict[str, dict[int, tuple[str, int, int, str]]]:
    """Every message's fields by number: (name, type, label, type name), from protoc."""
    from google.protobuf import descriptor_pb2

    files = sorted(str(p.relative_to(protos)) for p in protos.rglob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{protos}", "--include_imports",
         f"--descriptor_set_out={out}", *files],
        check=True, capture_output=True,
    )
    found: dict[str, dict[int, tuple[str, int, int, str]]] = {}

    def walk(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            name = f"{prefix}.{message.name}"
            found[name] = {
                f.number: (f.name, f.type, f.label, f.type_name) for f in message.field
            }
            walk(name, message.nested_type)

    descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    for file in descriptor_set.file:
        if file.package.startswith("hami.accounting"):
            walk(file.package, file.message_type)
    return found


@pytest.mark.parametrize("version", RELEASES["side_by_side"])
def test_the_contract_only_adds_to_each_side_by_side_release(
    version: str, tmp_path: Path
) -> None:
    commit = {r["version"]: r["commit"] for r in RELEASES["release"]}[version]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "protos"], cwd=REPO, capture_output=True
    )
    assert archive.returncode == 0, (
        f"release {version}'s commit {commit} is not in this clone (git fetch --unshallow): "
        f"{archive.stderr.decode(errors='replace')}"
    )
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    released = _descriptors(tmp_path / "protos", tmp_path / "released.pb")
    head = _descriptors(REPO / "protos", tmp_path / "head.pb")
    changed = [
        f"{message} field {number}: {field} in {version}, {head.get(message, {}).get(number)} now"
        for message, fields in released.items()
        for number, field in fields.items()
        if head.get(message, {}).get(number) != field
    ]
    assert not changed, (
        "a field of a release that runs side by side was removed, renumbered or retyped "
        "(docs/upgrades.md):\n" + "\n".join(changed)
    )
    assert released, "no message read from the release's protos"
