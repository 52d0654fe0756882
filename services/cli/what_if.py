"""``hami-accounting what-if``: replays a workload under each accounting rule and shows what each
costs, in a table and (with ``--chart``) a PNG.

Layer: services/cli (a subcommand; talks to no daemon). Reads the input, hands it to the pure replay
(the whatif package) once per rule, prints the figures:

* input: files or directories of Kubernetes objects, JSON or YAML (``kubectl get pods,nodes -A
  -o json``, a ``List``, or one manifest per document; ``-`` reads stdin), or ``--generate N``
  with ``--seed S`` (a synthetic workload; ``--save-generated FILE`` writes it out);
* rules: ``--rules summed,hami-v2.10,shrink,progressive`` (default: all four), each replayed in
  its own process unless ``--jobs`` says fewer (the replays share nothing);
* output: ``--output table`` (default) or ``json`` (stable keys; ``--pods`` adds every pod's
  outcome per rule); ``--chart FILE.png`` draws reserved GPU memory over time per rule with the
  requested memory for reference (needs matplotlib: the ``what-if`` extra).

Exit codes: 0 replayed (also when the input holds no GPU pod), 2 unreadable or malformed input
(the message names the object and the field), bad arguments, or a chart without matplotlib.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich import box
from rich.table import Table

from accounting import numbers
from accounting.counting_rules import CountingRule
from accounting.errors import InvalidInputError
from accounting.fit import POLICIES
from services.cli.options import print_violations
from services.cli.tables import add_identifier_column, console_for, print_uncut
from services.cli.what_if_chart import INSTALL_HINT, ChartUnavailableError, write_chart
from whatif.generate import generate
from whatif.kube_input import SourcedObject, read_workload
from whatif.replay import replay
from whatif.results import RuleResult
from whatif.settings import ReplaySettings
from whatif.workload import DEFAULT_INIT_RUN_S, Workload

EXIT_OK = 0
EXIT_USAGE = 2
PROG = "hami-accounting what-if"
MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")

Json = dict[str, Any]


class InputError(Exception):
    """An input file or directory that cannot be read; the message names it."""


# -- reading the input -------------------------------------------------------------------------


def read_objects(paths: Sequence[str], stdin: TextIO) -> Iterator[SourcedObject]:
    """Every document of every file (directories: their JSON and YAML files, sorted, at any
    depth), labelled with where it came from."""
    for path in paths:
        if path == "-":
            yield from _documents(stdin.read(), "stdin")
            continue
        location = Path(path)
        if location.is_dir():
            files = sorted(
                p for p in location.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES
            )
            if not files:
                raise InputError(f"{path}: no .json, .yaml or .yml file in the directory")
            for file in files:
                yield from _documents(_read_text(file), str(file))
        else:
            yield from _documents(_read_text(location), path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read the file ({error})") from None


def _documents(text: str, source: str) -> Iterator[SourcedObject]:
    if source.endswith(".json") or text.lstrip().startswith(("{", "[")):
        try:
            document = json.loads(text)
        except ValueError as error:
            raise InputError(f"{source}: not valid JSON ({error})") from None
        except RecursionError:
            raise InputError(f"{source}: not valid JSON (nested too deeply)") from None
        yield SourcedObject(source, document)
        return
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{source}: not valid YAML ({' '.join(str(error).split())})") from None
    except ValueError:
        # PyYAML reads an integer with int(), which refuses more than 4,300 digits.
        raise InputError(f"{source}: not valid YAML (a number of thousands of digits)") from None
    except RecursionError:
        raise InputError(f"{source}: not valid YAML (nested too deeply)") from None
    for index, document in enumerate(documents):
        # YAML may hold timestamps and other non-JSON values; the readers expect JSON shapes.
        try:
            normalised = json.loads(json.dumps(document, default=str))
        except (RecursionError, ValueError) as error:
            raise InputError(f"{source}: not a Kubernetes object ({error})") from None
        yield SourcedObject(f"{source}[{index}]" if len(documents) > 1 else source, normalised)


# -- replaying ---------------------------------------------------------------------------------

# The workload a forked worker replays: set before the pool starts, inherited by the children
# (a workload of 10,000 pods is not worth pickling to each of them).
_SHARED: tuple[Workload, ReplaySettings] | None = None


def _replay_shared(rule: CountingRule) -> RuleResult:
    assert _SHARED is not None
    workload, settings = _SHARED
    return replay(workload, rule, settings)


def replay_rules(
    workload: Workload, rules: Sequence[CountingRule], settings: ReplaySettings, jobs: int
) -> list[RuleResult]:
    """Each rule's replay, in the order given; in ``jobs`` forked processes when above 1."""
    if jobs <= 1 or len(rules) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [replay(workload, rule, settings) for rule in rules]
    global _SHARED
    _SHARED = (workload, settings)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(jobs, len(rules)), mp_context=multiprocessing.get_context("fork")
        ) as pool:
            return list(pool.map(_replay_shared, rules))
    finally:
        _SHARED = None


