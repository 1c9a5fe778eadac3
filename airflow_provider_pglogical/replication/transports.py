"""Reading raw pgoutput messages from a slot without ever moving it.

Two transports deliver the same thing, runs of raw messages (:class:`RawMessages`) for the
transactions a slot holds between its confirmed position and a bound:

* :class:`PeekTransport` (the default) runs ``pg_logical_slot_peek_binary_changes`` inside
  ``COPY … TO STDOUT (FORMAT binary)``. Peeking never consumes, and COPY hands the rows over
  as one byte stream that is cut into bounded chunks, instead of a Python object per column
  per row (a server-side cursor spent seconds on that alone).
* :class:`StreamingTransport` runs ``START_REPLICATION`` (protocol 2, ``streaming on`` for
  large transactions). psycopg2 confirms a keepalive's WAL end by itself whenever no data
  message is pending, and answers the server's reply requests with that position, so feedback
  cannot be fully controlled on the stream itself (measured: the slot moved with only
  unpublished tables written). The transport therefore streams from a *temporary copy* of
  the slot (``pg_copy_logical_replication_slot``) made on the replication connection: the copy
  starts at the slot's exact position, whatever feedback it receives dies with the
  connection, and the real slot is never touched. It needs one free replication slot.

Both end on a commit: the peek at the server's ``upto_lsn``/``upto_nchanges``, the stream
before the first commit at or past the bound or right after the first one past the message
limit (see :meth:`StreamingTransport.read`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import select
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg2
import psycopg2.errors
from psycopg2 import sql

from airflow_provider_pglogical.errors import (
    ConnectionLostError,
    SlotActiveError,
    SlotNotFoundError,
    TransportError,
)
from airflow_provider_pglogical.formats.lsn import Lsn
from airflow_provider_pglogical.replication.connection import (
    connection_lost_detail,
    is_connection_loss,
    missing_replication,
)
from airflow_provider_pglogical.replication.publications import publication_names_option

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 << 20

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER = struct.Struct("!11sii")
# One peek row in binary COPY: 3 fields; pg_lsn (8 bytes), xid (4 bytes), bytea (n bytes).
_ROW_HEAD = struct.Struct("!hiQiIi")
_ROW_HEAD_SIZE = _ROW_HEAD.size
_ROW_HEAD_FIELDS = np.dtype(
    [
        ("fields", ">i2"),
        ("lsn_length", ">i4"),
        ("lsn", ">u8"),
        ("xid_length", ">i4"),
        ("xid", ">u4"),
        ("length", ">i4"),
    ]
)
_BEGIN_FINAL_LSN = struct.Struct("!Q")  # at byte 1 of Begin
_STREAM_COMMIT_LSN = struct.Struct("!Q")  # at byte 6 of Stream Commit, after the xid and flags


@dataclass(slots=True)
class RawMessages:
    """A run of raw pgoutput messages sharing one buffer.

    Message ``i`` is ``buffer[offsets[i]:offsets[i] + lengths[i]]``, written to WAL at
    ``lsns[i]`` by transaction ``xids[i]`` (0 when the transport does not know it). Keeping
    one buffer with offsets lets the columnar decoder parse many messages at once.
    """

    buffer: bytes
    offsets: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    lsns: npt.NDArray[np.uint64]
    xids: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.offsets)

    def message(self, index: int) -> bytes:
        start = int(self.offsets[index])
        return self.buffer[start : start + int(self.lengths[index])]

    def select(self, start: int, stop: int) -> RawMessages:
        """Messages ``start`` to ``stop - 1``, sharing this buffer."""
        return RawMessages(
            self.buffer, self.offsets[start:stop], self.lengths[start:stop], self.lsns[start:stop],
            self.xids[start:stop],
        )  # fmt: skip

    def take(self, picked: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> RawMessages:
        """The messages ``picked`` (indices or a mask), sharing this buffer."""
        return RawMessages(
            self.buffer, self.offsets[picked], self.lengths[picked], self.lsns[picked], self.xids[picked]
        )

    def kinds(self) -> npt.NDArray[np.uint8]:
        """The type byte of every message."""
        if not len(self):
            return np.empty(0, np.uint8)
        return np.frombuffer(self.buffer, dtype=np.uint8)[self.offsets]

    @classmethod
    def joined(cls, parts: Sequence[RawMessages], padding: int = 0) -> RawMessages:
        """One run over one buffer from several, copying only the byte regions the messages use,
        with ``padding`` zero bytes after the last message (``parts`` must not be empty)."""
        if len(parts) == 1 and len(parts[0]):
            only = parts[0]
            end = int(only.offsets[-1] + only.lengths[-1])
            if end + padding <= len(only.buffer):
                return only
        regions: list[bytes] = []
        offsets: list[npt.NDArray[np.int64]] = []
        size = 0
        for part in parts:
            if not len(part):
                continue
            first, end = int(part.offsets[0]), int(part.offsets[-1] + part.lengths[-1])
            regions.append(part.buffer[first:end])
            offsets.append(part.offsets - first + size)
            size += end - first
        regions.append(bytes(padding))
        return cls(
            b"".join(regions),
            np.concatenate(offsets) if offsets else np.empty(0, np.int64),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.lsns for p in parts]),
            np.concatenate([p.xids for p in parts]),
        )

    def __iter__(self) -> Iterator[tuple[Lsn, bytes]]:
        for index in range(len(self)):
            yield Lsn(int(self.lsns[index])), self.message(index)

    @classmethod
    def from_messages(cls, messages: Sequence[tuple[int, bytes]]) -> RawMessages:
        """Join ``(lsn, payload)`` pairs into one buffer."""
        lengths = np.fromiter((len(p) for _, p in messages), dtype=np.int64, count=len(messages))
        offsets = np.zeros(len(messages), dtype=np.int64)
        if len(messages) > 1:
            np.cumsum(lengths[:-1], out=offsets[1:])
        lsns = np.fromiter((lsn for lsn, _ in messages), dtype=np.uint64, count=len(messages))
        xids = np.zeros(len(messages), dtype=np.int64)
        return cls(b"".join(p for _, p in messages), offsets, lengths, lsns, xids)


@dataclass(slots=True)
class ReadResult:
    """How a read ended: whether a limit cut it short, and how far the server had decoded."""

    messages: int = 0
    bytes: int = 0
    truncated: bool = False
    wal_end: Lsn | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def plugin_options(
    publications: Sequence[str], *, proto_version: int = 1, binary: bool = False, messages: bool = False,
    streaming: bool = False,
) -> list[tuple[str, str]]:  # fmt: skip
    """pgoutput's options as name/value pairs, in the order the server expects none of."""
    options = [
        ("proto_version", str(proto_version)),
        ("publication_names", publication_names_option(publications)),
    ]
    if binary:
        options.append(("binary", "true"))
    if messages:
        options.append(("messages", "true"))
    if streaming:
        options.append(("streaming", "on"))
    return options


