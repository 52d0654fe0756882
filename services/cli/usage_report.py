"""``hami-accounting usage``: what a running usage recorder charges, per node and namespace.

Layer: services/cli (a subcommand, a client tool). Asks the recorder (``--usage``, else
HAMI_ACCOUNTING_USAGE_ADDR, else 127.0.0.1:50053; TLS from HAMI_ACCOUNTING_TLS_*) for

* GetNodeUsage: every device of the nodes asked for (all registered nodes by default) with its
  used/total memory, cores and slots, and whether it is healthy;
* GetNamespaceUsage: per resource, used and limit, for the namespaces given with
  ``--namespace``; without any, the namespaces come from the SNAPSHOT events of
  WatchUsage(send_initial_state=True), read up to its initial-state-complete marker.

Prints tables (``--output table``, the default) or JSON with stable keys (``--output json``).
Exit codes: 0 reported, 1 the recorder answered with an error, 2 the recorder is unreachable or
the arguments/environment are invalid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import grpc
from rich import box
from rich.table import Table

from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from services.cli.options import add_addr_option
from services.cli.tables import add_identifier_column, console_for, print_uncut
from services.common.config import DEFAULT_USAGE_ADDR, ConfigError, TlsConfig, env_str
from services.common.server import client_channel

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

PROG = "hami-accounting usage"
CALL_TIMEOUT_S = 5.0

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

Json = dict[str, Any]


@dataclass(frozen=True)
class Report:
    """What the recorder said."""

    nodes: tuple[types_pb2.NodeUsage, ...]
    unknown_nodes: tuple[str, ...]
    namespaces: tuple[tuple[str, tuple[types_pb2.QuotaItem, ...]], ...]


class RecorderError(Exception):
    """A call to the recorder failed; ``unreachable`` when it could not be reached at all."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


# -- talking to the recorder -------------------------------------------------------------------


def discover_namespaces(
    stub: usage_pb2_grpc.UsageRecorderStub, *, deadline_s: float = CALL_TIMEOUT_S
) -> list[str]:
    """Namespaces named by the SNAPSHOT events of WatchUsage(send_initial_state=True).

    The recorder sends its whole state, then an INITIAL_STATE_COMPLETE event (also when it
    holds nothing): the stream is read up to that marker, so no namespace is missed on a large
    recorder and nothing waits on an empty one.
    """
    call = stub.WatchUsage(usage_pb2.WatchUsageRequest(send_initial_state=True), timeout=deadline_s)
    names: set[str] = set()
    try:
        for event in call:
            if event.kind == usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE:
                break
            if event.kind == usage_pb2.USAGE_EVENT_KIND_SNAPSHOT and event.namespace:
                names.add(event.namespace)
    finally:
        call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped
    return sorted(names)


def collect(
    stub: usage_pb2_grpc.UsageRecorderStub,
    *,
    namespaces: Sequence[str] = (),
    nodes: Sequence[str] = (),
    timeout_s: float = CALL_TIMEOUT_S,
    target: str = "",
) -> Report:
    """Asks the recorder for node and namespace usage.

    Raises:
        RecorderError: a call failed (``unreachable`` for UNAVAILABLE or a deadline).
    """
    try:
        node_response = stub.GetNodeUsage(
            usage_pb2.GetNodeUsageRequest(node_names=list(nodes)), timeout=timeout_s
        )
        names = list(dict.fromkeys(namespaces)) or discover_namespaces(stub, deadline_s=timeout_s)
        quota = tuple(
            (
                name,
                tuple(
                    stub.GetNamespaceUsage(
                        usage_pb2.GetNamespaceUsageRequest(namespace=name), timeout=timeout_s
                    ).items
                ),
            )
            for name in names
        )
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        if code in _UNREACHABLE:
            raise RecorderError(
                f"cannot reach the usage recorder at {target} ({code.name}: {details})",
                unreachable=True,
            ) from None
        raise RecorderError(
            f"the usage recorder at {target} answered {code.name}: {details}", unreachable=False
        ) from None
    return Report(
        nodes=tuple(node_response.nodes),
        unknown_nodes=tuple(node_response.unknown_node_names),
        namespaces=quota,
    )


# -- output ------------------------------------------------------------------------------------


