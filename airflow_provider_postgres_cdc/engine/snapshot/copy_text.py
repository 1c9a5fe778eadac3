"""Decoding ``COPY … TO STDOUT`` text into typed Arrow record batches.

COPY's text format (tab-separated, ``\\N`` for NULL, backslash escapes) costs the server less
than CSV and parses faster: a raw tab or newline is always a separator, never data. The stream
is cut into whole-row chunks of bounded size, pyarrow's CSV reader splits each into string
columns, escapes are undone in one vectorised pass, and every column is typed by the drain's own
text conversion (``values.overflow``), with overflow siblings where a value does not fit.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from airflow_provider_postgres_cdc.engine.snapshot.plan import TablePlan
from airflow_provider_postgres_cdc.errors import RowTooLargeError
from airflow_provider_postgres_cdc.values import overflow
from airflow_provider_postgres_cdc.values.raw_text import escape_raw_text

# A row is held in pieces, joined, then parsed into Arrow strings and typed: about four copies.
_ROW_COPIES = 4


# COPY's text format escapes exactly these (and the backslash itself) as backslash + letter.
_COPY_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
# Text values never contain NUL, so it can mark where each escape sequence starts.
_MARK = "\x00"


def decode_copy_text(values: pa.Array) -> pa.Array:
    """Undo ``COPY … TO STDOUT`` text-format escaping (``\\n`` → newline, ``\\\\`` → ``\\``), vectorised.

    COPY writes every backslash in a value as the start of a two-character escape, so one
    regex pass marks each sequence's start with NUL and plain replacements then resolve
    ``NUL+letter`` unambiguously (``\\\\n`` is a backslash and an ``n``, never a newline).
    Columns without a backslash are returned as they are.
    """
    if not pc.any(pc.match_substring(values, "\\")).as_py():
        return values
    marked = pc.replace_substring_regex(values, pattern=r"\\(.)", replacement=_MARK + r"\1")
    for letter, char in _COPY_ESCAPES.items():
        marked = pc.replace_substring(marked, pattern=_MARK + letter, replacement=char)
    return marked


def _whole_rows(stream: io.BufferedReader[io.FileIO], size: int, max_row_bytes: int) -> Iterator[memoryview]:
    """Chunks of about ``size`` bytes of COPY text, each ending at a row end.

    A raw newline always ends a row in COPY's text format (newlines in values are escaped),
    so cutting at the last one is safe; a row longer than ``size`` (a large TOASTed value)
    makes its chunk as long as the row instead of failing, as a fixed parser block would, up
    to ``max_row_bytes``: beyond, :class:`RowTooLargeError` stops the copy before memory does.
    """
    parts: list[memoryview] = []
    held = 0
    while data := stream.read(size):
        view = memoryview(data)
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            parts.append(view)
            held += len(view)
            if held > max_row_bytes:
                raise RowTooLargeError(
                    f"a row is larger than {max_row_bytes} bytes, the most a copy worker may hold with "
                    f"max_memory_bytes={max_row_bytes * _ROW_COPIES}; raise max_memory_bytes to at least "
                    f"{_ROW_COPIES} times the largest row"
                )
            continue
        parts.append(view[:cut])
        yield memoryview(b"".join(parts)) if len(parts) > 1 else parts[0]
        parts = [view[cut:]] if cut < len(data) else []
        held = len(data) - cut
    if parts:
        # COPY ends every row with a newline; a tail without one is parsed so the error shows.
        yield memoryview(b"".join(parts))


def typed_batches(
    stream: io.BufferedReader[io.FileIO],
    plan: TablePlan,
    batch_bytes: int,
    max_memory_bytes: int,
    raw_text: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Parse COPY's text format into string columns, then type each with ``types.text_to_arrow``;
    a chunk where some values do not fit their type carries their overflow siblings too.

    Text format (tab-separated, ``\\N`` for NULL, backslash escapes) costs the server less
    than CSV and parses faster: tabs and newlines inside values are always escaped, so
    rows and fields split on the raw characters. Every value is read as a string first
    because the conversion to Arrow types is the drain's too. ``raw_text``: the values are a
    SQL_ASCII database's bytes, read as binary and staged by the rule of ``raw_text.py``.
    """
    names = [f"c{position}" for position in range(len(plan.columns))]
    parse_options = pacsv.ParseOptions(
        delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False
    )
    convert_options = pacsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.binary() if raw_text else pa.string()),
        null_values=["\\N"],
        strings_can_be_null=True,
    )
    schema = plan.arrow_schema
    for chunk in _whole_rows(stream, batch_bytes, max_memory_bytes // _ROW_COPIES):
        table = pacsv.read_csv(
            pa.py_buffer(chunk),
            # One block, one thread: parallelism comes from the workers, threads here only contend.
            read_options=pacsv.ReadOptions(column_names=names, block_size=len(chunk) + 1, use_threads=False),
            parse_options=parse_options,
            convert_options=convert_options,
        )
        columns = [escape_raw_text(values) if raw_text else values for values in table.columns]
        converted = [
            overflow.typed_with_text(decode_copy_text(text), column.type_oid, column.typmod)
            for text, column in zip(columns, plan.columns, strict=True)
        ]
        typed = [values for values, _ in converted]
        fields, siblings = overflow.add_siblings(
            [column.name for column in plan.columns], typed, [text for _, text in converted]
        )
        if fields:
            yield pa.RecordBatch.from_arrays(typed + siblings, schema=pa.schema([*schema, *fields]))
        else:
            yield pa.RecordBatch.from_arrays(typed, schema=schema)
