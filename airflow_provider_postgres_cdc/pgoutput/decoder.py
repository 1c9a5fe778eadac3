"""The per-message pgoutput decoder: bytes in, one typed message out.

The columnar decoder (:mod:`.columnar`) sends it the control messages (Relation, Type, Origin,
Truncate, Message, streaming and two-phase messages, and Begin and Commit outside its bulk path:
the relation cache and streaming state they update are kept here) and, when its vector checks
find a malformed data message, that message, to raise the precise error.
``pgcdc peek`` prints what it returns for every message. It does no I/O: the caller hands it
each message's bytes (one row of ``pg_logical_slot_peek_binary_changes`` or the payload of one
XLogData message).

Every failure is one :class:`PgOutputDecodeError` naming the message type, the byte offset inside
the message and the LSN when known: a truncated buffer, a length running past the end, an
unknown type or tuple-kind byte, trailing bytes, or a change for a relation id never announced.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.wire import (
    BEGIN,
    BEGIN_PREPARE_HEAD,
    COLUMN_TAIL,
    COMMIT,
    PREPARE_HEAD,
    ROLLBACK_PREPARED_HEAD,
    STREAM_ABORT,
    STREAM_ABORT_V4,
    STREAM_COMMIT,
    STREAM_START,
)
from airflow_provider_postgres_cdc.pgoutput.messages import (
    STREAMING_TYPES,
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    TWO_PHASE_TYPES,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    MessageType,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TupleKind,
    Type,
    Update,
)
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")

_TEXT = TupleKind.TEXT
_BINARY = TupleKind.BINARY
_NULL = TupleKind.NULL
_UNCHANGED = TupleKind.UNCHANGED_TOAST
_STREAMED_XID_TYPES = frozenset(
    {
        MessageType.RELATION,
        MessageType.TYPE,
        MessageType.INSERT,
        MessageType.UPDATE,
        MessageType.DELETE,
        MessageType.TRUNCATE,
        MessageType.MESSAGE,
    }
)


# Messages that exist only from a protocol version on: streaming (2) and two-phase commit (3).
_MIN_VERSION: dict[int, int] = {**dict.fromkeys(STREAMING_TYPES, 2), **dict.fromkeys(TWO_PHASE_TYPES, 3)}

_TRUNCATE_OPTIONS = TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY


class _Reader:
    """A bounds-checked cursor over one message; every read failure becomes a decode error."""

    __slots__ = ("data", "lsn", "pos", "type_char")

    def __init__(self, data: bytes, lsn: Lsn | None) -> None:
        self.data = data
        self.pos = 1
        self.lsn = lsn
        self.type_char = chr(data[0]) if data else "?"

    def fail(self, reason: str, offset: int | None = None) -> PgOutputDecodeError:
        return PgOutputDecodeError(
            reason, message_type=self.type_char, offset=self.pos if offset is None else offset, lsn=self.lsn
        )

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        if self.pos + fmt.size > len(self.data):
            raise self.fail(f"truncated: needs {fmt.size} bytes, {len(self.data) - self.pos} left")
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def int_(self, fmt: struct.Struct) -> int:
        return self.unpack(fmt)[0]

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise self.fail("unterminated string")
        try:
            text = self.data[self.pos : end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(
                f"string {self.data[self.pos : end]!r} is not UTF-8 ({exc.reason}): a SQL_ASCII database "
                "can hold such a schema, table, column or type name, the lake cannot; rename it to valid "
                "UTF-8 (ALTER ... RENAME TO)"
            ) from None
        self.pos = end + 1
        return text

    def take(self, length: int) -> bytes:
        if length < 0 or self.pos + length > len(self.data):
            raise self.fail(f"length {length} runs past the end ({len(self.data) - self.pos} bytes left)")
        value = self.data[self.pos : self.pos + length]
        self.pos += length
        return value

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise self.fail("truncated: needs 1 byte, 0 left")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def tuple_data(self) -> TupleData:
        count = self.int_(_I16)
        if count < 0:
            raise self.fail(f"negative column count {count}", self.pos - 2)
        kinds = bytearray(count)
        values: list[bytes | None] = []
        for index in range(count):
            kind = self.byte()
            kinds[index] = kind
            if kind in (_TEXT, _BINARY):
                values.append(self.take(self.int_(_I32)))
            elif kind in (_NULL, _UNCHANGED):
                values.append(None)
            else:
                raise self.fail(f"unknown tuple kind byte {kind!r} in column {index}", self.pos - 1)
        return TupleData(bytes(kinds), tuple(values))

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} trailing bytes")


class PgOutputDecoder:
    """Decodes the messages of one pgoutput stream in order, tracking the state they depend on.

    The state is: whether we are inside a streamed transaction chunk (Stream Start .. Stream Stop),
    where Relation, Type, Insert, Update, Delete, Truncate and Message carry an extra Xid field;
    and the relation cache that turns relation ids into column lists. Changes for a relation id
    never announced, or whose column count differs from the announcement, are rejected.

    :param protocol_version: the ``proto_version`` the stream was requested with (1 to 4).
    """

    def __init__(self, protocol_version: int = 1, relations: RelationCache | None = None) -> None:
        if not 1 <= protocol_version <= 4:
            raise ValueError(f"protocol_version must be 1..4, not {protocol_version}")
        self.protocol_version = protocol_version
        self.relations = relations if relations is not None else RelationCache()
        self.in_stream = False
        self._handlers: dict[int, Callable[[_Reader, int | None], Message]] = {
            MessageType.BEGIN: _begin,
            MessageType.COMMIT: _commit,
            MessageType.ORIGIN: _origin,
            MessageType.RELATION: self._relation,
            MessageType.TYPE: self._type,
            MessageType.INSERT: self._insert,
            MessageType.UPDATE: self._update,
            MessageType.DELETE: self._delete,
            MessageType.TRUNCATE: self._truncate,
            MessageType.MESSAGE: _logical_message,
            MessageType.STREAM_START: self._stream_start,
            MessageType.STREAM_STOP: self._stream_stop,
            MessageType.STREAM_COMMIT: _stream_commit,
            MessageType.STREAM_ABORT: self._stream_abort,
            MessageType.BEGIN_PREPARE: _begin_prepare,
            MessageType.PREPARE: _prepare,
            MessageType.COMMIT_PREPARED: _commit_prepared,
            MessageType.ROLLBACK_PREPARED: _rollback_prepared,
            MessageType.STREAM_PREPARE: _stream_prepare,
        }

    def decode(self, data: bytes, lsn: Lsn | int | None = None) -> Message:
        """Decode one message (the full payload, type byte first)."""
        reader = _Reader(bytes(data), None if lsn is None else Lsn(lsn))
        if not data:
            raise reader.fail("empty message", 0)
        handler = self._handlers.get(data[0])
        if handler is None:
            raise reader.fail(f"unknown message type byte {data[0]!r}", 0)
        if _MIN_VERSION.get(data[0], 1) > self.protocol_version:
            raise reader.fail(f"not part of protocol version {self.protocol_version}", 0)
        xid = None
        if self.in_stream and data[0] in _STREAMED_XID_TYPES:
            xid = reader.int_(_U32)
        message = handler(reader, xid)
        reader.end()
        return message

    def _relation(self, reader: _Reader, xid: int | None) -> Relation:
        relation_id = reader.int_(_U32)
        namespace = reader.string()
        name = reader.string()
        identity = chr(reader.byte())
        count = reader.int_(_I16)
        if count < 0:
            raise reader.fail(f"negative column count {count}", reader.pos - 2)
        columns = []
        for _ in range(count):
            flags = reader.byte()
            column_name = reader.string()
            type_oid, typmod = reader.unpack(COLUMN_TAIL)
            columns.append(Column(flags, column_name, type_oid, typmod))
        relation = Relation(xid, relation_id, namespace, name, identity, tuple(columns))
        self.relations.add(relation)
        return relation

    def _type(self, reader: _Reader, xid: int | None) -> Type:
        type_oid = reader.int_(_U32)
        message = Type(xid, type_oid, reader.string(), reader.string())
        self.relations.add_type(message)
        return message

    def _checked_relation(self, reader: _Reader) -> int:
        offset = reader.pos
        relation_id = reader.int_(_U32)
        if relation_id not in self.relations:
            raise reader.fail(f"relation id {relation_id} was never announced by a Relation message", offset)
        return relation_id

    def _checked_tuple(self, reader: _Reader, relation_id: int) -> TupleData:
        offset = reader.pos
        data = reader.tuple_data()
        expected = len(self.relations[relation_id].columns)
        if len(data.kinds) != expected:
            raise reader.fail(
                f"tuple has {len(data.kinds)} columns, relation {relation_id} has {expected}", offset
            )
        return data

    def _expect(self, reader: _Reader, allowed: bytes) -> int:
        kind = reader.byte()
        if kind not in allowed:
            raise reader.fail(f"expected one of {allowed.decode()!r}, got byte {kind!r}", reader.pos - 1)
        return kind

    def _insert(self, reader: _Reader, xid: int | None) -> Insert:
        relation_id = self._checked_relation(reader)
        self._expect(reader, b"N")
        return Insert(xid, relation_id, self._checked_tuple(reader, relation_id))

    def _update(self, reader: _Reader, xid: int | None) -> Update:
        relation_id = self._checked_relation(reader)
        kind = self._expect(reader, b"KON")
        old_kind = None
        old = None
        if kind != ord("N"):
            old_kind = chr(kind)
            old = self._checked_tuple(reader, relation_id)
            self._expect(reader, b"N")
        return Update(xid, relation_id, old_kind, old, self._checked_tuple(reader, relation_id))

    def _delete(self, reader: _Reader, xid: int | None) -> Delete:
        relation_id = self._checked_relation(reader)
        kind = chr(self._expect(reader, b"KO"))
        return Delete(xid, relation_id, kind, self._checked_tuple(reader, relation_id))

    def _truncate(self, reader: _Reader, xid: int | None) -> Truncate:
        count = reader.int_(_U32)
        options = reader.byte()
        if options & ~_TRUNCATE_OPTIONS:  # pgoutput sets only CASCADE (1) and RESTART IDENTITY (2)
            raise reader.fail(
                f"truncate options {options:#04x} set bits PostgreSQL does not define", reader.pos - 1
            )
        if count > (len(reader.data) - reader.pos) // 4:
            raise reader.fail(f"relation count {count} runs past the end", reader.pos - 5)
        ids = []
        for _ in range(count):
            ids.append(self._checked_relation(reader))
        return Truncate(xid, options, tuple(ids))

    def _stream_start(self, reader: _Reader, xid: int | None) -> StreamStart:
        stream_xid, first = reader.unpack(STREAM_START)
        self.in_stream = True
        return StreamStart(stream_xid, bool(first))

    def _stream_stop(self, reader: _Reader, xid: int | None) -> StreamStop:
        self.in_stream = False
        return StreamStop()

    def _stream_abort(self, reader: _Reader, xid: int | None) -> StreamAbort:
        # Protocol 4 adds abort LSN and time only with streaming = parallel: tell by the length.
        if self.protocol_version >= 4 and len(reader.data) == 1 + STREAM_ABORT_V4.size:
            top, sub, abort_lsn, abort_time = reader.unpack(STREAM_ABORT_V4)
            return StreamAbort(top, sub, Lsn(abort_lsn), abort_time)
        top, sub = reader.unpack(STREAM_ABORT)
        return StreamAbort(top, sub)


def _begin(reader: _Reader, xid: int | None) -> Begin:
    final_lsn, commit_time, begin_xid = reader.unpack(BEGIN)
    return Begin(Lsn(final_lsn), commit_time, begin_xid)


def _commit(reader: _Reader, xid: int | None) -> Commit:
    flags, commit_lsn, end_lsn, commit_time = reader.unpack(COMMIT)
    return Commit(flags, Lsn(commit_lsn), Lsn(end_lsn), commit_time)


def _origin(reader: _Reader, xid: int | None) -> Origin:
    commit_lsn = reader.int_(_U64)
    return Origin(Lsn(commit_lsn), reader.string())


def _logical_message(reader: _Reader, xid: int | None) -> LogicalMessage:
    flags = reader.byte()
    lsn = reader.int_(_U64)
    prefix = reader.string()
    content = reader.take(reader.int_(_I32))
    return LogicalMessage(xid, flags, Lsn(lsn), prefix, content)


def _stream_commit(reader: _Reader, xid: int | None) -> StreamCommit:
    stream_xid, flags, commit_lsn, end_lsn, commit_time = reader.unpack(STREAM_COMMIT)
    return StreamCommit(stream_xid, flags, Lsn(commit_lsn), Lsn(end_lsn), commit_time)


def _begin_prepare(reader: _Reader, xid: int | None) -> BeginPrepare:
    prepare_lsn, end_lsn, prepare_time, prepare_xid = reader.unpack(BEGIN_PREPARE_HEAD)
    return BeginPrepare(Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, prepare_xid, reader.string())


def _prepare(reader: _Reader, xid: int | None) -> Prepare:
    flags, prepare_lsn, end_lsn, prepare_time, prepare_xid = reader.unpack(PREPARE_HEAD)
    return Prepare(flags, Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, prepare_xid, reader.string())


def _commit_prepared(reader: _Reader, xid: int | None) -> CommitPrepared:
    flags, commit_lsn, end_lsn, commit_time, commit_xid = reader.unpack(PREPARE_HEAD)
    return CommitPrepared(flags, Lsn(commit_lsn), Lsn(end_lsn), commit_time, commit_xid, reader.string())


def _rollback_prepared(reader: _Reader, xid: int | None) -> RollbackPrepared:
    flags, prepare_end, rollback_end, prepare_time, rollback_time, rb_xid = reader.unpack(
        ROLLBACK_PREPARED_HEAD
    )
    return RollbackPrepared(
        flags, Lsn(prepare_end), Lsn(rollback_end), prepare_time, rollback_time, rb_xid, reader.string()
    )


def _stream_prepare(reader: _Reader, xid: int | None) -> StreamPrepare:
    flags, prepare_lsn, end_lsn, prepare_time, prepare_xid = reader.unpack(PREPARE_HEAD)
    return StreamPrepare(flags, Lsn(prepare_lsn), Lsn(end_lsn), prepare_time, prepare_xid, reader.string())
