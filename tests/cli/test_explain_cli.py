"""``hami-accounting explain``: manifests in YAML and JSON (file or stdin), table and JSON
output, the example pods, and malformed manifests (exit 2, the field named)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.cli import app, explain
from tests.support.pods import (
    allocation,
    app_container,
    init_container,
    kube_pod,
    sidecar_container,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SIDECAR_FIRST = EXAMPLES / "sidecar-before-init.yaml"
SIDECAR_WHY = (
    "HAMi v2.10 counts the sidecar as an init container, so it charges "
    "max(10240, 2048, 20480) = 20480 and never releases it while the sidecar runs; "
    "Kubernetes charges 22528 until the pod ends; hami-accounting charges 22528 while the "
    "init container runs and 12288 after."
)

Json = dict[str, Any]


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables at their default width for a non-terminal (120), whatever COLUMNS says."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = explain.main(args, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(args: list[str], stdin: str = "") -> Json:
    code, out, err = run([*args, "--output", "json"], stdin)
    assert code == 0, err
    document: Json = json.loads(out)
    return document


def charges(document: Json) -> list[tuple[str, int, int, int]]:
    return [
        (
            c["label"],
            c["hami_accounting"]["memory_mib"],
            c["hami_v2_10"]["memory_mib"],
            c["kubernetes"]["memory_mib"],
        )
        for c in document["charges"]
    ]


# -- the example pods --------------------------------------------------------------------------


def test_sidecar_case_table_shows_every_figure() -> None:
    code, out, err = run([str(SIDECAR_FIRST)])

    assert code == 0, err
    lines = out.splitlines()
    init_row = next(line for line in lines if "convert-weights" in line and "init" in line)
    assert "20480" in init_row and "22528 = 20480 + 2048 (log-shipper)" in init_row
    assert any("steady state" in line and "12288" in line for line in lines)
    assert any("effective" in line and "22528" in line for line in lines)
    phase = next(line for line in lines if "init container convert-weights running" in line)
    assert phase.split()[-3:] == ["22528", "20480", "22528"]
    after = next(line for line in lines if "init containers done, apps running" in line)
    assert after.split()[-3:] == ["12288", "20480", "22528"]
    assert " ".join(SIDECAR_WHY.split()) in " ".join(out.split())


def test_sidecar_case_json() -> None:
    document = run_json([str(SIDECAR_FIRST)])

    assert document["effective"] == {"memory_mib": 22528, "core_percent": 0}
    assert document["steady"] == {"memory_mib": 12288, "core_percent": 0}
    assert charges(document) == [
        ("init container convert-weights running", 22528, 20480, 22528),
        ("init containers done, apps running", 12288, 20480, 22528),
        ("terminal", 0, 0, 0),
    ]
    assert document["why"] == SIDECAR_WHY


def test_init_first_example() -> None:
    document = run_json([str(EXAMPLES / "init-before-sidecar.yaml")])

    assert (document["effective"]["memory_mib"], document["steady"]["memory_mib"]) == (
        20480,
        12288,
    )
    assert charges(document)[0] == ("init container convert-weights running", 20480, 20480, 20480)


def test_three_init_example_releases_progressively() -> None:
    document = run_json([str(EXAMPLES / "three-init-containers.yaml")])

    assert [c[1] for c in charges(document)] == [16384, 13312, 9216, 5120, 0]
    assert document["pod"]["namespace"] == "team-a"


def test_allocation_example_is_explained_per_uuid() -> None:
    document = run_json([str(EXAMPLES / "allocated.json")])

    assert document["source"] == "grants"
    server = document["containers"][2]
    assert [(d["device"], d["memory_mib"]) for d in server["devices"]] == [
        ("GPU-0", 6144),
        ("GPU-1", 6144),
    ]
    assert server["requests"] == [
        {"vendor": "NVIDIA", "count": 2, "memory_mib": 6144, "memory_percent": 0, "core_percent": 0}
    ]
    assert document["pod"]["uid"] == "6f1c1f5e-3c1a-4a53-9d0e-2b8f1d2a7c11"
    code, out, _ = run([str(EXAMPLES / "allocated.json")])
    assert code == 0
    assert "GPU-1" in out and "(on device UUID)" in out


def test_another_vendors_pod_is_explained_with_its_own_names_and_units() -> None:
    """examples/mthreads/default_use.yaml (HAMi): 32 units of 512 MiB and 8 sixteenths of a
    GPU; with HAMi's Cambricon allocation annotation, per device."""
    pod = {
        "metadata": {"name": "mt", "namespace": "team-a"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {
            "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
            "mthreads.com/sgpu-core": "8"}}}]},
    }
    document = run_json(["-"], json.dumps(pod))
    assert document["source"] == "requests"
    charge = document["charges"][0]["hami_accounting"]
    assert (charge["memory_mib"], charge["core_percent"]) == (16384, 8)
    code, out, _ = run(["-"], json.dumps(pod))
    assert code == 0
    assert "mthreads.com/sgpu-memory MiB" in out
    assert "no hami.io/mthreads-vgpu-devices-allocated annotation" in " ".join(out.split())

    pod["metadata"]["annotations"] = {  # type: ignore[index]
        "hami.io/cambricon-mlu-devices-allocated": "node-cambricon-mlu-0,MLU,256000,2:;"}
    pod["spec"]["containers"][0]["resources"]["limits"] = {  # type: ignore[index]
        "cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "1000",
        "cambricon.com/mlu.smlu.vcore": "2"}
    document = run_json(["-"], json.dumps(pod))
    assert document["source"] == "grants"
    [device] = document["containers"][0]["devices"]
    assert (device["device"], device["vendor"], device["memory_mib"]) == (
        "node-cambricon-mlu-0", "MLU", 256000)


