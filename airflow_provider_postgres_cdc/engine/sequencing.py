"""Raw pgoutput messages in wire order -> whole committed transactions in commit order, in pieces
of bounded size, with undecided transactions spilled to local disk.

Why: on the wire a transaction is only known to count at its commit. With protocol 2
streaming, a large transaction arrives in blocks (Stream Start .. Stop) interleaved with other
transactions and is decided by Stream Commit or Stream Abort; without streaming (the SQL peek)
one transaction can still be larger than memory. The :class:`Sequencer` keeps every undecided
transaction aside, in memory up to :attr:`MemoryBudget.hold_bytes` and in an anonymous
temporary file beyond, and releases it only once committed, rewritten as a plain protocol-1
transaction (Begin, changes, Commit) that the columnar decoder takes in its fast path. A
transaction larger than :attr:`MemoryBudget.piece_bytes` is released as several pieces, each
wrapped in the transaction's own Begin and Commit; :attr:`Piece.continues` tells the decoder to
carry on the change numbering (``_pgl_seq``) of the previous piece.

Spill files are created in ``spill_dir`` (``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or
``/tmp``, when not set) and unlinked at once (``tempfile.TemporaryFile``): nothing is left behind,
even when the process is killed.
"""

from __future__ import annotations

import logging
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import numpy as np
import numpy.typing as npt

from airflow_provider_postgres_cdc.errors import SequencingError
from airflow_provider_postgres_cdc.formats import wire
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.columnar_buffer import PAD
from airflow_provider_postgres_cdc.replication.raw_messages import RawMessages

log = logging.getLogger(__name__)

DEFAULT_MAX_MEMORY_BYTES = 512 << 20
# The decoder reads fixed-width fields past a message's end: every joined buffer carries its padding.
DECODER_PADDING = len(PAD)
_BEGIN_BYTE, _COMMIT_BYTE, _STREAM_START_BYTE, _STREAM_STOP_BYTE, _STREAM_COMMIT_BYTE, _STREAM_ABORT_BYTE = (
    ord(c) for c in "BCSEcA"
)
_CONTROL = np.zeros(256, dtype=np.bool_)
_CONTROL[[ord(c) for c in "BCSEcAbPKrp"]] = True
_STREAMING = np.zeros(256, dtype=np.bool_)
_STREAMING[[ord(c) for c in "SEcAbPKrp"]] = True
# Messages that carry the (sub)transaction xid after their type byte inside a stream block.
_XID_PREFIXED = np.zeros(256, dtype=np.bool_)
_XID_PREFIXED[[ord(c) for c in "RYIUDTM"]] = True
# Messages dropped with an aborted subtransaction (Relation and Type messages stay: pgoutput
# counts the schema as sent for the whole top-level transaction).
_CHANGE = np.zeros(256, dtype=np.bool_)
_CHANGE[[ord(c) for c in "IUDTM"]] = True
_PART_HEAD = struct.Struct("!QQ")
U8Array = npt.NDArray[np.uint8]
I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """How the drain's one memory setting is shared out.

    The transport holds about four chunks (reading, queued, being split; the stream's Python
    objects double that): a sixth; the sequencer up to ``hold_bytes`` of undecided
    transactions before spilling: an eighth; the decode stage up to three pieces in flight (two
    being typed, one being staged), each expanded about eight times by per-column arrays and
    Arrow buffers: half. The rest is margin for row shapes that expand more.
    """

    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES

    @property
    def chunk_bytes(self) -> int:
        return self.max_memory_bytes // 48

    @property
    def hold_bytes(self) -> int:
        return self.max_memory_bytes // 8

    @property
    def piece_bytes(self) -> int:
        return self.max_memory_bytes // 48


@dataclass(slots=True)
class Piece:
    """Messages ready for the decoder: whole committed transactions in commit order, in plain
    protocol-1 form, padded for the decoder. When ``continues``, the first transaction is the
    one the previous piece ended with (its change numbering goes on); ``commits`` counts the
    transactions whose last piece this is, ``end_lsn`` is the end of the last of them."""

    raw: RawMessages
    continues: bool = False
    commits: int = 0
    end_lsn: Lsn | None = None


def _compact(raw: RawMessages) -> RawMessages:
    """A copy of the messages in a buffer of their own (so the chunk they came from can go)."""
    first, end = int(raw.offsets[0]), int(raw.offsets[-1] + raw.lengths[-1])
    return RawMessages(raw.buffer[first:end], raw.offsets - first, raw.lengths, raw.lsns, raw.xids)


