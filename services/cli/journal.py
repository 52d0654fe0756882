"""``hami-accounting journal backup|restore|check``: the usage recorder's journal, kept safe.

Layer: services/cli (a subcommand, on the recorder's files). Copying ``usage.sqlite3`` with
``cp`` while the recorder runs, or without its ``-wal``, makes a backup that silently misses
acknowledged changes (the realistic way to lose them). These commands use SQLite's online backup
API instead, which reads through the live WAL and gives a consistent snapshot while the recorder
keeps writing, and check every copy the way the recorder checks its journal at start (structure,
row checksums, revision against the watermark):

* ``backup --to FILE [--replace]``: snapshot of the live journal, checked, written as one
  self-contained file (no ``-wal``: a backup is complete on its own), put in place atomically.
  An existing FILE is replaced only with ``--replace``, and only when it is a journal backup;
* ``restore --from FILE``: the recorder stopped, the backup copied into the data directory and
  checked there, then swapped in: the current files are moved into a new directory
  ``usage.sqlite3.replaced-<time>`` and the copy renamed over the journal, with a matching
  watermark; a failure on the way puts everything back;
* ``check``: reads the journal and its watermark without writing; exit 0 when whole.

An operator's mistyped path must not destroy what it was meant to protect, so every path is
checked before anything is written: resolved (relative, symbolic links, ``..``) and compared
with the live journal's files as files (a hard link is the same file). A refusal or a failure
changes nothing, and ends with one line and its exit code:

====  ==========================================================================================
0     done
1     failed: the file system or SQLite failed while working (permission, no space); nothing
      changed
2     usage error: bad arguments, or a path that does not name what it must (no such data
      directory or journal, a directory where a file is meant, a missing parent directory)
3     damaged: the journal or the backup is damaged or incomplete (the recorder's exit code for
      the same finding)
4     refused: it would overwrite or lose something (a target that is, or is beside, the live
      journal's files; an existing file without ``--replace``, or one that is not a journal
      backup; a restore from the live journal, or while the recorder runs)
====  ==========================================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from services.common.config import env_name
from services.usage.config import DEFAULT_DATA_DIR
from services.usage.journal import (
    EXIT_JOURNAL_DAMAGED,
    JOURNAL_FILE_NAME,
    Inspection,
    inspect_journal,
    read_journal_id,
    read_only_uri,
)
from services.usage.journal_files import (
    KeptAside,
    fsync_path,
    keep_aside,
    live_file,
    remove_sqlite_files,
    reserved_name,
    same_file,
    side_files_with_content,
)
from services.usage.watermark import (
    JournalInUseError,
    Watermark,
    WatermarkError,
    WatermarkReading,
    look_at_watermark,
    watermark_path,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DAMAGED = EXIT_JOURNAL_DAMAGED
EXIT_REFUSED = 4
PROG = "hami-accounting journal"
_STAGED_SUFFIX = ".restoring"


class CommandStopped(Exception):
    """The command stops before changing anything: one line, one exit code."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one journal command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        journal = _data_dir(args.data_dir) / JOURNAL_FILE_NAME
        code: int = args.command(journal, args)
    except CommandStopped as stop:
        _say(f"{args.name}: {stop}", error=True)
        return stop.exit_code
    except (OSError, sqlite3.Error, WatermarkError) as error:
        _say(f"{args.name}: {_one_line(error)}", error=True)
        return EXIT_FAILED
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Back up, restore or check the usage recorder's journal. Exit "
        "codes: 0 done, 1 failed (nothing changed), 2 usage error, 3 damaged, 4 refused "
        "(it would overwrite or lose something).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, metavar="DIR",
                        help=f"the recorder's data directory ({env_name('DATA_DIR')}; "
                             "default ./data)")
    sub = parser.add_subparsers(metavar="COMMAND", required=True)
    backup = sub.add_parser("backup", parents=[common], help="write a consistent, checked "
                            "snapshot of the live journal (the recorder may keep running)")
    backup.add_argument("--to", type=Path, required=True, metavar="FILE",
                        help="the backup file to write; not in the data directory under a name "
                             f"starting with {JOURNAL_FILE_NAME}")
    backup.add_argument("--replace", action="store_true",
                        help="replace FILE if it exists and is a journal backup (anything else "
                             "is never replaced)")
    backup.set_defaults(command=_backup, name="backup")
    restore = sub.add_parser("restore", parents=[common], help="replace the journal with a "
                             "backup (stop the recorder first)")
    restore.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE",
                         help="a backup written by 'journal backup'")
    restore.set_defaults(command=_restore, name="restore")
    check = sub.add_parser("check", parents=[common], help="check the journal and its "
                           "watermark without writing anything; exit 0 when whole, 3 if not")
    check.set_defaults(command=_check, name="check")
    return parser


