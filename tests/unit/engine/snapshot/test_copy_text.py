"""The snapshot's worst case is bounded by max_memory_bytes: a row longer than a chunk grows the
chunk, but only up to a quarter of the setting."""

from __future__ import annotations

import io

import pytest

from airflow_provider_postgres_cdc.engine.snapshot.copy_text import _whole_rows
from airflow_provider_postgres_cdc.errors import RowTooLargeError


def _stream(data: bytes) -> io.BufferedReader:
    return io.BufferedReader(io.BytesIO(data))


def test_a_row_longer_than_a_chunk_makes_one_chunk_within_the_bound() -> None:
    data = b"1\tshort\n" + b"2\t" + b"x" * 1000 + b"\n" + b"3\tshort\n"
    chunks = [bytes(c) for c in _whole_rows(_stream(data), 64, max_row_bytes=2000)]
    assert b"".join(chunks) == data
    assert all(chunk.endswith(b"\n") for chunk in chunks)


def test_a_row_beyond_the_bound_is_refused_with_the_setting_to_raise() -> None:
    data = b"1\tshort\n" + b"2\t" + b"x" * 1000 + b"\n"
    with pytest.raises(RowTooLargeError, match="raise max_memory_bytes to at least 4 times the largest row"):
        list(_whole_rows(_stream(data), 64, max_row_bytes=500))
