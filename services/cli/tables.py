"""Tables of the client tools (``explain``, ``usage``): one console set-up, and identifiers
that are never cut.

Layer: services/cli (shared by the subcommands). rich fits a table to the console's width by
wrapping, then by cutting cells short with an ellipsis, and at last by dropping columns; a
device UUID or a node name cut short is no identifier at all. Identifier columns are therefore
``no_wrap``, and a table is printed at least as wide as its minimum (identifiers whole, other
cells wrapped between words): on a narrow terminal its lines run long (the terminal wraps them)
instead of losing characters.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from accounting import numbers

TABLE_WIDTH = 120
"""Width of the tables when the output is not a terminal and COLUMNS is unset."""


def console_for(out: TextIO, environ: Any = None) -> Console:
    """A console on ``out``: the terminal's width, else ``COLUMNS``, else ``TABLE_WIDTH``."""
    environ = os.environ if environ is None else environ
    width: int | None = None
    if not out.isatty():
        columns = str(environ.get("COLUMNS", ""))
        width = numbers.decimal_integer(columns) or TABLE_WIDTH
    return Console(file=out, width=width, highlight=False, soft_wrap=False)


def add_identifier_column(table: Table, header: str) -> None:
    """A column of identifiers (UUIDs, names): never wrapped, never cut."""
    table.add_column(header, no_wrap=True)


UNBOUNDED = 100_000
"""A width no table reaches: measuring within it gives the table's true minimum."""


def natural_width(console: Console, table: Table) -> int:
    """How wide ``table`` is with no cell wrapped."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table).maximum


def print_uncut(console: Console, table: Table) -> None:
    """Prints ``table`` no narrower than its minimum: identifiers whole, every other cell wrapped
    at most between words (rich would otherwise cut cells short, or drop whole columns)."""
    for column in table.columns:
        column.overflow = "fold"  # a word too long for its cell goes on, never "…"
    needed = Measurement.get(console, console.options.update_width(UNBOUNDED), table).minimum
    if needed > console.width:
        console.width = needed
    console.print(table)