def report_json(report: Report, target: str) -> Json:
    """The report with stable keys (``--output json``)."""
    return {
        "usage_addr": target,
        "nodes": [
            {
                "name": node.node_name,
                "pod_uids": list(node.pod_uids),
                "devices": [
                    {
                        "uuid": d.uuid,
                        "type": d.device_type,
                        "index": d.index,
                        "memory_used_mib": d.memory_used_mib,
                        "memory_total_mib": d.memory_total_mib,
                        "cores_used": d.cores_used,
                        "cores_total": d.cores_total,
                        "slots_used": d.slots_used,
                        "slots_total": d.slots_total,
                        "healthy": d.healthy,
                    }
                    for d in node.devices
                ],
            }
            for node in report.nodes
        ],
        "unknown_nodes": list(report.unknown_nodes),
        "namespaces": [
            {
                "name": name,
                "items": [
                    {
                        "resource": item.resource,
                        "used": item.used,
                        "limit": item.limit if item.limit_set else None,
                    }
                    for item in items
                ],
            }
            for name, items in report.namespaces
        ],
    }


def nodes_table(nodes: Iterable[types_pb2.NodeUsage]) -> Table:
    table = Table(title="Nodes", box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    add_identifier_column(table, "Node")
    add_identifier_column(table, "Device")
    table.add_column("Type")
    table.add_column("Memory MiB used/total", justify="right")
    table.add_column("Cores % used/total", justify="right")
    table.add_column("Slots used/total", justify="right")
    table.add_column("Healthy")
    table.add_column("Pods", justify="right")
    for node in nodes:
        if not node.devices:
            table.add_row(
                node.node_name, "(no devices)", "", "", "", "", "", str(len(node.pod_uids))
            )
            continue
        for index, device in enumerate(node.devices):
            first = index == 0
            table.add_row(
                node.node_name if first else "",
                device.uuid,
                device.device_type,
                f"{device.memory_used_mib}/{device.memory_total_mib}",
                f"{device.cores_used}/{device.cores_total}",
                f"{device.slots_used}/{device.slots_total}",
                "yes" if device.healthy else "NO",
                str(len(node.pod_uids)) if first else "",
            )
    return table


def namespaces_table(
    namespaces: Iterable[tuple[str, tuple[types_pb2.QuotaItem, ...]]],
) -> Table:
    table = Table(title="Namespaces", box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    add_identifier_column(table, "Namespace")
    add_identifier_column(table, "Resource")
    table.add_column("Used", justify="right")
    table.add_column("Limit", justify="right")
    for name, items in namespaces:
        if not items:
            table.add_row(name, "(nothing charged, no limit set)", "", "")
            continue
        for index, item in enumerate(items):
            table.add_row(
                name if index == 0 else "",
                item.resource,
                str(item.used),
                str(item.limit) if item.limit_set else "-",
            )
    return table


def print_tables(report: Report, target: str, out: TextIO) -> None:
    console = console_for(out)
    console.print(f"Usage recorder at {target}")
    console.print()
    if report.nodes:
        print_uncut(console, nodes_table(report.nodes))
    else:
        console.print("No node is registered.")
    for name in report.unknown_nodes:
        console.print(f"Node {name} is not registered.")
    console.print()
    if report.namespaces:
        print_uncut(console, namespaces_table(report.namespaces))
    else:
        console.print("No namespace has usage or a quota.")


# -- main --------------------------------------------------------------------------------------


def _parser(default_addr: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Show what the usage recorder charges, per node and namespace."
    )
    add_addr_option(
        parser, "usage", default=default_addr,
        help_text="the recorder's host:port (default: HAMI_ACCOUNTING_USAGE_ADDR or %(default)s)",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="a namespace to report (repeatable; default: every namespace the recorder knows)",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME",
        help="a node to report (repeatable; default: every registered node)",
    )
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "--timeout-s", type=float, default=CALL_TIMEOUT_S, help="deadline of each call"
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs the subcommand; returns the exit code."""
    env = os.environ if env is None else env
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        problems: list[str] = []
        default_addr = env_str(env, "USAGE_ADDR", DEFAULT_USAGE_ADDR, problems=problems)
        tls = TlsConfig.from_env(env, problems=problems)
        if problems:
            raise ConfigError(problems)
    except ConfigError as error:
        print(f"{PROG}: {error}", file=stderr)
        return EXIT_USAGE
    try:
        args = _parser(default_addr).parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help, or bad arguments (argparse printed why)
        return int(exit_.code or 0)

    target: str = args.usage
    try:
        with client_channel(target, tls=tls) as channel:
            report = collect(
                usage_pb2_grpc.UsageRecorderStub(channel),
                namespaces=args.namespace,
                nodes=args.node,
                timeout_s=args.timeout_s,
                target=target,
            )
    except RecorderError as error:
        print(f"{PROG}: {error}", file=stderr)
        return EXIT_USAGE if error.unreachable else EXIT_FAILED
    except OSError as error:  # a TLS file vanished between the check and the read
        print(f"{PROG}: {error}", file=stderr)
        return EXIT_USAGE

    if args.output == "json":
        json.dump(report_json(report, target), stdout, indent=2)
        stdout.write("\n")
    else:
        print_tables(report, target, stdout)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
