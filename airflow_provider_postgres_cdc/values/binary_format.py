"""pgoutput ``binary`` format values -> Arrow: the same types and overflow text as the text route.

With the pgoutput ``binary`` option values come in each type's *send* format instead of its text:
:func:`binary_to_arrow_with_overflow` reads the common built-in scalars into the Arrow types of
:func:`~.arrow_types.arrow_type`, and a value out of the Arrow type's range comes back as the
exact text PostgreSQL prints for it, as in the text route (the tests check both routes agree on
server captures). The rest (arrays, interval, custom types...) is refused with
:class:`UnsupportedBinaryTypeError` rather than guessed.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_postgres_cdc.errors import UnsupportedBinaryTypeError
from airflow_provider_postgres_cdc.formats.pgtypes import PG_EPOCH_DAYS, PG_EPOCH_US, pg_type_name
from airflow_provider_postgres_cdc.values.arrow_types import (
    OID_BOOL,
    OID_BYTEA,
    OID_NUMERIC,
    OID_TIME,
    arrow_type,
    text_to_arrow_with_overflow,
    unrepresentable,
)

__all__ = ["binary_to_arrow", "binary_to_arrow_with_overflow", "time_text"]

# Fixed-width send formats: network-order integers and floats; date, time and timestamps count
# days or microseconds from 2000-01-01 (PostgreSQL's epoch).
_FIXED_BINARY: dict[int, str] = {
    16: "u1", 20: ">i8", 21: ">i2", 23: ">i4", 26: ">u4", 28: ">u4", 29: ">u4",
    700: ">f4", 701: ">f8", 1082: ">i4", 1083: ">i8", 1114: ">i8", 1184: ">i8",
}  # fmt: skip
# Types whose send format is their text in the server encoding (UTF-8 here).
_TEXT_BINARY = frozenset({19, 25, 114, 142, 1042, 1043})
_JSONB, _UUID, _DATE, _TIMESTAMPTZ = 3802, 2950, 1082, 1184
_DAY_US = 86_400_000_000
# date32 and timestamp[us] bounds that keep values in years 1..9999, like the text route.
_DATE_RANGE = (-719_162, 2_932_896)
_TIMESTAMP_RANGE = (-62_135_596_800_000_000, 253_402_300_800_000_000 - 1)
_NUMERIC_HEAD = struct.Struct("!hhHh")
# date and timestamp send ``infinity`` / ``-infinity`` as the extremes of their integer type.
_DATE_INFINITIES = {2**31 - 1: "infinity", -(2**31): "-infinity"}
_TIMESTAMP_INFINITIES = {2**63 - 1: "infinity", -(2**63): "-infinity"}
_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}


def binary_to_arrow(values: pa.Array, type_oid: int, typmod: int) -> pa.Array:
    """Like :func:`binary_to_arrow_with_overflow`, but a value that does not fit raises
    :class:`UnrepresentableValueError`."""
    typed, overflow = binary_to_arrow_with_overflow(values, type_oid, typmod)
    if overflow is not None:
        raise unrepresentable(type_oid, typmod, overflow)
    return typed


def binary_to_arrow_with_overflow(
    values: pa.Array, type_oid: int, typmod: int
) -> tuple[pa.Array, pa.Array | None]:
    """Convert a column of binary-format values (pgoutput ``b`` kind; nulls = SQL NULL).

    Supported: the fixed-width built-ins (integers, oid, floats, bool, date, time, timestamps),
    text-like types, json, jsonb, bytea, uuid and numeric. Anything else raises
    :class:`UnsupportedBinaryTypeError`. Returns ``(typed, overflow)`` like
    :func:`text_to_arrow_with_overflow`: values out of the Arrow type's range come back as the
    exact text PostgreSQL prints for them (``DateStyle=ISO``, ``TimeZone=UTC``), as in the text
    route; ``time`` becomes that text too.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.binary())
    target = arrow_type(type_oid, typmod)
    if type_oid in _FIXED_BINARY:
        return _fixed_binary(values, type_oid, target)
    if type_oid in _TEXT_BINARY or type_oid == _JSONB:
        if type_oid == _JSONB:
            if not pc.all(pc.starts_with(values, "\x01"), min_count=0).as_py():
                raise UnsupportedBinaryTypeError("jsonb binary value with a format version other than 1")
            values = pa.array([None if v is None else v[1:] for v in values.to_pylist()], pa.binary())
        try:
            return values.cast(pa.string()), None
        except pa.ArrowInvalid as exc:
            raise UnsupportedBinaryTypeError(f"{pg_type_name(type_oid)} value is not UTF-8: {exc}") from None
    if type_oid == OID_BYTEA:
        return values, None
    if type_oid in (_UUID, OID_NUMERIC):
        convert = _uuid_text if type_oid == _UUID else _numeric_text
        texts = [None if v is None else convert(v) for v in values.to_pylist()]
        return text_to_arrow_with_overflow(pa.array(texts, pa.string()), type_oid, typmod)
    raise UnsupportedBinaryTypeError(
        f"binary format of type {pg_type_name(type_oid)} is not supported; decode it as text "
        "(leave the pgoutput 'binary' option off)"
    )


