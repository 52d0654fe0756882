"""``hami-accounting journal backup|restore|check``: the usage recorder's journal, kept safe.

Layer: services/usage (operator command). Copying ``usage.sqlite3`` with ``cp`` while the
recorder runs, or without its ``-wal``, makes a backup that silently misses acknowledged changes
(the realistic way to lose them). These commands use SQLite's online backup API instead, which
reads through the live WAL and gives a consistent snapshot while the recorder keeps writing, and
check every copy the way the recorder checks its journal at start (structure, row checksums,
revision against the watermark):

* ``backup --to FILE``: snapshot of the live journal, checked, written atomically;
* ``restore --from FILE``: the recorder stopped, the backup checked, the current files kept
  aside as ``*.replaced-<time>``, the backup copied in with a matching watermark;
* ``check``: reads the journal and its watermark without writing; exit 0 when whole.

Exit codes: 0 done, 1 cannot (no journal, the recorder running during a restore, I/O), 2 bad
arguments, 3 the journal or the backup is damaged or incomplete.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from services.common.config import env_name
from services.usage.config import DEFAULT_DATA_DIR
from services.usage.journal import (
    EXIT_JOURNAL_DAMAGED,
    JOURNAL_FILE_NAME,
    Inspection,
    inspect_journal,
)
from services.usage.watermark import (
    JournalInUseError,
    Watermark,
    WatermarkError,
    read_watermark,
    watermark_path,
)

EXIT_OK = 0
EXIT_CANNOT = 1
PROG = "hami-accounting journal"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one journal command; returns the exit code."""
    args = _parser().parse_args(argv)
    data_dir: Path = args.data_dir or Path(
        os.environ.get(env_name("DATA_DIR"), "") or DEFAULT_DATA_DIR
    )
    try:
        code: int = args.command(data_dir / JOURNAL_FILE_NAME, args)
    except (OSError, sqlite3.Error, WatermarkError) as error:
        _say(f"{args.name}: {error}", error=True)
        return EXIT_CANNOT
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Back up, restore or check the usage recorder's journal."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, metavar="DIR",
                        help=f"the recorder's data directory ({env_name('DATA_DIR')}; "
                             "default ./data)")
    sub = parser.add_subparsers(metavar="COMMAND", required=True)
    backup = sub.add_parser("backup", parents=[common], help="write a consistent, checked "
                            "snapshot of the live journal (the recorder may keep running)")
    backup.add_argument("--to", type=Path, required=True, metavar="FILE")
    backup.set_defaults(command=_backup, name="backup")
    restore = sub.add_parser("restore", parents=[common], help="replace the journal with a "
                             "backup (stop the recorder first)")
    restore.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE")
    restore.set_defaults(command=_restore, name="restore")
    check = sub.add_parser("check", parents=[common], help="check the journal and its "
                           "watermark without writing anything; exit 0 when whole, 3 if not")
    check.set_defaults(command=_check, name="check")
    return parser


def _say(line: str, *, error: bool = False) -> None:
    print(f"{PROG} {line}", file=sys.stderr if error else sys.stdout)


def _counts(inspection: Inspection) -> str:
    state = inspection.state
    return (f"revision {state.revision}: {len(state.pods)} pods, {len(state.nodes)} nodes, "
            f"{len(state.quotas)} quotas, {len(state.tombstones)} forgotten uids")


def _damaged(command: str, inspection: Inspection) -> int:
    damage = inspection.state.damage
    assert damage is not None
    _say(f"{command}: {damage.summary()}", error=True)
    for problem in damage.problems[1:]:
        _say(f"{command}:   also: {problem}", error=True)
    return EXIT_JOURNAL_DAMAGED


def _check(journal: Path, args: argparse.Namespace) -> int:
    inspection = inspect_journal(journal, read_watermark(journal))
    if inspection.state.damage is not None:
        return _damaged("check", inspection)
    _say(f"check: {journal} is whole, {_counts(inspection)}")
    return EXIT_OK


def _copy(source: Path, target: Path) -> None:
    """SQLite's online backup of ``source`` into a new file ``target`` (one step: a consistent
    snapshot, through the source's WAL)."""
    with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src, \
            contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def _backup(journal: Path, args: argparse.Namespace) -> int:
    if not journal.exists():
        _say(f"backup: there is no journal at {journal}", error=True)
        return EXIT_CANNOT
    # Read before the copy: the snapshot must hold at least what was acknowledged by then.
    mark = read_watermark(journal)
    target: Path = args.to
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        _copy(journal, partial)
        inspection = inspect_journal(partial, mark)
        if inspection.state.damage is not None:
            return _damaged("backup", inspection)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    size_mib = target.stat().st_size / 2**20
    _say(f"backup: wrote {target} ({size_mib:.1f} MiB), journal {inspection.journal_id:016x} "
         f"at {_counts(inspection)}")
    return EXIT_OK


def _restore(journal: Path, args: argparse.Namespace) -> int:
    source: Path = args.source
    inspection = inspect_journal(source, check_mark=False)
    if inspection.state.damage is not None:
        return _damaged("restore", inspection)
    assert inspection.journal_id is not None  # schema 3, checked by inspect_journal
    journal.parent.mkdir(parents=True, exist_ok=True)
    try:
        # The recorder holds this lock while it runs: a restore under it would be lost.
        watermark = Watermark(watermark_path(journal), lock=True)
    except JournalInUseError as error:
        _say(f"restore: {error}; stop it first", error=True)
        return EXIT_CANNOT
    try:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = []
        for suffix in ("", "-wal", "-shm"):
            current = journal.with_name(journal.name + suffix)
            if current.exists():
                aside = current.with_name(f"{current.name}.replaced-{stamp}")
                current.rename(aside)
                kept.append(aside.name)
        _copy(source, journal)
        watermark.write(inspection.journal_id, inspection.state.revision, sync=True)
    finally:
        watermark.close()
    previous = f"; the previous files are kept as {', '.join(kept)}" if kept else ""
    _say(f"restore: {journal} is now journal {inspection.journal_id:016x} from {source}, "
         f"{_counts(inspection)}{previous}")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
