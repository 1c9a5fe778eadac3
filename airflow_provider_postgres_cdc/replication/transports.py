"""Reading raw pgoutput messages from a slot without ever moving it.

Two transports deliver the same thing, runs of raw messages (:class:`RawMessages`) for the
transactions a slot holds between its confirmed position and a bound:

* :class:`PeekTransport` (the default) reads through the SQL interface inside
  ``COPY … TO STDOUT (FORMAT binary)``: COPY hands the rows over as one byte stream that is cut
  into bounded chunks, instead of a Python object per column per row (a server-side cursor
  spent seconds on that alone). It reads a temporary copy of the slot in several
  ``pg_logical_slot_get_binary_changes`` calls, so the server decodes the next run of
  transactions while the client works on the last (:mod:`peek_calls`); the copy dies with the
  session, and the real slot is never touched. Without a free replication slot, or when every
  call would re-read a long backlog, it peeks the real slot in one call.
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

from airflow_provider_postgres_cdc.errors import (
    ConnectionLostError,
    SlotActiveError,
    SlotNotFoundError,
    TransportError,
)
from airflow_provider_postgres_cdc.formats import wire
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import peek_calls
from airflow_provider_postgres_cdc.replication.connection import (
    connection_lost_detail,
    is_connection_loss,
    missing_replication,
)
from airflow_provider_postgres_cdc.replication.peek_calls import PeekCalls, worth_splitting
from airflow_provider_postgres_cdc.replication.publications import publication_names_option
from airflow_provider_postgres_cdc.replication.raw_messages import (
    PADDING,
    RawMessages,
    copy_header_end,
    framed_rows,
    split_rows,
)
from airflow_provider_postgres_cdc.replication.slots import describe_slot

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 << 20


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
    streaming: bool | str = False,
) -> list[tuple[str, str]]:  # fmt: skip
    """pgoutput's options as name/value pairs, in the order the server expects none of.

    ``streaming`` is ``True`` (``on``, protocol 2+) or ``"parallel"`` (protocol 4, PostgreSQL 16+).
    """
    options = [
        ("proto_version", str(proto_version)),
        ("publication_names", publication_names_option(publications)),
    ]
    if binary:
        options.append(("binary", "true"))
    if messages:
        options.append(("messages", "true"))
    if streaming:
        options.append(("streaming", "on" if streaming is True else str(streaming)))
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


_Chunks = queue.Queue[tuple[bytes, npt.NDArray[np.int64]] | BaseException | None]


class _ChunkWriter:
    """The file object COPY writes into: hands the stream over in chunks of about ``chunk_bytes``.

    psycopg2 calls ``write`` once per CopyData message and PostgreSQL sends every row of a binary
    COPY in a message of its own (the file header rides with the first row, the trailer comes
    alone), so a chunk goes with its message sizes: they tell the reader where each row starts
    (:func:`raw_messages.framed_rows`) without searching the bytes for row headers. The chunk is
    joined here, on the copy thread, which otherwise waits for the server; the padding after it
    spares the decoder a copy.
    """

    def __init__(self, chunks: _Chunks, chunk_bytes: int) -> None:
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
            parts = self._parts
            sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            parts.append(PADDING)
            self._parts, self._size = [], 0
            self._chunks.put((b"".join(parts), sizes))


class PeekTransport:
    """Non-consuming reads through the SQL interface (see module docstring).

    :param split: read a temporary copy of the slot in several calls (:mod:`peek_calls`);
        ``False`` peeks the slot itself in one call.
    :param first_call: messages the first of those calls asks for (default
        :data:`peek_calls.FIRST_CALL_MESSAGES`).
    """

    def __init__(
        self,
        conn: Any,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        split: bool = True,
        first_call: int | None = None,
    ) -> None:
        self.conn = conn
        self.chunk_bytes = chunk_bytes
        self.split = split
        self.first_call = first_call

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
        chunks: _Chunks = queue.Queue(maxsize=2)
        writer = _ChunkWriter(chunks, self.chunk_bytes)
        stop = threading.Event()

        def copy() -> None:
            try:
                with self.conn.cursor() as cur:
                    self._copy(cur, slot, options, upto_lsn, max_messages, writer, stop)
                chunks.put(None)
            except BaseException as exc:  # handed to the reading thread, which raises it
                chunks.put(exc)

        thread = threading.Thread(target=copy, name=f"peek-{slot}", daemon=True)
        thread.start()
        try:
            yield from self._parse(chunks, result, slot)
        finally:
            if thread.is_alive():  # the consumer stopped early: cancel the COPY, unblock the writer
                stop.set()
                self.conn.cancel()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    chunks.get(timeout=0.1)
            thread.join()
        if max_messages is not None and result.messages >= max_messages:
            result.truncated = True

    def _copy(
        self, cur: Any, slot: str, options: Sequence[tuple[str, str]], upto_lsn: Lsn,
        max_messages: int | None, writer: _ChunkWriter, stop: threading.Event,
    ) -> None:  # fmt: skip
        """Run the COPY calls of the window on the copy thread, each one's stream into ``writer``."""
        copy_name, start = self._make_copy(cur, slot, upto_lsn) if self.split else (None, None)
        if copy_name is None or start is None:
            cur.copy_expert(_peek_query("peek", slot, upto_lsn, max_messages, options), writer)
            writer.flush()
            return
        try:
            first = self.first_call or peek_calls.FIRST_CALL_MESSAGES
            calls = PeekCalls(start, upto_lsn, max_messages, first)
            limit: int | None = calls.first_limit()
            while limit is not None and not stop.is_set():
                cur.copy_expert(_peek_query("get", copy_name, upto_lsn, limit, options), writer)
                writer.flush()
                returned = cur.rowcount
                reached = describe_slot(self.conn, copy_name).confirmed_flush_lsn
                limit = calls.next_limit(returned, limit, reached or start)
            log.debug("peeked %s in %d calls on a temporary copy", slot, calls.calls)
        finally:
            with contextlib.suppress(psycopg2.Error):
                cur.execute("SELECT pg_drop_replication_slot(%s)", (copy_name,))

    def _make_copy(self, cur: Any, slot: str, upto_lsn: Lsn) -> tuple[str | None, Lsn | None]:
        """A temporary copy of ``slot`` to read in several calls, and where it starts; no copy when
        one call is better or possible only (the plain peek then reports a busy slot, or one of
        another database)."""
        info = describe_slot(self.conn, slot)
        restart, start = info.restart_lsn, info.confirmed_flush_lsn
        if info.active or info.database != self.conn.get_dsn_parameters().get("dbname"):
            return None, None
        if restart is None or start is None or not worth_splitting(restart, start, upto_lsn):
            return None, None
        copy_name = f"{slot[:40]}_peek_{self.conn.get_backend_pid()}"
        try:
            cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, copy_name))
        except psycopg2.errors.ConfigurationLimitExceeded as exc:
            log.info("peeking %s in one call: no replication slot is free for a copy (%s)", slot, exc)
            if not self.conn.autocommit:
                self.conn.rollback()
            return None, None
        return copy_name, start

    def _parse(self, chunks: _Chunks, result: ReadResult, slot: str) -> Iterator[RawMessages]:
        """Cut the COPY streams of the calls, one after the other, into runs of messages."""
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
                if tail or header_seen:
                    raise TransportError(f"COPY stream ended inside a row ({len(tail)} bytes left)")
                return
            data, sizes = item
            if tail:
                data = tail + data
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
            if done:  # this call's stream is over; the next call's (if any) starts with its header
                header_seen = False
                tail = b""


def _peek_query(
    function: str, slot: str, upto_lsn: Lsn, upto_nchanges: int | None, options: Sequence[tuple[str, str]]
) -> sql.Composed:
    """``COPY`` of ``pg_logical_slot_<function>_binary_changes`` over the window, in binary."""
    flat = [sql.Literal(item) for pair in options for item in pair]
    return sql.SQL(
        "COPY (SELECT lsn, xid, data FROM {}({}, {}::pg_lsn, {}, {})) TO STDOUT (FORMAT binary)"
    ).format(
        sql.Identifier("pg_catalog", f"pg_logical_slot_{function}_binary_changes"),
        sql.Literal(slot),
        sql.Literal(str(upto_lsn)),
        sql.Literal(upto_nchanges or None),
        sql.SQL(", ").join(flat),
    )


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
            if (kind == b"B" and wire.BEGIN.unpack_from(payload, 1)[0] >= upto_lsn) or (
                kind == b"c" and wire.STREAM_COMMIT.unpack_from(payload, 1)[2] >= upto_lsn
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