def _translate(exc: psycopg2.Error, slot: str, role: str | None = None) -> BaseException:
    if isinstance(exc, psycopg2.errors.ObjectInUse):
        return SlotActiveError(
            f"replication slot {slot!r} is active in another connection (another drain or a subscriber); "
            "a slot has one consumer at a time. Stop the other consumer or wait for it to finish."
        )
    if isinstance(exc, psycopg2.errors.UndefinedObject) and "replication slot" in str(exc):
        return SlotNotFoundError(f"replication slot {slot!r} does not exist")
    if isinstance(exc, psycopg2.errors.InsufficientPrivilege) and "replication role" in str(exc):
        return missing_replication(role, exc)
    if is_connection_loss(exc):
        return ConnectionLostError(
            f"lost the connection to PostgreSQL while reading slot {slot!r} ({connection_lost_detail(exc)}): "
            "the server restarted or the backend was terminated. The slot did not move and nothing of "
            "this read was kept: run the drain again, it starts from the same position."
        )
    translated: BaseException = exc
    return translated


class _ChunkWriter:
    """The file object COPY writes into: hands the stream over in chunks of about ``chunk_bytes``.

    psycopg2 calls ``write`` once per CopyData message and PostgreSQL sends every row of a binary
    COPY in a message of its own (the file header rides with the first row, the trailer comes
    alone), so a chunk is kept as the list of messages: their lengths tell the reader where each
    row starts (:func:`_framed_rows`) without searching the bytes for row headers.
    """

    def __init__(self, chunks: queue.Queue[list[bytes] | BaseException | None], chunk_bytes: int) -> None:
        self._chunks = chunks
        self._chunk_bytes = chunk_bytes
        self._parts: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> int:
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self._chunk_bytes:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._parts:
            self._chunks.put(self._parts)
            self._parts, self._size = [], 0


