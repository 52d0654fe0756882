"""The usage recorder's journal: the acknowledged ledger state in an embedded SQLite file.

Layer: services (usage recorder persistence). This face hands on the names the recorder and
the journal commands use; the pieces are ``database`` (the Journal: open, load, commit,
repair), ``schema`` (tables, versions, migration), ``codec`` (a row's values and checksum),
``integrity`` (the checked read and the read-only inspection), ``contents`` (the changes a
transaction carries, the state a load returns) and ``errors`` (what can be wrong, and what the
recorder may do about it).
"""

from services.usage.journal.codec import decode_devices, decode_grants, decode_usage
from services.usage.journal.contents import (
    DeleteNode,
    DeletePod,
    DeleteTombstones,
    JournalOp,
    JournalState,
    PutNode,
    PutPod,
    PutQuota,
    PutTombstone,
)
from services.usage.journal.database import JOURNAL_FILE_NAME, SYNCHRONOUS_MODES, Journal
from services.usage.journal.errors import (
    EXIT_JOURNAL_DAMAGED,
    ON_DAMAGE_ACCEPT_LOSS,
    ON_DAMAGE_MODES,
    ON_DAMAGE_REBUILD,
    ON_DAMAGE_REFUSE,
    JournalDamage,
    JournalDamagedError,
    JournalError,
    JournalSchemaError,
)
from services.usage.journal.integrity import (
    Inspection,
    inspect_journal,
    read_journal_id,
    read_only_uri,
)
from services.usage.journal.schema import SCHEMA_VERSION

__all__ = [
    "EXIT_JOURNAL_DAMAGED",
    "JOURNAL_FILE_NAME",
    "ON_DAMAGE_ACCEPT_LOSS",
    "ON_DAMAGE_MODES",
    "ON_DAMAGE_REBUILD",
    "ON_DAMAGE_REFUSE",
    "SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "DeleteNode",
    "DeletePod",
    "DeleteTombstones",
    "Inspection",
    "Journal",
    "JournalDamage",
    "JournalDamagedError",
    "JournalError",
    "JournalOp",
    "JournalSchemaError",
    "JournalState",
    "PutNode",
    "PutPod",
    "PutQuota",
    "PutTombstone",
    "decode_devices",
    "decode_grants",
    "decode_usage",
    "inspect_journal",
    "read_journal_id",
    "read_only_uri",
]
