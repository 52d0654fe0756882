"""``hami-accounting explain POD --node NODE``: the pod's placement on one node, card by card.

Layer: services/cli (what ``explain`` prints after its charge tables; talks to the usage
recorder only to read the node). For each container that asks for devices, in fitting order:
every card of the vendor in the order the walk tried it, and what the walk did there — taken,
refused with HAMi's reason (``CardCordoned``, ``NumaNotFit`` when the cards of a NUMA node were
left for another, ``ExclusiveDeviceAllocateConflict`` for a busy card under mutex, ...), or not
tried because the container had its cards before. ``accounting.fit.card_walk`` computes it
with the fit's own per-card check, beside the fit's answer for the node.

``NODE`` is a Node manifest (YAML or JSON, the cards from its HAMi register annotations, none
of them charged), or, with ``--usage-addr``, the name of a node the recorder holds (its cards
with what is charged on them now). The namespace quota is not applied.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import yaml
from rich import box
from rich.table import Table

from accounting.errors import InvalidInputError
from accounting.fit import NodeFit, NodeState
from accounting.fit.card_walk import ContainerWalk
from accounting.kube.node_json import parse_node
from accounting.vendors import VendorResources
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.cli.tables import add_identifier_column
from services.common.config import TlsConfig
from services.common.convert import device_state_from_pb
from services.common.server import client_channel

Json = dict[str, Any]
CALL_TIMEOUT_S = 10.0


class NodeSourceError(Exception):
    """The node cannot be read; the message names the file, the node or the recorder."""


def load_node(
    node: str, vendors: Sequence[VendorResources], usage_addr: str | None
) -> NodeState:
    """The node to place the pod on: a manifest file when ``node`` names one, else the node
    of that name the recorder at ``usage_addr`` holds.

    Raises:
        NodeSourceError: no such file and no recorder, an unreadable or invalid manifest, a
            node the recorder does not hold, or a failed call.
    """
    path = Path(node)
    if path.is_file():
        return _from_manifest(path, vendors)
    if usage_addr is None:
        raise NodeSourceError(
            f"--node {node}: no such file; a node name needs --usage-addr (the recorder that "
            "holds it)"
        )
    try:
        with client_channel(usage_addr, tls=TlsConfig.from_env(os.environ)) as channel:
            response = usage_pb2_grpc.UsageRecorderStub(channel).GetNodeUsage(
                usage_pb2.GetNodeUsageRequest(node_names=[node]), timeout=CALL_TIMEOUT_S
            )
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        raise NodeSourceError(
            f"--node {node}: the usage recorder at {usage_addr} answered {code.name}"
        ) from None
    if not response.nodes:
        raise NodeSourceError(f"--node {node}: the usage recorder at {usage_addr} holds no such "
                              "node")
    found = response.nodes[0]
    return NodeState(found.node_name, tuple(device_state_from_pb(d) for d in found.devices))


def _from_manifest(path: Path, vendors: Sequence[VendorResources]) -> NodeState:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise NodeSourceError(f"--node {path}: cannot be read: {error}") from None
    if not isinstance(document, dict) or document.get("kind", "Node") != "Node":
        raise NodeSourceError(f"--node {path}: not a Node manifest")
    try:
        registration = parse_node(document, vendors)
    except InvalidInputError as error:
        problems = "; ".join(f"{v.path}: {v.message}" for v in error.violations)
        raise NodeSourceError(f"--node {path}: not a valid Node: {problems}") from None
    return NodeState.unused(registration.node_name, registration.devices)


def placement_json(fitted: NodeFit, walks: Sequence[ContainerWalk]) -> Json:
    return {
        "node": fitted.node_name,
        "fits": fitted.fits,
        "reason": fitted.reason,
        "containers": [
            {
                "container": walk.container,
                "vendor": walk.vendor,
                "by_vendor_rules": walk.by_vendor_rules,
                "refusal": walk.refusal,
                "cards": [
                    {"uuid": c.uuid, "index": c.index, "numa": c.numa, "verdict": c.verdict}
                    for c in walk.cards
                ],
            }
            for walk in walks
        ],
    }


def placement_table(fitted: NodeFit, walks: Sequence[ContainerWalk]) -> Table:
    """One row per card per container, in walk order."""
    outcome = "fits" if fitted.fits else f"refused: {fitted.reason}"
    table = Table(
        title=f"Placement on {fitted.node_name} ({outcome})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
    )
    add_identifier_column(table, "Container")
    add_identifier_column(table, "Card")
    table.add_column("Index", justify="right")
    table.add_column("NUMA", justify="right")
    table.add_column("Walk")
    for walk in walks:
        if walk.by_vendor_rules:
            table.add_row(walk.container, "-", "", "", f"{walk.vendor}'s own walk (no card list)")
            continue
        if not walk.cards:
            table.add_row(walk.container, "-", "", "", walk.refusal)
            continue
        for number, card in enumerate(walk.cards):
            table.add_row(walk.container if number == 0 else "", card.uuid, str(card.index),
                          str(card.numa), card.verdict)
        table.add_section()
    return table