def _say(line: str, *, error: bool = False) -> None:
    print(f"{PROG} {line}", file=sys.stderr if error else sys.stdout)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


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
    return EXIT_DAMAGED


def _shown(raw: Path, resolved: Path) -> str:
    """A path as typed, and what it resolves to when that differs."""
    return str(raw) if Path(os.path.abspath(raw)) == resolved else f"{raw} (= {resolved})"


# -- the paths given ---------------------------------------------------------------------------


def _data_dir(given: Path | None) -> Path:
    data_dir = given or Path(os.environ.get(env_name("DATA_DIR"), "") or DEFAULT_DATA_DIR)
    where = (f"--data-dir {data_dir}" if given is not None
             else f"the data directory {data_dir} ({env_name('DATA_DIR')} or the default)")
    if not data_dir.exists():
        raise CommandStopped(EXIT_USAGE, f"{where} does not exist")
    if not data_dir.is_dir():
        raise CommandStopped(EXIT_USAGE, f"{where} is not a directory")
    return data_dir


def _require_journal(journal: Path, watermark: WatermarkReading) -> None:
    """A data directory holding no journal at all is a mistyped path, not a damaged journal
    (with a watermark beside it, the journal was lost: the inspection says so)."""
    if not journal.exists() and not watermark.exists:
        raise CommandStopped(EXIT_USAGE, f"there is no journal in {journal.parent} (no "
                             f"{journal.name} and no watermark): is --data-dir right?")


def _backup_target(given: Path, journal: Path, *, replace: bool) -> Path:
    """Where ``backup --to`` may write: never a live journal's file, a name the journal keeps,
    a directory, or an existing file unless it is a journal backup and ``replace`` is set."""
    target = Path(os.path.realpath(given))
    shown = _shown(given, target)
    live = live_file(target, journal)
    if live is not None:
        raise CommandStopped(EXIT_REFUSED, f"--to {shown} is the live journal's {live.name} "
                             f"in {journal.parent}: writing there would destroy the journal; "
                             "write the backup somewhere else")
    if reserved_name(target, journal):
        raise CommandStopped(EXIT_REFUSED, f"--to {shown}: names starting with {journal.name} "
                             f"in the data directory {journal.parent} belong to the journal "
                             "(its files, the copies kept aside); choose another name")
    if target.is_dir():
        raise CommandStopped(EXIT_USAGE, f"--to {shown} is a directory; name the backup file "
                             f"(e.g. {target / 'usage-backup.sqlite3'})")
    if not target.parent.is_dir():
        missing = "is not a directory" if target.parent.exists() else "does not exist"
        raise CommandStopped(EXIT_USAGE, f"--to {shown}: the directory {target.parent} "
                             f"{missing}")
    if target.exists() or target.is_symlink():
        if not replace:
            raise CommandStopped(EXIT_REFUSED, f"--to {shown} exists; pass --replace to "
                                 "replace it (only a journal backup is ever replaced)")
        _check_replaceable(target, shown)
    return target