# -- output ------------------------------------------------------------------------------------


def _gib(mib: int) -> str:
    return f"{mib / 1024:,.1f}"


def _gib_h(mib_s: int) -> str:
    return f"{mib_s / 1024 / 3600:,.1f}"


def _many(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _duration(seconds: int) -> str:
    return f"{seconds:,} s" if seconds < 3600 else f"{seconds / 3600:,.1f} h"


def summary_line(workload: Workload) -> str:
    cards = sum(len(n.devices) for n in workload.nodes)
    memory = sum(d.memory_total_mib for n in workload.nodes for d in n.devices)
    text = (
        f"{_many(len(workload.pods), 'GPU pod')} on {_many(len(workload.nodes), 'node')} "
        f"({_many(cards, 'GPU')}, {_gib(memory)} GiB), {_duration(workload.window_s)} window"
    )
    if workload.skipped:
        skipped = ", ".join(f"{count:,} {what}" for what, count in workload.skipped.items())
        text += f"; skipped: {skipped}"
    return text


def rules_table(results: Sequence[RuleResult]) -> Table:
    """One column per rule, one row per figure."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    table.add_column("", no_wrap=True)
    for result in results:
        table.add_column(result.rule.value, justify="right")
    threshold = results[0].wait_threshold_s
    reasons = sorted({reason for r in results for reason in r.refused})

    def row(label: str, values: Sequence[str]) -> None:
        table.add_row(label, *values)

    row("pods placed", [f"{r.placed:,}" for r in results])
    for reason in reasons:
        row(f"refused: {reason}", [f"{r.refused.get(reason, 0):,}" for r in results])
    row("still pending at the end", [f"{r.pending:,}" for r in results])
    row(f"waited longer than {threshold} s", [f"{r.waited_over_threshold:,}" for r in results])
    table.add_section()
    row("peak GPU memory reserved, GiB", [_gib(r.peak_reserved_mib) for r in results])
    row("mean GPU memory reserved, GiB", [_gib(r.mean_reserved_mib) for r in results])
    row("peak requested by running containers, GiB", [_gib(r.peak_requested_mib) for r in results])
    row("mean requested by running containers, GiB", [_gib(r.mean_requested_mib) for r in results])
    row("reserved but idle, GiB·h", [_gib_h(r.idle_mib_s) for r in results])
    row("running beyond its reservation, GiB·h", [_gib_h(r.unreserved_mib_s) for r in results])
    return table


def quota_table(results: Sequence[RuleResult]) -> Table | None:
    """Per namespace with a memory quota: the least headroom left at any time, per rule."""
    limited = [ns.namespace for ns in results[0].namespaces if ns.limit_mib is not None]
    if not limited:
        return None
    table = Table(
        title="Namespace quota headroom: the least GPU memory quota left at any time, GiB",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
    )
    add_identifier_column(table, "namespace")
    table.add_column("quota", justify="right")
    for result in results:
        table.add_column(result.rule.value, justify="right")
    for name in limited:
        figures = [next(ns for ns in r.namespaces if ns.namespace == name) for r in results]
        limit = figures[0].limit_mib
        assert limit is not None
        cells = []
        for figure in figures:
            headroom = figure.min_headroom_mib
            assert headroom is not None
            refused = f" ({figure.refused:,} refused)" if figure.refused else ""
            cells.append(f"{_gib(headroom)}{refused}")
        table.add_row(name, _gib(limit), *cells)
    return table


def print_tables(
    workload: Workload, results: Sequence[RuleResult], elapsed_s: float, out: TextIO
) -> None:
    console = console_for(out)
    console.print(summary_line(workload))
    if not workload.pods:
        console.print("No pod asks for a GPU: nothing to replay.")
        return
    console.print()
    print_uncut(console, rules_table(results))
    quotas = quota_table(results)
    if quotas is not None:
        console.print()
        print_uncut(console, quotas)
    console.print()
    for result in results:
        console.print(f"{result.rule.value}: {result.rule.description}.")
    console.print(f"{_many(len(results), 'rule')} replayed in {elapsed_s:.1f} s.")


def results_json(workload: Workload, results: Sequence[RuleResult], with_pods: bool) -> Json:
    """Every figure with stable keys; MiB and MiB·s as integers."""
    rules = []
    for r in results:
        rule: Json = {
            "rule": r.rule.value,
            "title": r.rule.title,
            "placed": r.placed,
            "refused": dict(r.refused),
            "pending": r.pending,
            "waited_over_threshold": r.waited_over_threshold,
            "wait_threshold_s": r.wait_threshold_s,
            "peak_reserved_mib": r.peak_reserved_mib,
            "mean_reserved_mib": r.mean_reserved_mib,
            "peak_requested_mib": r.peak_requested_mib,
            "mean_requested_mib": r.mean_requested_mib,
            "idle_mib_s": r.idle_mib_s,
            "unreserved_mib_s": r.unreserved_mib_s,
            "namespaces": [
                {
                    "namespace": ns.namespace,
                    "limit_mib": ns.limit_mib,
                    "peak_used_mib": ns.peak_used_mib,
                    "min_headroom_mib": ns.min_headroom_mib,
                    "refused": ns.refused,
                }
                for ns in r.namespaces
            ],
        }
        if with_pods:
            rule["pods"] = [
                {
                    "pod": p.key,
                    "outcome": p.outcome.value,
                    "reason": p.reason,
                    "request_mib": p.request_mib,
                    "node": p.node_name or None,
                    "placed_s": p.placed_s,
                    "waited_s": p.waited_s,
                    "peak_stored_mib": p.peak_stored_mib,
                }
                for p in r.pods
            ]
        rules.append(rule)
    return {
        "pods": len(workload.pods),
        "nodes": len(workload.nodes),
        "window_s": workload.window_s,
        "skipped": dict(workload.skipped),
        "rules": rules,
    }


# -- main --------------------------------------------------------------------------------------


def _rules(text: str) -> list[CountingRule]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = {rule.value: rule for rule in CountingRule}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(known)}; got {text!r}"
        )
    return list(dict.fromkeys(known[name] for name in names))


def _count(low: int) -> Any:
    def parse(text: str) -> int:
        value = numbers.decimal_integer(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay a workload on a node pool under each GPU accounting rule: pods "
        "placed, refused and waiting, GPU memory reserved against what running containers ask.",
    )
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="JSON or YAML file (e.g. kubectl get pods,nodes -A -o json), or a directory of "
        "them; - reads stdin",
    )
    parser.add_argument(
        "--generate",
        type=_count(0),
        metavar="N",
        help="replay N generated pods instead of an input",
    )
    parser.add_argument(
        "--seed", type=_count(0), default=1, help="seed of --generate (default: %(default)s)"
    )
    parser.add_argument(
        "--nodes", type=_count(1), help="nodes of --generate (default: one per 20 pods)"
    )
    parser.add_argument(
        "--save-generated",
        type=Path,
        metavar="FILE",
        help="write the generated objects (a JSON List) to FILE",
    )
    parser.add_argument(
        "--rules",
        type=_rules,
        default=list(CountingRule),
        help=f"which rules, in this order (default: {','.join(r.value for r in CountingRule)})",
    )
    parser.add_argument(
        "--wait-threshold-s",
        type=_count(0),
        default=60,
        help="count pods that wait longer than this (default: %(default)s)",
    )
    parser.add_argument(
        "--window-s",
        type=_count(0),
        help="length of the replay (default: up to the input's latest timestamp)",
    )
    parser.add_argument(
        "--default-init-s",
        type=_count(0),
        default=DEFAULT_INIT_RUN_S,
        help="run time of an init container whose status records none (default: %(default)s)",
    )
    parser.add_argument(
        "--node-policy",
        choices=POLICIES,
        default="binpack",
        help="node choice (default: %(default)s)",
    )
    parser.add_argument(
        "--gpu-policy",
        choices=POLICIES,
        default="spread",
        help="GPU choice within a node (default: %(default)s)",
    )
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "--pods",
        action="store_true",
        help="with --output json: every pod's outcome under every rule",
    )
    parser.add_argument(
        "--chart",
        type=Path,
        metavar="FILE.png",
        help="draw reserved GPU memory over time per rule (needs matplotlib)",
    )
    parser.add_argument(
        "--jobs",
        type=_count(1),
        help="processes replaying rules side by side (default: one per rule)",
    )
    return parser


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
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help, or bad arguments (argparse printed why)
        return int(exit_.code or 0)
    if bool(args.inputs) == (args.generate is not None):
        print(
            f"{PROG}: give input files or directories, or --generate N (one of the two)",
            file=stderr,
        )
        return EXIT_USAGE
    if args.chart is not None and args.chart.suffix.lower() != ".png":
        # Checked before the replay: the chart is a PNG, and a path with another ending (or
        # none) would otherwise be found out only after the whole replay has run.
        print(f"{PROG}: --chart {args.chart}: the chart is a PNG; give a path ending in .png",
              file=stderr)
        return EXIT_USAGE
    if args.chart is not None and not args.chart.parent.is_dir():
        print(f"{PROG}: --chart {args.chart}: no such directory {args.chart.parent}", file=stderr)
        return EXIT_USAGE
    if args.chart is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            f"{PROG}: --chart needs matplotlib: {INSTALL_HINT} (or leave out --chart)", file=stderr
        )
        return EXIT_USAGE

    try:
        workload = _workload(args, stdin)
    except InputError as error:
        print(f"{PROG}: {error}", file=stderr)
        return EXIT_USAGE
    except InvalidInputError as error:
        print_violations(f"{PROG}: malformed input:", error, stderr)
        return EXIT_USAGE

    settings = ReplaySettings(
        wait_threshold_s=args.wait_threshold_s,
        node_policy=args.node_policy,
        gpu_policy=args.gpu_policy,
    )
    started = time.perf_counter()
    jobs = len(args.rules) if args.jobs is None else args.jobs
    results = replay_rules(workload, args.rules, settings, jobs) if workload.pods else []
    elapsed_s = time.perf_counter() - started

    if args.output == "json":
        json.dump(results_json(workload, results, args.pods), stdout, indent=2)
        stdout.write("\n")
    else:
        print_tables(workload, results, elapsed_s, stdout)
    if args.chart is not None and results:
        capacity_mib = sum(d.memory_total_mib for n in workload.nodes for d in n.devices)
        try:
            write_chart(results, args.chart, capacity_mib=capacity_mib)
        except (ChartUnavailableError, OSError) as error:
            print(f"{PROG}: {args.chart}: {error}", file=stderr)
            return EXIT_USAGE
        if args.output != "json":
            print(f"Chart: {args.chart}", file=stdout)
    return EXIT_OK


def _workload(args: argparse.Namespace, stdin: TextIO) -> Workload:
    if args.generate is not None:
        made = generate(args.generate, args.seed, nodes=args.nodes)
        if args.save_generated is not None:
            args.save_generated.write_text(json.dumps(made.objects, indent=1) + "\n")
        objects: Sequence[SourcedObject] | Iterator[SourcedObject] = [
            SourcedObject(f"--generate {args.generate} --seed {args.seed}", made.objects)
        ]
        window_s = args.window_s if args.window_s is not None else made.window_s
    else:
        objects = read_objects(args.inputs, stdin)
        window_s = args.window_s
    return read_workload(objects, window_s=window_s, default_init_run_s=args.default_init_s)


if __name__ == "__main__":
    raise SystemExit(main())
