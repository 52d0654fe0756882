"""The usage recorder's journal: the acknowledged ledger state in an embedded SQLite file.

Layer: services (usage recorder persistence). The journal holds *state*, not an ever-growing log:
one row per tracked pod, per registered node and per namespace with limits, plus the ledger
revision and the schema version. Every acknowledged change is one transaction, committed before
the recorder replies, so a restarted recorder loads exactly what it had acknowledged.

Durability choice. The file runs in WAL mode. ``synchronous=NORMAL`` (the default here) does
not fsync on every commit: a committed transaction is in the WAL file in the operating system's
page cache, so it survives a crash or SIGKILL of the *process* — which is the guarantee the
recorder gives. Only a power loss or kernel crash can lose the last commits; with a Kubernetes
source those are restored by the re-list at start, and HAMi's informer re-sends pods on its
resync. ``synchronous=FULL`` (HAMI_ACCOUNTING_JOURNAL_SYNC=full) fsyncs every commit and also
survives power loss, at the price of one fsync per write under the store lock.

Encoding is chosen for a fast recovery (100,000 pods well under 3 s): one bulk SELECT per
table, usage as a compact JSON array of ``[uuid, type, memory_mib, core_percent, slots]`` whose
decoded value is shared between pods with the same text.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accounting.lifecycle import StoredPod
from accounting.model import Device, DeviceUsage

SCHEMA_VERSION = 1
"""The layout this build reads and writes; any other version is refused at open."""
JOURNAL_FILE_NAME = "usage.sqlite3"
SYNCHRONOUS_MODES = ("normal", "full")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pods ("
    " uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " node_name TEXT NOT NULL, usage TEXT NOT NULL,"
    " init_released INTEGER NOT NULL, terminal INTEGER NOT NULL,"
    " init_progress INTEGER NOT NULL, init_restarts INTEGER NOT NULL,"
    " traceparent TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, devices TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS quotas (namespace TEXT PRIMARY KEY, limits TEXT NOT NULL)",
)

_UPSERT_POD = (
    "INSERT INTO pods (uid, namespace, name, node_name, usage, init_released, terminal,"
    " init_progress, init_restarts, traceparent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET namespace = excluded.namespace, name = excluded.name,"
    " node_name = excluded.node_name, usage = excluded.usage,"
    " init_released = excluded.init_released, terminal = excluded.terminal,"
    " init_progress = excluded.init_progress, init_restarts = excluded.init_restarts,"
    " traceparent = excluded.traceparent"
)
# ON CONFLICT ... DO UPDATE keeps the row (and its rowid), so a re-registered node keeps its
# place in the listing order, as it does in the ledger.
_UPSERT_NODE = (
    "INSERT INTO nodes (name, devices) VALUES (?, ?)"
    " ON CONFLICT(name) DO UPDATE SET devices = excluded.devices"
)
_UPSERT_QUOTA = (
    "INSERT INTO quotas (namespace, limits) VALUES (?, ?)"
    " ON CONFLICT(namespace) DO UPDATE SET limits = excluded.limits"
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


JournalOp = PutPod | DeletePod | PutNode | DeleteNode | PutQuota


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
    revision: int = 0


# -- encoding ----------------------------------------------------------------------------------


def encode_usage(usage: Iterable[DeviceUsage]) -> str:
    """``[[uuid, type, memory_mib, core_percent, slots], ...]`` without spaces."""
    return json.dumps(
        [[u.uuid, u.device_type, u.memory_mib, u.core_percent, u.slots] for u in usage],
        separators=(",", ":"),
    )


def decode_usage(text: str) -> tuple[DeviceUsage, ...]:
    return tuple(DeviceUsage(str(e[0]), str(e[1]), e[2], e[3], e[4]) for e in json.loads(text))


def encode_devices(devices: Iterable[Device]) -> str:
    return json.dumps(
        [
            {
                "uuid": d.uuid,
                "device_type": d.device_type,
                "index": d.index,
                "slots_total": d.slots_total,
                "memory_total_mib": d.memory_total_mib,
                "cores_total": d.cores_total,
                "numa": d.numa,
                "mode": d.mode,
                "healthy": d.healthy,
                "vendor": d.vendor,
            }
            for d in devices
        ],
        separators=(",", ":"),
    )


def decode_devices(text: str) -> tuple[Device, ...]:
    return tuple(Device(**entry) for entry in json.loads(text))


def _encode_limits(limits: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(limits.items())), separators=(",", ":"))


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
            JournalSchemaError: the file has another schema version.
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
            elif row[0] != SCHEMA_VERSION:
                raise JournalSchemaError(
                    f"journal {self.path} has schema version {row[0]}; this build reads version "
                    f"{SCHEMA_VERSION}. Use the build that wrote it, or move the file away to "
                    "start empty (with a Kubernetes source the state is rebuilt by the re-list)."
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

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
        """Reads the whole state: one SELECT per table, cheap decoding.

        Raises:
            JournalError: the file cannot be read or holds rows this build cannot decode.
        """
        with self._lock:
            try:
                pod_rows = self._db.execute(
                    "SELECT uid, namespace, name, node_name, usage, init_released, terminal,"
                    " init_progress, init_restarts, traceparent FROM pods ORDER BY rowid"
                ).fetchall()
                node_rows = self._db.execute(
                    "SELECT name, devices FROM nodes ORDER BY rowid"
                ).fetchall()
                quota_rows = self._db.execute(
                    "SELECT namespace, limits FROM quotas ORDER BY rowid"
                ).fetchall()
                revision_row = self._db.execute(
                    "SELECT value FROM meta WHERE key = 'revision'"
                ).fetchone()
            except sqlite3.Error as error:
                raise JournalError(f"cannot read journal {self.path}: {error}") from None
        try:
            # Most pods of a cluster share a handful of usage shapes: decode each text once.
            decoded: dict[str, tuple[DeviceUsage, ...]] = {}
            pods = []
            traceparents: dict[str, str] = {}
            for (uid, namespace, name, node_name, usage_text, released, terminal, progress,
                 restarts, traceparent) in pod_rows:
                usage = decoded.get(usage_text)
                if usage is None:
                    usage = decoded[usage_text] = decode_usage(usage_text)
                pods.append(
                    StoredPod(uid, namespace, name, node_name, usage, bool(released),
                              bool(terminal), progress, restarts)
                )
                if traceparent:
                    traceparents[uid] = traceparent
            nodes = {name: decode_devices(text) for name, text in node_rows}
            quotas = {namespace: dict(json.loads(text)) for namespace, text in quota_rows}
        except (ValueError, TypeError, KeyError, IndexError) as error:
            raise JournalError(f"journal {self.path} holds an undecodable row: {error}") from None
        return JournalState(
            pods=tuple(pods),
            nodes=nodes,
            quotas=quotas,
            traceparents=traceparents,
            revision=int(revision_row[0]) if revision_row else 0,
        )

    def commit(self, ops: Sequence[JournalOp], revision: int) -> None:
        """Writes the changes and the new ledger revision in one transaction.

        Raises:
            JournalError: nothing was written (the transaction was rolled back).
        """
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for op in ops:
                        self._apply(op)
                    self._db.execute(_SET_META, ("revision", revision))
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as error:
                raise JournalError(f"cannot write journal {self.path}: {error}") from None

    def _apply(self, op: JournalOp) -> None:
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
                ),
            )
        elif isinstance(op, DeletePod):
            self._db.execute("DELETE FROM pods WHERE uid = ?", (op.uid,))
        elif isinstance(op, PutNode):
            self._db.execute(_UPSERT_NODE, (op.node_name, encode_devices(op.devices)))
        elif isinstance(op, DeleteNode):
            self._db.execute("DELETE FROM nodes WHERE name = ?", (op.node_name,))
        elif op.limits:
            self._db.execute(_UPSERT_QUOTA, (op.namespace, _encode_limits(op.limits)))
        else:
            self._db.execute("DELETE FROM quotas WHERE namespace = ?", (op.namespace,))

    def close(self) -> None:
        """Checkpoints the WAL into the main file and closes the connection (idempotent)."""
        with self._lock:
            # A closed or busy file keeps its WAL; the next open replays it.
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
