"""The journal's SQLite layout: its tables and statements, its schema version, and the opening
of a connection onto it, which creates a new file's tables or migrates an older file's.

Layer: services (usage recorder persistence). The journal holds *state*, not an ever-growing
log: one row per tracked pod, per registered node, per namespace with limits and per remembered
forgotten uid (tombstone, bounded by the ledger), plus the schema version, the revision of a
change that wrote no row and the journal's id in ``meta``.

Schema versions. Version 1 had no revision columns and no tombstones, and its first builds had
no ``init_progress``, ``init_restarts`` and ``traceparent`` either; version 2 had no checksums
and no journal id; version 3 had no optional fields in its usage and device arrays (version 4:
MIG instances on usage, MIG profiles and vendor facts on devices; version 5: the grants of a
reservation on its pod). An older file is migrated to version 5 in place, in one transaction,
when it is opened (missing columns are added with their defaults, checksums computed for the
rows it holds; a version-3 or -4 file's rows stay as they are; node inventories version 1 wrote
as JSON objects are read as they are, and written as arrays when the node changes). A file of
any other version is refused, and so is a newer file by an older build: going back means
moving the file away.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from services.usage.journal.codec import CHECKED_COLUMNS, ROW_CRC
from services.usage.journal.errors import JournalError, JournalSchemaError

SCHEMA_VERSION = 5
"""The layout this build writes; versions 1 to 4 are migrated at open, any other is refused."""
TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pods ("
    " uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " node_name TEXT NOT NULL, usage TEXT NOT NULL,"
    " init_released INTEGER NOT NULL, terminal INTEGER NOT NULL,"
    " init_progress INTEGER NOT NULL DEFAULT 0, init_restarts INTEGER NOT NULL DEFAULT 0,"
    " traceparent TEXT NOT NULL DEFAULT '', revision INTEGER NOT NULL DEFAULT 0,"
    " crc INTEGER NOT NULL DEFAULT 0, grants TEXT NOT NULL DEFAULT '')",
    "CREATE TABLE IF NOT EXISTS nodes ("
    " name TEXT PRIMARY KEY, devices TEXT NOT NULL, revision INTEGER NOT NULL DEFAULT 0,"
    " crc INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS quotas ("
    " namespace TEXT PRIMARY KEY, limits TEXT NOT NULL, revision INTEGER NOT NULL DEFAULT 0,"
    " crc INTEGER NOT NULL DEFAULT 0)",
    # reservable: 1 = refuses RecordPod only, 0 = refuses Reserve too (accounting.ledger).
    "CREATE TABLE IF NOT EXISTS tombstones ("
    " uid TEXT PRIMARY KEY, reservable INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " crc INTEGER NOT NULL DEFAULT 0)",
)

# Columns a version-1 file may lack (its first builds had none of them), with the definition
# that adds them; NOT NULL columns need their DEFAULT to be added to a table with rows.
_OLD_MISSING_COLUMNS = {
    "pods": (
        ("init_progress", "INTEGER NOT NULL DEFAULT 0"),
        ("init_restarts", "INTEGER NOT NULL DEFAULT 0"),
        ("traceparent", "TEXT NOT NULL DEFAULT ''"),
        ("revision", "INTEGER NOT NULL DEFAULT 0"),
        ("crc", "INTEGER NOT NULL DEFAULT 0"),
        ("grants", "TEXT NOT NULL DEFAULT ''"),
    ),
    "nodes": (("revision", "INTEGER NOT NULL DEFAULT 0"), ("crc", "INTEGER NOT NULL DEFAULT 0")),
    "quotas": (("revision", "INTEGER NOT NULL DEFAULT 0"), ("crc", "INTEGER NOT NULL DEFAULT 0")),
    "tombstones": (("crc", "INTEGER NOT NULL DEFAULT 0"),),
}

UPSERT_POD = (
    "INSERT INTO pods (uid, namespace, name, node_name, usage, init_released, terminal,"
    " init_progress, init_restarts, traceparent, revision, grants, crc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET namespace = excluded.namespace, name = excluded.name,"
    " node_name = excluded.node_name, usage = excluded.usage,"
    " init_released = excluded.init_released, terminal = excluded.terminal,"
    " init_progress = excluded.init_progress, init_restarts = excluded.init_restarts,"
    " traceparent = excluded.traceparent, revision = excluded.revision,"
    " grants = excluded.grants, crc = excluded.crc"
)
# ON CONFLICT ... DO UPDATE keeps the row (and its rowid), so a re-registered node keeps its
# place in the listing order, as it does in the ledger.
UPSERT_NODE = (
    "INSERT INTO nodes (name, devices, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(name) DO UPDATE SET devices = excluded.devices, revision = excluded.revision,"
    " crc = excluded.crc"
)
UPSERT_QUOTA = (
    "INSERT INTO quotas (namespace, limits, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(namespace) DO UPDATE SET limits = excluded.limits,"
    " revision = excluded.revision, crc = excluded.crc"
)
# A hardened tombstone keeps its row (and rowid), so its age (load order) stays that of the
# first forget.
UPSERT_TOMBSTONE = (
    "INSERT INTO tombstones (uid, reservable, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET reservable = excluded.reservable,"
    " revision = excluded.revision, crc = excluded.crc"
)
SET_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)



@dataclass(frozen=True, kw_only=True)
class JournalIdentity:
    """Which journal a file is, as its opening found or gave it."""

    journal_id: int
    created: bool
    """True when this opening gave the file its id: a new file, or one of schema 1 or 2."""


def prepare(db: sqlite3.Connection, path: Path, synchronous: str) -> JournalIdentity:
    """Switches a fresh connection to WAL mode and ``synchronous``, then, in one transaction,
    creates the tables a new file lacks, migrates an older file and gives a file without one its
    journal id.

    Raises:
        JournalSchemaError: the file has a schema version this build does not read.
        JournalError: the file cannot be switched to WAL mode.
        sqlite3.DatabaseError, ValueError: SQLite cannot read the file.
    """
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise JournalError(f"journal {path}: cannot switch to WAL mode (got {mode})")
    db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in TABLES:
            db.execute(statement)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            db.execute(SET_META, ("schema_version", SCHEMA_VERSION))
            db.execute(SET_META, ("revision", 0))
        elif row[0] in (1, 2, 3, 4):
            _migrate(db, row[0])
        elif row[0] != SCHEMA_VERSION:
            raise JournalSchemaError(
                f"journal {path} has schema version {row[0]}; this build reads versions "
                f"1 to {SCHEMA_VERSION}. Use the build that wrote it, or move the file away "
                "to start empty (with a Kubernetes source the state is rebuilt by the "
                "re-list)."
            )
        id_row = db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
        if id_row is None:
            identity = JournalIdentity(journal_id=_new_journal_id(), created=True)
            db.execute(SET_META, ("journal_id", identity.journal_id))
        else:
            identity = JournalIdentity(journal_id=int(id_row[0]), created=False)
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return identity


def _migrate(db: sqlite3.Connection, version: int) -> None:
    """Brings a version-1 to -4 file to version 5 inside the open transaction (a version-3
    or -4 file's rows are valid version-5 rows once the pods' ``grants`` column is added,
    empty: its checksums hold as they are).

    Version 1 wrote the revision into ``meta`` on every commit, so that row stays the
    revision until newer rows carry higher ones; the added revision columns start at 0.
    The tombstones table was created with the others (CREATE TABLE IF NOT EXISTS). Every
    row gets its checksum; the journal id is added by the caller.
    """
    if version in (3, 4):
        present = {row[1] for row in db.execute("PRAGMA table_info(pods)")}
        if "grants" not in present:
            db.execute("ALTER TABLE pods ADD COLUMN grants TEXT NOT NULL DEFAULT ''")
        db.execute(SET_META, ("schema_version", SCHEMA_VERSION))
        return
    for table, missing in _OLD_MISSING_COLUMNS.items():
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in missing:
            if name not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
    for table, checked in CHECKED_COLUMNS.items():
        rows = db.execute(f"SELECT rowid, {', '.join(checked)} FROM {table}").fetchall()
        db.executemany(
            f"UPDATE {table} SET crc = ? WHERE rowid = ?",
            [(ROW_CRC[table](row[1:]), row[0]) for row in rows],
        )
    db.execute(SET_META, ("schema_version", SCHEMA_VERSION))


def _new_journal_id() -> int:
    return int.from_bytes(os.urandom(8), "big") >> 1

