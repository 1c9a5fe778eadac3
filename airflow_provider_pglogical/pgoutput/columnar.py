"""The columnar route: many raw pgoutput messages -> typed change tables, without a Python object
per value (see :mod:`.arrow` for the output format and the reference route it must equal).

How: the messages are joined into one buffer viewed as a numpy array. The control messages
(everything but Insert, Update and Delete: a few per transaction) go through the per-message
:class:`~.decoder.PgOutputDecoder`, which keeps the relation cache and streaming state, and a
small state machine that records, per transaction, the *runs* of data messages between them.
Once the committed transactions are known, their data rows are grouped by relation version and
each group is parsed at once: for every column, numpy computes the kind byte, value offset and
length of that column in all rows, bounds-checked against each message's end. The text values
become an Arrow ``string_view`` array whose views point into the joined buffer (no copy), which
:func:`..types.text_to_arrow` casts. Any inconsistency found by the vector checks is re-decoded
by the per-message decoder to raise its precise :class:`PgOutputDecodeError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from airflow_provider_pglogical.formats.lsn import Lsn
from airflow_provider_pglogical.pgoutput.arrow import (
    DEFAULT_MAX_ROWS,
    MIXED_FORMATS,
    TRANSACTION_SCHEMA,
    UNCHANGED_OLD,
    BoolArray,
    DecodedBatch,
    Int64Array,
    TableChanges,
    VersionKeys,
    _Columns,
    build_batches,
    check_stageable,
    table_relation,
)
from airflow_provider_pglogical.pgoutput.decoder import PgOutputDecoder
from airflow_provider_pglogical.pgoutput.errors import PgOutputDecodeError
from airflow_provider_pglogical.pgoutput.messages import (
    PG_EPOCH_US,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
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
    TupleKind,
)
from airflow_provider_pglogical.pgoutput.relations import RelationCache
from airflow_provider_pglogical.values.raw_text import escape_raw_text

_PAD = bytes(16)
LsnArray = Sequence[int] | npt.NDArray[np.uint64]
"""Message LSNs, only used to name the position in error reports."""
_WINDOW = 1 << 30  # string_view offsets are int32: data buffers are 2 GiB windows every 1 GiB.
_IS_DATA = np.zeros(256, dtype=np.bool_)
_IS_DATA[[MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE]] = True
_OPS = pa.array(["I", "U", "D", "T"], pa.string())
_OP_CODE = np.zeros(256, dtype=np.int64)
_OP_CODE[MessageType.UPDATE] = 1
_OP_CODE[MessageType.DELETE] = 2
_K, _O, _N = ord("K"), ord("O"), ord("N")
_T_KIND, _B_KIND = TupleKind.TEXT.value, TupleKind.BINARY.value
_U_KIND, _NULL_KIND = TupleKind.UNCHANGED_TOAST.value, TupleKind.NULL.value

# Streaming and two-phase messages: transactions interleave or wait, the general walk handles them.
_NEEDS_WALK = np.zeros(256, dtype=np.bool_)
_NEEDS_WALK[[ord(c) for c in "SEcAbPKrp"]] = True
_IS_BEGIN_OR_COMMIT = np.zeros(256, dtype=np.bool_)
_IS_BEGIN_OR_COMMIT[[MessageType.BEGIN, MessageType.COMMIT]] = True
_BEGIN_SIZE = 21
_COMMIT_SIZE = 26

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True)
class _Run:
    """Data messages ``lo..hi-1`` of the batch, sent with the relation cache generation ``gen``."""

    lo: int
    hi: int
    prefix: int
    gen: int


@dataclass(slots=True)
class _TruncateRows:
    relations: list[Relation]
    options: int
    xid: int | None


@dataclass(slots=True)
class _Txn:
    xid: int
    items: list[_Run | _TruncateRows] = field(default_factory=list)
    messages: list[LogicalMessage] = field(default_factory=list)
    origin: Origin | None = None
    aborted: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Committed:
    txn: _Txn
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    gid: str | None
    streamed: bool


@dataclass(slots=True)
class _TxnColumns:
    """Per committed transaction, by commit ordinal: what its rows repeat and the batch reports."""

    xid: Int64Array
    commit_lsn: Int64Array
    end_lsn: Int64Array
    commit_time: Int64Array
    changes: Int64Array
    streamed: BoolArray
    gid: dict[int, str]  # by ordinal, only for two-phase transactions
    origin: dict[int, Origin]  # by ordinal, only for transactions replayed from an origin

    @classmethod
    def of(cls, committed: list[_Committed], changes: Int64Array) -> _TxnColumns:
        return cls(
            xid=np.array([c.xid for c in committed], dtype=np.int64),
            commit_lsn=np.array([c.commit_lsn for c in committed], dtype=np.uint64).astype(np.int64),
            end_lsn=np.array([c.end_lsn for c in committed], dtype=np.uint64).astype(np.int64),
            commit_time=np.array([c.commit_time for c in committed], dtype=np.int64),
            changes=changes,
            streamed=np.array([c.streamed for c in committed], dtype=np.bool_),
            gid={i: c.gid for i, c in enumerate(committed) if c.gid is not None},
            origin={i: c.txn.origin for i, c in enumerate(committed) if c.txn.origin is not None},
        )

    def __post_init__(self) -> None:
        check_stageable(self.commit_lsn, self.end_lsn, self.commit_time)

    def table(self) -> pa.Table:
        return pa.table(
            [
                pa.array(self.xid, pa.int64()),
                pa.array(self.commit_lsn, pa.int64()),
                pa.array(self.end_lsn, pa.int64()),
                pa.array(self.commit_time + PG_EPOCH_US, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(self.changes, pa.int64()),
                pa.array(self.streamed, pa.bool_()),
                _sparse(self.gid, len(self.xid), pa.string()),
                _sparse({i: o.name for i, o in self.origin.items()}, len(self.xid), pa.string()),
                _sparse({i: int(o.commit_lsn) for i, o in self.origin.items()}, len(self.xid), pa.int64()),
            ],
            schema=TRANSACTION_SCHEMA,
        )


def _sparse(values: dict[int, Any], count: int, data_type: pa.DataType) -> pa.Array:
    """An array of ``count`` nulls but at the positions ``values`` names."""
    if not values:
        return pa.nulls(count, data_type)
    items: list[Any] = [None] * count
    for position, value in values.items():
        items[position] = value
    return pa.array(items, data_type)


class _Tracker:
    """The per-transaction state machine of the columnar route (control messages only)."""

    def __init__(self) -> None:
        self.current: _Txn | None = None
        self.streams: dict[int, _Txn] = {}
        self.stream_xid: int | None = None
        self.prepared: dict[str, _Txn] = {}
        self.committed: list[_Committed] = []
        self.messages: list[LogicalMessage] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            Begin: self._begin,
            BeginPrepare: self._begin,
            Commit: self._commit,
            Prepare: self._prepare,
            StreamStart: self._stream_start,
            StreamStop: self._stream_stop,
            StreamCommit: self._stream_commit,
            StreamAbort: self._stream_abort,
            StreamPrepare: self._stream_prepare,
            CommitPrepared: self._commit_prepared,
            RollbackPrepared: self._rollback_prepared,
        }

    def target(self) -> _Txn | None:
        return self.streams[self.stream_xid] if self.stream_xid is not None else self.current

    def commit(
        self,
        txn: _Txn | None,
        xid: int,
        ends: tuple[Lsn, Lsn, int],
        gid: str | None = None,
        streamed: bool = False,
    ) -> None:
        if txn is None:
            raise ValueError("end of a transaction that was not seen")
        self.committed.append(_Committed(txn, xid, *ends, gid, streamed))
        self.messages.extend(txn.messages)

    def control(self, message: Message, relations: RelationCache) -> None:
        if isinstance(message, Origin | LogicalMessage | Truncate):
            self._in_transaction(message, relations)
            return
        handler = self._handlers.get(type(message))
        if handler is not None:
            handler(message)

    def _begin(self, message: Begin | BeginPrepare) -> None:
        if self.current is not None:
            raise ValueError(
                f"Begin of transaction {message.xid} while transaction {self.current.xid} is still open"
            )
        self.current = _Txn(message.xid)

    def _commit(self, message: Commit) -> None:
        txn, self.current = self.current, None
        self.commit(txn, txn.xid if txn else 0, (message.commit_lsn, message.end_lsn, message.commit_time))

    def _prepare(self, message: Prepare) -> None:
        if self.current is None:
            raise ValueError("Prepare without Begin Prepare")
        self.prepared[message.gid], self.current = self.current, None

    def _stream_start(self, message: StreamStart) -> None:
        self.stream_xid = message.xid
        self.streams.setdefault(message.xid, _Txn(message.xid))

    def _stream_stop(self, message: StreamStop) -> None:
        self.stream_xid = None

    def _stream_commit(self, message: StreamCommit) -> None:
        txn = self.streams.pop(message.xid, None)
        self.commit(
            txn, message.xid, (message.commit_lsn, message.end_lsn, message.commit_time), streamed=True
        )

    def _stream_abort(self, message: StreamAbort) -> None:
        if message.xid == message.subxid:
            self.streams.pop(message.xid, None)
        elif message.xid in self.streams:
            self.streams[message.xid].aborted.add(message.subxid)

    def _stream_prepare(self, message: StreamPrepare) -> None:
        txn = self.streams.pop(message.xid, None)
        if txn is None:
            raise ValueError("Stream Prepare of a transaction that never streamed")
        self.prepared[message.gid] = txn

    def _commit_prepared(self, message: CommitPrepared) -> None:
        txn = self.prepared.pop(message.gid, None)
        if txn is None:
            raise ValueError(f"Commit Prepared for {message.gid!r} whose Prepare was not in this batch")
        self.commit(txn, message.xid, (message.commit_lsn, message.end_lsn, message.commit_time), message.gid)

    def _rollback_prepared(self, message: RollbackPrepared) -> None:
        self.prepared.pop(message.gid, None)

    def _in_transaction(self, message: Origin | LogicalMessage | Truncate, relations: RelationCache) -> None:
        target = self.target()
        if isinstance(message, LogicalMessage):
            if message.transactional and target is not None:
                target.messages.append(message)
            else:
                self.messages.append(message)
        elif target is None:
            if isinstance(message, Truncate):
                raise ValueError("Truncate outside any transaction")
        elif isinstance(message, Origin):
            target.origin = message
        else:
            target.items.append(
                _TruncateRows([relations[r] for r in message.relation_ids], message.options, message.xid)
            )


class BatchDecoder:
    """Decodes many raw pgoutput messages at once into typed change tables (the drain's API).

    One instance follows one stream: the relation cache carries over between calls. Streamed or
    prepared transactions still undecided at the end of a call are reported in
    ``DecodedBatch.open_xids`` / ``prepared_gids`` and dropped: with the SQL peek transport the
    server sends them again, whole, on the next call that reaches their end.

    :param protocol_version: the ``proto_version`` the messages were requested with.
    :param max_rows: rows per output record batch.
    :param raw_text: values are the bytes a SQL_ASCII database stored, staged by the rule of
        ``raw_text.py``; otherwise they are UTF-8 (the server converted them) and an invalid
        value is an error.
    """

    def __init__(
        self, protocol_version: int = 1, *, max_rows: int = DEFAULT_MAX_ROWS, raw_text: bool = False
    ) -> None:
        self.protocol_version = protocol_version
        self.max_rows = max_rows
        self.raw_text = raw_text
        self.relations = RelationCache()

    def decode(self, messages: Sequence[bytes], lsns: Sequence[int] | None = None) -> DecodedBatch:
        """Decode ``messages`` (each one complete pgoutput message, in stream order).

        ``lsns`` (one per message, as returned next to each message by the peek function) only
        serves error reports.
        """
        lengths: Int64Array = np.fromiter(map(len, messages), dtype=np.int64, count=len(messages))
        starts: Int64Array = np.cumsum(lengths) - lengths
        return self.prepare(b"".join(messages) + _PAD, starts, lengths, lsns).build()

    def prepare(
        self,
        buffer: bytes,
        starts: Int64Array,
        lengths: Int64Array,
        lsns: LsnArray | None = None,
        *,
        first_seq: int = 0,
    ) -> PreparedBatch:
        """The first, cheap half of decoding messages already in one buffer (message ``i`` at
        ``buffer[starts[i]:starts[i] + lengths[i]]``, as a binary COPY stream delivers them: no
        per-message slicing or joining); :meth:`PreparedBatch.build` does the rest.

        This half walks the control messages, the only step that reads and updates this
        decoder's relation cache, so calls must come in stream order; builds need not. ``buffer``
        must extend at least 16 bytes past the end of the last message (anything may fill them).
        ``first_seq`` numbers the changes of the first transaction from there on, for a large
        transaction decoded in pieces (each wrapped in its Begin and Commit); the reported
        change counts are this call's only."""
        if len(starts) and int(starts[-1] + lengths[-1]) + len(_PAD) > len(buffer):
            raise ValueError("prepare needs 16 bytes after the last message; pad the buffer")
        batch = _Batch(buffer, starts, lengths, lsns, self.protocol_version, self.relations, self.raw_text)
        plain = batch.plain_transactions()
        if plain is not None:
            rows, per_txn, logical_messages = plain
            open_xids: list[int] = []
            prepared: list[str] = []
        else:
            tracker = batch.walk_control_messages()
            rows, changes = batch.committed_rows(tracker)
            batch.check_discarded(rows)
            per_txn = _TxnColumns.of(tracker.committed, changes)
            logical_messages = sorted(tracker.messages, key=lambda m: m.lsn)
            open_xids = sorted([*tracker.streams, *([tracker.current.xid] if tracker.current else [])])
            prepared = sorted(tracker.prepared)
        if first_seq:
            rows = rows.continuing(first_seq)
        return PreparedBatch(batch, rows, per_txn, logical_messages, open_xids, prepared, self.max_rows)


@dataclass(slots=True)
class PreparedBatch:
    """Committed rows found, not yet typed. :meth:`build` reads only what this object holds
    (the relation versions in force were captured by :meth:`BatchDecoder.prepare`), so several
    batches of one stream can be built at once on different threads."""

    batch: _Batch
    rows: _Rows
    per_txn: _TxnColumns
    messages: list[LogicalMessage]
    open_xids: list[int]
    prepared_gids: list[str]
    max_rows: int

    @property
    def last_changes(self) -> int:
        """Changes of the last committed transaction in this call (0 when none committed)."""
        return int(self.per_txn.changes[-1]) if len(self.per_txn.changes) else 0

    def build(self) -> DecodedBatch:
        """Type the rows into one table per relation version (the costly, numpy/Arrow half)."""
        return DecodedBatch(
            tables=self.batch.tables(self.rows, self.per_txn, self.max_rows),
            transactions=self.per_txn.table(),
            messages=self.messages,
            open_xids=self.open_xids,
            prepared_gids=self.prepared_gids,
        )


class _Slices(Sequence[bytes]):
    """Message ``i`` of a buffer as bytes, sliced only when asked for (control messages, errors)."""

    def __init__(self, buffer: bytes, starts: Int64Array, lengths: Int64Array) -> None:
        self._buffer = buffer
        self._starts = starts
        self._lengths = lengths

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start = int(self._starts[index])
        return self._buffer[start : start + int(self._lengths[index])]


@dataclass(slots=True)
class _Rows:
    """Committed data rows in commit order: message index, transaction ordinal, seq, generation."""

    msg: Int64Array
    txn: Int64Array
    seq: Int64Array
    gen: Int64Array
    prefix: Int64Array
    truncates: list[tuple[int, int, Relation, int]]  # (txn ordinal, seq, relation, options)

    def continuing(self, first_seq: int) -> _Rows:
        """The same rows with the first transaction's changes numbered from ``first_seq``."""
        seq = self.seq + np.where(self.txn == 0, first_seq, 0)
        truncates = [(t, s + (first_seq if t == 0 else 0), r, o) for t, s, r, o in self.truncates]
        return _Rows(self.msg, self.txn, seq, self.gen, self.prefix, truncates)


class _Batch:
    """One call's joined buffer and the per-message arrays over it."""

    def __init__(
        self,
        joined: bytes,
        starts: Int64Array,
        lengths: Int64Array,
        lsns: LsnArray | None,
        protocol_version: int,
        relations: RelationCache,
        raw_text: bool = False,
    ) -> None:
        """``joined`` holds message ``i`` at ``starts[i]:starts[i] + lengths[i]`` (gaps allowed)
        and ends with at least 16 padding bytes, so fixed-width gathers never run off its end.
        ``raw_text``: text values are SQL_ASCII bytes (see :class:`BatchDecoder`)."""
        self.messages = _Slices(joined, starts, lengths)
        self.lsns = lsns
        self.decoder = PgOutputDecoder(protocol_version, relations)
        count = len(starts)
        self.lengths: Int64Array = lengths
        if count and not self.lengths.all():
            self.fail_message(int(np.argmin(self.lengths)))
        self.starts: Int64Array = starts
        self.ends: Int64Array = starts + lengths
        self.buf: U8Array = np.frombuffer(joined, dtype=np.uint8)
        # Overlapping 16- and 4-byte windows at every offset: one gather reads a view or an int.
        self.views = np.ndarray(shape=(self.buf.size - 15,), dtype="V16", buffer=joined, strides=(1,))
        self._words = np.ndarray(shape=(self.buf.size - 3,), dtype=">u4", buffer=joined, strides=(1,))
        self._quads = np.ndarray(shape=(self.buf.size - 7,), dtype=">i8", buffer=joined, strides=(1,))
        whole = pa.py_buffer(joined)
        self.data_buffers = [
            whole.slice(k * _WINDOW, min(2 * _WINDOW, len(joined) - k * _WINDOW))
            for k in range(max(1, -(-len(joined) // _WINDOW)))
        ]
        self.types: U8Array = self.buf[self.starts] if count else np.zeros(0, np.uint8)
        # Relation cache generation -> relation id -> Relation in force.
        self.generations: list[dict[int, Relation]] = []
        self.runs: list[_Run] = []  # every run of data messages, committed or not
        self.raw_text = raw_text

    def lsn(self, index: int) -> Lsn | None:
        return None if self.lsns is None else Lsn(int(self.lsns[index]))

    def fail_message(self, index: int, gen: int | None = None, prefix: int = 0) -> NoReturn:
        """Re-decode one message with the per-message decoder, which raises the precise error."""
        relations = RelationCache()
        if gen is not None:
            for relation in self.generations[gen].values():
                relations.add(relation)
        decoder = PgOutputDecoder(self.decoder.protocol_version, relations)
        decoder.in_stream = prefix > 0
        decoder.decode(self.messages[index], self.lsn(index))
        raise PgOutputDecodeError(
            "message failed a columnar consistency check", message_type=chr(self.types[index]), offset=0,
            lsn=self.lsn(index),
        )  # fmt: skip

    def fail_at(self, position: int, reason: str) -> NoReturn:
        """Raise a decode error for the byte at ``position`` of the joined buffer."""
        index = int(np.searchsorted(self.ends, position, side="right"))
        raise PgOutputDecodeError(
            reason,
            message_type=chr(self.types[index]),
            offset=position - int(self.starts[index]),
            lsn=self.lsn(index),
        )

    def plain_transactions(self) -> tuple[_Rows, _TxnColumns, list[LogicalMessage]] | None:
        """The common case without a Python step per transaction: only Begin .. Commit blocks.

        Without streaming or two-phase messages every transaction arrives whole and committed,
        so Begin and Commit fields are read for all transactions at once and each data message
        belongs to the Begin before it. Returns ``None`` (use the general walk, which also
        reports malformed input precisely) when the batch has other shapes.
        """
        types = self.types
        if np.any(_NEEDS_WALK[types]):
            return None
        begins = np.flatnonzero(types == MessageType.BEGIN)
        commits = np.flatnonzero(types == MessageType.COMMIT)
        if (
            not len(begins)
            or len(begins) != len(commits)
            or np.any(commits <= begins)
            or np.any(begins[1:] <= commits[:-1])
        ):
            return None
        if np.any(self.lengths[begins] != _BEGIN_SIZE) or np.any(self.lengths[commits] != _COMMIT_SIZE):
            return None
        data = np.flatnonzero(_IS_DATA[types])
        txn_of = np.searchsorted(begins, data, side="right") - 1
        outside = (txn_of < 0) | (data > commits[np.maximum(txn_of, 0)])
        if np.any(outside):
            self._fail_outside(int(data[np.argmax(outside)]))
        gen_starts, truncates, origins, logical_messages = self._walk_other_controls(begins, commits)
        seq, trunc_seq, changes = _sequence(data, txn_of, begins, truncates)
        starts = self.starts[commits]
        per_txn = _TxnColumns(
            xid=self.be32(self.starts[begins] + 17),
            commit_lsn=self._quads[starts + 2].astype(np.int64),
            end_lsn=self._quads[starts + 10].astype(np.int64),
            commit_time=self._quads[starts + 18].astype(np.int64),
            changes=changes,
            streamed=np.zeros(len(begins), dtype=np.bool_),
            gid={},
            origin=origins,
        )
        rows = _Rows(
            msg=data,
            txn=txn_of,
            seq=seq,
            gen=np.searchsorted(np.array(gen_starts, dtype=np.int64), data, side="right"),
            prefix=np.zeros(len(data), dtype=np.int64),
            truncates=[
                (ordinal, first + k, relation, options)
                for (ordinal, _, relations, options), first in zip(truncates, trunc_seq, strict=True)
                for k, relation in enumerate(relations)
            ],
        )
        return rows, per_txn, logical_messages

    def _walk_other_controls(
        self, begins: Int64Array, commits: Int64Array
    ) -> tuple[list[int], list[_PlainTruncate], dict[int, Origin], list[LogicalMessage]]:
        """Relation, Type, Origin, Truncate and Message messages of a plain batch, one by one."""
        others = np.flatnonzero(~_IS_DATA[self.types] & ~_IS_BEGIN_OR_COMMIT[self.types]).tolist()
        ordinals = (np.searchsorted(begins, others, side="right") - 1).tolist()
        gen_starts: list[int] = []
        truncates: list[_PlainTruncate] = []
        origins: dict[int, Origin] = {}
        logical_messages: list[LogicalMessage] = []
        self._snapshot()
        for index, ordinal in zip(others, ordinals, strict=True):
            inside = ordinal >= 0 and index < commits[ordinal]
            message = self.decoder.decode(self.messages[index], self.lsn(index))
            if isinstance(message, Relation):
                if self._snapshot():
                    gen_starts.append(index)
            elif isinstance(message, Truncate):
                if not inside:
                    self._fail_outside(index)
                relations = [self.decoder.relations[r] for r in message.relation_ids]
                truncates.append((ordinal, index, relations, message.options))
            elif isinstance(message, Origin) and inside:
                origins[ordinal] = message
            elif isinstance(message, LogicalMessage):
                logical_messages.append(message)
        return gen_starts, truncates, origins, logical_messages

    def walk_control_messages(self) -> _Tracker:
        tracker = _Tracker()
        control = np.flatnonzero(~_IS_DATA[self.types]).tolist()
        previous = 0
        self._snapshot()
        for index in [*control, len(self.messages)]:
            if index > previous:
                target = tracker.target()
                if target is None:
                    self._fail_outside(previous)
                prefix = 4 if self.decoder.in_stream else 0
                run = _Run(previous, index, prefix, len(self.generations) - 1)
                target.items.append(run)
                self.runs.append(run)
            previous = index + 1
            if index == len(self.messages):
                break
            message = self.decoder.decode(self.messages[index], self.lsn(index))
            if isinstance(message, Relation):
                self._snapshot()
            try:
                tracker.control(message, self.decoder.relations)
            except ValueError as exc:
                raise PgOutputDecodeError(
                    str(exc), message_type=chr(self.types[index]), offset=0, lsn=self.lsn(index)
                ) from None
        return tracker

    def check_discarded(self, rows: _Rows) -> None:
        """Parse, only to validate, the data messages that will not be staged (aborted or still
        open transactions), so that malformed input fails here as in the per-message decoder."""
        if not self.runs:
            return
        msg = np.concatenate([np.arange(r.lo, r.hi, dtype=np.int64) for r in self.runs])
        prefix = np.concatenate([np.full(r.hi - r.lo, r.prefix, dtype=np.int64) for r in self.runs])
        gen = np.concatenate([np.full(r.hi - r.lo, r.gen, dtype=np.int64) for r in self.runs])
        discarded = ~np.isin(msg, rows.msg)
        if not discarded.any():
            return
        msg, prefix, gen = msg[discarded], prefix[discarded], gen[discarded]
        relation_ids = self.be32(self.starts[msg] + 1 + prefix)
        unique, inverse = np.unique((gen << 32) | relation_ids, return_inverse=True)
        for position, key in enumerate(unique.tolist()):
            members = np.flatnonzero(inverse.reshape(-1) == position)
            relation = self.generations[key >> 32].get(key & 0xFFFFFFFF)
            if relation is None:
                self.fail_message(int(msg[members[0]]), key >> 32, int(prefix[members[0]]))
            _parse_rows(self, msg[members], prefix[members], gen[members], len(relation.columns))

    def _fail_outside(self, index: int) -> NoReturn:
        raise PgOutputDecodeError(
            "change outside any transaction",
            message_type=chr(self.types[index]),
            offset=0,
            lsn=self.lsn(index),
        )

    def _snapshot(self) -> bool:
        """Start a new relation cache generation if the cache changed; True when it did."""
        current = self.decoder.relations.snapshot()
        if self.generations and self.generations[-1] == current:
            return False
        self.generations.append(current)
        return True

    def be32(self, positions: Int64Array) -> Int64Array:
        """Big-endian unsigned 32-bit values at each position (positions must be in bounds)."""
        return self._words[positions].astype(np.int64)

    def committed_rows(self, tracker: _Tracker) -> tuple[_Rows, Int64Array]:
        """The data rows of the committed transactions, and each transaction's change count."""
        msg_parts: list[Int64Array] = []
        seq_parts: list[Int64Array] = []
        txn_parts: list[Int64Array] = []
        gen_parts: list[Int64Array] = []
        prefix_parts: list[Int64Array] = []
        truncates: list[tuple[int, int, Relation, int]] = []
        changes = np.zeros(len(tracker.committed), dtype=np.int64)
        for ordinal, committed in enumerate(tracker.committed):
            counter = 0
            for item in committed.txn.items:
                if isinstance(item, _TruncateRows):
                    if item.xid is not None and item.xid in committed.txn.aborted:
                        continue
                    for relation in item.relations:
                        truncates.append((ordinal, counter, relation, item.options))
                        counter += 1
                    continue
                indices = np.arange(item.lo, item.hi, dtype=np.int64)
                if item.prefix and committed.txn.aborted:
                    subxids = self.be32(self.starts[indices] + 1)
                    indices = indices[~np.isin(subxids, list(committed.txn.aborted))]
                size = len(indices)
                msg_parts.append(indices)
                seq_parts.append(np.arange(counter, counter + size, dtype=np.int64))
                txn_parts.append(np.full(size, ordinal, dtype=np.int64))
                gen_parts.append(np.full(size, item.gen, dtype=np.int64))
                prefix_parts.append(np.full(size, item.prefix, dtype=np.int64))
                counter += size
            changes[ordinal] = counter
        empty = np.zeros(0, dtype=np.int64)
        rows = _Rows(
            msg=np.concatenate(msg_parts) if msg_parts else empty,
            txn=np.concatenate(txn_parts) if txn_parts else empty,
            seq=np.concatenate(seq_parts) if seq_parts else empty,
            gen=np.concatenate(gen_parts) if gen_parts else empty,
            prefix=np.concatenate(prefix_parts) if prefix_parts else empty,
            truncates=truncates,
        )
        return rows, changes

    def tables(self, rows: _Rows, per_txn: _TxnColumns, max_rows: int) -> list[TableChanges]:
        """Group the rows by relation version and build each version's table."""
        relation_ids = self.be32(self.starts[rows.msg] + 1 + rows.prefix) if len(rows.msg) else rows.msg
        combined = (rows.gen << 32) | relation_ids
        unique, first_row, inverse = np.unique(combined, return_index=True, return_inverse=True)
        # (txn ordinal, seq, relation, truncate index or -1 - unique position), keyed in commit order
        events: list[tuple[int, int, Relation, int]] = []
        for position, key in enumerate(unique.tolist()):
            gen, relation_id = key >> 32, key & 0xFFFFFFFF
            relation = self.generations[gen].get(relation_id)
            if relation is None:
                culprit = int(np.flatnonzero(inverse == position)[0])
                self.fail_message(int(rows.msg[culprit]), gen, int(rows.prefix[culprit]))
            row = int(first_row[position])
            events.append((int(rows.txn[row]), int(rows.seq[row]), relation, -1 - position))
        events += [(o, s, r, index) for index, (o, s, r, _) in enumerate(rows.truncates)]
        events.sort(key=lambda event: event[:2])
        version_keys = VersionKeys()
        versions: dict[tuple[object, ...], int] = {}
        relations: list[Relation] = []
        group_of_unique = np.zeros(len(unique), dtype=np.int64)
        truncate_groups: dict[int, list[tuple[int, int, int]]] = {}
        for ordinal, seq, relation, index in events:
            group = versions.setdefault(version_keys.key(relation), len(versions))
            if group == len(relations):
                relations.append(relation)
            if index < 0:
                group_of_unique[-1 - index] = group
            else:
                truncate_groups.setdefault(group, []).append((ordinal, seq, rows.truncates[index][3]))
        group_of_row = group_of_unique[inverse.reshape(-1)] if len(rows.msg) else rows.msg
        order = np.argsort(group_of_row, kind="stable")
        bounds = np.searchsorted(group_of_row[order], np.arange(len(relations) + 1))
        built: list[tuple[tuple[int, int], TableChanges]] = []
        for group, relation in enumerate(relations):
            selected = order[bounds[group] : bounds[group + 1]]
            raw, first = self._relation_rows(
                relation, rows, selected, truncate_groups.get(group, []), per_txn
            )
            relation = table_relation(relation)
            built.append((first, TableChanges(relation, build_batches(relation, raw, max_rows))))
        built.sort(key=lambda item: item[0])
        return [table for _, table in built]

    def _relation_rows(
        self,
        relation: Relation,
        rows: _Rows,
        selected: Int64Array,
        truncates: list[tuple[int, int, int]],
        per_txn: _TxnColumns,
    ) -> tuple[_Columns, tuple[int, int]]:
        msg = rows.msg[selected]
        txn = rows.txn[selected]
        seq = rows.seq[selected]
        parsed = _parse_rows(self, msg, rows.prefix[selected], rows.gen[selected], len(relation.columns))
        for kind, start in zip(parsed.old.kind, parsed.old.start, strict=True):
            unchanged = np.flatnonzero(kind == _U_KIND)
            if len(unchanged):
                self.fail_at(int(start[unchanged[0]]) - 5, UNCHANGED_OLD)  # at the kind byte
        op_code = _OP_CODE[self.types[msg]]
        flags = np.full(len(msg), -1, dtype=np.int64)
        new_rows, old_rows = parsed.new_rows, parsed.old_rows
        if truncates:
            t_txn, t_seq, t_opt = (np.array(v, dtype=np.int64) for v in zip(*truncates, strict=True))
            txn = np.concatenate([txn, t_txn])
            seq = np.concatenate([seq, t_seq])
            op_code = np.concatenate([op_code, np.full(len(t_txn), 3, dtype=np.int64)])
            flags = np.concatenate([flags, t_opt])
            order = np.lexsort((seq, txn))
            txn, seq, op_code, flags = txn[order], seq[order], op_code[order], flags[order]
            moved = np.empty(len(order), dtype=np.int64)
            moved[order] = np.arange(len(order), dtype=np.int64)
            new_rows, old_rows = moved[new_rows], moved[old_rows]
        names = pa.array([c.name for c in relation.columns], pa.string())
        unchanged = _unchanged_lists(parsed.new, new_rows, len(seq), names)
        new = parsed.new.dense(new_rows, len(seq))
        old = parsed.old.dense(old_rows, len(seq))
        raw = _Columns(
            op=_OPS.take(pa.array(op_code)),
            commit_lsn=per_txn.commit_lsn[txn],
            end_lsn=per_txn.end_lsn[txn],
            seq=seq,
            xid=per_txn.xid[txn],
            commit_time=per_txn.commit_time[txn],
            unchanged=unchanged,
            new=new.arrays(self),
            new_rows=new_rows,
            old=old.arrays(self),
            old_rows=old_rows,
            truncate_flags=pa.array(flags, pa.int8(), mask=flags < 0),
        )
        first = (int(txn[0]), int(seq[0])) if len(txn) else (0, 0)
        return raw, first


_PlainTruncate = tuple[int, int, list[Relation], int]  # (txn ordinal, message index, relations, options)


def _sequence(
    data: Int64Array, txn_of: Int64Array, begins: Int64Array, truncates: list[_PlainTruncate]
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """``_pgl_seq`` of each data row and of each truncate's first row, and changes per transaction.

    A change's position within its transaction counts the rows before it; a truncate counts one
    row per relation it names.
    """
    positions = np.concatenate([data, np.array([t[1] for t in truncates], dtype=np.int64)])
    weights = np.concatenate(
        [np.ones(len(data), np.int64), np.array([len(t[2]) for t in truncates], np.int64)]
    )
    txns = np.concatenate([txn_of, np.array([t[0] for t in truncates], dtype=np.int64)])
    order = np.argsort(positions, kind="stable")
    before = np.cumsum(weights[order]) - weights[order]  # rows before each change, batch-wide
    first_of_txn = np.searchsorted(positions[order], begins)
    base = np.append(before, 0)[first_of_txn]  # rows before each transaction's first change
    sequence = np.empty(len(positions), dtype=np.int64)
    sequence[order] = before - base[txns[order]]
    changes = np.bincount(txns, weights=weights, minlength=len(begins)).astype(np.int64)
    return sequence[: len(data)], sequence[len(data) :], changes


@dataclass(slots=True)
class _Tuples:
    """Per column: kind byte, value start and length, for the rows that carry this tuple."""

    kind: list[U8Array]
    start: list[Int64Array]
    length: list[Int64Array]

    def dense(self, rows: Int64Array, count: int) -> _Tuples:
        """Spread to all ``count`` rows (kind 0 elsewhere) when most rows carry the tuple: typing
        a few nulls is cheaper than spreading typed values afterwards."""
        if len(rows) == count or len(rows) * 2 < count:
            return self
        kinds, starts, lengths = [], [], []
        for kind, start, length in zip(self.kind, self.start, self.length, strict=True):
            kinds.append(np.zeros(count, np.uint8))
            kinds[-1][rows] = kind
            starts.append(np.full(count, 4, np.int64))
            starts[-1][rows] = start
            lengths.append(np.zeros(count, np.int64))
            lengths[-1][rows] = length
        return _Tuples(kinds, starts, lengths)

    def arrays(self, batch: _Batch) -> list[pa.Array]:
        out = []
        for kind, start, length in zip(self.kind, self.start, self.length, strict=True):
            binary = kind == _B_KIND
            if np.any(binary):
                if np.any(kind == _T_KIND):
                    batch.fail_at(int(start[np.argmax(binary)]) - 5, MIXED_FORMATS)
                out.append(_binary_view(batch, start, length, binary).cast(pa.binary()))
                continue
            raw = _binary_view(batch, start, length, kind == _T_KIND)
            if batch.raw_text:
                out.append(escape_raw_text(raw))
                continue
            try:
                out.append(raw.cast(pa.string_view()))
            except pa.ArrowInvalid:
                batch.fail_at(int(start[_first_invalid_utf8(raw)]), "text value is not valid UTF-8")
        return out


@dataclass(slots=True)
class _Parsed:
    new: _Tuples
    new_rows: Int64Array
    old: _Tuples
    old_rows: Int64Array


def _unchanged_lists(new: _Tuples, new_rows: Int64Array, count: int, names: pa.Array) -> pa.Array:
    """``_pgl_unchanged``: per row, the names of the columns sent as unchanged TOAST."""
    offsets = np.zeros(count + 1, dtype=np.int32)
    if not new.kind:
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array([], pa.string()))
    matrix = np.stack([k == _U_KIND for k in new.kind], axis=1)
    per_row = np.zeros(count, dtype=np.int32)
    per_row[new_rows] = matrix.sum(axis=1)
    np.cumsum(per_row, out=offsets[1:])
    _, columns = np.nonzero(matrix)
    return pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(columns, pa.int64())))


_VIEW = np.dtype([("length", "<i4"), ("prefix", "<u4"), ("rest", "<u8")])
_PREFIX_MASK = np.array([(1 << (8 * min(n, 4))) - 1 for n in range(13)], dtype=np.uint64).astype(np.uint32)
_REST_MASK = np.array([(1 << (8 * min(max(n - 4, 0), 8))) - 1 for n in range(13)], dtype=object).astype(
    np.uint64
)


def _first_invalid_utf8(values: pa.Array) -> int:
    for index, value in enumerate(values.to_pylist()):
        try:
            if value is not None:
                value.decode("utf-8")
        except UnicodeDecodeError:
            return index
    return 0


def _binary_view(batch: _Batch, start: Int64Array, length: Int64Array, valid: BoolArray) -> pa.Array:
    """An Arrow binary_view array over the joined buffer: values are not copied, only viewed.

    Each 16-byte view is gathered from the 4 bytes before the value (its big-endian length, then
    overwritten by the little-endian one) and the 12 bytes after; short values (<= 12 bytes) keep
    their bytes inline, zero-padded, long ones get their buffer index and offset.
    """
    count = len(start)
    nulls = count - int(np.count_nonzero(valid))
    if nulls == count:
        return pa.nulls(count, pa.binary_view())
    if nulls:
        start = np.where(valid, start, 4)
        length = np.where(valid, length, 0)
    views = batch.views[start - 4].view(_VIEW)
    views["length"] = length
    short = np.minimum(length, 12)
    views["prefix"] &= _PREFIX_MASK[short]
    views["rest"] &= _REST_MASK[short]
    long = np.flatnonzero(length > 12)
    if len(long):
        buffer_index = start[long] // _WINDOW
        offset = start[long] - buffer_index * _WINDOW
        views["rest"][long] = (offset.astype(np.uint64) << np.uint64(32)) | buffer_index.astype(np.uint64)
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.binary_view(), count, [validity, pa.py_buffer(views), *batch.data_buffers], null_count=nulls
    )


class _Checker:
    """Collects rows whose bytes fail a vector check; reads are clamped so they never fail.

    Reads past a message's end are not checked one field at a time: positions only grow, so
    any overrun shows in the final position, which :func:`_parse_rows` compares with the end.
    """

    def __init__(self, batch: _Batch, msg: Int64Array, prefix: Int64Array, gen: Int64Array) -> None:
        self.batch = batch
        self.msg = msg
        self.prefix = prefix
        self.gen = gen
        self.end = batch.ends[msg]
        self.bad = np.zeros(len(msg), dtype=np.bool_)
        self.limit = batch.buf.size - 16

    def byte(self, pos: Int64Array) -> U8Array:
        return self.batch.buf[np.minimum(pos, self.limit)]

    def int_(self, pos: Int64Array, size: int) -> Int64Array:
        """Big-endian unsigned integers of ``size`` (2 or 4) bytes."""
        safe = np.minimum(pos, self.limit)
        if size == 2:
            pair: Int64Array = (self.batch.buf[safe].astype(np.int64) << 8) | self.batch.buf[safe + 1]
            return pair
        return self.batch.be32(safe)

    def raise_if_bad(self) -> None:
        if self.bad.any():
            first = int(np.flatnonzero(self.bad)[0])
            self.batch.fail_message(int(self.msg[first]), int(self.gen[first]), int(self.prefix[first]))


def _parse_tuples(
    check: _Checker, rows: Int64Array, pos: Int64Array, width: int
) -> tuple[_Tuples, Int64Array]:
    """Parse the TupleData starting at ``pos`` in each of ``rows`` (indices into the checker)."""
    bad = check.int_(pos, 2) != width
    pos = pos + 2
    kinds, starts, lengths = [], [], []
    for _ in range(width):
        kind = check.byte(pos)
        has_value = (kind == _T_KIND) | (kind == _B_KIND)
        known = has_value | (kind == _U_KIND) | (kind == _NULL_KIND)
        length = np.where(has_value, check.int_(pos + 1, 4), 0)
        # A 4-byte length with the top bit set is negative: never valid.
        bad |= ~known | (length >= 1 << 31)
        kinds.append(np.where(known, kind, 0).astype(np.uint8))
        starts.append(pos + 5)
        lengths.append(length)
        pos = pos + 1 + np.where(has_value, 4 + length, 0)
    check.bad[rows] |= bad
    return _Tuples(kinds, starts, lengths), pos


def _parse_rows(batch: _Batch, msg: Int64Array, prefix: Int64Array, gen: Int64Array, width: int) -> _Parsed:
    """Parse the Insert/Update/Delete messages ``msg`` of one relation version, all at once."""
    check = _Checker(batch, msg, prefix, gen)
    types = batch.types[msg]
    is_update = types == MessageType.UPDATE
    is_delete = types == MessageType.DELETE
    pos = batch.starts[msg] + 1 + prefix + 4
    marker = check.byte(pos)
    keyed = (marker == _K) | (marker == _O)
    check.bad |= np.where(is_delete, ~keyed, np.where(is_update, ~keyed & (marker != _N), marker != _N))
    pos = pos + 1
    old_rows = np.flatnonzero(is_delete | (is_update & keyed))
    old, after_old = _parse_tuples(check, old_rows, pos[old_rows], width)
    pos[old_rows] = after_old
    both = np.flatnonzero(is_update & keyed)
    check.bad[both] |= check.byte(pos[both]) != _N
    pos[both] += 1
    new_rows = np.flatnonzero(~is_delete)
    new, after_new = _parse_tuples(check, new_rows, pos[new_rows], width)
    pos[new_rows] = after_new
    check.bad |= pos != check.end
    check.raise_if_bad()
    return _Parsed(new, new_rows, old, old_rows)
