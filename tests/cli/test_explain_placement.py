"""``hami-accounting explain POD --node NODE``: the pod's placement on one node, card by card,
from a Node manifest (nothing charged) or from a real recorder started in this process (what is
charged now), as a table and as JSON; an unreadable node exits 2 naming it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from hami.accounting.v1 import usage_pb2
from services.cli import explain
from tests.support.pods import allocation, app_container, gpu_device, kube_node, kube_pod, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder

# The recorder fixtures of tests/usage, re-exported so pytest finds them here.
from tests.usage.conftest import recorder as recorder
from tests.usage.conftest import start_recorder as start_recorder

Json = dict[str, Any]


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def _node(**annotations: str) -> Json:
    node = kube_node("node1", [
        {**gpu_device("gpu-0", index=0), "numa": 0},
        {**gpu_device("gpu-1", index=1), "numa": 0},
        {**gpu_device("gpu-2", index=2), "numa": 1},
    ])
    node["metadata"]["annotations"].update(annotations)
    return node


def _write(tmp_path: Path, name: str, document: Json) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def _pod(count: int, **annotations: str) -> Json:
    return kube_pod("trainer", apps=[app_container("main", gpus=count, gpumem=1000)],
                    annotations=annotations)


def run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = explain.main(args, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def walk_of(document: Json) -> list[tuple[str, str]]:
    (container,) = document["placement"]["containers"]
    return [(card["uuid"], card["verdict"]) for card in container["cards"]]


def test_a_cordoned_card_and_a_numa_node_too_small_are_named(tmp_path: Path) -> None:
    node = _write(tmp_path, "node.json", _node(**{"hami.io/device-cordon": "gpu-1"}))
    pod = _write(tmp_path, "pod.json", _pod(2, **{"nvidia.com/numa-bind": "true"}))
    code, out, err = run([pod, "--node", node, "--output", "json"])
    assert code == 0, err
    document = json.loads(out)
    # Spread with numa-bind: NUMA 1 first, where gpu-2 alone cannot take two; on NUMA 0 gpu-1
    # is cordoned: the node is refused.
    assert walk_of(document) == [
        ("gpu-2", "NumaNotFit"), ("gpu-0", "taken"), ("gpu-1", "CardCordoned"),
    ]
    assert document["placement"]["fits"] is False
    assert document["placement"]["reason"] == (
        "1/3 AllocatedCardsInsufficientRequest, 1/3 CardCordoned, 1/3 NumaNotFit"
    )


def test_the_table_shows_each_card_in_walk_order(tmp_path: Path) -> None:
    node = _write(tmp_path, "node.json", _node())
    pod = _write(tmp_path, "pod.json", _pod(1))
    code, out, err = run([pod, "--node", node, "--gpu-policy", "binpack"])
    assert code == 0, err
    assert "Placement on node1 (fits)" in out
    rows = [re.search(r"(gpu-\d)\s+(\d)\s+(\d)\s+(.+?)\s*$", line)
            for line in out.splitlines() if "gpu-" in line]
    # Three idle cards: the higher NUMA node first, then the higher index.
    assert [row.groups() for row in rows if row] == [
        ("gpu-2", "2", "1", "taken"), ("gpu-1", "1", "0", "not tried"),
        ("gpu-0", "0", "0", "not tried"),
    ]


def test_a_node_the_recorder_holds_is_placed_with_what_is_charged_on_it(
    recorder: RunningRecorder, tmp_path: Path
) -> None:
    stub = recorder.stub
    stub.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(_node())),
        timeout=RPC_TIMEOUT_S,
    )
    busy = kube_pod("busy", apps=[app_container("main", gpumem=1000)],
                    allocation=allocation([("gpu-2", 1000, 0)]), node="node1", phase="Running")
    assert stub.RecordPod(
        usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(busy)), timeout=RPC_TIMEOUT_S
    ).tracked
    pod = _write(tmp_path, "pod.json", _pod(1, **{"hami.io/gpu-scheduler-policy": "mutex"}))
    code, out, err = run([pod, "--node", "node1", "--usage-addr", recorder.app.target,
                          "--output", "json"])
    assert code == 0, err
    # mutex: the idle cards first (gpu-2 has a task now), the first of them taken.
    assert walk_of(json.loads(out)) == [
        ("gpu-1", "taken"), ("gpu-0", "not tried"), ("gpu-2", "not tried"),
    ]


@pytest.mark.parametrize(
    "node_arg, usage, message",
    [
        ("no-such-node.yaml", False, "no such file; a node name needs --usage-addr"),
        ("an invalid manifest", True, None),
    ],
)
def test_a_node_that_cannot_be_read_exits_2_naming_it(
    tmp_path: Path, node_arg: str, usage: bool, message: str | None
) -> None:
    pod = _write(tmp_path, "pod.json", _pod(1))
    if usage:
        bad = tmp_path / "node.yaml"
        bad.write_text("kind: Node\nmetadata: {}\n")
        node_arg = str(bad)
        message = "metadata.name: must be a non-empty string"
    code, out, err = run([pod, "--node", node_arg])
    assert code == 2
    assert out == ""
    assert f"--node {node_arg}" in err and message in err
