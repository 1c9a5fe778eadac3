"""PostgreSQL type -> Arrow type mapping, shared by the snapshot copy and the pgoutput decoder.

Both read values in PostgreSQL's *text* representation (``COPY ... TO STDOUT`` text format and
pgoutput ``'t'`` tuple values are produced by the same type output functions), so one vectorised
conversion serves both: :func:`text_to_arrow` takes a column of raw text values and lets
``pyarrow.compute`` cast it.

Assumptions the callers must guarantee on the server session that produced the text:

* ``DateStyle = ISO`` (``2024-01-02 03:04:05.123456``), ``bytea_output = hex`` and
  ``extra_float_digits >= 1`` (the default since PostgreSQL 12; shortest exact float text),
* ``IntervalStyle``: any (intervals stay text, in the style of the session that produced them;
  ``replication.connection`` sets ``iso_8601``),
* ``TimeZone = UTC`` so ``timestamptz`` values carry ``+00``; any whole-hour or ``HH:MM`` offset
  is still converted correctly, a seconds offset is not representable and is reported,
* text is UTF-8 (the server encoding is read by callers; other encodings must be transcoded first).

Type rules (docs/DESIGN.md, "Types"): lossless first.

=========================== ==========================================================
PostgreSQL                  Arrow
=========================== ==========================================================
bool                        bool (``t``/``f``)
int2 / int4 / int8          int16 / int32 / int64
oid, xid, cid               int64
float4 / float8             float32 / float64 (``NaN``, ``Infinity``, ``-Infinity`` kept)
numeric(p, s), p <= 38      decimal128(p, s)
numeric (no typmod, p > 38) string (exact text)
text, varchar, bpchar, name string (``bpchar`` keeps its padding, as the server sends it)
bytea                       binary (from hex text)
date                        date32
time                        string (PostgreSQL's text ``HH:MM:SS[.ffffff]``; ``24:00:00`` too)
timestamp                   timestamp[us]
timestamptz                 timestamp[us, UTC]
uuid                        string (canonical lower-case text; Spark has no UUID type)
json, jsonb                 string (a JSON ``null`` stays the text ``null``, unlike SQL NULL)
1-D arrays of the above     list<element> (``{}`` is an empty list, not NULL)
anything else               string (exact text: interval, money, timetz, inet, custom types, ...)
=========================== ==========================================================

Values that the chosen Arrow type cannot hold (``infinity``/``-infinity`` and BC or year > 9999
dates and timestamps, ``NaN``/``Infinity`` numerics in a decimal column, multi-dimensional arrays
and arrays with non-default bounds in a list column) are never dropped or silently nulled:
:func:`text_to_arrow_with_overflow` returns them as their exact PostgreSQL text next to the typed
column (where they are null), which the staging writers store in the column's overflow sibling
(:mod:`.overflow`, docs/TYPES.md); :func:`text_to_arrow` raises
:class:`UnrepresentableValueError` instead, for callers with no such side channel. Values in the
pgoutput ``binary`` format come to the same types through :mod:`.binary_format`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_postgres_cdc.errors import UnrepresentableValueError
from airflow_provider_postgres_cdc.formats.pgtypes import ARRAY_ELEMENT, numeric_precision_scale, pg_type_name

__all__ = [
    "UnrepresentableValueError",
    "arrow_type",
    "can_overflow",
    "pg_type_name",
    "text_to_arrow",
    "text_to_arrow_with_overflow",
]


_SCALAR_ARROW: dict[int, pa.DataType] = {
    16: pa.bool_(),
    17: pa.binary(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    26: pa.int64(),
    28: pa.int64(),
    29: pa.int64(),
    700: pa.float32(),
    701: pa.float64(),
    1082: pa.date32(),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
}

OID_BOOL, OID_BYTEA, OID_TIME, OID_NUMERIC = 16, 17, 1083, 1700
_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_NIBBLE[_c] = 10 + _i


def unrepresentable(type_oid: int, typmod: int, overflow: pa.Array) -> UnrepresentableValueError:
    """The error for the values of ``overflow`` (the non-null ones) that the column's type cannot hold."""
    values = [value for value in overflow.to_pylist() if value is not None]
    return UnrepresentableValueError(pg_type_name(type_oid), str(arrow_type(type_oid, typmod)), values)


