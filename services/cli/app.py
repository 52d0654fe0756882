"""The ``hami-accounting`` command: reads the subcommand and hands the rest to its module.

Layer: services/cli (the dispatcher, the top of the house). Subcommands:

* ``serve {admission,scheduler,usage} [args...]``: runs one daemon in this process (its
  ``__main__``);
* ``up``: the three daemons on localhost until Ctrl-C (``services.cli.up``);
* ``health ADDR [--service NAME]``: a daemon's gRPC health (``services.cli.health``);
* ``--version``: this build's version (``services.common.version``);
* ``demo``, ``explain``, ``usage``, ``what-if``, ``journal``: the tools, each parsing its own
  arguments (``services.cli.demo``, ``explain``, ``usage_report``, ``what_if``, ``journal``).

A daemon and a tool are imported when their subcommand runs, not before: ``--help`` and
``health`` stay quick, and a tool's dependencies (numpy, rich, YAML) load only for it.
"""

from __future__ import annotations

import os

# gRPC's C core, left to itself, prints INFO lines on stderr (a failed TLS handshake, say)
# beside the sentence the CLI prints about the same failure. ERROR is what gRPC documents as
# its default; it must be set before grpc is imported. An operator's own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import sys
from collections.abc import Callable, Sequence

from services.cli import health, up
from services.cli.health import DAEMONS, EXIT_USAGE
from services.common.config import ConfigError
from services.common.version import VERSION

EXIT_BROKEN_PIPE = 1
"""When the reader of stdout went away; rich ends its own table output the same way."""

Main = Callable[[list[str]], int]
"""A subcommand's ``main(argv)``: its arguments in, its exit code out."""


def _serve_main(daemon: str) -> Main:
    if daemon == "admission":
        from services.admission.__main__ import main as admission_main

        return admission_main
    if daemon == "scheduler":
        from services.scheduler.__main__ import main as scheduler_main

        return scheduler_main
    from services.usage.__main__ import main as usage_main

    return usage_main


def _demo(args: list[str]) -> int:
    from services.cli.demo import main as demo_main

    return demo_main(args)


def _explain(args: list[str]) -> int:
    from services.cli.explain import main as explain_main

    return explain_main(args)


def _usage(args: list[str]) -> int:
    from services.cli.usage_report import main as usage_report_main

    return usage_report_main(args)


def _what_if(args: list[str]) -> int:
    from services.cli.what_if import main as what_if_main

    return what_if_main(args)


def _journal(args: list[str]) -> int:
    from services.cli.journal import main as journal_main

    return journal_main(args)


TOOLS: dict[str, tuple[Main, str]] = {
    "demo": (_demo, "walk through the accounting against running daemons"),
    "explain": (_explain, "explain a pod's accounting step by step"),
    "usage": (_usage, "show what the usage recorder has charged"),
    "what-if": (_what_if, "replay a workload under each GPU accounting rule"),
    "journal": (_journal, "back up, restore or check the recorder's journal"),
}
"""The subcommands that parse their own arguments: each one's main and its ``--help`` line."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the process exit code."""
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly. stdout is pointed at /dev/null so
        # the interpreter's last flush cannot raise again on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _dispatch(args: list[str]) -> int:
    # The tools and `serve NAME` keep their arguments verbatim (including --help), so they are
    # dispatched before argparse sees them.
    if args and args[0] in TOOLS:
        tool, _ = TOOLS[args[0]]
        return _run(args[0], lambda: tool(args[1:]))
    if len(args) >= 2 and args[0] == "serve" and args[1] in DAEMONS:
        return _serve(args[1], args[2:])

    parser = _parser()
    namespace = parser.parse_args(args)
    command: Callable[[argparse.Namespace], int] = namespace.command
    return command(namespace)


def _serve(daemon: str, args: Sequence[str]) -> int:
    return _run(f"serve {daemon}", lambda: _serve_main(daemon)(list(args)))


def _run(command: str, call: Callable[[], int | None]) -> int:
    """A subcommand's exit code; a configuration it refuses is a usage error, said in one
    line."""
    try:
        result = call()
    except ConfigError as error:
        print(f"hami-accounting {command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    return int(result or 0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami-accounting",
        description="GPU accounting for Kubernetes pods with init containers and sidecars.",
    )
    parser.add_argument("--version", action="version", version=f"hami-accounting {VERSION}")
    sub = parser.add_subparsers(metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run one daemon in this process")
    serve.add_argument("name", choices=DAEMONS)
    serve.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the daemon")
    serve.set_defaults(command=lambda ns: _serve(ns.name, ns.args))

    up_parser = sub.add_parser("up", help="run the three daemons on localhost until Ctrl-C")
    up.add_arguments(up_parser)
    up_parser.set_defaults(command=up.run)

    check = sub.add_parser("health", help="print a daemon's gRPC health; exit 0 when SERVING")
    health.add_arguments(check)
    check.set_defaults(command=health.run)

    for name, (_tool, summary) in TOOLS.items():
        # Listed for --help only; main() hands these over before argparse runs.
        sub.add_parser(name, help=summary, add_help=False)
    return parser
