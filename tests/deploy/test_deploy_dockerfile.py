"""Contract tests for the Dockerfile and .dockerignore (parsed; CI has no Docker engine)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deploy_support import DAEMON_PORTS, DOCKERFILE, REPO_ROOT, RUN_AS_USER

BASE_IMAGE = "python:3.11-slim-bookworm"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and stages; continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, value = rest.partition("=")
                args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


def test_multi_stage_from_the_pinned_slim_python(stages: list[Stage]) -> None:
    assert len(stages) == 2
    builder, final = stages
    assert builder.name == "builder"
    assert builder.base == final.base == BASE_IMAGE


def test_builder_installs_a_wheel_into_a_venv(stages: list[Stage]) -> None:
    runs = " ".join(stages[0].all("RUN"))
    assert "python -m venv /opt/venv" in runs
    assert "pip wheel" in runs
    assert "pip install /tmp/wheels/" in runs
    assert "-e " not in runs, "an editable install would need the sources in the image"


def test_final_stage_copies_only_the_venv_and_has_no_build_tools(stages: list[Stage]) -> None:
    final = stages[1]
    assert final.all("COPY") == ["--from=builder /opt/venv /opt/venv"]
    runs = " ".join(final.all("RUN"))
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in runs
    assert "pip uninstall -y pip setuptools wheel" in runs


def test_final_stage_runs_as_the_numeric_non_root_user(stages: list[Stage]) -> None:
    final = stages[1]
    assert final.all("USER") == [f"{RUN_AS_USER}:{RUN_AS_USER}"]
    runs = " ".join(final.all("RUN"))
    assert f"--uid {RUN_AS_USER}" in runs
    # The data directory exists and belongs to that user, so a fresh named volume is writable.
    assert f"install -d -o {RUN_AS_USER} -g {RUN_AS_USER}" in runs
    assert "/var/lib/hami-accounting" in runs
    env = " ".join(final.all("ENV"))
    assert "HAMI_ACCOUNTING_DATA_DIR=/var/lib/hami-accounting" in env


def test_entrypoint_is_the_cli_and_the_default_command_serves_usage(stages: list[Stage]) -> None:
    final = stages[1]
    assert [json.loads(a) for a in final.all("ENTRYPOINT")] == [["hami-accounting"]]
    assert [json.loads(a) for a in final.all("CMD")] == [["serve", "usage"]]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "hami-accounting" in scripts


def test_healthcheck_uses_grpc_health_on_the_daemon_port(stages: list[Stage]) -> None:
    (check,) = stages[1].all("HEALTHCHECK")
    assert "hami-accounting health" in check
    assert "HAMI_ACCOUNTING_LISTEN_ADDR" in check
    assert f"127.0.0.1:{DAEMON_PORTS['usage'][0]}" in check


def test_every_port_is_exposed(stages: list[Stage]) -> None:
    exposed = {int(p) for args in stages[1].all("EXPOSE") for p in args.split()}
    assert exposed == {p for ports in DAEMON_PORTS.values() for p in ports} | {8443}


def test_build_context_allow_list_covers_what_the_builder_copies(stages: list[Stage]) -> None:
    rules = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", ".dockerignore is an allow-list"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for copy in stages[0].all("COPY"):
        *sources, _destination = copy.split()
        for source in sources:
            name = source.rstrip("/")
            assert name in allowed, f"COPY {source} is excluded by .dockerignore"
            assert (REPO_ROOT / name).exists(), f"{name} is missing"
    # The wheel is built from these packages (pyproject's package discovery).
    assert {"accounting", "whatif", "services", "gen", "pyproject.toml"} <= allowed
    assert Path(REPO_ROOT / "gen" / "hami").is_dir()


def test_the_image_ships_the_licence(stages: list[Stage], tmp_path: Path) -> None:
    # The builder stage as Docker runs it, minus Docker: exactly the files it copies, then the
    # same `pip wheel`. The final stage copies the venv the wheel is installed into, so the
    # wheel's dist-info/licenses/LICENSE is the licence the image carries.
    source = tmp_path / "src"
    source.mkdir()
    for copy in stages[0].all("COPY"):
        *sources, destination = copy.split()
        for name in sources:
            origin = REPO_ROOT / name.rstrip("/")
            target = source / (destination if destination not in ("./", ".") else origin.name)
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(origin, target)
    assert (source / "LICENSE").is_file(), "the builder stage does not copy LICENSE"
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--wheel-dir", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("hami_accounting-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        # Every package the hami-accounting command imports ships in the wheel.
        names = set(archive.namelist())
        assert {"accounting/fold.py", "whatif/replay.py", "services/cli/app.py"} <= names
        licences = [n for n in archive.namelist() if ".dist-info/licenses/" in n]
        assert [n.rsplit("/", 1)[-1] for n in licences] == ["LICENSE"]
        assert archive.read(licences[0]) == (REPO_ROOT / "LICENSE").read_bytes()
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
    assert b"License-File: LICENSE" in metadata
    assert b"License-Expression: Apache-2.0" in metadata
