"""PostgreSQL text -> Arrow conversions (values/arrow_types.py), values as the server prints them."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.errors import UnrepresentableValueError, UnsupportedBinaryTypeError
from airflow_provider_postgres_cdc.values.arrow_types import (
    arrow_type,
    binary_to_arrow,
    binary_to_arrow_with_overflow,
    pg_type_name,
    text_to_arrow,
    text_to_arrow_with_overflow,
)


def _numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def convert(values: list[str | None], oid: int, typmod: int = -1, view: bool = False) -> list[object]:
    array = pa.array(values, pa.string())
    if view:
        array = array.cast(pa.string_view())
    return text_to_arrow(array, oid, typmod).to_pylist()


def test_arrow_types() -> None:
    assert arrow_type(23, -1) == pa.int32()
    assert arrow_type(1700, -1) == pa.string()
    assert arrow_type(1700, _numeric_typmod(10, 2)) == pa.decimal128(10, 2)
    assert arrow_type(1700, _numeric_typmod(39, 2)) == pa.string()
    assert arrow_type(1184, -1) == pa.timestamp("us", tz="UTC")
    assert arrow_type(1007, -1) == pa.list_(pa.int32())
    assert arrow_type(3802, -1) == pa.string()
    assert arrow_type(1186, -1) == pa.string()
    assert arrow_type(99999, -1) == pa.string()
    assert pg_type_name(1007) == "_int4"
    assert pg_type_name(3802) == "jsonb"
    assert pg_type_name(99999) == "oid:99999"


@pytest.mark.parametrize("view", [False, True])
def test_scalars(view: bool) -> None:
    assert convert(["1", None, "-32768"], 21, view=view) == [1, None, -32768]
    assert convert(["9223372036854775807"], 20, view=view) == [9223372036854775807]
    assert convert(["t", "f", None], 16, view=view) == [True, False, None]
    assert convert(["1.50", "-0.01"], 1700, _numeric_typmod(10, 2), view=view) == [
        decimal.Decimal("1.50"),
        decimal.Decimal("-0.01"),
    ]
    assert convert(["123456789012345678901234567890.5"], 1700, view=view) == [
        "123456789012345678901234567890.5"
    ]
    assert convert(["2024-02-29 23:59:59.999999+00"], 1184, view=view) == [
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=dt.UTC)
    ]
    assert convert(["2024-02-29 05:30:00+05:30"], 1184, view=view)[0] == dt.datetime(
        2024, 2, 29, 0, 0, tzinfo=dt.UTC
    )
    assert convert(["2024-01-02 03:04:05"], 1114, view=view) == [dt.datetime(2024, 1, 2, 3, 4, 5)]
    assert convert(["2024-01-02"], 1082, view=view) == [dt.date(2024, 1, 2)]
    assert convert(["13:14:15.5", "24:00:00"], 1083, view=view) == ["13:14:15.5", "24:00:00"]
    assert convert(["1 day 02:00:00"], 1186, view=view) == ["1 day 02:00:00"]
    assert convert(['{"a": null}', "null", None], 3802, view=view) == ['{"a": null}', "null", None]


def test_floats_keep_special_values() -> None:
    out = convert(["NaN", "Infinity", "-Infinity", "1.5"], 701)
    assert math.isnan(out[0]) and out[1] == math.inf and out[2] == -math.inf and out[3] == 1.5  # type: ignore[operator]


def test_bytea_hex() -> None:
    assert convert(["\\x00ff10", None, "\\x", "\\xABcd"], 17) == [b"\x00\xff\x10", None, b"", b"\xab\xcd"]
    sliced = pa.array([None, "\\x01", "\\x0203"], pa.string()).slice(1)
    assert text_to_arrow(sliced, 17, -1).to_pylist() == [b"\x01", b"\x02\x03"]


def test_arrays() -> None:
    assert convert(["{1,2,NULL}", "{}", None], 1007) == [[1, 2, None], [], None]
    assert convert(['{"a,b",c,"NULL",NULL,"q\\"x"}'], 1009) == [["a,b", "c", "NULL", None, 'q"x']]
    assert convert(['{"2024-01-02 03:04:05+00"}'], 1185) == [
        [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)]
    ]


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (1082, "infinity"),
        (1114, "-infinity"),
        (1184, "infinity"),
        (1082, "0044-03-15 BC"),
        (1700, "NaN"),
        (1082, "10000-01-01"),
        (1114, "0044-03-15 00:00:00 BC"),
        (1184, "10000-01-01 00:00:00+00"),
        (1700, "Infinity"),
        (1700, "-Infinity"),
        (1007, "{{1,2},{3,4}}"),
        (1007, "[0:1]={1,2}"),
        (1182, "{2024-01-01,infinity}"),
    ],
)
def test_unrepresentable_values_are_reported_not_lost(oid: int, text: str) -> None:
    typmod = _numeric_typmod(10, 2) if oid == 1700 else -1
    values = pa.array(["2024-01-02" if oid == 1082 else None, text], pa.string())
    with pytest.raises(UnrepresentableValueError):
        text_to_arrow(values, oid, typmod)
    typed, overflow = text_to_arrow_with_overflow(values, oid, typmod)
    assert overflow is not None
    assert overflow.to_pylist() == [None, text]
    assert typed[1].as_py() is None


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
    assert convert([text], 1083) == [text]


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
