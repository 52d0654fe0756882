"""The usage recorder's journal: the acknowledged ledger state in an embedded SQLite file.

Layer: services (usage recorder persistence). The journal holds *state*, not an ever-growing log:
one row per tracked pod, per registered node, per namespace with limits and per remembered
forgotten uid (tombstone, bounded by the ledger), plus the schema version. Every acknowledged
change is one transaction, committed before the recorder replies, so a restarted recorder loads
exactly what it had acknowledged.

Revision. Each row written carries the ledger revision of the change that wrote it, and the
revision is derived at load as the highest one found. A change that writes no row (a pod deleted
while its tombstone already existed, a node dropped, a quota unset) stores it in ``meta``
instead. Writing ``meta`` on every commit would cost a second statement per RecordPod; a
one-statement change runs without BEGIN/COMMIT (autocommit makes the statement its own
transaction).

Schema versions. Version 1 had no revision columns and no tombstones, and its first builds had
no ``init_progress``, ``init_restarts`` and ``traceparent`` either; such a file is migrated to
version 2 in place, in one transaction, when it is opened (missing columns are added with their
defaults; node inventories it wrote as JSON objects are read as they are, and written as arrays
when the node changes). A file of any other version is refused, and so is a version-2 file by a
version-1 build: going back means moving the file away.

Durability choice. The file runs in WAL mode. ``synchronous=NORMAL`` (the default here) does
not fsync on every commit: a committed transaction is in the WAL file in the operating system's
page cache, so it survives a crash or SIGKILL of the *process* — which is the guarantee the
recorder gives. Only a power loss or kernel crash can lose the last commits; with a Kubernetes
source those are restored by the re-list at start, and HAMi's informer re-sends pods on its
resync. ``synchronous=FULL`` (HAMI_ACCOUNTING_JOURNAL_SYNC=full) fsyncs every commit and also
survives power loss, at the price of one fsync per write under the store lock.

Encoding is chosen for a fast, compact recovery (100,000 pods well under 3 s): one SELECT per
table read row by row (no list of every row held at once: its temporaries would stay in the
process's resident memory), usage as a compact JSON array of ``[uuid, type, memory_mib,
core_percent, slots]`` decoded straight into the ledger's final objects: strings interned, equal
usage texts sharing one tuple, repeated quantities sharing one int.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path

from accounting.lifecycle import StoredPod
from accounting.model import Device, DeviceUsage

SCHEMA_VERSION = 2
"""The layout this build writes; version 1 is migrated at open, any other is refused."""
JOURNAL_FILE_NAME = "usage.sqlite3"
SYNCHRONOUS_MODES = ("normal", "full")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pods ("
    " uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " node_name TEXT NOT NULL, usage TEXT NOT NULL,"
    " init_released INTEGER NOT NULL, terminal INTEGER NOT NULL,"
    " init_progress INTEGER NOT NULL DEFAULT 0, init_restarts INTEGER NOT NULL DEFAULT 0,"
    " traceparent TEXT NOT NULL DEFAULT '', revision INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS nodes ("
    " name TEXT PRIMARY KEY, devices TEXT NOT NULL, revision INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS quotas ("
    " namespace TEXT PRIMARY KEY, limits TEXT NOT NULL, revision INTEGER NOT NULL DEFAULT 0)",
    # reservable: 1 = refuses RecordPod only, 0 = refuses Reserve too (accounting.ledger).
    "CREATE TABLE IF NOT EXISTS tombstones ("
    " uid TEXT PRIMARY KEY, reservable INTEGER NOT NULL, revision INTEGER NOT NULL)",
)

# Columns a version-1 file may lack (its first builds had none of them), with the definition
# that adds them; NOT NULL columns need their DEFAULT to be added to a table with rows.
_V1_MISSING_COLUMNS = {
    "pods": (
        ("init_progress", "INTEGER NOT NULL DEFAULT 0"),
        ("init_restarts", "INTEGER NOT NULL DEFAULT 0"),
        ("traceparent", "TEXT NOT NULL DEFAULT ''"),
        ("revision", "INTEGER NOT NULL DEFAULT 0"),
    ),
    "nodes": (("revision", "INTEGER NOT NULL DEFAULT 0"),),
    "quotas": (("revision", "INTEGER NOT NULL DEFAULT 0"),),
}

_UPSERT_POD = (
    "INSERT INTO pods (uid, namespace, name, node_name, usage, init_released, terminal,"
    " init_progress, init_restarts, traceparent, revision)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET namespace = excluded.namespace, name = excluded.name,"
    " node_name = excluded.node_name, usage = excluded.usage,"
    " init_released = excluded.init_released, terminal = excluded.terminal,"
    " init_progress = excluded.init_progress, init_restarts = excluded.init_restarts,"
    " traceparent = excluded.traceparent, revision = excluded.revision"
)
# ON CONFLICT ... DO UPDATE keeps the row (and its rowid), so a re-registered node keeps its
# place in the listing order, as it does in the ledger.
_UPSERT_NODE = (
    "INSERT INTO nodes (name, devices, revision) VALUES (?, ?, ?)"
    " ON CONFLICT(name) DO UPDATE SET devices = excluded.devices, revision = excluded.revision"
)
_UPSERT_QUOTA = (
    "INSERT INTO quotas (namespace, limits, revision) VALUES (?, ?, ?)"
    " ON CONFLICT(namespace) DO UPDATE SET limits = excluded.limits,"
    " revision = excluded.revision"
)
# A hardened tombstone keeps its row (and rowid), so its age (load order) stays that of the
# first forget.
_UPSERT_TOMBSTONE = (
    "INSERT INTO tombstones (uid, reservable, revision) VALUES (?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET reservable = excluded.reservable,"
    " revision = excluded.revision"
)
_SET_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)


class JournalError(Exception):
    """The journal cannot be opened, read or written; the message names the file."""


class JournalSchemaError(JournalError):
    """The file was written by a build with another schema version."""


# -- the changes a transaction can carry -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutPod:
    """Store (insert or replace) what is charged for one pod."""

    stored: StoredPod
    traceparent: str = ""
    """The pod's hami.io/traceparent, so spans about it after a restart join its trace."""


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Forget one pod."""

    uid: str


@dataclass(frozen=True, slots=True)
class PutNode:
    """Register or replace a node's device inventory."""

    node_name: str
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Drop a node's inventory."""

    node_name: str