# -- output keys -------------------------------------------------------------------------------


def test_json_keys_are_stable() -> None:
    document = run_json([str(SIDECAR_FIRST)])

    assert list(document) == [
        "pod",
        "source",
        "memory_factor",
        "containers",
        "devices",
        "steady",
        "effective",
        "charges",
        "why",
        "notes",
    ]
    assert list(document["pod"]) == ["namespace", "name", "uid"]
    # A manifest without a uid gets a placeholder, which is not reported as the pod's.
    assert document["pod"] == {"namespace": "default", "name": "trainer-sidecar-first", "uid": None}
    container = document["containers"][1]
    assert list(container) == ["position", "name", "class", "requests", "devices"]
    assert list(container["devices"][0]) == [
        "device",
        "vendor",
        "memory_mib",
        "core_percent",
        "slots",
        "init_point",
    ]
    assert container["devices"][0]["init_point"] == {
        "own": {"memory_mib": 20480, "core_percent": 0},
        "sidecars": {"memory_mib": 2048, "core_percent": 0},
        "sidecar_names": ["log-shipper"],
        "total": {"memory_mib": 22528, "core_percent": 0},
    }
    assert list(document["devices"][0]) == ["device", "vendor", "steady", "effective"]
    assert list(document["charges"][0]) == [
        "phase",
        "container",
        "label",
        "hami_accounting",
        "hami_v2_10",
        "kubernetes",
    ]
    assert [c["phase"] for c in document["charges"]] == [
        "init_running",
        "apps_running",
        "terminal",
    ]
    assert document["charges"][0]["container"] == "convert-weights"
    assert document["charges"][1]["container"] is None


# -- input forms -------------------------------------------------------------------------------


def _seed_manifest() -> Json:
    manifest = kube_pod(
        "trainer",
        init=[
            sidecar_container("log-shipper", gpumem=2048),
            init_container("convert-weights", gpumem=20480),
        ],
        apps=[app_container("server", gpumem=10240)],
    )
    del manifest["metadata"]["uid"]
    del manifest["metadata"]["namespace"]
    return manifest


def test_json_on_stdin_reads_like_yaml_from_a_file(tmp_path: Path) -> None:
    from_stdin = run_json(["-"], stdin=json.dumps(_seed_manifest()))
    json_file = tmp_path / "pod.json"
    json_file.write_text(json.dumps(_seed_manifest()))
    from_file = run_json([str(json_file)])

    assert charges(from_stdin) == charges(from_file) == charges(run_json([str(SIDECAR_FIRST)]))
    assert from_stdin["pod"]["namespace"] == "default"


def test_yaml_on_stdin() -> None:
    document = run_json(["-"], stdin=SIDECAR_FIRST.read_text())

    assert document["effective"]["memory_mib"] == 22528


def test_memory_factor_option() -> None:
    document = run_json([str(SIDECAR_FIRST), "--memory-factor", "2"])

    assert charges(document)[0] == ("init container convert-weights running", 45056, 40960, 22528)
    assert document["memory_factor"] == 2


def test_through_the_cli_dispatcher(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["explain", str(SIDECAR_FIRST), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["effective"]["memory_mib"] == 22528


def test_as_a_command() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "explain", str(SIDECAR_FIRST)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert "22528 = 20480 + 2048 (log-shipper)" in result.stdout


# -- malformed manifests -----------------------------------------------------------------------


def test_malformed_quantity_names_the_field() -> None:
    manifest = kube_pod("p", apps=[app_container("app", gpumem=1024)])
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"

    code, out, err = run(["-"], stdin=json.dumps(manifest))

    assert code == 2
    assert out == ""
    assert 'spec.containers[0].resources.limits["nvidia.com/gpumem"]' in err
    assert "Kubernetes quantity" in err


def test_every_problem_is_listed() -> None:
    manifest = kube_pod("p", apps=[app_container("app", gpumem=1024), {"image": "x"}])
    manifest["spec"]["initContainers"] = "not a list"

    code, _, err = run(["-"], stdin=json.dumps(manifest))

    assert code == 2
    assert "spec.initContainers: must be an array" in err
    assert "spec.containers[1].name: must not be empty" in err


def test_bad_allocation_annotation_names_the_field() -> None:
    manifest = kube_pod(
        "p",
        apps=[app_container("app", gpumem=1024)],
        allocation=allocation([("GPU-0", 1024, 0)], [("GPU-1", 1024, 0)]),
    )

    code, _, err = run(["-"], stdin=json.dumps(manifest))

    assert code == 2
    assert "hami.io/vgpu-devices-allocated" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("a: [unclosed", "not valid YAML"),
        ("a: " + "9" * 5000, "not valid YAML (a number of thousands of digits)"),
        ("", "holds no document"),
        ("kind: Pod\n---\nkind: Pod\n", "holds 2 documents"),
        ("- just\n- a list\n", "must be a Pod object"),
        ("kind: Deployment\nmetadata: {name: d}\n", "kind: must be Pod, got 'Deployment'"),
        ("metadata: 3\n", "metadata: must be an object"),
    ],
)
def test_unreadable_manifests_exit_2(text: str, message: str) -> None:
    code, out, err = run(["-"], stdin=text)

    assert code == 2
    assert out == ""
    assert message in err


def test_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, err = run([str(tmp_path / "absent.yaml")])

    assert code == 2
    assert "cannot read the file" in err


@pytest.mark.parametrize(
    "args", [[], ["pod.yaml", "--output", "xml"], ["pod.yaml", "--memory-factor", "0"]]
)
def test_bad_arguments_exit_2(args: list[str]) -> None:
    assert run(args)[0] == 2
