"""Oracle transaction assembly: decoded messages in, committed transactions out, in commit order.

pgoutput sends plain transactions whole (Begin, changes, Commit), but with protocol 2 streaming
a large transaction arrives in chunks (Stream Start .. Stop, possibly interleaved with other
transactions) and is only decided by Stream Commit or Stream Abort; with protocol 3 two-phase a
transaction is sent at PREPARE and decided later by Commit Prepared or Rollback Prepared. The
assembler buffers each undecided transaction in memory, one Python object per change, and
releases only committed work: aborted transactions and aborted subtransactions leave no trace.

It is written independently of the columnar decoder's transaction tracking, plainly, so the
tests can compare the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
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
    TupleData,
    Update,
)
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache


@dataclass(slots=True, frozen=True)
class RowChange:
    """One row-level change of a transaction, with the relation shape in force when it was sent.

    ``op`` is ``I``, ``U``, ``D`` or ``T`` (one ``T`` per truncated relation, with
    ``truncate_options``); ``xid`` is the (sub)transaction id carried by streamed changes, else
    ``None``.
    """

    op: str
    relation: Relation
    new: TupleData | None = None
    old: TupleData | None = None
    old_kind: str | None = None
    truncate_options: int | None = None
    xid: int | None = None


@dataclass(slots=True)
class Transaction:
    """A committed transaction: its changes in order and where the slot may advance after it.

    ``commit_time`` is microseconds since 2000-01-01 UTC. ``gid`` is set for two-phase
    transactions, ``origin`` when the transaction was replayed from a replication origin.
    """

    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int
    changes: list[RowChange] = field(default_factory=list)
    messages: list[LogicalMessage] = field(default_factory=list)
    origin: Origin | None = None
    gid: str | None = None
    streamed: bool = False


@dataclass(slots=True)
class _Pending:
    """An undecided transaction's changes."""

    xid: int
    changes: list[RowChange] = field(default_factory=list)
    messages: list[LogicalMessage] = field(default_factory=list)
    origin: Origin | None = None
    aborted_subxids: set[int] = field(default_factory=set)

    def committed(self) -> list[RowChange]:
        """The changes in order, without those of aborted subtransactions."""
        return [c for c in self.changes if c.xid not in self.aborted_subxids]


