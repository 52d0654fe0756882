"""The journal's watermark: which journal file belongs here, and the last revision it
acknowledged, kept in a small file beside it.

Layer: services (usage recorder persistence). SQLite cannot tell that committed transactions
are missing: with its ``-wal`` deleted, truncated or damaged, or a backup copied without it,
the database opens cleanly with fewer pods, or none. The watermark is written after every
commit (one 64-byte ``pwrite``, no fsync: it lives in the same page cache as the commit it
follows, so it survives what the commit survives), so at open a journal reading an older
revision than its watermark, or carrying another journal's id, has lost acknowledged changes.

The file holds one fixed-width line, rewritten in place::

    hami-accounting-watermark 1 id=0123456789abcdef revision=00000000000000000042

A file holding anything else (a line with more after it, say) is damaged; the first write cuts
it to the line, so the repair that follows the refusal (``--accept-journal-loss``, a restore)
leaves a watermark the next start reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

WATERMARK_SUFFIX = ".watermark"
_FORMAT = "hami-accounting-watermark 1 id={id:016x} revision={revision:020d}\n"
_LINE = re.compile(r"hami-accounting-watermark 1 id=([0-9a-f]{16}) revision=([0-9]{20})\n")


@dataclass(frozen=True, slots=True)
class Mark:
    """What a watermark says."""

    journal_id: int
    revision: int


class WatermarkError(Exception):
    """The watermark file cannot be read or written; the message names it."""


class JournalInUseError(WatermarkError):
    """Another process holds the journal (a second recorder on the same data directory, or a
    restore while the recorder runs)."""


def watermark_path(journal_path: Path) -> Path:
    """``usage.sqlite3.watermark`` beside ``usage.sqlite3``."""
    return journal_path.with_name(journal_path.name + WATERMARK_SUFFIX)


class Watermark:
    """An open watermark file; ``write`` after each commit, ``close`` at the end."""

    def __init__(self, path: Path, *, lock: bool = False) -> None:
        """Opens (creating if needed) the watermark at ``path``.

        Args:
            path: the watermark file.
            lock: hold an exclusive lock on it until ``close`` (the recorder and a restore do:
                one process at a time may write the journal).

        Raises:
            JournalInUseError: ``lock`` and another process holds it.
            WatermarkError: it cannot be opened, or holds something other than a watermark.
        """
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise WatermarkError(f"cannot open the journal watermark {path}: {error}") from None
        self._size_bytes = 0
        try:
            if lock:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise JournalInUseError(
                        f"the journal beside {path} is in use by another process (a recorder "
                        "already running on this data directory?)"
                    ) from None
            self.problem: str | None = None
            """Why the file's content is not a watermark (it is then treated as absent)."""
            self.mark: Mark | None = None
            """What the file said when opened (None: new, empty or damaged)."""
            try:
                self.mark = self._read()
            except WatermarkError as error:
                self.problem = str(error)
        except BaseException:
            os.close(self._fd)
            raise

    def _read(self) -> Mark | None:
        try:
            self._size_bytes = os.fstat(self._fd).st_size
            data = os.pread(self._fd, 256, 0)
        except OSError as error:
            raise WatermarkError(
                f"cannot read the journal watermark {self.path}: {error}"
            ) from None
        if not data:
            return None
        match = _LINE.fullmatch(data.decode("ascii", errors="replace"))
        if match is None or self._size_bytes != len(data):
            raise WatermarkError(
                f"the journal watermark {self.path} is damaged (it holds {self._size_bytes:,} "
                "bytes that are not a watermark)"
            )
        return Mark(int(match[1], 16), int(match[2]))

    def write(self, journal_id: int, revision: int, *, sync: bool = False) -> None:
        """Records ``revision`` as acknowledged by journal ``journal_id``.

        Raises:
            WatermarkError: the write failed.
        """
        self.put(_FORMAT.format(id=journal_id, revision=revision).encode("ascii"), sync=sync)
        self.mark = Mark(journal_id, revision)

    def put(self, content: bytes, *, sync: bool = False) -> None:
        """Makes ``content`` the whole file: a line from ``write``, or what the file held before
        (a restore that fails puts it back).

        Raises:
            WatermarkError: the write failed.
        """
        try:
            os.pwrite(self._fd, content, 0)
            if self._size_bytes != len(content):
                # Whatever followed (a damaged file) would make the line unreadable again.
                os.ftruncate(self._fd, len(content))
                self._size_bytes = len(content)
            if sync:
                os.fsync(self._fd)
        except OSError as error:
            raise WatermarkError(
                f"cannot write the journal watermark {self.path}: {error}"
            ) from None

    def close(self) -> None:
        """Closes the file, releasing its lock (idempotent)."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            os.close(fd)


@dataclass(frozen=True, slots=True)
class WatermarkReading:
    """What the watermark beside a journal says, read without writing or locking it."""

    exists: bool
    mark: Mark | None = None
    """None: absent, empty or damaged."""
    problem: str | None = None
    """Why its content is not a watermark (a damage of the journal)."""


def look_at_watermark(journal_path: Path) -> WatermarkReading:
    """Reads the watermark beside ``journal_path`` without creating it.

    Raises:
        WatermarkError: it cannot be opened or read.
    """
    path = watermark_path(journal_path)
    if not path.exists():
        return WatermarkReading(exists=False)
    watermark = Watermark(path)
    watermark.close()
    return WatermarkReading(True, watermark.mark, watermark.problem)


def read_watermark(journal_path: Path) -> Mark | None:
    """What the watermark beside ``journal_path`` says, without creating it (None: absent or
    empty).

    Raises:
        WatermarkError: it cannot be read, or is damaged.
    """
    reading = look_at_watermark(journal_path)
    if reading.problem is not None:
        raise WatermarkError(reading.problem)
    return reading.mark
