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
no ``init_progress``, ``init_restarts`` and ``traceparent`` either; version 2 had no checksums
and no journal id; version 3 had no optional fields in its usage and device arrays (version 4:
MIG instances on usage, MIG profiles and vendor facts on devices). An older file is migrated
to version 4 in place, in one transaction, when it is opened (missing columns are added with
their defaults, checksums computed for the rows it holds; a version-3 file's rows stay as they
are; node inventories version 1 wrote as JSON objects are read as they are, and written as
arrays when the node changes). A file of any other version is refused, and so is a newer file by
an older build: going back means moving the file away.

Integrity. Nothing acknowledged may go missing unnoticed, so the journal checks itself when it
is loaded and reports what it finds as a ``JournalDamage`` rather than starting empty or partly
empty by surprise:

* every row carries a CRC-32 of its values, so a changed digit is caught, not served;
* ``PRAGMA quick_check`` finds a file whose pages are damaged or missing;
* the watermark beside the file (services/usage/watermark.py) holds the journal's id and the
  last revision it acknowledged: a file that reads an older revision (its ``-wal`` deleted,
  truncated or damaged after a kill, a backup copied without it), another journal's id (the
  file deleted, emptied or replaced) or no watermark at all is a loss of acknowledged changes.

What happens then is the recorder's choice (``UsageStore.recover``): refuse to start, keep what
is readable (``accept_loss``), or start empty for the Kubernetes source to rebuild (``reset``).
A file SQLite cannot read at all loads as empty with the damage saying why.

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
core_percent, slots]`` (and the MIG instances held, when there are any) decoded straight into
the ledger's final objects: strings interned, equal usage texts sharing one tuple, repeated
quantities sharing one int.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import sys
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from accounting.lifecycle import StoredPod
from accounting.model import (
    Device,
    DeviceGrant,
    DeviceUsage,
    MigInstance,
    MigPlacement,
    MigProfile,
)
from services.usage.journal_files import keep_aside, remove_sqlite_files
from services.usage.watermark import Mark, Watermark, WatermarkError, watermark_path

_LOG = logging.getLogger(__name__)

SCHEMA_VERSION = 5
"""The layout this build writes; versions 1 to 4 are migrated at open, any other is refused."""
JOURNAL_FILE_NAME = "usage.sqlite3"
SYNCHRONOUS_MODES = ("normal", "full")
ON_DAMAGE_REFUSE = "refuse"
ON_DAMAGE_ACCEPT_LOSS = "accept-loss"
ON_DAMAGE_REBUILD = "rebuild-from-kubernetes"
ON_DAMAGE_MODES = (ON_DAMAGE_REFUSE, ON_DAMAGE_ACCEPT_LOSS, ON_DAMAGE_REBUILD)
"""What the recorder does on a damaged or incomplete journal (HAMI_ACCOUNTING_JOURNAL_ON_DAMAGE)."""
EXIT_JOURNAL_DAMAGED = 3
"""The recorder's exit code when it refuses to start on a damaged journal."""

