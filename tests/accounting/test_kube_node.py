"""The Kubernetes Node parser: the node's name and its hami.io/node-nvidia-register devices."""

from __future__ import annotations

import json
from typing import Any

import pytest

from accounting.errors import InvalidInputError
from accounting.kube import node_json
from accounting.model import Device
from accounting.vendors import NVIDIA_RESOURCES

NVIDIA_ONLY = (NVIDIA_RESOURCES,)
"""The vendors a test means when it reads NVIDIA's resources only."""

REGISTER_KEY = "hami.io/node-nvidia-register"
REGISTER_PATH = 'metadata.annotations["hami.io/node-nvidia-register"]'


def node_obj(name: str | None = "gpu-node-1", annotations: Any = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "uid": "0b8e7f55-5a1c-4b7e-8d0c-3c8d3f0f2a10",
        "resourceVersion": "912",
        "labels": {"gpu": "on", "kubernetes.io/hostname": "gpu-node-1"},
    }
    if name is not None:
        metadata["name"] = name
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "metadata": metadata,
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "32", "nvidia.com/gpu": "20"},
            "allocatable": {"cpu": "32", "nvidia.com/gpu": "20"},
        },
    }


W9_REGISTER = json.dumps(
    [
        {"id": "GPU-0", "count": 10, "devmem": 24576, "devcore": 100, "type": "NVIDIA A10"},
        {
            "id": "GPU-1",
            "index": 1,
            "count": 10,
            "devmem": 24576,
            "devcore": 100,
            "type": "NVIDIA A10",
            "mode": "hami-core",
            "health": True,
        },
    ],
    separators=(",", ":"),
)


def test_w9_index_numa_and_health_omitted_by_go_read_as_zero_and_false() -> None:
    node = node_json.parse_node(
        node_obj(annotations={REGISTER_KEY: W9_REGISTER, "hami.io/node-handshake": "Reported"}),
        NVIDIA_ONLY,
    )
    assert node == node_json.NodeRegistration(
        "gpu-node-1",
        (
            Device("GPU-0", "NVIDIA A10", 0, 10, 24576, 100, numa=0, healthy=False),
            Device("GPU-1", "NVIDIA A10", 1, 10, 24576, 100, numa=0, healthy=True),
        ),
    )


@pytest.mark.parametrize(
    "annotations",
    [None, {}, {"node.alpha.kubernetes.io/ttl": "0"}],
    ids=["no annotations", "empty annotations", "other annotations only"],
)
def test_a_node_without_the_annotation_has_no_devices(annotations: Any) -> None:
    node = node_json.parse_node(node_obj(annotations=annotations), NVIDIA_ONLY)
    assert node == node_json.NodeRegistration(
        "gpu-node-1", ()
    )


def test_a_nameless_node_and_a_bad_annotation_are_reported_together() -> None:
    obj = node_obj(name=None, annotations={REGISTER_KEY: '[{"id":"GPU-0","devmem":-1}]'})
    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node(obj, NVIDIA_ONLY)
    assert [str(violation) for violation in raised.value.violations] == [
        "metadata.name: must be a non-empty string",
        f"{REGISTER_PATH}[0].devmem: must be an integer between 0 and 2147483647, got -1",
    ]


def test_the_legacy_comma_format_is_refused() -> None:
    obj = node_obj(annotations={REGISTER_KEY: "GPU-0,10,24576,100,NVIDIA-Tesla T4,0,true:"})
    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node(obj, NVIDIA_ONLY)
    (violation,) = raised.value.violations
    assert violation.path == REGISTER_PATH
    assert "legacy comma format" in violation.message


def test_wrong_json_types_are_reported() -> None:
    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node(node_obj(annotations={REGISTER_KEY: 42}), NVIDIA_ONLY)
    assert str(raised.value) == f"{REGISTER_PATH}: must be a string"
    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node(node_obj(annotations=["x"]), NVIDIA_ONLY)
    assert str(raised.value) == "metadata.annotations: must be an object"


def test_parse_node_json_prefixes_paths() -> None:
    raw = json.dumps(node_obj(annotations={REGISTER_KEY: W9_REGISTER})).encode()
    assert node_json.parse_node_json(raw, NVIDIA_ONLY).node_name == "gpu-node-1"

    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node_json(json.dumps(node_obj(name="")), NVIDIA_ONLY)
    assert str(raised.value) == "kubernetes_node_json.metadata.name: must be a non-empty string"

    with pytest.raises(InvalidInputError) as raised:
        node_json.parse_node_json(b"not json", NVIDIA_ONLY)
    assert [v.path for v in raised.value.violations] == ["kubernetes_node_json"]
