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
from airflow_provider_pglogical.replication.raw_messages import (
    PADDING,
    RawMessages,
    copy_header_end,
    framed_rows,
    split_rows,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 << 20

_BEGIN_FINAL_LSN = struct.Struct("!Q")  # at byte 1 of Begin
_STREAM_COMMIT_LSN = struct.Struct("!Q")  # at byte 6 of Stream Commit, after the xid and flags


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
    row starts (:func:`raw_messages.framed_rows`) without searching the bytes for row headers.
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
            data = b"".join([tail, *item, PADDING])  # the padding spares the decoder a copy
            end = len(data) - len(PADDING)
            pos = 0
            if not header_seen:
                pos = copy_header_end(data)
                header_seen = True
            rows = framed_rows(data, sizes, pos) if framed else None
            if rows is not None:
                batch, done = rows
            else:
                framed = False
                batch, pos, done = split_rows(data[:end], pos)
                tail = b"" if done else data[pos:end]
            if len(batch):
                result.messages += len(batch)
                result.bytes += int(batch.lengths.sum())
                yield batch
            if done:
                return


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
