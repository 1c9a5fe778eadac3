"""PostgreSQL's built-in type names, typmods and time epoch: one definition for the engine and the
Spark job.

Standard library only, so the apply job ships it (``spark.job_py_files``) and its messages name
types the way PostgreSQL does, from the same table :mod:`.types` maps to Arrow.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""PostgreSQL's epoch: binary dates count days, and timestamps (pgoutput's commit times too)
microseconds, from here."""
PG_EPOCH_DAYS = (PG_EPOCH.date() - date(1970, 1, 1)).days
"""Days from the Unix epoch to PostgreSQL's: add to a PostgreSQL date for a Unix day number."""
PG_EPOCH_US = PG_EPOCH_DAYS * 86_400_000_000
"""Microseconds from the Unix epoch to PostgreSQL's: add to a PostgreSQL timestamp for Unix time."""


def pg_timestamp(micros: int) -> datetime:
    """A PostgreSQL timestamp (microseconds since :data:`PG_EPOCH`) as an aware UTC datetime."""
    return PG_EPOCH + timedelta(microseconds=micros)


TEXT_OID = 25
"""``text``: what overflow siblings and hashed columns are staged as."""

# Built-in scalar type OIDs (pg_type.dat) and their names.
TYPE_NAMES: dict[int, str] = {
    16: "bool",
    17: "bytea",
    18: "char",
    19: "name",
    20: "int8",
    21: "int2",
    23: "int4",
    25: "text",
    26: "oid",
    28: "xid",
    29: "cid",
    114: "json",
    142: "xml",
    650: "cidr",
    700: "float4",
    701: "float8",
    790: "money",
    829: "macaddr",
    869: "inet",
    1042: "bpchar",
    1043: "varchar",
    1082: "date",
    1083: "time",
    1114: "timestamp",
    1184: "timestamptz",
    1186: "interval",
    1266: "timetz",
    1560: "bit",
    1562: "varbit",
    1700: "numeric",
    2950: "uuid",
    3220: "pg_lsn",
    3802: "jsonb",
}

# Array type OID -> element type OID for the built-in scalars above.
ARRAY_ELEMENT: dict[int, int] = {
    1000: 16,
    1001: 17,
    1002: 18,
    1003: 19,
    1016: 20,
    1005: 21,
    1007: 23,
    1009: 25,
    1028: 26,
    1011: 28,
    199: 114,
    143: 142,
    651: 650,
    1021: 700,
    1022: 701,
    791: 790,
    1040: 829,
    1041: 869,
    1014: 1042,
    1015: 1043,
    1182: 1082,
    1183: 1083,
    1115: 1114,
    1185: 1184,
    1187: 1186,
    1270: 1266,
    1561: 1560,
    1563: 1562,
    1231: 1700,
    2951: 2950,
    3221: 3220,
    3807: 3802,
}

_NUMERIC, _VARCHAR, _BPCHAR = 1700, 1043, 1042
_VARHDRSZ = 4


def pg_type_name(type_oid: int) -> str:
    """The ``pg_type.typname`` of a built-in type (``_int4`` for arrays), else ``oid:<n>``."""
    if type_oid in TYPE_NAMES:
        return TYPE_NAMES[type_oid]
    element = ARRAY_ELEMENT.get(type_oid)
    if element is not None:
        return "_" + TYPE_NAMES[element]
    return f"oid:{type_oid}"


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric(p,s)`` typmod; None for an unconstrained numeric.

    PostgreSQL 15 stores the scale as an 11-bit signed field (negative scales are allowed).
    """
    if typmod < _VARHDRSZ:
        return None
    packed = typmod - _VARHDRSZ
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def pg_type_text(type_oid: int, typmod: int) -> str:
    """A column type as a person reads it: ``numeric(12,2)``, ``varchar(40)``, ``int4``."""
    name = pg_type_name(type_oid)
    if type_oid == _NUMERIC and (ps := numeric_precision_scale(typmod)) is not None:
        return f"{name}({ps[0]},{ps[1]})"
    if type_oid in (_VARCHAR, _BPCHAR) and typmod >= _VARHDRSZ:
        return f"{name}({typmod - _VARHDRSZ})"
    return name