class PeekTransport:
    """Non-consuming reads through ``pg_logical_slot_peek_binary_changes`` (see module docstring)."""

    def __init__(self, conn: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.conn = conn
        self.chunk_bytes = chunk_bytes

    def read(
        self,
        slot: str,
        options: Sequence[tuple[str, str]],
        *,
        upto_lsn: Lsn,
        max_messages: int | None,
        result: ReadResult,
    ) -> Iterator[RawMessages]:
        """Yield the slot's messages of transactions committed before ``upto_lsn``, in chunks.

        ``max_messages`` ends the read at the first transaction boundary at or past that many
        messages (the server's ``upto_nchanges``); ``result.truncated`` then says so.
        """
        flat = [sql.Literal(item) for pair in options for item in pair]
        query = sql.SQL(
            "COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes({}, {}::pg_lsn, {}, {})) "
            "TO STDOUT (FORMAT binary)"
        ).format(
            sql.Literal(slot), sql.Literal(str(upto_lsn)), sql.Literal(max_messages), sql.SQL(", ").join(flat)
        )
        chunks: queue.Queue[list[bytes] | BaseException | None] = queue.Queue(maxsize=2)
        writer = _ChunkWriter(chunks, self.chunk_bytes)

        def copy() -> None:
            try:
                with self.conn.cursor() as cur:
                    cur.copy_expert(query, writer)
                writer.flush()
                chunks.put(None)
            except BaseException as exc:  # handed to the reading thread, which raises it
                chunks.put(exc)

        thread = threading.Thread(target=copy, name=f"peek-{slot}", daemon=True)
        thread.start()
        try:
            yield from self._parse(chunks, result, slot)
        finally:
            if thread.is_alive():  # the consumer stopped early: cancel the COPY, unblock the writer
                self.conn.cancel()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    chunks.get(timeout=0.1)
            thread.join()
        if max_messages is not None and result.messages >= max_messages:
            result.truncated = True

    def _parse(
        self, chunks: queue.Queue[list[bytes] | BaseException | None], result: ReadResult, slot: str
    ) -> Iterator[RawMessages]:
        tail = b""
        header_seen = False
        framed = True  # one row per message so far (see _ChunkWriter)
        while True:
            item = chunks.get()
            if isinstance(item, BaseException):
                raise (
                    _translate(item, slot, self.conn.info.user) if isinstance(item, psycopg2.Error) else item
                )
            if item is None:
                if tail:
                    raise TransportError(f"COPY stream ended inside a row ({len(tail)} bytes left)")
                return
            sizes = np.fromiter(map(len, item), dtype=np.int64, count=len(item))
            data = b"".join([tail, *item, _PADDING])  # the padding spares the decoder a copy
            end = len(data) - len(_PADDING)
            pos = 0
            if not header_seen:
                signature, _flags, ext = _COPY_HEADER.unpack_from(data, 0)
                if signature != _COPY_SIGNATURE:
                    raise TransportError("not a binary COPY stream")
                pos = _COPY_HEADER.size + ext
                header_seen = True
            framed_rows = _framed_rows(data, sizes, pos) if framed else None
            if framed_rows is not None:
                batch, done = framed_rows
            else:
                framed = False
                batch, pos, done = _split_rows(data[:end], pos)
                tail = b"" if done else data[pos:end]
            if len(batch):
                result.messages += len(batch)
                result.bytes += int(batch.lengths.sum())
                yield batch
            if done:
                return


_PADDING = bytes(16)


def _framed_rows(data: bytes, sizes: npt.NDArray[np.int64], skip: int) -> tuple[RawMessages, bool] | None:
    """The rows of a chunk whose messages (of ``sizes`` bytes, the first after ``skip`` bytes of
    file header) each hold one row, then possibly the trailer; also whether the trailer came.
    ``None`` when the messages are cut otherwise: the caller then searches the byte stream.
    ``data`` is the messages joined, then 16 bytes of padding."""
    starts = np.cumsum(sizes) - sizes
    if len(sizes):
        starts[0] += skip
        sizes = sizes.copy()
        sizes[0] -= skip
    done = bool(len(sizes)) and sizes[-1] == 2 and data[starts[-1] : starts[-1] + 2] == b"\xff\xff"
    if done:
        starts, sizes = starts[:-1], sizes[:-1]
    if np.any(sizes < _ROW_HEAD_SIZE):
        return None
    heads = np.ndarray(
        shape=(len(data) - _ROW_HEAD_SIZE + 1,), dtype=_ROW_HEAD_FIELDS, buffer=data, strides=(1,)
    )
    head = heads[starts]  # one gather of whole headers, then field reads on the compact copy
    if not np.all(
        (head["fields"] == 3)
        & (head["lsn_length"] == _LSN_LENGTH)
        & (head["xid_length"] == _XID_LENGTH)
        & (head["length"] == sizes - _ROW_HEAD_SIZE)
    ):
        return None
    raw = RawMessages(
        data,
        starts + _ROW_HEAD_SIZE,
        sizes - _ROW_HEAD_SIZE,
        head["lsn"].astype(np.uint64),
        head["xid"].astype(np.int64),
    )
    return raw, done


_ROW_FIRST_WORD = 0x00030000  # 3 fields, then the first half of the LSN's length (8)
_LSN_LENGTH, _XID_LENGTH = 8, 4


def _split_rows(data: bytes, pos: int) -> tuple[RawMessages, int, bool]:
    """Index the complete rows of a binary COPY chunk; returns the rows, where the rest starts,
    and whether the end-of-data marker was reached.

    Each row's start depends on the previous row's length, which a Python loop would follow
    one row at a time (it was the drain's costliest per-row step). Instead every position whose
    bytes look like a row header is a candidate; each candidate's successor (start + header +
    length) is looked up among the candidates, and the chain from ``pos``, a known row start,
    is followed by pointer doubling (log2(rows) numpy passes). Message bytes that happen to
    look like a header are never on that chain, because real rows only lead to real rows.
    """
    end = len(data)
    last_head = end - _ROW_HEAD_SIZE
    if pos > last_head:
        return _no_rows(data, pos)
    buf = np.frombuffer(data, dtype=np.uint8)
    words = np.ndarray(shape=(end - 3,), dtype=">u4", buffer=data, strides=(1,))
    starts = np.flatnonzero(buf[pos + 1 : last_head + 2] == 3) + pos  # byte 1 of a header is 3
    starts = starts[
        (words[starts] == _ROW_FIRST_WORD)
        & (words[starts + 2] == _LSN_LENGTH)
        & (words[starts + 14] == _XID_LENGTH)
    ]
    if not len(starts) or starts[0] != pos:
        return _no_rows(data, pos)
    lengths = words[starts + 22].astype(np.int64)
    following = starts + _ROW_HEAD_SIZE + lengths
    successor = np.searchsorted(starts, following)
    found = successor < len(starts)
    found[found] = starts[successor[found]] == following[found]
    terminal = len(starts)
    successor = np.append(np.where(found, successor, terminal), terminal)
    chain = _chain(successor, terminal)
    if following[chain[-1]] > end:  # the last row is cut off by the chunk's end
        chain = chain[:-1]
    rest = int(following[chain[-1]]) if len(chain) else pos
    done = data[rest : rest + 2] == b"\xff\xff" and rest + 2 == end
    if not done and rest <= last_head and len(chain) and not found[chain[-1]]:
        _no_rows(data, rest)  # raises on a header of another shape
        raise TransportError(f"unexpected bytes in the COPY stream at byte {rest}: not a peek row")
    quads = np.ndarray(shape=(end - 7,), dtype=">u8", buffer=data, strides=(1,))
    row_starts = starts[chain]
    raw = RawMessages(
        data,
        row_starts + _ROW_HEAD_SIZE,
        lengths[chain],
        quads[row_starts + 6].astype(np.uint64),
        words[row_starts + 18].astype(np.int64),
    )
    return raw, rest + 2 if done else rest, done


def _chain(successor: npt.NDArray[np.int64], terminal: int) -> npt.NDArray[np.int64]:
    """Candidate 0, its successor, that one's, ... up to (without) ``terminal``, which is its own
    successor: the path doubles in length with each numpy gather."""
    path = np.zeros(1, dtype=np.int64)
    jump = successor
    while path[-1] != terminal:
        path = np.concatenate([path, jump[path]])
        jump = jump[jump]
    return path[: int(np.searchsorted(path, terminal))]


def _no_rows(data: bytes, pos: int) -> tuple[RawMessages, int, bool]:
    """No complete row at ``pos``: the end-of-data marker, a partial row, or garbage."""
    if data[pos : pos + 2] == b"\xff\xff" and pos + 2 == len(data):
        return RawMessages.from_messages([]), pos + 2, True
    if pos + _ROW_HEAD_SIZE <= len(data):
        nfields = _ROW_HEAD.unpack_from(data, pos)[0]
        if nfields != 3:
            raise TransportError(f"unexpected COPY row with {nfields} fields at byte {pos}")
    return RawMessages.from_messages([]), pos, False


class StreamingTransport:
    """``START_REPLICATION`` on a temporary copy of the slot (see module docstring).

    :param conn: a ``LogicalReplicationConnection``, used for this one read.
    :param chunk_messages: yield a chunk after this many messages ...
    :param chunk_bytes: ... or this many payload bytes, whichever comes first (mid-block too:
        the consumer keeps undecided transactions aside, so a chunk may end anywhere).
    """

    def __init__(
        self,
        conn: Any,
        *,
        chunk_messages: int = 100_000,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        idle_timeout: float = 1.0,
    ) -> None:
        self.conn = conn
        self.chunk_messages = chunk_messages
        self.chunk_bytes = chunk_bytes
        self.idle_timeout = idle_timeout

    def read(
        self,
        slot: str,
        options: Sequence[tuple[str, str]],
        *,
        start_lsn: Lsn,
        upto_lsn: Lsn,
        max_messages: int | None,
        result: ReadResult,
        deadline_seconds: float = 3600.0,
    ) -> Iterator[RawMessages]:
        """Yield messages in wire order, in chunks, ending on a transaction boundary.

        A transaction counts at its commit, so the read stops on commits only: before the first
        Begin or Stream Commit whose commit LSN is at or past ``upto_lsn`` (it belongs to a later
        batch, even when its streamed blocks came earlier); right after the first Commit or Stream
        Commit at or past ``max_messages`` messages (``result.truncated``; a streamed transaction
        the limit falls into is thus read whole); or when the server says it has decoded past
        ``upto_lsn`` and no Begin .. Commit or stream block is open. Streamed transactions still
        undecided at the end commit after the end: the consumer drops them.
        """
        stream = self.conn.cursor()
        copy_name = f"{slot[:40]}_drain_{self.conn.get_backend_pid()}"
        try:
            stream.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, copy_name))
            stream.start_replication(
                slot_name=copy_name,
                decode=False,
                start_lsn=int(start_lsn),
                options=dict(options),
                status_interval=deadline_seconds * 10,
            )
        except psycopg2.Error as exc:
            raise _translate(exc, slot, self.conn.info.user) from exc
        try:
            yield from self._pump(stream, upto_lsn, max_messages, result, time.monotonic() + deadline_seconds)
        except psycopg2.Error as exc:
            raise _translate(exc, slot, self.conn.info.user) from exc
        finally:
            with contextlib.suppress(psycopg2.Error):
                stream.close()

    def _pump(
        self, stream: Any, upto_lsn: Lsn, max_messages: int | None, result: ReadResult, deadline: float
    ) -> Iterator[RawMessages]:
        pending: list[tuple[int, bytes]] = []
        size = 0
        inside = False  # within Begin..Commit or a streamed block Stream Start..Stream Stop
        while time.monotonic() < deadline:
            msg = stream.read_message()
            if msg is None:
                wal_end = Lsn(stream.wal_end)
                if not inside and wal_end >= upto_lsn:
                    result.wal_end = wal_end
                    break
                select.select([self.conn], [], [], self.idle_timeout)
                continue
            payload: bytes = msg.payload
            kind = payload[:1]
            if (kind == b"B" and _BEGIN_FINAL_LSN.unpack_from(payload, 1)[0] >= upto_lsn) or (
                kind == b"c" and _STREAM_COMMIT_LSN.unpack_from(payload, 6)[0] >= upto_lsn
            ):
                result.wal_end = upto_lsn
                break
            if kind in (b"B", b"S"):
                inside = True
            elif kind in (b"C", b"E"):
                inside = False
            pending.append((msg.data_start, payload))
            size += len(payload)
            result.messages += 1
            if len(pending) >= self.chunk_messages or size >= self.chunk_bytes:
                result.bytes += size
                yield RawMessages.from_messages(pending)
                pending, size = [], 0
            if kind in (b"C", b"c") and max_messages is not None and result.messages >= max_messages:
                result.truncated = True
                break
        else:
            raise TransportError(f"streaming did not reach {upto_lsn} within the drain's deadline")
        if pending:
            result.bytes += size
            yield RawMessages.from_messages(pending)