def _numeric_type(typmod: int) -> pa.DataType:
    precision_scale = numeric_precision_scale(typmod)
    if precision_scale is None:
        return pa.string()
    precision, scale = precision_scale
    if not 1 <= precision <= 38 or scale < 0 or scale > precision:
        return pa.string()
    return pa.decimal128(precision, scale)


def _scalar_type(type_oid: int, typmod: int) -> pa.DataType:
    if type_oid == OID_NUMERIC:
        return _numeric_type(typmod)
    return _SCALAR_ARROW.get(type_oid, pa.string())


def arrow_type(type_oid: int, typmod: int) -> pa.DataType:
    """The Arrow type a column of this PostgreSQL type (and ``atttypmod``) is stored as."""
    element = ARRAY_ELEMENT.get(type_oid)
    if element is not None:
        # Array typmods are the element's typmod (numeric(10,2)[] has the numeric typmod).
        return pa.list_(_scalar_type(element, typmod))
    return _scalar_type(type_oid, typmod)


def can_overflow(type_oid: int, typmod: int) -> bool:
    """Whether some value of this type may not fit its Arrow type (and then needs the sibling)."""
    target = arrow_type(type_oid, typmod)
    return bool(
        pa.types.is_list(target)
        or pa.types.is_date(target)
        or pa.types.is_timestamp(target)
        or pa.types.is_decimal(target)
    )


def text_to_arrow(values: pa.Array, type_oid: int, typmod: int) -> pa.Array:
    """Convert a column of PostgreSQL text values (string or string_view, nulls = SQL NULL).

    Raises :class:`UnrepresentableValueError` when a value cannot be held exactly.
    """
    typed, overflow = text_to_arrow_with_overflow(values, type_oid, typmod)
    if overflow is not None:
        raise unrepresentable(type_oid, typmod, overflow)
    return typed


