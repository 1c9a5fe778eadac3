"""The SQL_ASCII rule (raw_text.py): exact, reversible, and the identity on ordinary UTF-8."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.values.raw_text import escape_bytes, escape_raw_text, raw_bytes

# Bytes rich in what matters: invalid UTF-8, valid multibyte sequences, the escape range's own.
PIECES = st.sampled_from([b"a", b"\\", b"\xe9", b"\xff", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf4\x8f\xba\x80"])
STORED = st.one_of(st.binary(max_size=12), st.lists(PIECES, max_size=8).map(b"".join))


@given(STORED)
def test_every_stored_value_is_staged_as_unicode_and_recovered_exactly(stored: bytes) -> None:
    staged = escape_bytes(stored)
    staged.encode("utf-8")  # never a lone surrogate: Arrow and Parquet can hold it
    assert raw_bytes(staged) == stored


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12))
def test_utf8_outside_the_escape_range_is_staged_unchanged(text: str) -> None:
    assume(not any(0x10FE80 <= ord(c) <= 0x10FEFF for c in text))
    assert escape_bytes(text.encode()) == text


def test_examples() -> None:
    assert escape_bytes(b"caf\xe9") == "caf\U0010fee9"
    assert escape_bytes("été".encode()) == "été"
    assert escape_bytes("\U0010fe90".encode()) == "\U0010fef4\U0010fe8f\U0010feba\U0010fe90"


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.binary_view()])
@given(st.lists(st.one_of(st.none(), STORED), max_size=6))
def test_arrays_follow_the_per_value_rule(kind: pa.DataType, values: list[bytes | None]) -> None:
    staged = escape_raw_text(pa.array(values, kind))
    assert staged.to_pylist() == [None if v is None else escape_bytes(v) for v in values]
    chunked = escape_raw_text(pa.chunked_array([pa.array(values, kind)], kind))
    assert chunked.to_pylist() == staged.to_pylist()
