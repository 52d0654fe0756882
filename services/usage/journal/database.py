"""The journal: one SQLite file in WAL mode and its watermark, opened, loaded (checked),
written one transaction per acknowledged change, and repaired or set aside after damage.

Layer: services (usage recorder persistence). Every acknowledged change is one transaction,
committed before the recorder replies, so a restarted recorder loads exactly what it had
acknowledged. The layout is in services/usage/journal/schema.py, the rows' encoding in
services/usage/journal/codec.py and the checks a load runs in
services/usage/journal/integrity.py.

Revision. Each row written carries the ledger revision of the change that wrote it, and the
revision is derived at load as the highest one found. A change that writes no row (a pod deleted
while its tombstone already existed, a node dropped, a quota unset) stores it in ``meta``
instead. Writing ``meta`` on every commit would cost a second statement per RecordPod; a
one-statement change runs without BEGIN/COMMIT (autocommit makes the statement its own
transaction).

Durability choice. The file runs in WAL mode. ``synchronous=NORMAL`` (the default here) does
not fsync on every commit: a committed transaction is in the WAL file in the operating system's
page cache, so it survives a crash or SIGKILL of the *process* — which is the guarantee the
recorder gives. Only a power loss or kernel crash can lose the last commits; with a Kubernetes
source those are restored by the re-list at start, and HAMi's informer re-sends pods on its
resync. ``synchronous=FULL`` (HAMI_ACCOUNTING_JOURNAL_SYNC=full) fsyncs every commit and also
survives power loss, at the price of one fsync per write under the store lock.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from services.usage.journal.codec import (
    encode_devices,
    encode_limits,
    pod_crc,
    pod_row_values,
    triple_crc,
)
from services.usage.journal.contents import (
    DeleteNode,
    DeletePod,
    DeleteTombstones,
    JournalOp,
    JournalState,
    PutNode,
    PutPod,
    PutTombstone,
    writes_row,
)
from services.usage.journal.errors import JournalDamage, JournalError, short_reason
from services.usage.journal.integrity import (
    RowsRead,
    page_problems,
    read_rows,
    unreadable_state,
    with_damage_found,
)
from services.usage.journal.schema import (
    SET_META,
    UPSERT_NODE,
    UPSERT_POD,
    UPSERT_QUOTA,
    UPSERT_TOMBSTONE,
    prepare,
)
from services.usage.journal_files import keep_aside, remove_sqlite_files
from services.usage.watermark import Watermark, WatermarkError, watermark_path

_LOG = logging.getLogger(__name__)

JOURNAL_FILE_NAME = "usage.sqlite3"
SYNCHRONOUS_MODES = ("normal", "full")


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
            identity = prepare(self._db, self.path, self._synchronous)
        except JournalError:
            self._db.close()
            self._db = None
            raise
        except (sqlite3.DatabaseError, ValueError) as error:
            # Not a database, a malformed schema, undecodable text (UnicodeDecodeError).
            self._broken = short_reason(error)
            self._db.close()
            self._db = None
            return
        self.journal_id = identity.journal_id
        self._id_created = self._id_created or identity.created

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
            try:
                problems = page_problems(self._db) if verify else []
                loaded = read_rows(self._db, verify=verify)
            except (sqlite3.DatabaseError, ValueError) as error:
                return self._unreadable(short_reason(error))
        return self._checked(loaded, problems)

    def _unreadable(self, reason: str) -> JournalState:
        mark = self._watermark.mark
        acknowledged = mark.revision if mark is not None else 0
        return unreadable_state(self.path, f"SQLite cannot read it ({reason})",
                                acknowledged_revision=acknowledged)

    def _checked(self, loaded: RowsRead, pages: list[str]) -> JournalState:
        mark = self._watermark.mark
        state = with_damage_found(
            self.path, loaded, pages,
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
                for table, rowid in damage.damaged_rowids:
                    self._db.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
                self._db.execute(SET_META, ("revision", revision))
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
                    self._db.execute(SET_META, ("revision", revision))
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
        stamped = any(writes_row(op) for op in ops)
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
                            self._db.execute(SET_META, ("revision", revision))
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
            values = pod_row_values(op.stored, op.traceparent, revision)
            self._db.execute(UPSERT_POD, (*values, pod_crc(values)))
        elif isinstance(op, DeletePod):
            self._db.execute("DELETE FROM pods WHERE uid = ?", (op.uid,))
        elif isinstance(op, PutTombstone):
            values = (op.uid, int(op.reservable), revision)
            self._db.execute(UPSERT_TOMBSTONE, (*values, triple_crc(values)))
        elif isinstance(op, DeleteTombstones):
            self._db.executemany(
                "DELETE FROM tombstones WHERE uid = ?", [(uid,) for uid in op.uids]
            )
        elif isinstance(op, PutNode):
            values = (op.node_name, encode_devices(op.devices), revision)
            self._db.execute(UPSERT_NODE, (*values, triple_crc(values)))
        elif isinstance(op, DeleteNode):
            self._db.execute("DELETE FROM nodes WHERE name = ?", (op.node_name,))
        elif op.limits:
            values = (op.namespace, encode_limits(op.limits), revision)
            self._db.execute(UPSERT_QUOTA, (*values, triple_crc(values)))
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