@dataclass(frozen=True, slots=True)
class PutQuota:
    """Replace a namespace's limits (keyed by resource name); empty limits delete the row."""

    namespace: str
    limits: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PutTombstone:
    """Remember a forgotten uid, or harden the tombstone it has (see accounting.ledger)."""

    uid: str
    reservable: bool


@dataclass(frozen=True, slots=True)
class DeleteTombstones:
    """Drop tombstones the ledger evicted to keep its bound."""

    uids: tuple[str, ...]


JournalOp = PutPod | DeletePod | PutNode | DeleteNode | PutQuota | PutTombstone | DeleteTombstones


def _stamps(op: JournalOp) -> bool:
    """Whether the op writes a row, which then carries the transaction's revision: the load
    takes the highest revision it finds, so a transaction with such an op need not write
    ``meta`` (the store never deletes, in the same transaction, a row it writes)."""
    if isinstance(op, PutQuota):
        return bool(op.limits)
    return isinstance(op, PutPod | PutNode | PutTombstone)


@dataclass(frozen=True)
class JournalState:
    """Everything the journal holds, as loaded at start."""

    pods: tuple[StoredPod, ...] = ()
    nodes: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    """Node name -> devices, in registration order."""
    quotas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Namespace -> resource name (nvidia.com/gpumem) -> limit."""
    traceparents: Mapping[str, str] = field(default_factory=dict)
    """Pod uid -> its hami.io/traceparent (pods without one are absent)."""
    tombstones: tuple[tuple[str, bool], ...] = ()
    """(uid, reservable) of the remembered forgotten uids, oldest first."""
    revision: int = 0


# -- encoding ----------------------------------------------------------------------------------


# json.dumps with non-default separators builds a new encoder per call (about 10 µs); one
# shared encoder takes a quarter of that.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def encode_usage(usage: Iterable[DeviceUsage]) -> str:
    """``[[uuid, type, memory_mib, core_percent, slots], ...]`` without spaces (what
    ``json.dumps`` writes with compact separators; formatted directly because it runs on every
    RecordPod)."""
    return (
        "["
        + ",".join(
            f"[{encode_basestring_ascii(u.uuid)},{encode_basestring_ascii(u.vendor)},"
            f"{u.memory_mib:d},{u.core_percent:d},{u.slots:d}]"
            for u in usage
        )
        + "]"
    )


def decode_usage(text: str) -> tuple[DeviceUsage, ...]:
    return tuple(DeviceUsage(str(e[0]), str(e[1]), e[2], e[3], e[4]) for e in json.loads(text))


class _UsageDecoder:
    """Decodes usage texts into the ledger's final objects: each distinct text once (equal texts
    share one tuple), strings interned, repeated quantities sharing one int object."""

    def __init__(self) -> None:
        self._by_text: dict[str, tuple[DeviceUsage, ...]] = {}
        self._ints: dict[int, int] = {}

    def decode(self, text: str) -> tuple[DeviceUsage, ...]:
        usage = self._by_text.get(text)
        if usage is None:
            # sys.intern refuses anything but a str, which keeps the row check of decode_usage.
            share = self._ints.setdefault
            intern = sys.intern
            usage = self._by_text[text] = tuple(
                [
                    DeviceUsage(intern(uuid), intern(vendor), share(memory_mib, memory_mib),
                                share(core_percent, core_percent), share(slots, slots))
                    for uuid, vendor, memory_mib, core_percent, slots in json.loads(text)
                ]
            )
        return usage


def encode_devices(devices: Iterable[Device]) -> str:
    """``[[uuid, model, index, slots_total, memory_total_mib, core_percent_total, numa, mode,
    healthy, vendor], ...]``: arrays decode in half the time of objects (12,500 nodes of 8
    devices: 0.25 s less at recovery). Version 1 wrote one object per device; both are read."""
    return _COMPACT.encode(
        [
            [d.uuid, d.model, d.index, d.slots_total, d.memory_total_mib, d.core_percent_total,
             d.numa, d.mode, d.healthy, d.vendor]
            for d in devices
        ]
    )


_DEVICE_STRINGS = frozenset(("uuid", "device_type", "mode", "vendor"))
_VERSION_1_DEVICE_KEYS = {"device_type": "model", "cores_total": "core_percent_total"}
"""Version 1 wrote each device's fields by name; these names have changed since."""


