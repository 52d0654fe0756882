"""kube-scheduler's extender request (``ExtenderArgs``) read as Go's ``encoding/json`` reads it,
and its answer (``ExtenderFilterResult``) written as Go writes it.

Layer: services/scheduler (adapter). The types are ``k8s.io/kube-scheduler/extender/v1``'s.
They carry no JSON tags, so the keys are the Go field names (``Pod``, ``Nodes``,
``NodeNames``; ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``), and Go's decoder
matches an object's keys to them without regard to case, a later key overwriting an earlier
one; ``null`` leaves a field nil. The objects inside (the Pod, the NodeList's Nodes) are the
Kubernetes objects as the API serves them; they are read by accounting.kube's parsers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting import quoting

ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")
"""ExtenderArgs' fields; any other key is ignored, as Go's decoder ignores it."""


class ExtenderArgsError(ValueError):
    """The body is not an ExtenderArgs kube-scheduler could have sent; the message names the
    field."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """One filter request: the pod, and its candidates by name or as Node objects."""

    pod: Mapping[str, Any]
    node_names: tuple[str, ...] | None
    """``NodeNames`` (the extender is ``nodeCacheCapable``), None when nil."""
    nodes: tuple[Mapping[str, Any], ...] | None
    """``Nodes.items`` (not ``nodeCacheCapable``, or a cluster-autoscaler simulation), None
    when nil."""


def read_extender_args(body: bytes) -> ExtenderArgs:
    """Decodes one request.

    Raises:
        ExtenderArgsError: not JSON, not an object, a field of the wrong type, no pod
            (HAMi's ``extender args missing pod``), or neither ``NodeNames`` nor ``Nodes``.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExtenderArgsError(f"the body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ExtenderArgsError(
            f"the body must be a JSON object (ExtenderArgs), got {_json_type(document)}"
        )
    fields = go_fields(document, ARGS_FIELDS)
    pod = fields.get("Pod")
    if pod is None:
        raise ExtenderArgsError("Pod: extender args missing pod")
    if not isinstance(pod, dict):
        raise ExtenderArgsError(f"Pod: must be a Pod object, got {_json_type(pod)}")
    node_names = _node_names(fields.get("NodeNames"))
    nodes = _nodes(fields.get("Nodes"))
    if node_names is None and nodes is None:
        raise ExtenderArgsError(
            "NodeNames: one of NodeNames (nodeCacheCapable: true) or Nodes is required"
        )
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=nodes)


def go_fields(document: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The values of the struct fields ``names`` in ``document``, matched as Go's decoder
    matches them: case-insensitively, the later of two matching keys winning. A field whose
    value is ``null`` is left out (nil)."""
    by_folded = {name.casefold(): name for name in names}
    found: dict[str, Any] = {}
    for key, value in document.items():
        name = by_folded.get(key.casefold())
        if name is None:
            continue
        if value is None:
            found.pop(name, None)
        else:
            found[name] = value
    return found


def _node_names(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ExtenderArgsError(f"NodeNames: must be an array of strings, got {_json_type(value)}")
    for index, name in enumerate(value):
        if not isinstance(name, str):
            raise ExtenderArgsError(
                f"NodeNames[{index}]: must be a string, got {_json_type(name)}"
            )
    return tuple(value)


def _nodes(value: object) -> tuple[Mapping[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ExtenderArgsError(f"Nodes: must be a NodeList object, got {_json_type(value)}")
    items = value.get("items")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ExtenderArgsError(f"Nodes.items: must be an array of Nodes, got {_json_type(items)}")
    for index, node in enumerate(items):
        if not isinstance(node, dict):
            raise ExtenderArgsError(f"Nodes.items[{index}]: must be a Node object, got "
                                    f"{_json_type(node)}")
    return tuple(items)


def node_name(node: Mapping[str, Any]) -> str:
    """A Node object's ``metadata.name`` ("" when it has none)."""
    metadata = node.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def filter_result(
    *,
    node_names: Sequence[str] | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """An ``ExtenderFilterResult`` as Go's ``json.Marshal`` writes it: every field present, nil
    ones as ``null`` (kube-scheduler reads ``NodeNames`` when it is not null, else ``Nodes``;
    both null means no node passed)."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": list(nodes)},
        "NodeNames": None if node_names is None else list(node_names),
        "FailedNodes": dict(failed) if failed else {},
        "FailedAndUnresolvableNodes": dict(unresolvable) if unresolvable else {},
        "Error": error,
    }


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"the string {quoting.quote(value)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"
