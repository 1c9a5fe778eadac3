"""Raw pgoutput messages in one buffer, and how they are cut out of a binary COPY of the peek.

:class:`RawMessages` is what both transports hand on: runs of messages over one shared buffer,
so the columnar decoder parses many at once. The peek's rows arrive as ``COPY … (FORMAT binary)``
of ``(lsn pg_lsn, xid xid, data bytea)``; :func:`framed_rows` reads them from the CopyData
message sizes (one row per message, as PostgreSQL sends them) and :func:`split_rows` searches the
bytes for row headers when the messages are cut any other way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from airflow_provider_postgres_cdc.errors import TransportError
from airflow_provider_postgres_cdc.formats.lsn import Lsn

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


PADDING = bytes(16)
"""Zero bytes after a chunk's last row, so the decoder may read a word past any message."""


def framed_rows(data: bytes, sizes: npt.NDArray[np.int64], skip: int) -> tuple[RawMessages, bool] | None:
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


def split_rows(data: bytes, pos: int) -> tuple[RawMessages, int, bool]:
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


def copy_header_end(data: bytes) -> int:
    """Where the first row starts, after a binary COPY stream's signature, flags and extension."""
    signature, _flags, ext = _COPY_HEADER.unpack_from(data, 0)
    if signature != _COPY_SIGNATURE:
        raise TransportError("not a binary COPY stream")
    return int(_COPY_HEADER.size + ext)
