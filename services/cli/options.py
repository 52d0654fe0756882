"""Options the command-line tools share, spelled once, and how they print a refused input.

Layer: services/cli (shared by the subcommands). A daemon's address is ``--<daemon>-addr``
everywhere — the daemons' own flags, ``explain``, ``demo``, ``usage`` and the Go client — after
the ``HAMI_ACCOUNTING_<DAEMON>_ADDR`` variable it stands for. The short ``--usage``,
``--admission`` and ``--scheduler`` that ``demo`` and ``usage`` once took are still read, and no
longer shown.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from accounting.errors import InvalidInputError

__all__ = ["add_addr_option", "print_violations"]


def add_addr_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    daemon: str,
    *,
    default: str | None,
    help_text: str,
) -> None:
    """Adds ``--<daemon>-addr HOST:PORT`` (read into ``<daemon>``), and the old ``--<daemon>``
    spelling as a hidden alias."""
    parser.add_argument(
        f"--{daemon}-addr", dest=daemon, default=default, metavar="HOST:PORT", help=help_text
    )
    parser.add_argument(
        f"--{daemon}", dest=daemon, default=argparse.SUPPRESS, metavar="HOST:PORT",
        help=argparse.SUPPRESS,
    )


def print_violations(heading: str, error: InvalidInputError, err: TextIO) -> None:
    """A refused input on stderr: ``heading``, then one line per offending field."""
    print(heading, file=err)
    for violation in error.violations:
        print(f"  {violation.path}: {violation.message}", file=err)