def _check_replaceable(target: Path, shown: str) -> None:
    """Only a backup (a journal with no watermark, no changes in a ``-wal``) that is not
    write-protected is replaced: anything else is someone's file, or a journal in use."""
    mode = target.lstat().st_mode
    if not stat.S_ISREG(mode):
        raise CommandStopped(EXIT_REFUSED, f"--to {shown} is not a regular file; not replaced")
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise CommandStopped(EXIT_REFUSED, f"--to {shown} is write-protected (mode "
                             f"{stat.S_IMODE(mode):04o}); not replaced")
    if watermark_path(target).exists() or side_files_with_content(target):
        raise CommandStopped(EXIT_REFUSED, f"--to {shown} is a recorder's journal (it has a "
                             "watermark or a -wal beside it), not a backup; not replaced")
    if read_journal_id(target) is None:
        raise CommandStopped(EXIT_REFUSED, f"--to {shown} is not a journal backup; it is "
                             "never replaced (move it away, or choose another name)")


def _restore_source(given: Path, journal: Path) -> Path:
    """What ``restore --from`` may read: an existing file that is not the live journal's, and
    complete on its own (no changes in a ``-wal`` beside it that a copy of the file misses)."""
    source = Path(os.path.realpath(given))
    shown = _shown(given, source)
    if not source.exists():
        raise CommandStopped(EXIT_USAGE, f"--from {shown} does not exist")
    if source.is_dir():
        raise CommandStopped(EXIT_USAGE, f"--from {shown} is a directory; name the backup "
                             "file in it")
    if not source.is_file():
        raise CommandStopped(EXIT_USAGE, f"--from {shown} is not a regular file (a backup is "
                             "one)")
    live = live_file(source, journal)
    if live is None and same_file(source, _staged(journal)):
        live = _staged(journal)
    if live is not None:
        raise CommandStopped(EXIT_REFUSED, f"--from {shown} is the live journal's {live.name} in "
                             f"{journal.parent}: restore replaces the journal with a backup "
                             "(make one with 'journal backup --to FILE')")
    sides = side_files_with_content(source)
    if sides:
        raise CommandStopped(EXIT_REFUSED, f"--from {shown} has changes in {sides[0].name} "
                             "beside it that the file does not hold (a journal in use, or not "
                             "closed cleanly), so it is not a backup; back it up first: "
                             f"journal backup --data-dir {source.parent} --to NEW, then "
                             "restore NEW")
    return source


def _staged(journal: Path) -> Path:
    return journal.with_name(f".{journal.name}{_STAGED_SUFFIX}")


# -- the commands ------------------------------------------------------------------------------


def _check(journal: Path, args: argparse.Namespace) -> int:
    watermark = look_at_watermark(journal)
    _require_journal(journal, watermark)
    inspection = inspect_journal(journal, watermark.mark, watermark_problem=watermark.problem)
    if inspection.state.damage is not None:
        return _damaged("check", inspection)
    _say(f"check: {journal} is whole, {_counts(inspection)}")
    return EXIT_OK


def _snapshot(source: Path, target: Path) -> None:
    """SQLite's online backup of ``source`` into a new file ``target`` (one step: a consistent
    snapshot, through the source's WAL), left in rollback-journal mode: one file, complete on
    its own, that a read leaves nothing beside (the recorder switches it to WAL when it opens
    it)."""
    with contextlib.closing(sqlite3.connect(read_only_uri(source), uri=True)) as src, \
            contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")