_SCHEMA = (
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
# The columns each table's checksum covers, in order: what _crc joins at write and at load.
_CHECKED_COLUMNS = {
    "pods": ("uid", "namespace", "name", "node_name", "usage", "init_released", "terminal",
             "init_progress", "init_restarts", "traceparent", "revision", "grants"),
    "nodes": ("name", "devices", "revision"),
    "quotas": ("namespace", "limits", "revision"),
    "tombstones": ("uid", "reservable", "revision"),
}

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

_UPSERT_POD = (
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
_UPSERT_NODE = (
    "INSERT INTO nodes (name, devices, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(name) DO UPDATE SET devices = excluded.devices, revision = excluded.revision,"
    " crc = excluded.crc"
)
_UPSERT_QUOTA = (
    "INSERT INTO quotas (namespace, limits, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(namespace) DO UPDATE SET limits = excluded.limits,"
    " revision = excluded.revision, crc = excluded.crc"
)
# A hardened tombstone keeps its row (and rowid), so its age (load order) stays that of the
# first forget.
_UPSERT_TOMBSTONE = (
    "INSERT INTO tombstones (uid, reservable, revision, crc) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(uid) DO UPDATE SET reservable = excluded.reservable,"
    " revision = excluded.revision, crc = excluded.crc"
)
_SET_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)


class JournalError(Exception):
    """The journal cannot be opened, read or written; the message names the file."""


class JournalSchemaError(JournalError):
    """The file was written by a build with another schema version."""


@dataclass(frozen=True)
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
    _rowids: tuple[tuple[str, int], ...] = ()

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
    """Everything the journal holds, as loaded at start (the readable part when damaged)."""

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
    damage: JournalDamage | None = None
    """What is wrong with the journal; None when it is whole."""


# -- encoding ----------------------------------------------------------------------------------


# json.dumps with non-default separators builds a new encoder per call (about 10 µs); one
# shared encoder takes a quarter of that.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def encode_usage(usage: Iterable[DeviceUsage]) -> str:
    """``[[uuid, type, memory_mib, core_percent, slots(, mig)], ...]`` without spaces (what
    ``json.dumps`` writes with compact separators; formatted directly because it runs on every
    RecordPod). ``mig``, ``[[profile, start, size], ...]``, only on an entry holding MIG
    instances."""
    return (
        "["
        + ",".join(
            f"[{encode_basestring_ascii(u.uuid)},{encode_basestring_ascii(u.vendor)},"
            f"{u.memory_mib:d},{u.core_percent:d},{u.slots:d}{_encode_instances(u.mig)}]"
            for u in usage
        )
        + "]"
    )


def encode_grants(grants: tuple[tuple[DeviceGrant, ...], ...] | None) -> str:
    """A reservation's grants per container position, ``[[[uuid, type, memory_mib,
    core_percent, slots(, [profile, start, size])], ...], ...]``; "" for none (a pod recorded
    from its annotations)."""
    if grants is None:
        return ""
    return _COMPACT.encode([
        [
            [g.uuid, g.vendor, g.memory_mib, g.core_percent, g.slots]
            + ([[g.mig.profile, g.mig.placement.start, g.mig.placement.size]] if g.mig else [])
            for g in container
        ]
        for container in grants
    ])


def decode_grants(text: str) -> tuple[tuple[DeviceGrant, ...], ...]:
    """The inverse of ``encode_grants`` for a non-empty text.

    Raises:
        ValueError, TypeError, KeyError: not what ``encode_grants`` writes.
    """
    intern = sys.intern
    decoded = []
    for container in json.loads(text):
        grants = []
        for entry in container:
            mig = None
            if len(entry) == 6:
                profile, start, size = entry[5]
                mig = MigInstance(str(profile), MigPlacement(int(start), int(size)))
            elif len(entry) != 5:
                raise ValueError(f"a grant has 5 or 6 fields, got {len(entry)}")
            uuid, vendor, memory_mib, core_percent, slots = entry[:5]
            grants.append(DeviceGrant(intern(str(uuid)), intern(str(vendor)), int(memory_mib),
                                      int(core_percent), int(slots), mig))
        decoded.append(tuple(grants))
    return tuple(decoded)


def _encode_instances(instances: tuple[MigInstance, ...]) -> str:
    if not instances:
        return ""
    return "," + _COMPACT.encode(
        [[m.profile, m.placement.start, m.placement.size] for m in instances]
    )


def _decode_instances(rows: list[list[Any]]) -> tuple[MigInstance, ...]:
    return tuple(
        MigInstance(sys.intern(str(profile)), MigPlacement(start, size))
        for profile, start, size in rows
    )


def decode_usage(text: str) -> tuple[DeviceUsage, ...]:
    return tuple(
        DeviceUsage(
            str(e[0]), str(e[1]), e[2], e[3], e[4], _decode_instances(e[5]) if len(e) > 5 else ()
        )
        for e in json.loads(text)
    )


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
            entries = []
            for entry in json.loads(text):
                # Unpacked by length: a starred target or a starred call would cost a list and
                # a slower call per entry (300,000 entries at the recovery of 100,000 pods).
                if len(entry) == 5:
                    uuid, vendor, memory_mib, core_percent, slots = entry
                    mig: tuple[MigInstance, ...] = ()
                else:
                    uuid, vendor, memory_mib, core_percent, slots, instances = entry
                    mig = _decode_instances(instances)
                entries.append(
                    DeviceUsage(intern(uuid), intern(vendor), share(memory_mib, memory_mib),
                                share(core_percent, core_percent), share(slots, slots), mig)
                )
            usage = self._by_text[text] = tuple(entries)
        return usage


def encode_devices(devices: Iterable[Device]) -> str:
    """``[[uuid, model, index, slots_total, memory_total_mib, core_percent_total, numa, mode,
    healthy, vendor(, mig_profiles, custom_info)], ...]``: arrays decode in half the time of
    objects (12,500 nodes of 8 devices: 0.25 s less at recovery). The last two only on a device
    with MIG profiles or vendor facts. Version 1 wrote one object per device; both are read."""
    return _COMPACT.encode(
        [
            [d.uuid, d.model, d.index, d.slots_total, d.memory_total_mib, d.core_percent_total,
             d.numa, d.mode, d.healthy, d.vendor, *_device_extras(d)]
            for d in devices
        ]
    )


def _device_extras(device: Device) -> list[object]:
    if not device.mig_profiles and not device.custom_info:
        return []
    profiles = [
        [p.name, p.memory_mib, p.core_percent, p.slice_count,
         [[placement.start, placement.size] for placement in p.placements]]
        for p in device.mig_profiles
    ]
    return [profiles, [list(pair) for pair in device.custom_info]]


def _decode_profiles(rows: list[list[Any]]) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(str(name), memory, core, slices,
                   tuple(MigPlacement(start, size) for start, size in placements))
        for name, memory, core, slices, placements in rows
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
        # Unpacked by length, as the usage decoder does (12,500 nodes of 8 devices at recovery).
        if len(entry) == 10:
            uuid, model, index, slots, memory, cores, numa, mode, healthy, vendor = entry
            profiles: tuple[MigProfile, ...] = ()
            info: tuple[tuple[str, str], ...] = ()
        else:
            (uuid, model, index, slots, memory, cores, numa, mode, healthy, vendor, mig,
             pairs) = entry
            profiles = _decode_profiles(mig)
            info = tuple((str(k), str(v)) for k, v in pairs)
        devices.append(
            Device(intern(uuid), intern(model), index, slots, memory, cores, numa, intern(mode),
                   healthy, intern(vendor), profiles, info)
        )
    return tuple(devices)


def _encode_limits(limits: Mapping[str, int]) -> str:
    return _COMPACT.encode(dict(sorted(limits.items())))


# -- checksums ---------------------------------------------------------------------------------


def _pod_crc(v: Sequence[Any]) -> int:
    # One f-string per table: about 2.5 times faster than joining str() of each value, which
    # counts at recovery (100,000 rows). A row without reserved grants sums what a version-4
    # row summed, so those rows keep their checksums across the migration.
    grants = f"\x1f{v[11]}" if v[11] else ""
    return zlib.crc32(
        f"{v[0]}\x1f{v[1]}\x1f{v[2]}\x1f{v[3]}\x1f{v[4]}\x1f{v[5]}\x1f{v[6]}\x1f{v[7]}\x1f{v[8]}"
        f"\x1f{v[9]}\x1f{v[10]}{grants}".encode()
    )


def _triple_crc(v: Sequence[Any]) -> int:
    return zlib.crc32(f"{v[0]}\x1f{v[1]}\x1f{v[2]}".encode())


_CRC = {"pods": _pod_crc, "nodes": _triple_crc, "quotas": _triple_crc, "tombstones": _triple_crc}
"""CRC-32 of a row's values (the ``_CHECKED_COLUMNS`` of its table, in order) as SQLite hands
them back, text as str and integers as int, joined by the unit separator."""


def _pod_values(stored: StoredPod, traceparent: str, revision: int) -> tuple[object, ...]:
    s = stored
    return (s.uid, s.namespace, s.name, s.node_name, encode_usage(s.usage), int(s.init_released),
            int(s.terminal), s.init_progress, s.init_restarts, traceparent, revision,
            encode_grants(s.reserved_grants))


def _new_journal_id() -> int:
    return int.from_bytes(os.urandom(8), "big") >> 1


# -- the journal -------------------------------------------------------------------------------


class Journal:
    """One SQLite file in WAL mode and its watermark; thread-safe (one connection behind a
    lock).

    The usage store calls ``commit`` under its own lock, so writes are already serialised; the
    journal's lock only protects the connection from a concurrent ``load`` or ``close``.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "normal",
        lock: bool = False,
    ) -> None:
        """Opens (creating if needed) the journal at ``path`` and its watermark.

        A file SQLite cannot read does not raise here: ``load`` reports it as damage, and
        ``reset`` moves it aside.

        Args:
            path: the SQLite file; its directory is created.
            synchronous: ``normal`` (survives a process kill) or ``full`` (also power loss).
            lock: hold the data directory until ``close`` (the recorder does): a second
                recorder on it, or a restore while it runs, is refused.

        Raises:
            JournalSchemaError: the file has a schema version other than 1, 2 (migrated) or 3.
            JournalError: the directory or the watermark cannot be opened, or another process
                holds the journal.
        """
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        self.path = path
        self._synchronous = synchronous
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._watermark = Watermark(watermark_path(path), lock=lock)
        except (OSError, WatermarkError) as error:
            raise JournalError(f"cannot open journal {path}: {error}") from None
        self.journal_id = 0
        self._id_created = False
        """True when this open gave the file its id: a new file, or one of schema 1 or 2."""
        self._broken: str | None = None
        """Why SQLite cannot read the file (load reports it; reset moves the file aside)."""
        self._db: sqlite3.Connection | None = None
        try:
            self._open()
        except JournalError:
            self._watermark.close()
            raise

    def _open(self) -> None:
        try:
            # Autocommit mode: transactions are opened explicitly with BEGIN IMMEDIATE.
            self._db = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=5.0
            )
        except (OSError, sqlite3.Error) as error:
            raise JournalError(f"cannot open journal {self.path}: {error}") from None
        try:
            self._prepare(self._synchronous)
        except JournalError:
            self._db.close()
            self._db = None
            raise
        except (sqlite3.DatabaseError, ValueError) as error:
            # Not a database, a malformed schema, undecodable text (UnicodeDecodeError).
            self._broken = _reason(error)
            self._db.close()
            self._db = None

    def _prepare(self, synchronous: str) -> None:
        assert self._db is not None
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
            elif row[0] in (1, 2, 3, 4):
                self._migrate(row[0])
            elif row[0] != SCHEMA_VERSION:
                raise JournalSchemaError(
                    f"journal {self.path} has schema version {row[0]}; this build reads versions "
                    f"1 to {SCHEMA_VERSION}. Use the build that wrote it, or move the file away "
                    "to start empty (with a Kubernetes source the state is rebuilt by the "
                    "re-list)."
                )
            id_row = self._db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
            if id_row is None:
                self.journal_id = _new_journal_id()
                self._id_created = True
                self._db.execute(_SET_META, ("journal_id", self.journal_id))
            else:
                self.journal_id = int(id_row[0])
            self._db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise

    def _migrate(self, version: int) -> None:
        """Brings a version-1 to -4 file to version 5 inside the open transaction (a version-3
        or -4 file's rows are valid version-5 rows once the pods' ``grants`` column is added,
        empty: its checksums hold as they are).

        Version 1 wrote the revision into ``meta`` on every commit, so that row stays the
        revision until newer rows carry higher ones; the added revision columns start at 0.
        The tombstones table was created with the others (CREATE TABLE IF NOT EXISTS). Every
        row gets its checksum; the journal id is added by the caller.
        """
        assert self._db is not None
        if version in (3, 4):
            present = {row[1] for row in self._db.execute("PRAGMA table_info(pods)")}
            if "grants" not in present:
                self._db.execute("ALTER TABLE pods ADD COLUMN grants TEXT NOT NULL DEFAULT ''")
            self._db.execute(_SET_META, ("schema_version", SCHEMA_VERSION))
            return
        for table, missing in _OLD_MISSING_COLUMNS.items():
            present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, definition in missing:
                if name not in present:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
        for table, checked in _CHECKED_COLUMNS.items():
            rows = self._db.execute(f"SELECT rowid, {', '.join(checked)} FROM {table}").fetchall()
            self._db.executemany(
                f"UPDATE {table} SET crc = ? WHERE rowid = ?",
                [(_CRC[table](row[1:]), row[0]) for row in rows],
            )
        self._db.execute(_SET_META, ("schema_version", SCHEMA_VERSION))

    @classmethod
    def in_data_dir(
        cls,
        data_dir: Path,
        *,
        synchronous: str = "normal",
        lock: bool = False,
    ) -> Journal:
        """The journal at ``<data_dir>/usage.sqlite3``."""
        return cls(data_dir / JOURNAL_FILE_NAME, synchronous=synchronous, lock=lock)

    # -- load --------------------------------------------------------------------------------

    def load(self, *, verify: bool = True) -> JournalState:
        """Reads the whole state, one table after the other, row by row, and checks it: the
        file's structure (``PRAGMA quick_check``), each row's checksum, and the revision and id
        against the watermark. Whatever is wrong is in ``JournalState.damage``, and the state
        holds what could be read (nothing when the file cannot be read at all).

        The pods come back ready for ``Ledger.restore_all(..., interned=True)``: namespace,
        node and device strings interned, equal usage sharing one tuple.

        Args:
            verify: False skips quick_check and the checksums: only for the benchmark that
                measures what they cost (bench/journal_integrity.py).
        """
        with self._lock:
            if self._db is None:
                return self._unreadable(self._broken or "it is closed")
            problems: list[str] = []
            try:
                checked = (
                    [row[0] for row in self._db.execute("PRAGMA quick_check(5)")]
                    if verify else ["ok"]
                )
                if checked != ["ok"]:
                    problems.append(
                        "its pages are damaged (SQLite's quick_check: " + "; ".join(
                            str(message) for message in checked) + ")"
                    )
                try:
                    loaded = _Loader(self._db, verify=verify).load()
                except sqlite3.OperationalError as error:
                    if "decode" not in str(error):
                        raise
                    # Text that is not UTF-8 stops SQLite's own decoding of the whole query:
                    # read again as bytes, and leave out only the rows that do not decode.
                    loaded = _Loader(self._db, as_bytes=True, verify=verify).load()
            except (sqlite3.DatabaseError, ValueError) as error:
                return self._unreadable(_reason(error))
        return self._checked(loaded, problems)

    def _unreadable(self, reason: str) -> JournalState:
        mark = self._watermark.mark
        acknowledged = mark.revision if mark is not None else 0
        return JournalState(damage=JournalDamage(
            self.path,
            (f"SQLite cannot read it ({reason})",),
            acknowledged_revision=acknowledged,
            unreadable=True,
        ))

    def _checked(self, loaded: _Loaded, page_problems: list[str]) -> JournalState:
        mark = self._watermark.mark
        state = _verdict(
            self.path, loaded, page_problems,
            journal_id=self.journal_id, id_created=self._id_created, mark=mark,
            watermark_problem=self._watermark.problem, watermark_file=self._watermark.path,
        )
        if state.damage is None and (
            mark is None or state.revision > mark.revision or mark.journal_id != self.journal_id
        ):
            self._write_watermark(state.revision, sync=True)
        return state

    # -- going on after damage ---------------------------------------------------------------

    def accept_loss(self, damage: JournalDamage) -> int:
        """Keeps what is readable: deletes the damaged rows and stamps the journal and its
        watermark with a revision past everything ever acknowledged, which it returns (revisions
        handed to clients before the loss stay in the past). A file SQLite cannot read is
        moved aside instead, as ``reset`` does.

        Raises:
            JournalError: the repair could not be written.
        """
        revision = max(damage.readable_revision, damage.acknowledged_revision)
        if damage.unreadable:
            self.reset(revision)
            return revision
        with self._lock:
            assert self._db is not None
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for table, rowid in damage._rowids:
                    self._db.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
                self._db.execute(_SET_META, ("revision", revision))
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise JournalError(f"cannot repair journal {self.path}: {error}") from None
            self._write_watermark(revision, sync=True)
        return revision

    def reset(self, revision: int) -> list[Path]:
        """Moves the file, its ``-wal`` and ``-shm`` and a copy of the watermark into a new
        directory ``<name>.damaged-<time>`` beside it (a data directory of its own, never one
        kept before), and starts an empty journal that continues at ``revision``; returns the
        moved files. When the new journal cannot be started, the files are put back.

        Raises:
            JournalError: the files cannot be moved or the new journal written.
        """
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None
            try:
                kept = keep_aside(self.path, "damaged")
            except OSError as error:
                raise JournalError(f"cannot move journal {self.path} aside: {error}") from None
            try:
                self._broken = None
                self._open()
                if self._db is None:
                    raise JournalError(f"cannot start a new journal {self.path}: {self._broken}")
                try:
                    self._db.execute(_SET_META, ("revision", revision))
                except sqlite3.Error as error:
                    raise JournalError(f"cannot write journal {self.path}: {error}") from None
            except JournalError:
                if self._db is not None:
                    self._db.close()
                    self._db = None
                remove_sqlite_files(self.path)
                with contextlib.suppress(OSError):
                    kept.undo()
                raise
            self._write_watermark(revision, sync=True)
        return list(kept.files)

    def _write_watermark(self, revision: int, *, sync: bool = False) -> None:
        try:
            self._watermark.write(self.journal_id, revision, sync=sync)
        except WatermarkError as error:
            # The change is committed; only the check at the next start is weaker.
            _LOG.error("journal watermark not updated: %s", error)

    # -- writes ------------------------------------------------------------------------------

    def commit(self, ops: Sequence[JournalOp], revision: int) -> None:
        """Writes the changes, stamped with the ledger revision, in one transaction, then
        advances the watermark.

        Raises:
            JournalError: nothing was written (the transaction was rolled back).
        """
        stamped = any(_stamps(op) for op in ops)
        with self._lock:
            if self._db is None:
                raise JournalError(f"cannot write journal {self.path}: {self._broken}")
            try:
                if stamped and len(ops) == 1:
                    # One statement is its own transaction in autocommit mode: RecordPod's usual
                    # write costs one statement instead of three.
                    self._apply(ops[0], revision)
                else:
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
            mark = self._watermark.mark
            if mark is None or revision > mark.revision:
                self._write_watermark(revision)

    def _apply(self, op: JournalOp, revision: int) -> None:
        assert self._db is not None
        if isinstance(op, PutPod):
            values = _pod_values(op.stored, op.traceparent, revision)
            self._db.execute(_UPSERT_POD, (*values, _pod_crc(values)))
        elif isinstance(op, DeletePod):
            self._db.execute("DELETE FROM pods WHERE uid = ?", (op.uid,))
        elif isinstance(op, PutTombstone):
            values = (op.uid, int(op.reservable), revision)
            self._db.execute(_UPSERT_TOMBSTONE, (*values, _triple_crc(values)))
        elif isinstance(op, DeleteTombstones):
            self._db.executemany(
                "DELETE FROM tombstones WHERE uid = ?", [(uid,) for uid in op.uids]
            )
        elif isinstance(op, PutNode):
            values = (op.node_name, encode_devices(op.devices), revision)
            self._db.execute(_UPSERT_NODE, (*values, _triple_crc(values)))
        elif isinstance(op, DeleteNode):
            self._db.execute("DELETE FROM nodes WHERE name = ?", (op.node_name,))
        elif op.limits:
            values = (op.namespace, _encode_limits(op.limits), revision)
            self._db.execute(_UPSERT_QUOTA, (*values, _triple_crc(values)))
        else:
            self._db.execute("DELETE FROM quotas WHERE namespace = ?", (op.namespace,))

    def close(self) -> None:
        """Checkpoints the WAL into the main file, closes the connection and the watermark
        (releasing the data directory) (idempotent)."""
        with self._lock:
            if self._db is not None:
                # A closed or busy file keeps its WAL; the next open replays it.
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.close()
                self._db = None
            self._watermark.close()


def _verdict(
    path: Path,
    loaded: _Loaded,
    page_problems: list[str],
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
    problems.extend(page_problems)
    if not problems:
        return state
    damage = JournalDamage(
        path,
        tuple(_one_line(problem) for problem in problems),
        readable_revision=revision,
        acknowledged_revision=mark.revision if mark is not None else 0,
        damaged_rows=tuple(_one_line(name) for name, _, _ in loaded.damaged),
        _rowids=tuple((table, rowid) for _, table, rowid in loaded.damaged),
    )
    return dataclasses.replace(state, damage=damage)


@dataclass(frozen=True)
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
    if not path.exists():
        damage = JournalDamage(shown, ("the file does not exist",), unreadable=True,
                               acknowledged_revision=mark.revision if mark else 0)
        return Inspection(JournalState(damage=damage), None)
    try:
        db = sqlite3.connect(read_only_uri(path), uri=True, isolation_level=None)
    except sqlite3.Error as error:
        damage = JournalDamage(shown, (f"SQLite cannot read it ({_reason(error)})",),
                               unreadable=True)
        return Inspection(JournalState(damage=damage), None)
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        if "meta" not in tables:
            acknowledged = (f": its watermark says revision {mark.revision} was acknowledged"
                            if mark is not None and mark.revision else "")
            damage = JournalDamage(shown, (f"the file holds no journal{acknowledged}",),
                                   unreadable=True,
                                   acknowledged_revision=mark.revision if mark else 0)
            return Inspection(JournalState(damage=damage), None)
        version_row = db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
        if version_row is None or version_row[0] != SCHEMA_VERSION:
            found = "no schema version" if version_row is None else f"schema {version_row[0]}"
            damage = JournalDamage(shown, (
                f"it has {found}, this build reads schema {SCHEMA_VERSION} (the recorder "
                "migrates versions 1 to 3 when it opens them)",), unreadable=True)
            return Inspection(JournalState(damage=damage), None)
        checked = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
        pages = [] if checked == ["ok"] else [
            "its pages are damaged (SQLite's quick_check: " + "; ".join(map(str, checked)) + ")"
        ]
        id_row = db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
        journal_id = int(id_row[0]) if id_row is not None else None
        try:
            loaded = _Loader(db).load()
        except sqlite3.OperationalError as error:
            if "decode" not in str(error):
                raise
            loaded = _Loader(db, as_bytes=True).load()
    except (sqlite3.DatabaseError, ValueError) as error:
        damage = JournalDamage(shown, (f"SQLite cannot read it ({_reason(error)})",),
                               unreadable=True,
                               acknowledged_revision=mark.revision if mark else 0)
        return Inspection(JournalState(damage=damage), None)
    finally:
        db.close()
    state = _verdict(
        shown, loaded, pages, journal_id=journal_id,
        # Without a watermark to compare, a missing one is not a problem here.
        id_created=not check_mark or journal_id is None, mark=mark if check_mark else None,
        watermark_problem=watermark_problem if check_mark else None,
        watermark_file=watermark_path(shown),
    )
    return Inspection(state, journal_id)


@dataclass(frozen=True)
class _Loaded:
    state: JournalState
    damaged: list[tuple[str, str, int]]
    """(what, table, rowid) of each row left out."""


class _Loader:
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
        columns = _CHECKED_COLUMNS[table]
        crc_of = _CRC[table]
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

    def load(self) -> _Loaded:
        # SQLite's text_factory applies as rows are fetched: keep it for the whole read.
        previous = self._db.text_factory
        if self._as_bytes:
            self._db.text_factory = bytes
        try:
            return self._load()
        finally:
            self._db.text_factory = previous

    def _load(self) -> _Loaded:
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
        decode = _UsageDecoder().decode
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
                StoredPod(uid, intern(namespace), name, intern(node_name), usage,
                          bool(released), bool(terminal), progress, restarts, row_revision or 1,
                          grants)
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
        return _Loaded(state, self.damaged)


def _reason(error: BaseException) -> str:
    """An exception as a short reason for a one-line message."""
    return _one_line(str(error) or type(error).__name__)


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (SQLite's messages span several), shortened past ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"
