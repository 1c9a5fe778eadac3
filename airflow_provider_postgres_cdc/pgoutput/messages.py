"""One slots dataclass per pgoutput logical replication message (protocol versions 1 to 4).

Field names and order follow the PostgreSQL message-format page,
https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html (and the version 16+
page for the protocol 4 Stream Abort fields). Timestamps are kept as PostgreSQL sends them:
microseconds since 2000-01-01 00:00 UTC (``formats.pgtypes.pg_timestamp`` makes them datetimes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from airflow_provider_postgres_cdc.formats.lsn import Lsn


class MessageType(enum.IntEnum):
    """The type byte that starts each message."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    MESSAGE = ord("M")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")
    BEGIN_PREPARE = ord("b")
    PREPARE = ord("P")
    COMMIT_PREPARED = ord("K")
    ROLLBACK_PREPARED = ord("r")
    STREAM_PREPARE = ord("p")


STREAMING_TYPES = frozenset(
    {
        MessageType.STREAM_START,
        MessageType.STREAM_STOP,
        MessageType.STREAM_COMMIT,
        MessageType.STREAM_ABORT,
    }
)
"""Messages of streamed transactions, sent from protocol version 2 on."""
TWO_PHASE_TYPES = frozenset(
    {
        MessageType.BEGIN_PREPARE,
        MessageType.PREPARE,
        MessageType.COMMIT_PREPARED,
        MessageType.ROLLBACK_PREPARED,
        MessageType.STREAM_PREPARE,
    }
)
"""Messages of two-phase transactions, sent from protocol version 3 on."""


class TupleKind(enum.IntEnum):
    """The kind byte before each TupleData column value."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")
    TEXT = ord("t")
    BINARY = ord("b")


TRUNCATE_CASCADE = 1
"""Truncate option bit: the relations were truncated with CASCADE."""
TRUNCATE_RESTART_IDENTITY = 2
"""Truncate option bit: RESTART IDENTITY."""


@dataclass(slots=True, frozen=True)
class TupleData:
    """TupleData: per column a kind (``n``, ``u``, ``t``, ``b``) and the raw bytes for ``t``/``b``.

    ``kinds`` is the kind bytes in column order (``b"tnu"``); ``values[i]`` is ``None`` for ``n``
    and ``u``. Unchanged TOAST (``u``) is therefore told apart from NULL by ``kinds``, never lost.
    """

    kinds: bytes
    values: tuple[bytes | None, ...]

    def is_unchanged(self, index: int) -> bool:
        return self.kinds[index] == TupleKind.UNCHANGED_TOAST

    def text(self, index: int) -> str | None:
        """The value as text (``t`` values are the server's text form), ``None`` for NULL/TOAST."""
        value = self.values[index]
        return None if value is None else value.decode("utf-8")


@dataclass(slots=True, frozen=True)
class Begin:
    """``B``: Int64 final LSN, Int64 commit timestamp, Int32 xid."""

    final_lsn: Lsn
    commit_time: int
    xid: int


@dataclass(slots=True, frozen=True)
class Commit:
    """``C``: Int8 flags (0), Int64 commit LSN, Int64 end LSN, Int64 commit timestamp."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(slots=True, frozen=True)
class Origin:
    """``O``: Int64 commit LSN on the origin server, String origin name."""

    commit_lsn: Lsn
    name: str


@dataclass(slots=True, frozen=True)
class Column:
    """One column of a Relation message: Int8 flags (1 = part of the key), name, type OID, typmod."""

    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(slots=True, frozen=True)
class Relation:
    """``R``: [Int32 xid], Int32 relation id, namespace, name, Int8 replica identity, Int16 n, columns."""

    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_key)

    def same_shape(self, other: Relation) -> bool:
        """Equal apart from the streamed-transaction xid: the same relation version."""
        return (
            self.relation_id == other.relation_id
            and self.namespace == other.namespace
            and self.name == other.name
            and self.replica_identity == other.replica_identity
            and self.columns == other.columns
        )


@dataclass(slots=True, frozen=True)
class Type:
    """``Y``: [Int32 xid], Int32 type OID, namespace, type name (sent for non-built-in types)."""

    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(slots=True, frozen=True)
class Insert:
    """``I``: [Int32 xid], Int32 relation id, Byte1 ``N``, TupleData new row."""

    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(slots=True, frozen=True)
class Update:
    """``U``: [Int32 xid], Int32 relation id, optional ``K``/``O`` + TupleData old, ``N`` + new.

    ``old_kind`` is ``"K"`` (old key: the key changed), ``"O"`` (whole old row, REPLICA IDENTITY
    FULL) or ``None``.
    """

    xid: int | None
    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(slots=True, frozen=True)
class Delete:
    """``D``: [Int32 xid], Int32 relation id, ``K`` or ``O``, TupleData old key or old row."""

    xid: int | None
    relation_id: int
    old_kind: str
    old: TupleData


@dataclass(slots=True, frozen=True)
class Truncate:
    """``T``: [Int32 xid], Int32 relation count, Int8 options (1 CASCADE, 2 RESTART IDENTITY), ids."""

    xid: int | None
    options: int
    relation_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class LogicalMessage:
    """``M``: [Int32 xid], Int8 flags (1 = transactional), Int64 LSN, String prefix, Int32 n, content."""

    xid: int | None
    flags: int
    lsn: Lsn
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(slots=True, frozen=True)
class StreamStart:
    """``S``: Int32 xid, Int8 first-segment flag (1 for the transaction's first chunk)."""

    xid: int
    first_segment: bool


@dataclass(slots=True, frozen=True)
class StreamStop:
    """``E``: no fields."""


@dataclass(slots=True, frozen=True)
class StreamCommit:
    """``c``: Int32 xid, Int8 flags (0), Int64 commit LSN, Int64 end LSN, Int64 commit timestamp."""

    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(slots=True, frozen=True)
class StreamAbort:
    """``A``: Int32 xid, Int32 subtransaction xid (= xid when the whole transaction aborted).

    Protocol 4 with ``streaming = parallel`` adds Int64 abort LSN and Int64 abort timestamp.
    """

    xid: int
    subxid: int
    abort_lsn: Lsn | None = None
    abort_time: int | None = None


@dataclass(slots=True, frozen=True)
class BeginPrepare:
    """``b``: Int64 prepare LSN, Int64 end LSN, Int64 prepare timestamp, Int32 xid, String gid."""

    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(slots=True, frozen=True)
class Prepare:
    """``P``: Int8 flags, Int64 prepare LSN, Int64 end LSN, Int64 prepare timestamp, Int32 xid, gid."""

    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(slots=True, frozen=True)
class CommitPrepared:
    """``K``: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit timestamp, Int32 xid, gid."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int
    xid: int
    gid: str


@dataclass(slots=True, frozen=True)
class RollbackPrepared:
    """``r``: Int8 flags, Int64 prepare end LSN, Int64 rollback end LSN, Int64 prepare and rollback
    timestamps, Int32 xid, String gid."""

    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(slots=True, frozen=True)
class StreamPrepare:
    """``p``: Int8 flags, Int64 prepare LSN, Int64 end LSN, Int64 prepare timestamp, Int32 xid, gid."""

    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
"""Any decoded pgoutput message."""