def _unprefixed(raw: RawMessages) -> RawMessages:
    """Stream-block messages as plain ones: the xid after the type byte goes to ``xids``, and the
    type byte is moved onto the xid's last byte, so each message just starts 4 bytes later."""
    first, end = int(raw.offsets[0]), int(raw.offsets[-1] + raw.lengths[-1])
    buffer = bytearray(raw.buffer[first:end])
    data = np.frombuffer(buffer, dtype=np.uint8)
    offsets = raw.offsets - first
    kinds = data[offsets]
    prefixed = np.flatnonzero(_XID_PREFIXED[kinds])
    at = offsets[prefixed]
    xids = raw.xids.copy()
    xids[prefixed] = (
        (data[at + 1].astype(np.int64) << 24) | (data[at + 2].astype(np.int64) << 16)
        | (data[at + 3].astype(np.int64) << 8) | data[at + 4]
    )  # fmt: skip
    data[at + 4] = kinds[prefixed]
    offsets = offsets.copy()
    offsets[prefixed] += 4
    lengths = raw.lengths.copy()
    lengths[prefixed] -= 4
    return RawMessages(bytes(buffer), offsets, lengths, raw.lsns, xids)


class _Direct:
    """Whole plain transactions of the current chunk, handed out as one piece that views the
    chunk's buffer (no copy); ``begun`` is where a plain transaction began in this chunk."""

    def __init__(self, raw: RawMessages) -> None:
        self.raw = raw
        self.indices: list[int] = []
        self.commits = 0
        self.begun: int | None = None

    def commit(self, index: int) -> None:
        assert self.begun is not None
        self.indices.extend(range(self.begun, index + 1))
        self.commits += 1
        self.begun = None

    def flush(self, end_lsn: Lsn | None) -> Iterator[Piece]:
        if self.indices:
            whole = self.raw.take(np.array(self.indices, dtype=np.int64))
            yield Piece(
                RawMessages.joined([whole], padding=DECODER_PADDING), commits=self.commits, end_lsn=end_lsn
            )
            self.indices, self.commits = [], 0


def _single(lsn: int, message: bytes) -> RawMessages:
    return RawMessages.from_messages([(lsn, message)])


@dataclass(slots=True)
class _Undecided:
    """One transaction not yet committed: its messages in memory, then in its spill file."""

    xid: int
    streamed: bool
    begin: RawMessages | None = None
    parts: list[RawMessages] = field(default_factory=list)
    held: int = 0
    aborted: set[int] = field(default_factory=set)
    spill: IO[bytes] | None = None
    spilled: int = 0

    def add(self, raw: RawMessages) -> int:
        part = _unprefixed(raw) if self.streamed else _compact(raw)
        self.parts.append(part)
        size = len(part.buffer)
        self.held += size
        return size

    def spill_parts(self, directory: str | None) -> int:
        """Write the in-memory messages to the spill file; returns the bytes freed."""
        if not self.parts:
            return 0
        if self.spill is None:
            # Closed by close(), which every end of the transaction and of the read calls.
            self.spill = tempfile.TemporaryFile(prefix=f"postgres-cdc-drain-xid{self.xid}-", dir=directory)  # noqa: SIM115
        for part in self.parts:
            self.spill.write(_PART_HEAD.pack(len(part), len(part.buffer)))
            for array in (part.offsets, part.lengths, part.xids, part.lsns):
                self.spill.write(np.ascontiguousarray(array).tobytes())
            self.spill.write(part.buffer)
        freed, self.held, self.parts = self.held, 0, []
        self.spilled += freed
        return freed

    def read_parts(self) -> Iterator[RawMessages]:
        """Every part in order: the spilled ones read back one at a time, then those in memory."""
        if self.spill is not None:
            self.spill.flush()
            self.spill.seek(0)
            while head := self.spill.read(_PART_HEAD.size):
                count, size = _PART_HEAD.unpack(head)
                offsets, lengths, xids = (
                    np.frombuffer(self.spill.read(8 * count), np.int64) for _ in range(3)
                )
                lsns = np.frombuffer(self.spill.read(8 * count), np.uint64)
                yield RawMessages(self.spill.read(size), offsets, lengths, lsns, xids)
        yield from self.parts

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.parts, self.held = [], 0