def text_to_arrow_with_overflow(
    values: pa.Array, type_oid: int, typmod: int
) -> tuple[pa.Array, pa.Array | None]:
    """Like :func:`text_to_arrow`, but unrepresentable values come back instead of raising.

    Returns ``(typed, overflow)``: ``overflow`` is ``None`` when every value converted; else a
    string array of the same length holding the exact text where ``typed`` is null only because
    the value did not fit (null elsewhere).
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    target = arrow_type(type_oid, typmod)
    numeric = pa.types.is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target)
    if (pa.types.is_string_view(values.type) and not numeric) or pa.types.is_large_string(values.type):
        # Numbers parse straight from views; other kernels need (and the schema wants) plain strings.
        values = values.cast(pa.string())
    if pa.types.is_string(target):
        return values, None
    if pa.types.is_list(target):
        element = ARRAY_ELEMENT[type_oid]
        return _array_to_list(values, element, typmod, target)
    return _convert_scalar(values, type_oid, target)


def _convert_scalar(values: pa.Array, type_oid: int, target: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    try:
        return _cast_fast(values, type_oid, target), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # Rare path: at least one value does not fit; find which, one by one.
    typed: list[object] = []
    overflow: list[str | None] = []
    for item in values.to_pylist():
        if item is None:
            typed.append(None)
            overflow.append(None)
            continue
        try:
            typed.append(_cast_fast(pa.array([item], pa.string()), type_oid, target)[0].as_py())
            overflow.append(None)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            typed.append(None)
            overflow.append(item)
    has_overflow = any(v is not None for v in overflow)
    return pa.array(typed, target), (pa.array(overflow, pa.string()) if has_overflow else None)


def _cast_fast(values: pa.Array, type_oid: int, target: pa.DataType) -> pa.Array:
    """Whole-column conversion; raises ArrowInvalid if any value does not convert exactly."""
    if type_oid == OID_BOOL:
        return _text_to_bool(values)
    if type_oid == OID_BYTEA:
        return _hex_to_binary(values)
    # pyarrow reads "0044-03-15 BC" as year 44 AD; refuse rather than shift by 87 years.
    if (pa.types.is_date(target) or pa.types.is_timestamp(target)) and pc.any(
        pc.ends_with(values, " BC")
    ).as_py():
        raise pa.ArrowInvalid("BC date")
    return pc.cast(values, target)


def _text_to_bool(values: pa.Array) -> pa.Array:
    is_true = pc.equal(values, "t")
    if not pc.all(pc.or_(is_true, pc.equal(values, "f")), min_count=0).as_py():
        raise pa.ArrowInvalid("boolean text other than 't'/'f'")
    return is_true


def _hex_to_binary(values: pa.Array) -> pa.Array:
    """``\\x0a1b`` hex text to binary, vectorised over the whole data buffer."""
    if values.null_count == len(values):
        return pa.nulls(len(values), pa.binary())
    if not pc.all(pc.starts_with(values, "\\x"), min_count=0).as_py():
        raise pa.ArrowInvalid("bytea text is not hex (bytea_output must be 'hex')")
    digits = pc.utf8_slice_codeunits(values, 2).cast(pa.string())
    lengths = pc.fill_null(pc.binary_length(digits), 0).to_numpy(zero_copy_only=False)
    if np.any(lengths % 2):
        raise pa.ArrowInvalid("odd number of hex digits in bytea text")
    offsets = np.zeros(len(digits) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    joined = pc.binary_join(pa.array([pc.fill_null(digits, "")], pa.list_(pa.string())), "")[0].as_py()
    nibbles = _HEX_NIBBLE[np.frombuffer(joined.encode("ascii"), dtype=np.uint8)]
    if np.any(nibbles == 255):
        raise pa.ArrowInvalid("invalid hex digit in bytea text")
    data = (nibbles[0::2] << 4) | nibbles[1::2]
    validity = values.buffers()[0] if values.null_count else None
    if validity is not None and values.offset:
        validity = pc.is_valid(values).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), len(values), [validity, pa.py_buffer(offsets // 2), pa.py_buffer(data.tobytes())]
    )


def _array_to_list(
    values: pa.Array, element: int, typmod: int, target: pa.ListType
) -> tuple[pa.Array, pa.Array | None]:
    """One-dimensional array text ``{a,"b c",NULL}`` to ``list<element>``."""
    texts = values.to_pylist()
    items: list[list[str | None] | None] = []
    overflow: list[str | None] = []
    for text in texts:
        parsed = None if text is None else _parse_array_text(text)
        items.append(parsed)
        overflow.append(text if text is not None and parsed is None else None)
    offsets = [0]
    flat: list[str | None] = []
    validity: list[bool] = []
    for parsed in items:
        if parsed is not None:
            flat.extend(parsed)
        offsets.append(len(flat))
        validity.append(parsed is not None)
    flat_typed, flat_overflow = text_to_arrow_with_overflow(pa.array(flat, pa.string()), element, typmod)
    if flat_overflow is not None:
        bad_rows = set(np.searchsorted(offsets, np.flatnonzero(pc.is_valid(flat_overflow)), side="right") - 1)
        for row in bad_rows:
            overflow[int(row)] = texts[int(row)]
            validity[int(row)] = False
    mask = pa.array([not ok for ok in validity], pa.bool_())
    result = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat_typed, type=target, mask=mask)
    has_overflow = any(v is not None for v in overflow)
    return result, (pa.array(overflow, pa.string()) if has_overflow else None)


def _parse_array_text(text: str) -> list[str | None] | None:
    """Parse a one-dimensional array literal; ``None`` when it is not one (nested, bounds)."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return None
    body = text[1:-1]
    if not body:
        return []
    if '"' not in body and "\\" not in body:
        if "{" in body:
            return None
        return [None if item == "NULL" else item for item in body.split(",")]
    out: list[str | None] = []
    i, n = 0, len(body)
    while i <= n:
        if i < n and body[i] == "{":
            return None
        if i < n and body[i] == '"':
            i += 1
            chars: list[str] = []
            while i < n and body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            out.append("".join(chars))
            i += 1
        else:
            end = body.find(",", i)
            end = n if end < 0 else end
            raw = body[i:end]
            out.append(None if raw == "NULL" else raw)
            i = end
        i += 1
    return out
