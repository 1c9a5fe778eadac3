"""pgoutput binary-format values -> Arrow (values/binary_format.py): the same types and overflow text
as the text route."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.errors import UnrepresentableValueError, UnsupportedBinaryTypeError
from airflow_provider_postgres_cdc.values.arrow_types import text_to_arrow
from airflow_provider_postgres_cdc.values.binary_format import binary_to_arrow, binary_to_arrow_with_overflow


def _numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def _numeric_send(text: str) -> bytes:
    """numeric's binary send format, built the way numeric_send does (base 10000 digits)."""
    sign = 0x4000 if text.startswith("-") else 0
    digits_text = text.lstrip("-")
    integer, _, fraction = digits_text.partition(".")
    dscale = len(fraction)
    integer = integer.lstrip("0")
    integer = "0" * (-len(integer) % 4) + integer
    fraction = fraction + "0" * (-len(fraction) % 4)
    groups = [int(integer[i : i + 4]) for i in range(0, len(integer), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHh{len(groups)}h", len(groups), weight, sign, dscale, *groups)


@pytest.mark.parametrize(
    "text", ["0", "1.50", "-12345.678", "0.00001234", "100000000", "123456789012345678.5", "0.0"]
)
def test_binary_numeric_reads_as_its_text(text: str) -> None:
    values = pa.array([_numeric_send(text), None], pa.binary())
    assert binary_to_arrow(values, 1700, -1).to_pylist() == [text, None]


def test_binary_fixed_width_values() -> None:
    assert binary_to_arrow(pa.array([struct.pack("!i", -7), None], pa.binary()), 23, -1).to_pylist() == [
        -7,
        None,
    ]
    days = struct.pack("!i", 59)  # 2000-01-01 + 59 days
    assert binary_to_arrow(pa.array([days], pa.binary()), 1082, -1).to_pylist() == [dt.date(2000, 2, 29)]
    micros = struct.pack("!q", 1_500_000)
    assert binary_to_arrow(pa.array([micros], pa.binary()), 1184, -1).to_pylist() == [
        dt.datetime(2000, 1, 1, 0, 0, 1, 500000, tzinfo=dt.UTC)
    ]
    assert binary_to_arrow(pa.array([b"\x01", b"\x00"], pa.binary()), 16, -1).to_pylist() == [True, False]


def test_binary_infinity_and_unsupported_types_are_reported() -> None:
    infinity = pa.array([struct.pack("!q", 2**63 - 1)], pa.binary())
    with pytest.raises(UnrepresentableValueError):
        binary_to_arrow(infinity, 1184, -1)
    typed, overflow = binary_to_arrow_with_overflow(infinity, 1184, -1)
    assert typed.to_pylist() == [None] and overflow is not None and overflow.to_pylist() == ["infinity"]
    with pytest.raises(UnsupportedBinaryTypeError):
        binary_to_arrow(pa.array([b"\x00"], pa.binary()), 1186, -1)
    with pytest.raises(UnsupportedBinaryTypeError):
        binary_to_arrow(pa.array([b"\x00\x01"], pa.binary()), 23, -1)  # wrong width


# (send-format integer, PostgreSQL's text) pairs: the text as psql prints it with DateStyle=ISO and
# TimeZone=UTC (checked on PostgreSQL 15 against the server in tests/integration/test_value_overflow.py).
_BINARY_DATES = [
    (2**31 - 1, "infinity"),
    (-(2**31), "-infinity"),
    (-749_770, "0054-03-15 BC"),
    (2_930_352, "10023-01-12"),
    (-730_485, "0001-01-01 BC"),
    (-2_451_507, "4713-01-01 BC"),
]


@pytest.mark.parametrize(("days", "text"), _BINARY_DATES)
def test_binary_dates_beyond_date32_overflow_to_their_text(days: int, text: str) -> None:
    values = pa.array([struct.pack("!i", 0), struct.pack("!i", days)], pa.binary())
    typed, overflow = binary_to_arrow_with_overflow(values, 1082, -1)
    assert typed.to_pylist() == [dt.date(2000, 1, 1), None]
    assert overflow is not None and overflow.to_pylist() == [None, text]


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (0, "00:00:00"),
        (45_296_500_000, "12:34:56.5"),
        (45_296_000_001, "12:34:56.000001"),
        (86_400_000_000, "24:00:00"),
    ],
)
def test_binary_time_prints_like_postgresql(micros: int, text: str) -> None:
    typed, overflow = binary_to_arrow_with_overflow(pa.array([struct.pack("!q", micros), None]), 1083, -1)
    assert typed.to_pylist() == [text, None] and overflow is None
    assert text_to_arrow(pa.array([text]), 1083, -1).to_pylist() == [text]  # the text route agrees


def test_binary_timestamps_beyond_range_overflow_to_their_text() -> None:
    bc, future = -63_113_986_677_000_000, 252_455_616_000_000_000  # from the server, as the dates
    values = pa.array([struct.pack("!q", v) for v in (bc, future, -(2**63))], pa.binary())
    _, plain = binary_to_arrow_with_overflow(values, 1114, -1)
    _, zoned = binary_to_arrow_with_overflow(values, 1184, -1)
    assert plain is not None and zoned is not None
    assert plain.to_pylist() == ["0002-12-31 01:02:03 BC", "10000-01-01 00:00:00", "-infinity"]
    assert zoned.to_pylist() == ["0002-12-31 01:02:03+00 BC", "10000-01-01 00:00:00+00", "-infinity"]


def test_binary_numeric_nan_overflows_a_decimal_column() -> None:
    nan = struct.pack("!hhHh", 0, 0, 0xC000, 0)
    typed, overflow = binary_to_arrow_with_overflow(pa.array([nan, None]), 1700, _numeric_typmod(10, 2))
    assert typed.to_pylist() == [None, None]
    assert overflow is not None and overflow.to_pylist() == ["NaN", None]
