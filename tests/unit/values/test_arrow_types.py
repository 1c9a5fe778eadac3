"""PostgreSQL text -> Arrow conversions (values/arrow_types.py), values as the server prints them."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.errors import UnrepresentableValueError
from airflow_provider_postgres_cdc.values.arrow_types import (
    arrow_type,
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
