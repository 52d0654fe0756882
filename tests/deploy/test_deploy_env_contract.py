"""Every variable the deploy artefacts set is documented and read by the daemon it is set on.

Guards against a manifest setting HAMI_ACCOUNTING_LISTEN_ADRR (silently ignored) or a daemon
renaming a variable without the manifests following.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from deploy_support import (
    CHART_DIR,
    COMPOSE_FILE,
    DAEMON_PORTS,
    DEPLOY_DIR,
    DOCKERFILE,
    DOCS_DEPLOY,
    REPO_ROOT,
    chart_objects,
    daemon_of,
    env_of,
    load_renderer,
    render_chart,
    the_container,
    workloads,
)

PREFIX = "HAMI_ACCOUNTING_"
MENTIONED = re.compile(rf"\b{PREFIX}[A-Z_]+")


# The chart's defaults, and every option that sets variables (metrics off sets one to "off").
CHART_VALUES = [
    {},
    {
        "tls": {"enabled": True},
        "tracing": {"otlpEndpoint": "http://collector:4317", "sampler": "always_on",
                    "samplerArg": "1"},
    },
]


def variables_by_daemon() -> dict[str, set[str]]:
    """daemon -> names set on it by the kustomizations (all components), the chart and
    compose."""
    renderer = load_renderer()
    names: dict[str, set[str]] = {daemon: set() for daemon in DAEMON_PORTS}
    for directory in renderer.find_kustomizations(DEPLOY_DIR):
        for workload in workloads(renderer.render(directory)):
            names[daemon_of(workload)] |= set(env_of(the_container(workload)))
    for values in CHART_VALUES:
        for workload in workloads(chart_objects(render_chart(values))):
            names[daemon_of(workload)] |= set(env_of(the_container(workload)))
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    for daemon in DAEMON_PORTS:
        names[daemon] |= set(compose["services"][daemon].get("environment", {}))
    return names


def variables_mentioned() -> set[str]:
    """Every HAMI_ACCOUNTING_ name in the artefacts, comments included."""
    names = set(MENTIONED.findall(COMPOSE_FILE.read_text() + DOCKERFILE.read_text()))
    for path in [*DEPLOY_DIR.rglob("*.yaml"), *CHART_DIR.rglob("*.yaml"),
                 *CHART_DIR.rglob("*.tpl"), *CHART_DIR.rglob("*.txt")]:
        names |= set(MENTIONED.findall(path.read_text()))
    return names


BY_DAEMON = variables_by_daemon()
ALL_VARIABLES = sorted(set().union(*BY_DAEMON.values()) | variables_mentioned())
PAIRS = sorted((d, n) for d, names in BY_DAEMON.items() for n in names if n.startswith(PREFIX))


def test_artefacts_set_the_expected_variables() -> None:
    assert {
        f"{PREFIX}LISTEN_ADDR",
        f"{PREFIX}USAGE_ADDR",
        f"{PREFIX}DATA_DIR",
        "OTEL_SERVICE_NAME",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    } <= set(ALL_VARIABLES)


@pytest.mark.parametrize("name", ALL_VARIABLES)
def test_variable_is_documented_in_docs_deploy(name: str) -> None:
    assert DOCS_DEPLOY.exists(), "docs/deploy.md is missing"
    assert f"`{name}`" in DOCS_DEPLOY.read_text(), f"{name} is not in docs/deploy.md"


def sources_of(daemon: str) -> str:
    """The code a daemon runs: its package, the shared runtime and the CLI's dispatcher, with
    ``up`` and ``health``."""
    roots = [REPO_ROOT / "services" / daemon, REPO_ROOT / "services" / "common"]
    cli = [REPO_ROOT / "services" / "cli" / name for name in ("app.py", "up.py", "health.py")]
    files = [p for root in roots for p in root.rglob("*.py")] + cli
    return "\n".join(Path(p).read_text() for p in files if Path(p).is_file())


@pytest.mark.parametrize("daemon, name", PAIRS, ids=[f"{d}-{n}" for d, n in PAIRS])
def test_variable_is_read_by_the_daemon_it_is_set_on(daemon: str, name: str) -> None:
    if not (REPO_ROOT / "services" / daemon / "__main__.py").is_file():
        pytest.skip(f"the {daemon} daemon is not written yet")
    key = name.removeprefix(PREFIX)
    sources = sources_of(daemon)
    read = f'"{key}"' in sources or f'"{name}"' in sources
    assert read, f"the {daemon} daemon never reads {name}"


@pytest.mark.parametrize("daemon", ["admission", "scheduler"])
def test_the_accounting_policy_is_set_on_the_recorder_only(daemon: str) -> None:
    # One policy (docs/design.md): the other daemons take it from the recorder and refuse it.
    policy = {f"{PREFIX}MEMORY_FACTOR", f"{PREFIX}ENFORCE_GPU_COUNT", f"{PREFIX}VENDORS"}
    assert not BY_DAEMON[daemon] & policy
    assert policy <= BY_DAEMON["usage"]
