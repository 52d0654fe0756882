"""The journal's integrity check: every table read with each row's checksum checked, the file's
pages checked, and the revision and id held against the watermark.

Layer: services (usage recorder persistence). Nothing acknowledged may go missing unnoticed, so
the journal checks itself when it is loaded and reports what it finds as a ``JournalDamage``
rather than starting empty or partly empty by surprise:

* every row carries a CRC-32 of its values, so a changed digit is caught, not served;
* ``PRAGMA quick_check`` finds a file whose pages are damaged or missing;
* the watermark beside the file (services/usage/watermark.py) holds the journal's id and the
  last revision it acknowledged: a file that reads an older revision (its ``-wal`` deleted,
  truncated or damaged after a kill, a backup copied without it), another journal's id (the
  file deleted, emptied or replaced) or no watermark at all is a loss of acknowledged changes.

What happens then is the recorder's choice (``UsageStore.recover``): refuse to start, keep what
is readable (``Journal.accept_loss``), or start empty for the Kubernetes source to rebuild
(``Journal.reset``). A file SQLite cannot read at all loads as empty with the damage saying why.
``inspect_journal`` runs the same check read-only, for ``hami-accounting journal check`` and to
verify a backup.

Each table is read with one SELECT, row by row (no list of every row held at once: its
temporaries would stay in the process's resident memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accounting.lifecycle import StoredPod
from accounting.model import Device
from services.usage.journal.codec import (
    CHECKED_COLUMNS,
    ROW_CRC,
    UsageDecoder,
    decode_devices,
    decode_grants,
)
from services.usage.journal.contents import JournalState
from services.usage.journal.errors import JournalDamage, one_line, short_reason
from services.usage.journal.schema import SCHEMA_VERSION
from services.usage.watermark import Mark, watermark_path


def page_problems(db: sqlite3.Connection) -> list[str]:
    """What SQLite's ``quick_check`` finds wrong with the file's pages (nothing: empty)."""
    checked = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    if checked == ["ok"]:
        return []
    return ["its pages are damaged (SQLite's quick_check: " + "; ".join(map(str, checked)) + ")"]


def read_rows(db: sqlite3.Connection, *, verify: bool = True) -> RowsRead:
    """Reads every table, leaving out (and listing) the rows that fail their checksum or do not
    decode.

    Args:
        verify: False skips the checksums: only for the benchmark that measures what they cost
            (bench/journal_integrity.py).
    """
    try:
        return _RowReader(db, verify=verify).read()
    except sqlite3.OperationalError as error:
        if "decode" not in str(error):
            raise
        # Text that is not UTF-8 stops SQLite's own decoding of the whole query: read again as
        # bytes, and leave out only the rows that do not decode.
        return _RowReader(db, as_bytes=True, verify=verify).read()


def with_damage_found(
    path: Path,
    loaded: RowsRead,
    pages: list[str],
    *,
    journal_id: int | None,
    id_created: bool,
    mark: Mark | None,
    watermark_problem: str | None,
    watermark_file: Path,
) -> JournalState:
    """The loaded state, with ``damage`` set when anything is wrong: the watermark missing,
    damaged or belonging to another journal, acknowledged revisions missing, rows left out,
    damaged pages — the most telling first."""
    state = loaded.state
    revision = state.revision
    problems: list[str] = []
    if watermark_problem is not None:
        problems.append(watermark_problem)
    elif mark is None and not id_created:
        problems.append(
            f"it has no watermark beside it ({watermark_file} is missing or empty): "
            "whether acknowledged changes are missing cannot be told"
        )
    elif mark is not None and journal_id is not None and mark.journal_id != journal_id:
        if id_created:
            problems.append(
                f"the file is new or emptied, but its watermark says journal "
                f"{mark.journal_id:016x} had acknowledged revision {mark.revision} "
                "(the file was deleted, truncated or replaced)"
            )
        else:
            problems.append(
                f"the file is journal {journal_id:016x}, but its watermark belongs to journal "
                f"{mark.journal_id:016x}, which had acknowledged revision {mark.revision} (the "
                "file was replaced, or deleted or emptied and started again)"
            )
    elif mark is not None and revision < mark.revision:
        problems.append(
            f"it reads revision {revision}, but revision {mark.revision} was acknowledged: "
            f"the changes after {revision} are missing (its -wal lost, cut or damaged?)"
        )
    if loaded.damaged:
        shown = ", ".join(name for name, _, _ in loaded.damaged[:5])
        more = f" and {len(loaded.damaged) - 5} more" if len(loaded.damaged) > 5 else ""
        problems.append(
            f"{len(loaded.damaged)} rows fail their checksum or do not decode ({shown}{more})"
        )
    problems.extend(pages)
    if not problems:
        return state
    damage = JournalDamage(
        path=path,
        problems=tuple(one_line(problem) for problem in problems),
        readable_revision=revision,
        acknowledged_revision=mark.revision if mark is not None else 0,
        damaged_rows=tuple(one_line(name) for name, _, _ in loaded.damaged),
        damaged_rowids=tuple((table, rowid) for _, table, rowid in loaded.damaged),
    )
    return dataclasses.replace(state, damage=damage)


def unreadable_state(path: Path, problem: str, *, acknowledged_revision: int) -> JournalState:
    """The state of a file SQLite cannot read at all: nothing, and the damage saying why."""
    return JournalState(damage=JournalDamage(
        path=path, problems=(problem,), acknowledged_revision=acknowledged_revision,
        unreadable=True,
    ))


@dataclass(frozen=True, kw_only=True)
class Inspection:
    """A journal file read and checked without writing anything."""

    state: JournalState
    """What it holds (``state.damage`` says what is wrong)."""
    journal_id: int | None
    """Its id (None: written before schema 3, or unreadable)."""


def read_only_uri(path: Path, *, immutable: bool | None = None) -> str:
    """The SQLite URI that opens ``path`` read-only (any character in the path quoted).

    Immutable also leaves out locking and the ``-shm``, so nothing at all is created beside the
    file (a read-only open of a WAL file otherwise leaves an ``-shm`` and an empty ``-wal``
    that it cannot remove). By default it is used when no ``-wal`` and no rollback journal is
    beside the file: then no process has it open for writing, and nothing beside it holds
    changes an immutable read would miss. A recorder that opens the file meanwhile writes its
    changes to a ``-wal``; only its checkpoint, after about 4 MiB of them, writes the file
    under the read, which can then report damage a second read does not (nothing is written
    either way).
    """
    if immutable is None:
        immutable = not any(
            path.with_name(path.name + suffix).exists() for suffix in ("-wal", "-journal")
        )
    return path.absolute().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


def read_journal_id(path: Path) -> int | None:
    """The journal id a file holds, None when it holds none (not a journal, written before
    schema 3, unreadable). Reads it immutable: nothing is created beside the file."""
    try:
        with contextlib.closing(sqlite3.connect(read_only_uri(path, immutable=True),
                                                uri=True)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
    except (sqlite3.Error, ValueError):
        return None
    return int(row[0]) if row is not None and isinstance(row[0], int) else None


def inspect_journal(
    path: Path,
    mark: Mark | None = None,
    *,
    check_mark: bool = True,
    watermark_problem: str | None = None,
    shown_as: Path | None = None,
) -> Inspection:
    """Reads and checks a journal file read-only (no schema change, no watermark written), as
    ``Journal.load`` does: for ``hami-accounting journal check``, and to verify a backup.

    Args:
        path: the SQLite file.
        mark: the watermark to compare with (None: none found).
        check_mark: False to leave the watermark out (a backup file has none of its own).
        watermark_problem: why the watermark beside the journal is not one (a damage).
        shown_as: the journal the damage names, when ``path`` is a copy of it (a backup being
            made, a restore being staged).
    """
    shown = shown_as or path
    acknowledged = mark.revision if mark else 0

    def unreadable(problem: str, *, acknowledged_revision: int = acknowledged) -> Inspection:
        return Inspection(
            state=unreadable_state(shown, problem, acknowledged_revision=acknowledged_revision),
            journal_id=None,
        )

    if not path.exists():
        return unreadable("the file does not exist")
    try:
        db = sqlite3.connect(read_only_uri(path), uri=True, isolation_level=None)
    except sqlite3.Error as error:
        return unreadable(f"SQLite cannot read it ({short_reason(error)})",
                          acknowledged_revision=0)
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        if "meta" not in tables:
            said = (f": its watermark says revision {mark.revision} was acknowledged"
                    if mark is not None and mark.revision else "")
            return unreadable(f"the file holds no journal{said}")
        version_row = db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
        if version_row is None or version_row[0] != SCHEMA_VERSION:
            found = "no schema version" if version_row is None else f"schema {version_row[0]}"
            return unreadable(
                f"it has {found}, this build reads schema {SCHEMA_VERSION} (the recorder "
                "migrates versions 1 to 3 when it opens them)", acknowledged_revision=0)
        pages = page_problems(db)
        id_row = db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
        journal_id = int(id_row[0]) if id_row is not None else None
        loaded = read_rows(db)
    except (sqlite3.DatabaseError, ValueError) as error:
        return unreadable(f"SQLite cannot read it ({short_reason(error)})")
    finally:
        db.close()
    state = with_damage_found(
        shown, loaded, pages, journal_id=journal_id,
        # Without a watermark to compare, a missing one is not a problem here.
        id_created=not check_mark or journal_id is None, mark=mark if check_mark else None,
        watermark_problem=watermark_problem if check_mark else None,
        watermark_file=watermark_path(shown),
    )
    return Inspection(state=state, journal_id=journal_id)


@dataclass(frozen=True, kw_only=True)
class RowsRead:
    """What one read of every table found."""

    state: JournalState
    damaged: list[tuple[str, str, int]]
    """(what, table, rowid) of each row left out."""


class _RowReader:
    """One read of every table, checking each row's checksum; rows that fail it, or do not
    decode, are left out and listed.

    ``as_bytes`` reads text as bytes and decodes it per row (the fallback once SQLite's own
    decoding failed on a row: that error ends the whole query).
    """

    def __init__(
        self, db: sqlite3.Connection, *, as_bytes: bool = False, verify: bool = True
    ) -> None:
        self._db = db
        self._as_bytes = as_bytes
        self._verify = verify
        self.damaged: list[tuple[str, str, int]] = []

    def _rows(self, table: str) -> Iterator[tuple[Any, ...]]:
        """Each row whose checksum holds: its values in checksum order, then crc and rowid (the
        checksum functions read the values from the front of the row as it comes: no copy)."""
        columns = CHECKED_COLUMNS[table]
        crc_of = ROW_CRC[table]
        count = len(columns)
        cursor = self._db.execute(
            f"SELECT {', '.join(columns)}, crc, rowid FROM {table} ORDER BY rowid"
        )
        for row in cursor:
            if self._as_bytes:
                try:
                    row = tuple(v.decode() if isinstance(v, bytes) else v for v in row)
                except UnicodeDecodeError:
                    rowid = row[-1]
                    self.damaged.append((f"{table[:-1]} row {rowid} (not UTF-8)", table, rowid))
                    continue
            if self._verify and crc_of(row) != row[count]:
                self.damaged.append((f"{table[:-1]} {row[0]}", table, row[-1]))
                continue
            yield row

    def read(self) -> RowsRead:
        # SQLite's text_factory applies as rows are fetched: keep it for the whole read.
        previous = self._db.text_factory
        if self._as_bytes:
            self._db.text_factory = bytes
        try:
            return self._read()
        finally:
            self._db.text_factory = previous

    def _read(self) -> RowsRead:
        db = self._db
        revision_row = db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()
        revision = int(revision_row[0]) if revision_row else 0
        nodes: dict[str, tuple[Device, ...]] = {}
        for name, text, row_revision, _, rowid in self._rows("nodes"):
            try:
                nodes[sys.intern(name)] = decode_devices(text)
            except (ValueError, TypeError, KeyError):
                self.damaged.append((f"node {name} (undecodable)", "nodes", rowid))
                continue
            revision = max(revision, row_revision)
        quotas: dict[str, Mapping[str, int]] = {}
        for namespace, text, row_revision, _, rowid in self._rows("quotas"):
            try:
                quotas[sys.intern(namespace)] = dict(json.loads(text))
            except (ValueError, TypeError):
                self.damaged.append((f"quota {namespace} (undecodable)", "quotas", rowid))
                continue
            revision = max(revision, row_revision)
        tombstones = []
        for uid, reservable, row_revision, _, _ in self._rows("tombstones"):
            tombstones.append((uid, bool(reservable)))
            revision = max(revision, row_revision)
        # 100,000 pods: iterating the cursor keeps one row alive at a time, where fetchall()
        # would hold them all and leave about a kilobyte of freed memory per pod resident.
        decode = UsageDecoder().decode
        intern = sys.intern
        pods = []
        traceparents: dict[str, str] = {}
        for (uid, namespace, name, node_name, usage_text, released, terminal, progress,
             restarts, traceparent, row_revision, grants_text, _, rowid) in self._rows("pods"):
            try:
                usage = decode(usage_text)
                grants = decode_grants(grants_text) if grants_text else None
            except (ValueError, TypeError, KeyError):
                self.damaged.append((f"pod {uid} (undecodable usage)", "pods", rowid))
                continue
            pods.append(
                # A row from before revisions (0) reads as 1: never 0 (nothing stored), and
                # never a revision a later change can take.
                StoredPod(
                    uid=uid,
                    namespace=intern(namespace),
                    name=name,
                    node_name=intern(node_name),
                    usage=usage,
                    init_released=bool(released),
                    terminal=bool(terminal),
                    init_progress=progress,
                    init_restarts=restarts,
                    revision=row_revision or 1,
                    reserved_grants=grants,
                )
            )
            if traceparent:
                traceparents[uid] = traceparent
            if row_revision > revision:
                revision = row_revision
        state = JournalState(
            pods=tuple(pods),
            nodes=nodes,
            quotas=quotas,
            traceparents=traceparents,
            tombstones=tuple(tombstones),
            revision=revision,
        )
        return RowsRead(state=state, damaged=self.damaged)

