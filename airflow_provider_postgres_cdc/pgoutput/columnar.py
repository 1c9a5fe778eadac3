"""The decoder the drain uses: many raw pgoutput messages -> typed change tables, without a Python
object per value (see :mod:`.arrow` for the output format).

How: the messages are joined into one buffer viewed as a numpy array. The control messages
(everything but Insert, Update and Delete: a few per transaction) go through the per-message
:class:`~.decoder.PgOutputDecoder`, which keeps the relation cache and streaming state, and a
small state machine that records, per transaction, the *runs* of data messages between them.
Once the committed transactions are known, their data rows are grouped by relation version and
each group is parsed at once: for every column, numpy computes the kind byte, value offset and
length of that column in all rows, bounds-checked against each message's end. The text values
become an Arrow ``string_view`` array whose views point into the joined buffer (no copy), which
:mod:`..values` casts to each column's type. Any inconsistency found by the vector checks is
re-decoded by the per-message decoder to raise its precise :class:`PgOutputDecodeError`.

This module finds the committed rows; :mod:`.columnar_buffer` holds the joined buffer and its
per-message arrays, :mod:`.columnar_transactions` tracks the transactions of the general walk,
:mod:`.columnar_tuples` parses the tuples and views their values, :mod:`.columnar_tables` builds
one table per relation version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.formats.wire import BEGIN, COMMIT, field_offsets
from airflow_provider_postgres_cdc.pgoutput.arrow import (
    DEFAULT_MAX_ROWS,
    DecodedBatch,
    Int64Array,
)
from airflow_provider_postgres_cdc.pgoutput.columnar_buffer import PAD, LsnArray, MessageBuffer
from airflow_provider_postgres_cdc.pgoutput.columnar_tables import relation_tables
from airflow_provider_postgres_cdc.pgoutput.columnar_transactions import (
    CommittedRows,
    DataRun,
    TransactionColumns,
    TransactionTracker,
    TruncateItem,
)
from airflow_provider_postgres_cdc.pgoutput.columnar_tuples import parse_rows
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    STREAMING_TYPES,
    TWO_PHASE_TYPES,
    LogicalMessage,
    MessageType,
    Origin,
    Relation,
    Truncate,
)
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache

_IS_DATA = np.zeros(256, dtype=np.bool_)
_IS_DATA[[MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE]] = True

# Streaming and two-phase messages: transactions interleave or wait, the general walk handles them.
_NEEDS_WALK = np.zeros(256, dtype=np.bool_)
_NEEDS_WALK[[*STREAMING_TYPES, *TWO_PHASE_TYPES]] = True
_IS_BEGIN_OR_COMMIT = np.zeros(256, dtype=np.bool_)
_IS_BEGIN_OR_COMMIT[[MessageType.BEGIN, MessageType.COMMIT]] = True
_BEGIN_SIZE, _COMMIT_SIZE = 1 + BEGIN.size, 1 + COMMIT.size
_BEGIN_XID = field_offsets(BEGIN)[2]
_COMMIT_LSN, _COMMIT_END_LSN, _COMMIT_TIME = field_offsets(COMMIT)[1:]

_PlainTruncate = tuple[int, int, list[Relation], int]  # (txn ordinal, message index, relations, options)


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
    :param text_columns: columns to type as ``text`` whatever their type, by ``schema.table``:
        their values stay the PostgreSQL text form the stream carries (:func:`.arrow.as_text`).
    """

    def __init__(
        self,
        protocol_version: int = 1,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
        raw_text: bool = False,
        text_columns: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.protocol_version = protocol_version
        self.max_rows = max_rows
        self.raw_text = raw_text
        self.text_columns = dict(text_columns or {})
        self.relations = RelationCache()

    def decode(self, messages: Sequence[bytes], lsns: Sequence[int] | None = None) -> DecodedBatch:
        """Decode ``messages`` (each one complete pgoutput message, in stream order).

        ``lsns`` (one per message, as returned next to each message by the peek function) only
        serves error reports.
        """
        lengths: Int64Array = np.fromiter(map(len, messages), dtype=np.int64, count=len(messages))
        starts: Int64Array = np.cumsum(lengths) - lengths
        return self.prepare(b"".join(messages) + PAD, starts, lengths, lsns).build()

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
        if len(starts) and int(starts[-1] + lengths[-1]) + len(PAD) > len(buffer):
            raise ValueError(f"prepare needs {len(PAD)} bytes after the last message; pad the buffer")
        batch = MessageBatch(
            buffer, starts, lengths, lsns, self.protocol_version, self.relations, self.raw_text
        )
        plain = batch.plain_transactions()
        if plain is not None:
            rows, per_txn, logical_messages = plain
            open_xids: list[int] = []
            prepared: list[str] = []
        else:
            tracker = batch.walk_control_messages()
            rows, changes = batch.committed_rows(tracker)
            batch.check_discarded(rows)
            per_txn = TransactionColumns.of(tracker.committed, changes)
            logical_messages = sorted(tracker.messages, key=lambda m: m.lsn)
            open_xids = sorted([*tracker.streams, *([tracker.current.xid] if tracker.current else [])])
            prepared = sorted(tracker.prepared)
        if first_seq:
            rows = rows.continuing(first_seq)
        return PreparedBatch(
            batch, rows, per_txn, logical_messages, open_xids, prepared, self.max_rows, self.text_columns
        )


@dataclass(slots=True)
class PreparedBatch:
    """Committed rows found, not yet typed. :meth:`build` reads only what this object holds
    (the relation versions in force were captured by :meth:`BatchDecoder.prepare`), so several
    batches of one stream can be built at once on different threads."""

    batch: MessageBatch
    rows: CommittedRows
    per_txn: TransactionColumns
    messages: list[LogicalMessage]
    open_xids: list[int]
    prepared_gids: list[str]
    max_rows: int
    text_columns: Mapping[str, frozenset[str]]

    @property
    def last_changes(self) -> int:
        """Changes of the last committed transaction in this call (0 when none committed)."""
        return int(self.per_txn.changes[-1]) if len(self.per_txn.changes) else 0

    def build(self) -> DecodedBatch:
        """Type the rows into one table per relation version (the costly, numpy/Arrow half)."""
        return DecodedBatch(
            tables=relation_tables(self.batch, self.rows, self.per_txn, self.max_rows, self.text_columns),
            transactions=self.per_txn.table(),
            messages=self.messages,
            open_xids=self.open_xids,
            prepared_gids=self.prepared_gids,
        )


class MessageBatch(MessageBuffer):
    """A buffer of messages and the walk over its control messages, which finds the committed rows."""

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
        super().__init__(joined, starts, lengths, lsns, protocol_version, raw_text)
        self.decoder = PgOutputDecoder(protocol_version, relations)
        self.runs: list[DataRun] = []  # every run of data messages, committed or not

    def plain_transactions(self) -> tuple[CommittedRows, TransactionColumns, list[LogicalMessage]] | None:
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
        per_txn = TransactionColumns(
            xid=self.be32(self.starts[begins] + _BEGIN_XID),
            commit_lsn=self.be64(starts + _COMMIT_LSN),
            end_lsn=self.be64(starts + _COMMIT_END_LSN),
            commit_time=self.be64(starts + _COMMIT_TIME),
            changes=changes,
            streamed=np.zeros(len(begins), dtype=np.bool_),
            gid={},
            origin=origins,
        )
        rows = CommittedRows(
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

    def walk_control_messages(self) -> TransactionTracker:
        tracker = TransactionTracker()
        control = np.flatnonzero(~_IS_DATA[self.types]).tolist()
        previous = 0
        self._snapshot()
        for index in [*control, len(self.messages)]:
            if index > previous:
                target = tracker.target()
                if target is None:
                    self._fail_outside(previous)
                prefix = 4 if self.decoder.in_stream else 0
                run = DataRun(previous, index, prefix, len(self.generations) - 1)
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

    def check_discarded(self, rows: CommittedRows) -> None:
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
            parse_rows(self, msg[members], prefix[members], gen[members], len(relation.columns))

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

    def committed_rows(self, tracker: TransactionTracker) -> tuple[CommittedRows, Int64Array]:
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
                if isinstance(item, TruncateItem):
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
        rows = CommittedRows(
            msg=np.concatenate(msg_parts) if msg_parts else empty,
            txn=np.concatenate(txn_parts) if txn_parts else empty,
            seq=np.concatenate(seq_parts) if seq_parts else empty,
            gen=np.concatenate(gen_parts) if gen_parts else empty,
            prefix=np.concatenate(prefix_parts) if prefix_parts else empty,
            truncates=truncates,
        )
        return rows, changes


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