def _backup(journal: Path, args: argparse.Namespace) -> int:
    # Read before the copy: the snapshot must hold at least what was acknowledged by then.
    watermark = look_at_watermark(journal)
    _require_journal(journal, watermark)
    target = _backup_target(args.to, journal, replace=args.replace)
    if not journal.exists():
        return _damaged("backup", inspect_journal(journal, watermark.mark))
    partial = target.with_name(f".{target.name}.partial")
    remove_sqlite_files(partial)
    _create_private(partial)
    try:
        try:
            _snapshot(journal, partial)
        except sqlite3.Error as error:
            raise CommandStopped(EXIT_FAILED, f"cannot write the backup {partial}: "
                                 f"{_one_line(error)}") from None
        inspection = inspect_journal(partial, watermark.mark,
                                     watermark_problem=watermark.problem, shown_as=journal)
        if inspection.state.damage is not None:
            return _damaged("backup", inspection)
        fsync_path(partial)
        _put_in_place(partial, target, replace=args.replace, shown=_shown(args.to, target))
    finally:
        remove_sqlite_files(partial)
    size_mib = target.stat().st_size / 2**20
    _say(f"backup: wrote {target} ({size_mib:.1f} MiB), journal {inspection.journal_id:016x} "
         f"at {_counts(inspection)}")
    return EXIT_OK


def _create_private(path: Path) -> None:
    """Creates the new, empty file ``path`` readable by its owner only (a journal holds pod
    names), saying clearly when its directory takes no file."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as error:
        raise CommandStopped(EXIT_FAILED, f"cannot write in {path.parent}: "
                             f"{error.strerror or error}") from None


def _put_in_place(partial: Path, target: Path, *, replace: bool, shown: str) -> None:
    if replace:
        os.replace(partial, target)
    else:
        try:
            # A link never overwrites: a file that appeared since the check stays.
            os.link(partial, target)
        except FileExistsError:
            raise CommandStopped(EXIT_REFUSED, f"--to {shown} was created meanwhile; not "
                                 "replaced") from None
        except OSError:
            # A file system without hard links: the check above is all there is.
            if target.exists():
                raise CommandStopped(EXIT_REFUSED, f"--to {shown} was created meanwhile; "
                                     "not replaced") from None
            os.replace(partial, target)
    fsync_path(target.parent)


def _restore(journal: Path, args: argparse.Namespace) -> int:
    source = _restore_source(args.source, journal)
    mark_file = watermark_path(journal)
    had_watermark = mark_file.exists()
    try:
        # The recorder holds this lock while it runs: a restore under it would be lost.
        watermark = Watermark(mark_file, lock=True)
    except JournalInUseError as error:
        raise CommandStopped(EXIT_REFUSED, f"{error}; stop it first") from None
    staged = _staged(journal)
    kept: KeptAside | None = None
    try:
        previous = mark_file.read_bytes()
        remove_sqlite_files(staged)
        _create_private(staged)
        _copy_file(source, staged)
        inspection = inspect_journal(staged, check_mark=False, shown_as=source)
        # A backup in WAL mode (written by an earlier build) read read-only leaves these.
        remove_sqlite_files(staged, side_files_only=True)
        if inspection.state.damage is not None:
            return _damaged("restore", inspection)
        assert inspection.journal_id is not None  # schema 4, checked by inspect_journal
        kept = keep_aside(journal, "replaced", replacement=staged)
        try:
            watermark.write(inspection.journal_id, inspection.state.revision, sync=True)
        except WatermarkError:
            kept.undo()
            watermark.put(previous, sync=True)
            kept = None
            raise
    finally:
        remove_sqlite_files(staged)
        watermark.close()
        if kept is None and not had_watermark:
            mark_file.unlink(missing_ok=True)
    previous_files = (f"; the previous files are kept in {kept.directory.name}/"
                      if kept.directory is not None else "")
    _say(f"restore: {journal} is now journal {inspection.journal_id:016x} from {source}, "
         f"{_counts(inspection)}{previous_files}")
    return EXIT_OK


def _copy_file(source: Path, target: Path) -> None:
    """A byte copy, so the backup is never opened where it lies (SQLite would leave its
    ``-shm`` and ``-wal`` beside it); ``target`` is new, empty and private to this run."""
    with source.open("rb") as reader, target.open("r+b") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)
        writer.flush()
        os.fsync(writer.fileno())


if __name__ == "__main__":
    raise SystemExit(main())