class Sequencer:
    """Feeds on raw message chunks in wire order; yields :class:`Piece` objects in commit order.

    The transport must end its read on a transaction boundary; streamed transactions still
    undecided at :meth:`finish` commit after the batch's end and are dropped (the server sends
    them again, whole, to the next batch).
    """

    def __init__(self, budget: MemoryBudget, spill_dir: str | None = None) -> None:
        self.budget = budget
        self.spill_dir = spill_dir
        self.plain: _Undecided | None = None
        self.streams: dict[int, _Undecided] = {}
        self.block: int | None = None
        self.held = 0
        self.commits = 0
        self.last_end: Lsn | None = None
        self.spilled_bytes = 0

    def feed(self, raw: RawMessages) -> Iterator[Piece]:
        """Take the next chunk; yield what it completes."""
        if not len(raw):
            return
        kinds = raw.kinds()
        control = np.flatnonzero(_CONTROL[kinds])
        if self.block is None and not np.any(_STREAMING[kinds[control]]):
            yield from self._plain_chunk(raw, kinds, control)
        else:
            yield from self._general_chunk(raw, kinds, control.tolist())
        if self.held > self.budget.hold_bytes:
            self._spill()

    def finish(self) -> None:
        """End of the read: drop what did not commit in it."""
        if self.plain is not None:
            self.close()
            raise SequencingError("the read ended inside a transaction; retry the drain")
        if self.streams:
            log.info(
                "streamed transactions %s do not commit in this batch: the next batch reads them again",
                sorted(self.streams),
            )
        self.close()

    def close(self) -> None:
        """Remove every spill file (also on errors)."""
        for txn in [*self.streams.values(), *([self.plain] if self.plain else [])]:
            txn.close()
        self.streams, self.plain, self.held = {}, None, 0

    def _plain_chunk(self, raw: RawMessages, kinds: U8Array, control: I64Array) -> Iterator[Piece]:
        """No streaming message in sight: only Begin/Commit positions matter, found at once."""
        commits = control[kinds[control] == _COMMIT_BYTE]
        position = 0
        if self.plain is not None:
            if not len(commits):
                self._add(self.plain, raw)
                return
            first = int(commits[0])
            if first:
                self._add(self.plain, raw.select(0, first))
            yield from self._release(self.plain, raw.select(first, first + 1), raw.message(first))
            self.plain, position = None, first + 1
        last = int(commits[-1]) if len(commits) else -1
        if last >= position:
            count = int(np.count_nonzero(commits >= position))
            self._count_commit(raw.message(last), count)
            whole = RawMessages.joined([raw.select(position, last + 1)], padding=DECODER_PADDING)
            yield Piece(whole, commits=count, end_lsn=self.last_end)
            position = last + 1
        if position < len(raw):
            self._begin_plain(raw, position, len(raw))

    def _general_chunk(self, raw: RawMessages, kinds: U8Array, control: list[int]) -> Iterator[Piece]:
        """Streaming messages present: walk the control messages (a few per block) one by one."""
        direct = _Direct(raw)
        previous = 0
        for index in [*control, len(raw)]:
            if index > previous:  # a run of changes between two control messages
                self._run_of_changes(direct, previous, index)
            if index == len(raw):
                break
            previous = index + 1
            kind = int(kinds[index])
            if kind == _BEGIN_BYTE:
                direct.begun = index
            elif kind == _COMMIT_BYTE and direct.begun is not None:
                direct.commit(index)
                self._count_commit(raw.message(index), 1)
            elif kind in (_COMMIT_BYTE, _STREAM_COMMIT_BYTE):
                yield from direct.flush(self.last_end)
                yield from self._commit_undecided(raw, index)
            elif kind == _STREAM_START_BYTE:
                self.block = wire.STREAM_START.unpack_from(raw.message(index), 1)[0]
                self.streams.setdefault(self.block, _Undecided(self.block, streamed=True))
            elif kind == _STREAM_STOP_BYTE:
                self.block = None
            elif kind == _STREAM_ABORT_BYTE:
                self._stream_abort(raw.message(index))
            else:
                raise SequencingError(
                    f"two-phase message {chr(kind)!r}: the drain does not enable two_phase; use a slot "
                    "created without it"
                )
        yield from direct.flush(self.last_end)
        if direct.begun is not None:
            self._begin_plain(raw, direct.begun, len(raw))

    def _run_of_changes(self, direct: _Direct, start: int, stop: int) -> None:
        """Messages between two control messages go to the transaction they belong to."""
        if self.block is not None:
            self._add(self.streams[self.block], direct.raw.select(start, stop))
        elif direct.begun is None:
            if self.plain is None:
                raise SequencingError(
                    f"change outside any transaction at {Lsn(int(direct.raw.lsns[start]))}; the stream "
                    "is damaged, retry the drain"
                )
            self._add(self.plain, direct.raw.select(start, stop))

    def _commit_undecided(self, raw: RawMessages, index: int) -> Iterator[Piece]:
        """A Commit ending the plain transaction carried from earlier chunks, or a Stream Commit."""
        message = raw.message(index)
        if message[:1] == b"c":
            yield from self._stream_commit(raw, index, message)
            return
        if self.plain is None:
            raise SequencingError("Commit of a transaction that never began; retry the drain")
        plain, self.plain = self.plain, None
        yield from self._release(plain, raw.select(index, index + 1), message)

    def _begin_plain(self, raw: RawMessages, start: int, stop: int) -> None:
        if raw.kinds()[start] != _BEGIN_BYTE:
            raise SequencingError(
                f"change outside any transaction at {Lsn(int(raw.lsns[start]))}; retry the drain"
            )
        self.plain = _Undecided(wire.BEGIN.unpack_from(raw.message(start), 1)[2], streamed=False)
        self.plain.begin = _compact(raw.select(start, start + 1))
        if stop > start + 1:
            self._add(self.plain, raw.select(start + 1, stop))

    def _add(self, txn: _Undecided, raw: RawMessages) -> None:
        self.held += txn.add(raw)

    def _spill(self) -> None:
        for txn in [*self.streams.values(), *([self.plain] if self.plain else [])]:
            freed = txn.spill_parts(self.spill_dir)
            if freed and txn.spilled == freed:
                log.info("transaction %d is larger than memory allows: spilling it to disk", txn.xid)
            self.held -= freed
            self.spilled_bytes += freed

    def _count_commit(self, commit: bytes, count: int) -> None:
        self.commits += count
        self.last_end = Lsn(wire.COMMIT.unpack_from(commit, 1)[2])

    def _stream_commit(self, raw: RawMessages, index: int, message: bytes) -> Iterator[Piece]:
        xid, _, commit_lsn, end_lsn, commit_time = wire.STREAM_COMMIT.unpack_from(message, 1)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise SequencingError(f"Stream Commit of transaction {xid} that never streamed; retry the drain")
        lsn = int(raw.lsns[index])
        txn.begin = _single(lsn, b"B" + wire.BEGIN.pack(commit_lsn, commit_time, xid))
        commit = b"C" + wire.COMMIT.pack(0, commit_lsn, end_lsn, commit_time)
        yield from self._release(txn, _single(lsn, commit), commit)

    def _stream_abort(self, message: bytes) -> None:
        xid, subxid = wire.STREAM_ABORT.unpack_from(message, 1)
        txn = self.streams.get(xid)
        if txn is None:
            return
        if xid == subxid:
            self.held -= txn.held
            txn.close()
            del self.streams[xid]
        else:
            txn.aborted.add(subxid)

    def _release(self, txn: _Undecided, commit: RawMessages, commit_message: bytes) -> Iterator[Piece]:
        """A committed transaction as pieces of at most ``piece_bytes`` (one message may exceed it)."""
        assert txn.begin is not None
        self.held -= txn.held
        limit = self.budget.piece_bytes
        batch: list[RawMessages] = []
        size = 0
        continues = False
        try:
            for part in txn.read_parts():
                if txn.aborted:
                    part = part.take(~(_CHANGE[part.kinds()] & np.isin(part.xids, list(txn.aborted))))
                ends = np.cumsum(part.lengths)
                start = 0
                while start < len(part):
                    base = int(ends[start - 1]) if start else 0
                    stop = int(np.searchsorted(ends, base + limit - size, side="right"))
                    if stop <= start:
                        if batch:  # this piece is full
                            yield Piece(
                                RawMessages.joined([txn.begin, *batch, commit], DECODER_PADDING), continues
                            )
                            batch, size, continues = [], 0, True
                            continue
                        stop = start + 1  # one message larger than a piece goes alone
                    batch.append(part.select(start, stop))
                    size += int(ends[stop - 1]) - base
                    start = stop
        finally:
            txn.close()
        self._count_commit(commit_message, 1)
        yield Piece(RawMessages.joined([txn.begin, *batch, commit], DECODER_PADDING), continues,
                    commits=1, end_lsn=self.last_end)  # fmt: skip