def decode_devices(text: str) -> tuple[Device, ...]:
    """The inventory with its strings interned: the pods' usage (interned by the ledger) then
    shares the UUID strings with the node's devices instead of holding copies."""
    intern = sys.intern
    devices = []
    for entry in json.loads(text):
        if isinstance(entry, dict):  # written by version 1
            # A missing key is left to Device() to name; only present strings are interned.
            for key in _DEVICE_STRINGS.intersection(entry):
                entry[key] = intern(entry[key])
            fields = {_VERSION_1_DEVICE_KEYS.get(str(key), str(key)): v for key, v in entry.items()}
            devices.append(Device(**fields))
            continue
        uuid, model, index, slots, memory, cores, numa, mode, healthy, vendor = entry
        devices.append(
            Device(uuid=intern(uuid), model=intern(model), index=index,
                   slots_total=slots, memory_total_mib=memory, core_percent_total=cores, numa=numa,
                   mode=intern(mode), healthy=healthy, vendor=intern(vendor))
        )
    return tuple(devices)


def _encode_limits(limits: Mapping[str, int]) -> str:
    return _COMPACT.encode(dict(sorted(limits.items())))


# -- the journal -------------------------------------------------------------------------------


class Journal:
    """One SQLite file in WAL mode; thread-safe (one connection behind a lock).

    The usage store calls ``commit`` under its own lock, so writes are already serialised; the
    journal's lock only protects the connection from a concurrent ``load`` or ``close``.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "normal",
    ) -> None:
        """Opens (creating if needed) the journal at ``path``.

        Args:
            path: the SQLite file; its directory is created.
            synchronous: ``normal`` (survives a process kill) or ``full`` (also power loss).

        Raises:
            JournalSchemaError: the file has a schema version other than 1 (migrated) or 2.
            JournalError: the file cannot be opened or is not a journal.
        """
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: transactions are opened explicitly with BEGIN IMMEDIATE.
            self._db = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=5.0
            )
        except (OSError, sqlite3.Error) as error:
            raise JournalError(f"cannot open journal {path}: {error}") from None
        try:
            self._prepare(synchronous)
        except sqlite3.Error as error:
            self._db.close()
            raise JournalError(f"cannot open journal {path}: {error}") from None
        except JournalError:
            self._db.close()
            raise

    def _prepare(self, synchronous: str) -> None:
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"journal {self.path}: cannot switch to WAL mode (got {mode})")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                self._db.execute(_SET_META, ("schema_version", SCHEMA_VERSION))
                self._db.execute(_SET_META, ("revision", 0))
            elif row[0] == 1:
                self._migrate_from_v1()
            elif row[0] != SCHEMA_VERSION:
                raise JournalSchemaError(
                    f"journal {self.path} has schema version {row[0]}; this build reads versions "
                    f"1 and {SCHEMA_VERSION}. Use the build that wrote it, or move the file away "
                    "to start empty (with a Kubernetes source the state is rebuilt by the "
                    "re-list)."
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _migrate_from_v1(self) -> None:
        """Brings a version-1 file to version 2 inside the open transaction.

        Version 1 wrote the revision into ``meta`` on every commit, so that row stays the
        revision until newer rows carry higher ones; the added revision columns start at 0.
        The tombstones table was created with the others (CREATE TABLE IF NOT EXISTS).
        """
        for table, columns in _V1_MISSING_COLUMNS.items():
            present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, definition in columns:
                if name not in present:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
        self._db.execute(_SET_META, ("schema_version", SCHEMA_VERSION))

    @classmethod
    def in_data_dir(
        cls,
        data_dir: Path,
        *,
        synchronous: str = "normal",
    ) -> Journal:
        """The journal at ``<data_dir>/usage.sqlite3``."""
        return cls(data_dir / JOURNAL_FILE_NAME, synchronous=synchronous)

    def load(self) -> JournalState:
        """Reads the whole state, one table after the other, row by row.

        The pods come back ready for ``Ledger.restore_all(..., interned=True)``: namespace,
        node and device strings interned, equal usage sharing one tuple.

        Raises:
            JournalError: the file cannot be read or holds rows this build cannot decode.
        """
        with self._lock:
            try:
                return self._load()
            except sqlite3.Error as error:
                raise JournalError(f"cannot read journal {self.path}: {error}") from None
            except (ValueError, TypeError, KeyError, IndexError) as error:
                raise JournalError(
                    f"journal {self.path} holds an undecodable row: {error}"
                ) from None

    def _load(self) -> JournalState:
        db = self._db
        revision_row = db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()
        revision = int(revision_row[0]) if revision_row else 0
        nodes: dict[str, tuple[Device, ...]] = {}
        for name, text, row_revision in db.execute(
            "SELECT name, devices, revision FROM nodes ORDER BY rowid"
        ):
            nodes[sys.intern(name)] = decode_devices(text)
            revision = max(revision, row_revision)
        quotas: dict[str, Mapping[str, int]] = {}
        for namespace, text, row_revision in db.execute(
            "SELECT namespace, limits, revision FROM quotas ORDER BY rowid"
        ):
            quotas[sys.intern(namespace)] = dict(json.loads(text))
            revision = max(revision, row_revision)
        tombstones = []
        for uid, reservable, row_revision in db.execute(
            "SELECT uid, reservable, revision FROM tombstones ORDER BY rowid"
        ):
            tombstones.append((uid, bool(reservable)))
            revision = max(revision, row_revision)
        # 100,000 pods: iterating the cursor keeps one row alive at a time, where fetchall()
        # would hold them all and leave about a kilobyte of freed memory per pod resident.
        decode = _UsageDecoder().decode
        intern = sys.intern
        pods = []
        traceparents: dict[str, str] = {}
        for (uid, namespace, name, node_name, usage_text, released, terminal, progress,
             restarts, traceparent, row_revision) in db.execute(
            "SELECT uid, namespace, name, node_name, usage, init_released, terminal,"
            " init_progress, init_restarts, traceparent, revision FROM pods ORDER BY rowid"
        ):
            pods.append(
                StoredPod(uid, intern(namespace), name, intern(node_name), decode(usage_text),
                          bool(released), bool(terminal), progress, restarts)
            )
            if traceparent:
                traceparents[uid] = traceparent
            if row_revision > revision:
                revision = row_revision
        return JournalState(
            pods=tuple(pods),
            nodes=nodes,
            quotas=quotas,
            traceparents=traceparents,
            tombstones=tuple(tombstones),
            revision=revision,
        )

    def commit(self, ops: Sequence[JournalOp], revision: int) -> None:
        """Writes the changes, stamped with the ledger revision, in one transaction.

        Raises:
            JournalError: nothing was written (the transaction was rolled back).
        """
        stamped = any(_stamps(op) for op in ops)
        with self._lock:
            try:
                if stamped and len(ops) == 1:
                    # One statement is its own transaction in autocommit mode: RecordPod's usual
                    # write costs one statement instead of three.
                    self._apply(ops[0], revision)
                    return
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for op in ops:
                        self._apply(op, revision)
                    if not stamped:
                        self._db.execute(_SET_META, ("revision", revision))
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as error:
                raise JournalError(f"cannot write journal {self.path}: {error}") from None

    def _apply(self, op: JournalOp, revision: int) -> None:
        if isinstance(op, PutPod):
            s = op.stored
            self._db.execute(
                _UPSERT_POD,
                (
                    s.uid,
                    s.namespace,
                    s.name,
                    s.node_name,
                    encode_usage(s.usage),
                    int(s.init_released),
                    int(s.terminal),
                    s.init_progress,
                    s.init_restarts,
                    op.traceparent,
                    revision,
                ),
            )
        elif isinstance(op, DeletePod):
            self._db.execute("DELETE FROM pods WHERE uid = ?", (op.uid,))
        elif isinstance(op, PutTombstone):
            self._db.execute(_UPSERT_TOMBSTONE, (op.uid, int(op.reservable), revision))
        elif isinstance(op, DeleteTombstones):
            self._db.executemany(
                "DELETE FROM tombstones WHERE uid = ?", [(uid,) for uid in op.uids]
            )
        elif isinstance(op, PutNode):
            self._db.execute(_UPSERT_NODE, (op.node_name, encode_devices(op.devices), revision))
        elif isinstance(op, DeleteNode):
            self._db.execute("DELETE FROM nodes WHERE name = ?", (op.node_name,))
        elif op.limits:
            self._db.execute(
                _UPSERT_QUOTA, (op.namespace, _encode_limits(op.limits), revision)
            )
        else:
            self._db.execute("DELETE FROM quotas WHERE namespace = ?", (op.namespace,))

    def close(self) -> None:
        """Checkpoints the WAL into the main file and closes the connection (idempotent)."""
        with self._lock:
            # A closed or busy file keeps its WAL; the next open replays it.
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
