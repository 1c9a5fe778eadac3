"""The TupleData of many Insert/Update/Delete messages of one relation version, parsed column by
column with numpy, and their values as Arrow arrays that view the batch's buffer (no copy).

For every column, one pass finds the kind byte, value start and length in all rows at once
(:func:`parse_tuples`); a :class:`RowChecker` collects rows whose bytes are inconsistent, which
the batch then re-decodes one message at a time to raise the precise error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_provider_postgres_cdc.pgoutput.arrow import MIXED_FORMATS, BoolArray, Int64Array
from airflow_provider_postgres_cdc.pgoutput.columnar_buffer import VIEW_WINDOW, MessageBuffer, U8Array
from airflow_provider_postgres_cdc.pgoutput.messages import MessageType, TupleKind
from airflow_provider_postgres_cdc.values.raw_text import escape_raw_text

_KEY_TUPLE, _OLD_TUPLE, _NEW_TUPLE = ord("K"), ord("O"), ord("N")
_TEXT_KIND, _BINARY_KIND = TupleKind.TEXT.value, TupleKind.BINARY.value
_UNCHANGED_KIND, _NULL_KIND = TupleKind.UNCHANGED_TOAST.value, TupleKind.NULL.value


@dataclass(slots=True)
class TupleColumns:
    """Per column: kind byte, value start and length, for the rows that carry this tuple."""

    kind: list[U8Array]
    start: list[Int64Array]
    length: list[Int64Array]

    def dense(self, rows: Int64Array, count: int) -> TupleColumns:
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
        return TupleColumns(kinds, starts, lengths)

    def arrays(self, batch: MessageBuffer) -> list[pa.Array]:
        out = []
        for kind, start, length in zip(self.kind, self.start, self.length, strict=True):
            binary = kind == _BINARY_KIND
            if np.any(binary):
                if np.any(kind == _TEXT_KIND):
                    batch.fail_at(int(start[np.argmax(binary)]) - 5, MIXED_FORMATS)
                out.append(binary_view(batch, start, length, binary).cast(pa.binary()))
                continue
            raw = binary_view(batch, start, length, kind == _TEXT_KIND)
            if batch.raw_text:
                out.append(escape_raw_text(raw))
                continue
            try:
                out.append(raw.cast(pa.string_view()))
            except pa.ArrowInvalid:
                batch.fail_at(int(start[_first_invalid_utf8(raw)]), "text value is not valid UTF-8")
        return out


@dataclass(slots=True)
class ParsedRows:
    new: TupleColumns
    new_rows: Int64Array
    old: TupleColumns
    old_rows: Int64Array


def unchanged_lists(new: TupleColumns, new_rows: Int64Array, count: int, names: pa.Array) -> pa.Array:
    """``_pgl_unchanged``: per row, the names of the columns sent as unchanged TOAST."""
    offsets = np.zeros(count + 1, dtype=np.int32)
    if not new.kind:
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array([], pa.string()))
    matrix = np.stack([k == _UNCHANGED_KIND for k in new.kind], axis=1)
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


def binary_view(batch: MessageBuffer, start: Int64Array, length: Int64Array, valid: BoolArray) -> pa.Array:
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
        buffer_index = start[long] // VIEW_WINDOW
        offset = start[long] - buffer_index * VIEW_WINDOW
        views["rest"][long] = (offset.astype(np.uint64) << np.uint64(32)) | buffer_index.astype(np.uint64)
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.binary_view(), count, [validity, pa.py_buffer(views), *batch.data_buffers], null_count=nulls
    )


class RowChecker:
    """Collects rows whose bytes fail a vector check; reads are clamped so they never fail.

    Reads past a message's end are not checked one field at a time: positions only grow, so
    any overrun shows in the final position, which :func:`parse_rows` compares with the end.
    """

    def __init__(self, batch: MessageBuffer, msg: Int64Array, prefix: Int64Array, gen: Int64Array) -> None:
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


def parse_tuples(
    check: RowChecker, rows: Int64Array, pos: Int64Array, width: int
) -> tuple[TupleColumns, Int64Array]:
    """Parse the TupleData starting at ``pos`` in each of ``rows`` (indices into the checker)."""
    bad = check.int_(pos, 2) != width
    pos = pos + 2
    kinds, starts, lengths = [], [], []
    for _ in range(width):
        kind = check.byte(pos)
        has_value = (kind == _TEXT_KIND) | (kind == _BINARY_KIND)
        known = has_value | (kind == _UNCHANGED_KIND) | (kind == _NULL_KIND)
        length = np.where(has_value, check.int_(pos + 1, 4), 0)
        # A 4-byte length with the top bit set is negative: never valid.
        bad |= ~known | (length >= 1 << 31)
        kinds.append(np.where(known, kind, 0).astype(np.uint8))
        starts.append(pos + 5)
        lengths.append(length)
        pos = pos + 1 + np.where(has_value, 4 + length, 0)
    check.bad[rows] |= bad
    return TupleColumns(kinds, starts, lengths), pos


def parse_rows(
    batch: MessageBuffer, msg: Int64Array, prefix: Int64Array, gen: Int64Array, width: int
) -> ParsedRows:
    """Parse the Insert/Update/Delete messages ``msg`` of one relation version, all at once."""
    check = RowChecker(batch, msg, prefix, gen)
    types = batch.types[msg]
    is_update = types == MessageType.UPDATE
    is_delete = types == MessageType.DELETE
    pos = batch.starts[msg] + 1 + prefix + 4
    marker = check.byte(pos)
    keyed = (marker == _KEY_TUPLE) | (marker == _OLD_TUPLE)
    check.bad |= np.where(
        is_delete, ~keyed, np.where(is_update, ~keyed & (marker != _NEW_TUPLE), marker != _NEW_TUPLE)
    )
    pos = pos + 1
    old_rows = np.flatnonzero(is_delete | (is_update & keyed))
    old, after_old = parse_tuples(check, old_rows, pos[old_rows], width)
    pos[old_rows] = after_old
    both = np.flatnonzero(is_update & keyed)
    check.bad[both] |= check.byte(pos[both]) != _NEW_TUPLE
    pos[both] += 1
    new_rows = np.flatnonzero(~is_delete)
    new, after_new = parse_tuples(check, new_rows, pos[new_rows], width)
    pos[new_rows] = after_new
    check.bad |= pos != check.end
    check.raise_if_bad()
    return ParsedRows(new, new_rows, old, old_rows)
