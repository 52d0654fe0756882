"""Reads a Kubernetes Node (as decoded JSON) into the devices HAMi registered on it.

Layer: accounting (pure). The devices come from the ``hami.io/node-nvidia-register`` annotation
the device plugin writes; a node without it simply has no HAMi devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accounting import hami_codec
from accounting.annotations import NODE_REGISTER_ANNOTATION
from accounting.errors import InvalidInputError, Violations
from accounting.model import Device
from accounting.validate import json_object, quote


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """A node's name and the devices registered on it, in registration order."""

    node_name: str
    devices: tuple[Device, ...] = ()


def parse_node_json(raw: bytes | str, *, path: str = "kubernetes_node_json") -> NodeRegistration:
    """Parses ``json.Marshal(node)`` output.

    Raises:
        InvalidInputError: not a JSON object, or any problem ``parse_node`` finds.
    """
    return parse_node(json_object(raw, path), path=path)


def parse_node(obj: Mapping[str, Any], *, path: str = "") -> NodeRegistration:
    """Builds a ``NodeRegistration`` from a Kubernetes Node object.

    Raises:
        InvalidInputError: a missing ``metadata.name`` and every problem of the register
            annotation, together.
    """
    prefix = f"{path}." if path else ""
    found = Violations()
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        found.add(f"{prefix}metadata.name", "must be a non-empty string")
        name = ""
    annotations = metadata.get("annotations")
    devices: tuple[Device, ...] = ()
    annotation_path = f"{prefix}metadata.annotations[{quote(NODE_REGISTER_ANNOTATION)}]"
    if annotations is not None and not isinstance(annotations, dict):
        found.add(f"{prefix}metadata.annotations", "must be an object")
    elif annotations:
        value = annotations.get(NODE_REGISTER_ANNOTATION)
        if isinstance(value, str):
            try:
                devices = hami_codec.decode_node_register(value, path=annotation_path)
            except InvalidInputError as error:
                found.extend(error)
        elif value is not None:
            found.add(annotation_path, "must be a string")
    found.raise_if_any()
    return NodeRegistration(node_name=name, devices=devices)
