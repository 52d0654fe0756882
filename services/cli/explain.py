"""``hami-accounting explain POD.yaml|POD.json``: how one pod is charged, step by step (and with
``--node`` where it would be placed on one node: ``services.cli.explain_placement``).

Layer: services/cli (a subcommand; talks to the usage recorder only to read its policy). Reads a
Kubernetes Pod manifest (YAML or JSON; ``-`` reads stdin), parses it with the shared parser
(accounting.kube.pod_json) and prints what accounting.explain computes:

* a table per container and device: position, class, request, the container's own usage and,
  for a regular init container, its init-phase point (its own usage plus the sidecars declared
  before it), then the pod's steady state and effective usage per device;
* the pod's charge over its life under hami-accounting, HAMi v2.10 and the Kubernetes
  ResourceQuota, with one sentence on why they differ.

Grants come from ``hami.io/vgpu-devices-allocated`` when the manifest carries it; otherwise the
pod is explained on its requests. ``--output json`` prints the same with stable keys.

The accounting policy (resource names, memory factor) is the usage recorder's: with
``--usage-addr`` it is read from the recorder (GetPolicy) and printed with its id, so the
explanation is the one every daemon answers with; without it, the accounting's defaults, with
``--memory-factor`` to try another factor. Exit codes: 0 explained, 1 the recorder cannot be
reached, 2 unreadable or invalid manifest, bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from accounting import numbers
from accounting.errors import InvalidInputError
from accounting.explain import (
    Amount,
    ContainerExplanation,
    DeviceLine,
    Explanation,
    InitPoint,
    Model,
    explain,
)
from accounting.fit.card_walk import card_walks
from accounting.kube.pod_json import DEFAULT_NAMESPACE, parse_pod
from accounting.model import DeviceRequest
from accounting.pod import vendors_asked
from accounting.policy import AccountingPolicy, policy_for
from accounting.vendors import NVIDIA_RESOURCES
from services.cli import explain_placement
from services.cli.options import add_addr_option, print_violations
from services.cli.tables import add_identifier_column, console_for, natural_width, print_uncut
from services.common.config import ConfigError, TlsConfig
from services.common.errors import DependencyUnavailableError
from services.common.policy import RecorderPolicy
from services.common.server import client_channel

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

PROG = "hami-accounting explain"
PLACEHOLDER_UID = "explain-placeholder-uid"
"""Filled in when the manifest has no metadata.uid (a manifest written by hand never has one)."""

Json = dict[str, Any]


class ManifestError(Exception):
    """The manifest cannot be read as one Pod; the message names the problem."""


# -- reading the manifest ----------------------------------------------------------------------


def load_manifest(text: str, source: str) -> Json:
    """The one Pod object in ``text`` (JSON, or YAML), as JSON-compatible data.

    Raises:
        ManifestError: not JSON/YAML, not exactly one object, or a kind other than Pod.
    """
    stripped = text.lstrip()
    if source.endswith(".json") or stripped.startswith("{"):
        try:
            documents: list[object] = [json.loads(text)]
        except ValueError as error:
            raise ManifestError(f"not valid JSON ({error})") from None
    else:
        try:
            documents = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as error:
            raise ManifestError(f"not valid YAML ({_one_line(str(error))})") from None
        except ValueError:
            # PyYAML reads an integer with int(), which refuses more than 4,300 digits.
            raise ManifestError("not valid YAML (a number of thousands of digits)") from None
    if not documents:
        raise ManifestError("holds no document; expected one Pod")
    if len(documents) > 1:
        raise ManifestError(f"holds {len(documents)} documents; explain reads one Pod")
    document = documents[0]
    if not isinstance(document, dict):
        raise ManifestError(f"must be a Pod object, got {type(document).__name__}")
    kind = document.get("kind")
    if kind is not None and kind != "Pod":
        raise ManifestError(f"kind: must be Pod, got {kind!r}")
    # YAML may hold timestamps and non-string keys; the parser expects what JSON can carry.
    normalised: Json = json.loads(json.dumps(document, default=str))
    return normalised


def with_placeholders(document: Json) -> tuple[Json, bool]:
    """The document with a placeholder metadata.uid and namespace "default" where missing;
    also whether the uid is a placeholder. A metadata that is not an object is left for the
    parser to report."""
    metadata = document.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return document, False
    filled = dict(metadata)
    placeholder = not filled.get("uid")
    if placeholder:
        filled["uid"] = PLACEHOLDER_UID
    if not filled.get("namespace"):
        filled["namespace"] = DEFAULT_NAMESPACE
    return {**document, "metadata": filled}, placeholder


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"cannot read the file ({error})") from None


# -- JSON output -------------------------------------------------------------------------------


def _amount_json(amount: Amount) -> Json:
    return {"memory_mib": amount.memory_mib, "core_percent": amount.core_percent}


def _request_json(request: DeviceRequest) -> Json:
    return {
        "vendor": request.vendor,
        "count": request.count,
        "memory_mib": request.memory_mib,
        "memory_percent": request.memory_percent,
        "core_percent": request.core_percent,
    }


def _point_json(point: InitPoint | None) -> Json | None:
    if point is None:
        return None
    return {
        "own": _amount_json(point.own),
        "sidecars": _amount_json(point.sidecars),
        "sidecar_names": list(point.sidecar_names),
        "total": _amount_json(point.total),
    }


def _line_json(line: DeviceLine) -> Json:
    return {
        "device": line.device,
        "vendor": line.vendor,
        **_amount_json(line.amount),
        "slots": line.slots,
        "init_point": _point_json(line.init_point),
    }


def _container_json(container: ContainerExplanation) -> Json:
    return {
        "position": container.position,
        "name": container.name,
        "class": container.container_class.value,
        "requests": [_request_json(r) for r in container.requests],
        "devices": [_line_json(line) for line in container.devices],
    }


def explanation_json(explanation: Explanation, *, uid_known: bool = True) -> Json:
    """The explanation with stable keys (``--output json``)."""
    return {
        "pod": {
            "namespace": explanation.namespace,
            "name": explanation.name,
            "uid": explanation.uid if uid_known else None,
        },
        "source": explanation.source.value,
        "memory_factor": explanation.memory_factor,
        "containers": [_container_json(c) for c in explanation.containers],
        "devices": [
            {
                "device": d.device,
                "vendor": d.vendor,
                "steady": {**_amount_json(d.steady), "slots": d.steady_slots},
                "effective": {**_amount_json(d.effective), "slots": d.effective_slots},
            }
            for d in explanation.devices
        ],
        "steady": _amount_json(explanation.steady),
        "effective": _amount_json(explanation.effective),
        "charges": [
            {
                "phase": c.phase.value,
                "container": c.container or None,
                "label": c.label,
                "hami_accounting": _amount_json(c.hami_accounting),
                "hami_v2_10": _amount_json(c.hami_v2_10),
                "kubernetes": _amount_json(c.kubernetes),
            }
            for c in explanation.charges
        ],
        "why": explanation.why,
        "notes": list(explanation.notes),
    }


# -- table output ------------------------------------------------------------------------------


def _request_text(requests: Sequence[DeviceRequest]) -> str:
    parts = []
    for request in requests:
        size = (
            f"{request.memory_mib} MiB"
            if request.memory_mib or not request.memory_percent
            else f"{request.memory_percent} % of a card"
        )
        text = f"{request.count} × {size}"
        if request.core_percent:
            text += f", {request.core_percent} %"
        if request.vendor != NVIDIA_RESOURCES.vendor:
            text = f"{request.vendor} {text}"
        parts.append(text)
    return "; ".join(parts) or "-"


def _point_text(point: InitPoint | None, show_cores: bool) -> str:
    if point is None:
        return ""
    total = point.total
    text = str(total.memory_mib)
    if point.sidecar_names or point.sidecars.memory_mib:
        names = ", ".join(point.sidecar_names) or "sidecars"
        text += f" = {point.own.memory_mib} + {point.sidecars.memory_mib} ({names})"
    if show_cores:
        text += f" · {total.core_percent} %"
    return text


def _charge_text(amount: Amount, show_cores: bool) -> str:
    if show_cores:
        return f"{amount.memory_mib} · {amount.core_percent} %"
    return str(amount.memory_mib)


def _uses_cores(explanation: Explanation) -> bool:
    return explanation.effective.core_percent > 0 or any(
        c.kubernetes.core_percent > 0 for c in explanation.charges
    )


def containers_table(explanation: Explanation, *, compact: bool = False) -> Table:
    """Per container and device, then the pod's steady state and effective usage.

    ``compact`` (for a narrow terminal) leaves out the columns that say nothing for this pod:
    the device when the pod is explained on its requests (every row says ``request``; the title
    says so) and the cores when no container asks for any.
    """
    show_cores = _uses_cores(explanation)
    on_requests = explanation.source.value != "grants"
    on = "requests" if on_requests else "device UUID"
    show_device = not (compact and on_requests)
    show_core_column = show_cores or not compact
    table = Table(
        title=f"Containers of {explanation.namespace}/{explanation.name} (on {on})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
    )
    table.add_column("#", justify="right")
    add_identifier_column(table, "Container")
    table.add_column("Class", no_wrap=True)
    table.add_column("Request", no_wrap=True)
    if show_device:
        add_identifier_column(table, "Device")
    table.add_column("MiB", justify="right")
    if show_core_column:
        table.add_column("Cores %", justify="right")
    table.add_column("Init point = own + sidecars before it")

    def add_row(head: tuple[str, str, str, str], device: str, memory: str, cores: str,
                point: str) -> None:
        table.add_row(*head, *((device,) if show_device else ()), memory,
                      *((cores,) if show_core_column else ()), point)

    for container in explanation.containers:
        lines = container.devices or (None,)
        for index, line in enumerate(lines):
            first = index == 0
            head = (
                (str(container.position), container.name, container.container_class.value,
                 _request_text(container.requests))
                if first else ("", "", "", "")
            )
            add_row(
                head,
                line.device if line else "-",
                str(line.amount.memory_mib) if line else "0",
                str(line.amount.core_percent) if line else "0",
                _point_text(line.init_point, show_cores) if line else "",
            )
    table.add_section()
    rows = [("steady state", "sidecars + apps", d.device, d.steady) for d in explanation.devices]
    rows += [
        ("effective", "max(init points, steady state)", d.device, d.effective)
        for d in explanation.devices
    ]
    for label, meaning, device, amount in rows:
        add_row(("", label, "", ""), device, str(amount.memory_mib), str(amount.core_percent),
                meaning)
    return table


def charges_table(explanation: Explanation, memory_resource: str) -> Table:
    """The pod's charge per phase of its life under the three models."""
    show_cores = _uses_cores(explanation)
    unit = f"{memory_resource} MiB" + (" · cores %" if show_cores else "")
    table = Table(
        title=f"Charge over the pod's life ({unit})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
    )
    table.add_column("Phase")
    for model in Model:
        table.add_column(model.value, justify="right")
    for charge in explanation.charges:
        table.add_row(
            charge.label, *(_charge_text(charge.charge(model), show_cores) for model in Model)
        )
    return table