def _fixed_binary(values: pa.Array, type_oid: int, target: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    dtype = np.dtype(_FIXED_BINARY[type_oid])
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(values), dtype.itemsize).to_numpy(zero_copy_only=False)
    if np.any(lengths != dtype.itemsize):
        raise UnsupportedBinaryTypeError(f"{pg_type_name(type_oid)} binary value of unexpected length")
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + len(values) + 1
    ]
    data = values.buffers()[2]
    raw = np.frombuffer(data, dtype=dtype, count=int(valid.sum()), offset=int(offsets[0])) if data else None
    numbers = np.zeros(len(values), dtype=dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype)
    if raw is not None:
        numbers[valid] = raw
    if type_oid == OID_BOOL:
        return pa.array(numbers != 0, pa.bool_(), mask=~valid), None
    if type_oid == OID_TIME:
        texts = [time_text(int(v)) if ok else None for v, ok in zip(numbers, valid, strict=True)]
        return pa.array(texts, pa.string()), None
    if type_oid == _DATE:
        days = numbers.astype(np.int64)
        outside = _outside(days + PG_EPOCH_DAYS, valid, _DATE_RANGE)
        days[outside] = 0
        typed = pa.array((days + PG_EPOCH_DAYS).astype(np.int32), pa.int32(), mask=~valid | outside)
        return typed.cast(target), _overflow_texts(numbers, outside, _date_text)
    if pa.types.is_timestamp(target):
        micros = numbers.astype(np.int64)
        bounds = (_TIMESTAMP_RANGE[0] - PG_EPOCH_US, _TIMESTAMP_RANGE[1] - PG_EPOCH_US)
        outside = _outside(micros, valid, bounds)
        micros[outside] = 0
        typed = pa.array(micros + PG_EPOCH_US, pa.int64(), mask=~valid | outside).cast(target)
        zone = "+00" if type_oid == _TIMESTAMPTZ else ""
        return typed, _overflow_texts(numbers, outside, lambda v: _timestamp_text(v, zone))
    return pa.array(numbers, mask=~valid).cast(target), None


def _outside(numbers: np.ndarray, valid: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    result: np.ndarray = valid & ((numbers < bounds[0]) | (numbers > bounds[1]))
    return result


def _overflow_texts(numbers: np.ndarray, outside: np.ndarray, text: Callable[[int], str]) -> pa.Array | None:
    if not outside.any():
        return None
    return pa.array(
        [text(int(v)) if bad else None for v, bad in zip(numbers, outside, strict=True)], pa.string()
    )


def time_text(micros: int) -> str:
    """``time`` as PostgreSQL prints it: ``HH:MM:SS``, then ``.ffffff`` without trailing zeros."""
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}".rstrip("0") if fraction else text


def _civil(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day count from 1970-01-01; year 0 is 1 BC.

    Howard Hinnant's ``civil_from_days``: exact for any integer, unlike ``datetime``.
    """
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _ymd_text(days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix) of a day count from 1970-01-01, as PostgreSQL prints them."""
    year, month, day = _civil(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d}", " BC"
    return f"{year:04d}-{month:02d}-{day:02d}", ""


def _date_text(pg_days: int) -> str:
    if pg_days in _DATE_INFINITIES:
        return _DATE_INFINITIES[pg_days]
    text, era = _ymd_text(pg_days + PG_EPOCH_DAYS)
    return text + era


def _timestamp_text(pg_micros: int, zone: str) -> str:
    if pg_micros in _TIMESTAMP_INFINITIES:
        return _TIMESTAMP_INFINITIES[pg_micros]
    days, micros = divmod(pg_micros + PG_EPOCH_US, _DAY_US)
    text, era = _ymd_text(days)
    return f"{text} {time_text(micros)}{zone}{era}"


def _uuid_text(raw: bytes) -> str:
    return str(uuid.UUID(bytes=raw))


def _numeric_text(raw: bytes) -> str:
    """numeric's send format (base-10000 digits, weight, sign, display scale) as its text form."""
    ndigits, weight, sign, dscale = _NUMERIC_HEAD.unpack_from(raw)
    if sign in _NUMERIC_SPECIAL:
        return _NUMERIC_SPECIAL[sign]
    digits = struct.unpack_from(f"!{ndigits}h", raw, _NUMERIC_HEAD.size)
    text = "".join(f"{d:04d}" for d in digits)
    point = (weight + 1) * 4  # decimal digits before the point
    if point <= 0:
        text, point = "0" * (-point) + text, 0
    text = text.ljust(point, "0")
    integer = text[:point].lstrip("0") or "0"
    fraction = text[point:].ljust(dscale, "0")[:dscale]
    number = integer + ("." + fraction if dscale > 0 else "")
    return "-" + number if sign == 0x4000 else number
