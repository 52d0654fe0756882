"""What can be wrong with the journal: the errors it raises, the damage a load finds, and what
the recorder may do about that damage.

Layer: services (usage recorder persistence). Values and exceptions only; the checks that find
damage are in services/usage/journal/integrity.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ON_DAMAGE_REFUSE = "refuse"
ON_DAMAGE_ACCEPT_LOSS = "accept-loss"
ON_DAMAGE_REBUILD = "rebuild-from-kubernetes"
ON_DAMAGE_MODES = (ON_DAMAGE_REFUSE, ON_DAMAGE_ACCEPT_LOSS, ON_DAMAGE_REBUILD)
"""What the recorder does on a damaged or incomplete journal (HAMI_ACCOUNTING_JOURNAL_ON_DAMAGE)."""
EXIT_JOURNAL_DAMAGED = 3
"""The recorder's exit code when it refuses to start on a damaged journal."""


class JournalError(Exception):
    """The journal cannot be opened, read or written; the message names the file."""


class JournalSchemaError(JournalError):
    """The file was written by a build with another schema version."""


@dataclass(frozen=True, kw_only=True)
class JournalDamage:
    """What a load found wrong with the journal: acknowledged changes that are missing, rows
    that fail their checksum, a file SQLite cannot read."""

    path: Path
    problems: tuple[str, ...]
    """One sentence each, the most telling first."""
    readable_revision: int = 0
    """The revision of what could be read."""
    acknowledged_revision: int = 0
    """The watermark's revision (0 when it has none): what had been acknowledged."""
    damaged_rows: tuple[str, ...] = ()
    """The rows left out, e.g. ``pod uid-1 (namespace team-a, node node1)``, ``node node7``."""
    unreadable: bool = False
    """SQLite cannot read the file at all: nothing was loaded."""
    damaged_rowids: tuple[tuple[str, int], ...] = ()
    """(table, rowid) of each row left out: what ``Journal.accept_loss`` deletes."""

    def summary(self) -> str:
        """One line for the operator: what is wrong and how to go on."""
        return (
            f"journal {self.path} is damaged or incomplete: {self.problems[0]}"
            + (f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else "")
        )


class JournalDamagedError(JournalError):
    """The recorder refuses to start on a damaged journal (exit code 3)."""

    def __init__(self, damage: JournalDamage) -> None:
        self.damage = damage
        super().__init__(
            f"{damage.summary()}. Refusing to start (exit code {EXIT_JOURNAL_DAMAGED}); to go on, "
            "restore a backup (hami-accounting journal restore), or restart with "
            "--accept-journal-loss (keep what is readable, log what was lost) or "
            "--rebuild-from-kubernetes (start empty, rebuilt by the Kubernetes re-list); "
            "see docs/deploy.md, \"A damaged journal\""
        )


def short_reason(error: BaseException) -> str:
    """An exception as a short reason for a one-line message."""
    return one_line(str(error) or type(error).__name__)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (SQLite's messages span several), shortened past ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"