def print_tables(explanation: Explanation, out: TextIO, memory_resource: str) -> Console:
    """Prints the two tables and the sentences under them; returns the console (its width is
    the width the lines after them should keep to)."""
    console = console_for(out)
    containers = containers_table(explanation)
    if natural_width(console, containers) > console.width:
        containers = containers_table(explanation, compact=True)
    print_uncut(console, containers)
    console.print()
    print_uncut(console, charges_table(explanation, memory_resource))
    console.print()
    console.print(f"Why: {explanation.why}")
    for note in explanation.notes:
        console.print(f"Note: {note}")
    return console


# -- main --------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Explain how a pod's GPU usage is charged: per container and device, and "
        "over its life by hami-accounting, HAMi v2.10 and the Kubernetes ResourceQuota.",
    )
    parser.add_argument("manifest", help="Pod manifest, YAML or JSON; - reads stdin")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    source = parser.add_mutually_exclusive_group()
    add_addr_option(
        source, "usage", default=None,
        help_text="read the accounting policy in force from the usage recorder there (TLS from "
        "the HAMI_ACCOUNTING_TLS_* variables)",
    )
    parser.add_argument(
        "--node",
        default=None,
        help="also show the pod's placement on this node, card by card: a Node manifest "
        "(YAML or JSON, nothing charged), or with --usage-addr a node the recorder holds",
    )
    parser.add_argument(
        "--gpu-policy",
        choices=("binpack", "spread"),
        default="spread",
        help="with --node: the scheduler's GPU policy for a pod without its own "
        "hami.io/gpu-scheduler-policy (default: spread, HAMi's)",
    )
    source.add_argument(
        "--memory-factor",
        type=_positive_int,
        default=None,
        help="without a recorder: HAMi's memoryFactor to explain under; requested MiB are "
        f"multiplied by it (default: {NVIDIA_RESOURCES.memory_factor})",
    )
    return parser