class TransactionAssembler:
    """Feeds on decoded messages (in stream order) and returns each transaction once committed.

    :param relations: the relation cache of the decoder producing the messages, used to attach
        the relation shape in force to each change.
    """

    def __init__(self, relations: RelationCache) -> None:
        self.relations = relations
        self._current: _Pending | None = None
        self._streams: dict[int, _Pending] = {}
        self._stream_xid: int | None = None
        self._prepared: dict[str, _Pending] = {}
        self._handlers: dict[type, Callable[[Any, Lsn | None], Transaction | None]] = {
            Begin: self._begin,
            BeginPrepare: self._begin,
            Commit: self._finish_plain,
            Origin: self._origin,
            Prepare: self._prepare,
            StreamStart: self._stream_start,
            StreamStop: self._stream_stop,
            StreamCommit: self._stream_commit,
            StreamAbort: self._abort_stream,
            StreamPrepare: self._stream_prepare,
            CommitPrepared: self._commit_prepared,
            RollbackPrepared: self._rollback_prepared,
        }

    def feed(self, message: Message, lsn: Lsn | None = None) -> Transaction | LogicalMessage | None:
        """Take one message; return a transaction when it committed, or a non-transactional
        logical decoding message, else ``None``."""
        if isinstance(message, Insert | Update | Delete | Truncate):
            self._change(message)
            return None
        if isinstance(message, LogicalMessage):
            target = self._target()
            if not message.transactional or target is None:
                return message
            target.messages.append(message)
            return None
        handler = self._handlers.get(type(message))
        return None if handler is None else handler(message, lsn)

    def _begin(self, message: Begin | BeginPrepare, lsn: Lsn | None) -> None:
        if self._current is not None:
            raise PgOutputDecodeError(
                f"Begin of transaction {message.xid} while transaction {self._current.xid} is still open",
                message_type="B" if isinstance(message, Begin) else "b",
                offset=0,
                lsn=lsn,
            )
        self._current = _Pending(message.xid)

    def _origin(self, message: Origin, lsn: Lsn | None) -> None:
        if self._current is not None:
            self._current.origin = message

    def _prepare(self, message: Prepare, lsn: Lsn | None) -> None:
        self._prepared[message.gid] = self._take_current("P", lsn)

    def _stream_start(self, message: StreamStart, lsn: Lsn | None) -> None:
        self._stream_xid = message.xid
        self._streams.setdefault(message.xid, _Pending(message.xid))

    def _stream_stop(self, message: StreamStop, lsn: Lsn | None) -> None:
        self._stream_xid = None

    def _take_stream(self, xid: int, type_char: str, lsn: Lsn | None) -> _Pending:
        pending = self._streams.pop(xid, None)
        if pending is None:
            raise PgOutputDecodeError(
                f"end of streamed transaction {xid} that never streamed",
                message_type=type_char,
                offset=1,
                lsn=lsn,
            )
        return pending

    def _stream_commit(self, message: StreamCommit, lsn: Lsn | None) -> Transaction:
        pending = self._take_stream(message.xid, "c", lsn)
        return Transaction(
            message.xid, message.commit_lsn, message.end_lsn, message.commit_time,
            pending.committed(), pending.messages, pending.origin, streamed=True,
        )  # fmt: skip

    def _stream_prepare(self, message: StreamPrepare, lsn: Lsn | None) -> None:
        self._prepared[message.gid] = self._take_stream(message.xid, "p", lsn)

    def _rollback_prepared(self, message: RollbackPrepared, lsn: Lsn | None) -> None:
        self._prepared.pop(message.gid, None)

    def _target(self) -> _Pending | None:
        if self._stream_xid is not None:
            return self._streams[self._stream_xid]
        return self._current

    def _change(self, message: Insert | Update | Delete | Truncate) -> None:
        target = self._target()
        if target is None:
            raise PgOutputDecodeError(
                "change outside any transaction", message_type=_OP_OF[type(message)], offset=0
            )
        if isinstance(message, Truncate):
            for relation_id in message.relation_ids:
                relation = self.relations[relation_id]
                target.changes.append(
                    RowChange("T", relation, truncate_options=message.options, xid=message.xid)
                )
            return
        relation = self.relations[message.relation_id]
        if isinstance(message, Insert):
            change = RowChange("I", relation, new=message.new, xid=message.xid)
        elif isinstance(message, Update):
            change = RowChange("U", relation, message.new, message.old, message.old_kind, xid=message.xid)
        else:
            change = RowChange("D", relation, old=message.old, old_kind=message.old_kind, xid=message.xid)
        target.changes.append(change)

    def _take_current(self, type_char: str, lsn: Lsn | None) -> _Pending:
        pending = self._current
        if pending is None:
            raise PgOutputDecodeError(
                "end of a transaction that never began", message_type=type_char, offset=0, lsn=lsn
            )
        self._current = None
        return pending

    def _finish_plain(self, message: Commit, lsn: Lsn | None) -> Transaction:
        pending = self._take_current("C", lsn)
        return Transaction(
            pending.xid, message.commit_lsn, message.end_lsn, message.commit_time,
            pending.committed(), pending.messages, pending.origin,
        )  # fmt: skip

    def _abort_stream(self, message: StreamAbort, lsn: Lsn | None) -> None:
        pending = self._streams.get(message.xid)
        if pending is None:
            return
        if message.subxid == message.xid:
            del self._streams[message.xid]
        else:
            pending.aborted_subxids.add(message.subxid)

    def _commit_prepared(self, message: CommitPrepared, lsn: Lsn | None) -> Transaction:
        pending = self._prepared.pop(message.gid, None)
        if pending is None:
            # Its changes were sent at PREPARE, before this stream started: they cannot be rebuilt.
            raise PgOutputDecodeError(
                f"Commit Prepared for {message.gid!r} whose Prepare was not in this stream; restart "
                "decoding from before the PREPARE (two-phase slots must not advance past open prepares)",
                message_type="K",
                offset=1,
                lsn=lsn,
            )
        return Transaction(
            message.xid, message.commit_lsn, message.end_lsn, message.commit_time,
            pending.committed(), pending.messages, pending.origin, gid=message.gid,
        )  # fmt: skip


_OP_OF: dict[type, str] = {Insert: "I", Update: "U", Delete: "D", Truncate: "T"}


def committed_transactions(
    messages: Sequence[bytes], protocol_version: int, lsns: Sequence[int] | None = None
) -> list[Transaction]:
    """The committed transactions of raw messages, in commit order, decoded one message at a time
    by the package's per-message decoder (``lsns``, one per message, only name error positions)."""
    decoder = PgOutputDecoder(protocol_version)
    assembler = TransactionAssembler(decoder.relations)
    positions = [None if lsns is None else Lsn(lsns[i]) for i in range(len(messages))]
    committed = []
    for data, lsn in zip(messages, positions, strict=True):
        event = assembler.feed(decoder.decode(data, lsn), lsn)
        if isinstance(event, Transaction):
            committed.append(event)
    return committed
