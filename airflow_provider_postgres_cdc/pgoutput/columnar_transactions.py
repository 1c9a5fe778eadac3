"""Which data messages of a columnar batch belong to which transaction, and which of those commit.

The columnar decoder (:mod:`.columnar`) never decodes a data message one at a time, so nothing
here holds a row: the :class:`TransactionTracker` sees only the control messages (Begin, Commit,
Stream Start/Stop/Commit/Abort, two-phase) and records, per transaction, *runs* of message
indices (:class:`DataRun`) between them; the rows are parsed later, all at once, from the runs of
the transactions that committed (:class:`CommittedRows`). Nor is it ``engine/sequencing.py``'s
``Sequencer``, which works before any decoding, on raw bytes and without the relation cache, to
put whole committed transactions in commit order and spill them: the drain feeds the decoder
only what the sequencer released (plain protocol-1 transactions, which take the decoder's fast
path without this tracker). The tracker serves input that still interleaves streamed and
two-phase transactions: ``BatchDecoder.decode`` on a raw capture, as the tests and
``benchmarks/decode.py`` use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.pgtypes import PG_EPOCH_US
from airflow_provider_postgres_cdc.pgoutput.arrow import (
    TRANSACTION_SCHEMA,
    BoolArray,
    Int64Array,
    check_stageable,
)
from airflow_provider_postgres_cdc.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
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
)
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache


@dataclass(slots=True)
class DataRun:
    """Data messages ``lo..hi-1`` of the batch, sent with the relation cache generation ``gen``."""

    lo: int
    hi: int
    prefix: int
    gen: int


@dataclass(slots=True)
class TruncateItem:
    relations: list[Relation]
    options: int
    xid: int | None


@dataclass(slots=True)
class OpenTransaction:
    xid: int
    items: list[DataRun | TruncateItem] = field(default_factory=list)
    messages: list[LogicalMessage] = field(default_factory=list)
    origin: Origin | None = None
    aborted: set[int] = field(default_factory=set)


@dataclass(slots=True)
class CommittedTransaction:
    txn: OpenTransaction
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    gid: str | None
    streamed: bool


@dataclass(slots=True)
class CommittedRows:
    """Committed data rows in commit order: message index, transaction ordinal, seq, generation."""

    msg: Int64Array
    txn: Int64Array
    seq: Int64Array
    gen: Int64Array
    prefix: Int64Array
    truncates: list[tuple[int, int, Relation, int]]  # (txn ordinal, seq, relation, options)

    def continuing(self, first_seq: int) -> CommittedRows:
        """The same rows with the first transaction's changes numbered from ``first_seq``."""
        seq = self.seq + np.where(self.txn == 0, first_seq, 0)
        truncates = [(t, s + (first_seq if t == 0 else 0), r, o) for t, s, r, o in self.truncates]
        return CommittedRows(self.msg, self.txn, seq, self.gen, self.prefix, truncates)


@dataclass(slots=True)
class TransactionColumns:
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
    def of(cls, committed: list[CommittedTransaction], changes: Int64Array) -> TransactionColumns:
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


class TransactionTracker:
    """The per-transaction state machine of the columnar route (control messages only)."""

    def __init__(self) -> None:
        self.current: OpenTransaction | None = None
        self.streams: dict[int, OpenTransaction] = {}
        self.stream_xid: int | None = None
        self.prepared: dict[str, OpenTransaction] = {}
        self.committed: list[CommittedTransaction] = []
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

    def target(self) -> OpenTransaction | None:
        return self.streams[self.stream_xid] if self.stream_xid is not None else self.current

    def commit(
        self,
        txn: OpenTransaction | None,
        xid: int,
        ends: tuple[Lsn, Lsn, int],
        gid: str | None = None,
        streamed: bool = False,
    ) -> None:
        if txn is None:
            raise ValueError("end of a transaction that was not seen")
        self.committed.append(CommittedTransaction(txn, xid, *ends, gid, streamed))
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
        self.current = OpenTransaction(message.xid)

    def _commit(self, message: Commit) -> None:
        txn, self.current = self.current, None
        self.commit(txn, txn.xid if txn else 0, (message.commit_lsn, message.end_lsn, message.commit_time))

    def _prepare(self, message: Prepare) -> None:
        if self.current is None:
            raise ValueError("Prepare without Begin Prepare")
        self.prepared[message.gid], self.current = self.current, None

    def _stream_start(self, message: StreamStart) -> None:
        self.stream_xid = message.xid
        self.streams.setdefault(message.xid, OpenTransaction(message.xid))

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
                TruncateItem([relations[r] for r in message.relation_ids], message.options, message.xid)
            )