def _policy_from(args: argparse.Namespace) -> tuple[AccountingPolicy, str]:
    """The policy to explain under and where it comes from (for the "Policy:" line).

    Raises:
        ConfigError: bad TLS settings; DependencyUnavailableError: the recorder cannot be read.
    """
    if args.usage is None:
        if args.memory_factor is None:
            return policy_for(), "defaults; --usage-addr reads the recorder's"
        policy = policy_for(memory_factor=args.memory_factor)
        return policy, "defaults with --memory-factor; --usage-addr reads the recorder's"
    with client_channel(args.usage, tls=TlsConfig.from_env(os.environ)) as channel:
        policy = RecorderPolicy(channel, args.usage, service="explain").refresh()
    return policy, f"the usage recorder's at {args.usage}"


def _positive_int(text: str) -> int:
    value = numbers.decimal_integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs the subcommand; returns the exit code."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help, or bad arguments (argparse printed why)
        return int(exit_.code or 0)

    try:
        policy, policy_source = _policy_from(args)
    except (ConfigError, DependencyUnavailableError) as error:
        print(f"{PROG}: {error}", file=stderr)
        return EXIT_UNAVAILABLE
    source = "stdin" if args.manifest == "-" else args.manifest
    try:
        document, placeholder_uid = with_placeholders(
            load_manifest(_read(args.manifest, stdin), source)
        )
        pod = parse_pod(document, policy.vendors)
    except ManifestError as error:
        print(f"{PROG}: {source}: {error}", file=stderr)
        return EXIT_USAGE
    except InvalidInputError as error:
        print_violations(f"{PROG}: {source}: not a valid Pod:", error, stderr)
        return EXIT_USAGE

    placed = None
    if args.node is not None:
        try:
            node = explain_placement.load_node(args.node, policy.vendors, args.usage)
            placed = card_walks(pod, node, vendors=policy.vendors, gpu_policy=args.gpu_policy)
        except explain_placement.NodeSourceError as error:
            print(f"{PROG}: {error}", file=stderr)
            return EXIT_USAGE
        except InvalidInputError as error:
            print_violations(f"{PROG}: {source}: cannot be placed:", error, stderr)
            return EXIT_USAGE
    explanation = explain(pod, policy.vendors)
    if args.output == "json":
        document = explanation_json(explanation, uid_known=not placeholder_uid)
        if args.usage is not None:
            document["policy"] = _policy_json(policy, args.usage)
        if placed is not None:
            document["placement"] = explain_placement.placement_json(*placed)
        json.dump(document, stdout, indent=2)
        stdout.write("\n")
    else:
        shown = vendors_asked(pod, policy.vendors)[0]
        console = print_tables(explanation, stdout, shown.memory_resource or shown.count_resource)
        if placed is not None:
            console.print()
            print_uncut(console, explain_placement.placement_table(*placed))
        console.print(f"Policy: {policy.policy_id} ({policy_source}): {policy.describe()}",
                      markup=False)
    return EXIT_OK


def _policy_json(policy: AccountingPolicy, usage_addr: str) -> Json:
    """The recorder's policy (``--usage-addr`` only: without it the policy is not one in
    force anywhere)."""
    return {
        "policy_id": policy.policy_id,
        "usage_addr": usage_addr,
        "enforce_gpu_count": policy.enforce_gpu_count,
        "vendors": [dataclasses.asdict(vendor) for vendor in policy.vendors],
    }


if __name__ == "__main__":
    raise SystemExit(main())
