"""One columnar batch's messages in a single buffer, the per-message arrays over it, and its errors.

:mod:`.columnar` walks the control messages of a :class:`MessageBuffer` and records the relation
cache generations; :mod:`.columnar_tuples` and :mod:`.columnar_tables` read the data messages
through it. It is their shared ground, so none of them imports another to reach it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.arrow import Int64Array
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import Relation
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache

PAD = bytes(16)
"""What a buffer must hold after its last message: fixed-width gathers never run off its end."""
VIEW_WINDOW = 1 << 30  # string_view offsets are int32: data buffers are 2 GiB windows every 1 GiB.
U8Array = npt.NDArray[np.uint8]
LsnArray = Sequence[int] | npt.NDArray[np.uint64]
"""Message LSNs, only used to name the position in error reports."""


class _MessageSlices(Sequence[bytes]):
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


class MessageBuffer:
    """One call's joined buffer and the per-message arrays over it."""

    def __init__(
        self,
        joined: bytes,
        starts: Int64Array,
        lengths: Int64Array,
        lsns: LsnArray | None,
        protocol_version: int,
        raw_text: bool = False,
    ) -> None:
        """``joined`` holds message ``i`` at ``starts[i]:starts[i] + lengths[i]`` (gaps allowed)
        and ends with at least the :data:`PAD` bytes. ``raw_text``: text values are SQL_ASCII
        bytes (see :class:`~.columnar.BatchDecoder`)."""
        self.messages = _MessageSlices(joined, starts, lengths)
        self.lsns = lsns
        self.protocol_version = protocol_version
        self.raw_text = raw_text
        count = len(starts)
        self.lengths: Int64Array = lengths
        self.starts: Int64Array = starts
        self.ends: Int64Array = starts + lengths
        self.buf: U8Array = np.frombuffer(joined, dtype=np.uint8)
        self.types: U8Array = self.buf[self.starts] if count else np.zeros(0, np.uint8)
        # Relation cache generation -> relation id -> Relation in force (filled by the walk).
        self.generations: list[dict[int, Relation]] = []
        if count and not self.lengths.all():
            self.fail_message(int(np.argmin(self.lengths)))
        # Overlapping 16-, 8- and 4-byte windows at every offset: one gather reads a view or an int.
        self.views = np.ndarray(shape=(self.buf.size - 15,), dtype="V16", buffer=joined, strides=(1,))
        self._words = np.ndarray(shape=(self.buf.size - 3,), dtype=">u4", buffer=joined, strides=(1,))
        self._quads = np.ndarray(shape=(self.buf.size - 7,), dtype=">i8", buffer=joined, strides=(1,))
        whole = pa.py_buffer(joined)
        self.data_buffers = [
            whole.slice(k * VIEW_WINDOW, min(2 * VIEW_WINDOW, len(joined) - k * VIEW_WINDOW))
            for k in range(max(1, -(-len(joined) // VIEW_WINDOW)))
        ]

    def lsn(self, index: int) -> Lsn | None:
        return None if self.lsns is None else Lsn(int(self.lsns[index]))

    def be32(self, positions: Int64Array) -> Int64Array:
        """Big-endian unsigned 32-bit values at each position (positions must be in bounds)."""
        return self._words[positions].astype(np.int64)

    def be64(self, positions: Int64Array) -> Int64Array:
        """Big-endian 64-bit values at each position, as int64 (unsigned ones wrap)."""
        return self._quads[positions].astype(np.int64)

    def fail_message(self, index: int, gen: int | None = None, prefix: int = 0) -> NoReturn:
        """Re-decode one message with the per-message decoder, which raises the precise error."""
        relations = RelationCache()
        if gen is not None:
            for relation in self.generations[gen].values():
                relations.add(relation)
        decoder = PgOutputDecoder(self.protocol_version, relations)
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
