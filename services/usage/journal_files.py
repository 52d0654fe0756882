"""The files of a journal on disk: which paths are a live journal's, and setting them aside.

Layer: services/usage (recorder persistence). A journal is more than ``usage.sqlite3``: SQLite
keeps the recent commits in its ``-wal`` (and their index in ``-shm``), and the watermark beside
it says what was acknowledged. Writing over any of them, or replacing the file while its
``-wal`` stays, loses acknowledged changes; keeping only some of them aside keeps a copy SQLite
cannot read whole. So a path is compared with the journal's files as files (the same directory
or the same inode, however the path was spelled: relative, through a symbolic link, with
``..``, a hard link), and what is set aside goes into a new directory of its own, named once,
that is a data directory in its own right (``hami-accounting journal check --data-dir`` reads
it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.usage.watermark import watermark_path

SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
"""The file and what SQLite keeps beside it: write-ahead log, its index, a rollback journal."""
_SIDE_SUFFIXES = SQLITE_SUFFIXES[1:]


def sqlite_files(path: Path) -> tuple[Path, ...]:
    """``path`` and the files SQLite keeps beside it."""
    return tuple(path.with_name(path.name + suffix) for suffix in SQLITE_SUFFIXES)


def journal_files(journal: Path) -> tuple[Path, ...]:
    """Every file of the journal at ``journal``: SQLite's and the watermark."""
    return (*sqlite_files(journal), watermark_path(journal))


def same_file(one: Path, other: Path) -> bool:
    """Whether both paths name one existing file (or directory)."""
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def live_file(path: Path, journal: Path) -> Path | None:
    """The file of the journal at ``journal`` that ``path`` names, or None: the same name in
    the journal's directory (reached any way), or the same file under another name (a hard
    link)."""
    in_its_directory = same_file(path.parent, journal.parent)
    for live in journal_files(journal):
        if (in_its_directory and path.name == live.name) or same_file(path, live):
            return live
    return None


def reserved_name(path: Path, journal: Path) -> bool:
    """Whether ``path`` is in the journal's directory under a name the journal's files, what is
    set aside from it and what a restore stages take (they start with the journal's name)."""
    return same_file(path.parent, journal.parent) and path.name.lstrip(".").startswith(
        journal.name
    )


def side_files_with_content(path: Path) -> tuple[Path, ...]:
    """The ``-wal`` and rollback journal beside ``path`` that hold something: changes the file
    itself does not have (an ``-shm`` is only an index, rebuilt from the ``-wal``)."""
    found = []
    for side in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-journal")):
        with contextlib.suppress(OSError):
            if side.stat().st_size > 0:
                found.append(side)
    return tuple(found)


def remove_sqlite_files(path: Path, *, side_files_only: bool = False) -> None:
    """Deletes ``path`` (unless ``side_files_only``) and what SQLite left beside it; only for
    a file of our own (a staging copy), never for a journal someone may have open."""
    for file in sqlite_files(path)[1 if side_files_only else 0:]:
        file.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Makes a file's content, or the renames in a directory, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class KeptAside:
    """What ``keep_aside`` moved, and how to put it back."""

    directory: Path | None
    """The new directory holding the files (None: there was nothing to keep)."""
    files: list[Path] = field(default_factory=list)
    """The files in it."""
    _undo: list[tuple[Path, Path]] = field(default_factory=list)
    """(where it is now, where it was) of each move, in order."""

    def undo(self) -> None:
        """Puts every file back where it was and removes the directory (a failed restore or
        reset changes nothing)."""
        for now, before in reversed(self._undo):
            os.replace(now, before)
        self._undo.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory)
            self.directory = None
        self.files.clear()


def keep_aside(journal: Path, label: str, *, replacement: Path | None = None) -> KeptAside:
    """Moves the journal's files into a new directory ``<journal name>.<label>-<UTC time>``
    beside it (``-2``, ``-3`` … when that name is taken: a copy already kept is never
    overwritten), with a copy of its watermark, and puts ``replacement`` (if any) in the
    journal's place. Call it with the journal closed and its watermark locked.

    The ``-wal`` goes first, so the journal's name never pairs one file with another's log; the
    file itself is then hard-linked into the directory and ``replacement`` renamed over it, so
    the name always holds one whole file (moved and then renamed where links are refused).
    Whatever fails is undone before the error propagates.

    Raises:
        OSError: a file could not be moved, copied or linked (all moves undone).
    """
    present = [path for path in sqlite_files(journal) if path.exists()]
    watermark = watermark_path(journal)
    kept = KeptAside(None)
    try:
        if present or watermark.exists():
            kept.directory = _new_directory(journal, label)
            if watermark.exists():
                copy = kept.directory / watermark.name
                shutil.copyfile(watermark, copy)
                kept.files.append(copy)
            for side in present:
                if side != journal:
                    _move(side, kept.directory / side.name, kept)
            if journal in present:
                aside = kept.directory / journal.name
                try:
                    os.link(journal, aside)
                except OSError:
                    _move(journal, aside, kept)
                else:
                    kept.files.append(aside)
                    # Renaming the replacement over the name drops this link; undo renames back.
                    kept._undo.append((aside, journal))
        if replacement is not None:
            if journal.exists():
                os.replace(replacement, journal)
            else:
                os.rename(replacement, journal)
                kept._undo.append((journal, replacement))
        elif journal.exists():
            journal.unlink()
        fsync_path(journal.parent)
        if kept.directory is not None:
            fsync_path(kept.directory)
    except BaseException:
        kept.undo()
        raise
    return kept


def _move(source: Path, target: Path, kept: KeptAside) -> None:
    os.rename(source, target)
    kept._undo.append((target, source))
    kept.files.append(target)


def utc_stamp() -> str:
    """The time in the names of what is set aside, to the second (UTC)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _new_directory(journal: Path, label: str) -> Path:
    base = journal.with_name(f"{journal.name}.{label}-{utc_stamp()}")
    for number in range(1, 1000):
        directory = base if number == 1 else base.with_name(f"{base.name}-{number}")
        try:
            # mkdir fails on a name that exists: nothing kept before is ever written over.
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return directory
    raise FileExistsError(f"{base}: 999 copies kept in one second; remove some")
