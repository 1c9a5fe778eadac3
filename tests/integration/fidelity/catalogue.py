"""The type catalogue of the randomized fidelity test: each type with a generator of PostgreSQL input text.

Values are produced as the text a user would type after a cast (``'…'::type``), so the generator
needs no Python model of any type: PostgreSQL parses them, and the test compares what PostgreSQL
then holds with the lake. Each generator mixes ordinary values with the hostile ones the issue
names: NaN and ±Infinity, ±infinity and BC dates, years past 9999, ``24:00:00``, JSON ``null``
next to SQL NULL, empty arrays and arrays holding NULL, quotes, backslashes, newlines, non-ASCII.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from random import Random

from psycopg2 import sql

Gen = Callable[[Random], str]

TEXT_PIECES = [
    "plain", "it's", 'say "hi"', "back\\slash", "new\nline", "tab\tsep", "cr\r\nlf", "ünïcødé ß",
    "日本語", "emoji 😀", "", " ", "NULL", "\\N", "a,b", "{brace}", "(paren)", "%pct", "x" * 30,
]  # fmt: skip


def hostile_text(rng: Random) -> str:
    return "".join(rng.choice(TEXT_PIECES) for _ in range(rng.randint(1, 3)))


def big_text(rng: Random) -> str:
    """2.5-6 kB that pglz cannot compress: stored out of line (TOAST), so untouched updates send 'u'."""
    return "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(2500, 6000)))


def _pick(rng: Random, special: list[str], p: float, normal: Gen) -> str:
    return rng.choice(special) if rng.random() < p else normal(rng)


def _int(bits: int) -> Gen:
    top = 2 ** (bits - 1)
    return lambda r: str(r.choice([0, -1, top - 1, -top, r.randint(-top, top - 1), r.randint(-999, 999)]))


def _digits(rng: Random, n: int) -> str:
    return "".join(rng.choices(string.digits, k=n)) if n else ""


def _decimal(int_digits: int, scale: int, special: list[str]) -> Gen:
    def gen(rng: Random) -> str:
        if rng.random() < 0.15:
            return rng.choice(special)
        sign = rng.choice(["", "-"])
        whole = _digits(rng, rng.randint(1, int_digits)).lstrip("0") or "0"
        frac = _digits(rng, rng.randint(0, scale))
        return f"{sign}{whole}.{frac}" if frac else f"{sign}{whole}"

    return gen


def _float(span: float) -> Gen:
    special = ["NaN", "Infinity", "-Infinity", "-0", "0", "1e-30", "3.4e38" if span < 1e39 else "1e-320"]
    return lambda r: _pick(r, special, 0.3, lambda r: repr(r.uniform(-span, span)))


def _date(rng: Random) -> str:
    return f"{rng.randint(1900, 2100):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _clock(rng: Random) -> str:
    frac = rng.choice(["", f".{rng.randint(0, 999999):06d}", f".{rng.randint(0, 9)}"])
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{frac}"


DATE_SPECIAL = ["infinity", "-infinity", "0044-03-15 BC", "12345-06-07", "0001-01-01", "9999-12-31"]
TS_SPECIAL = [
    "infinity",
    "-infinity",
    "0044-03-15 12:00:00 BC",
    "12345-06-07 08:09:10",
    "0001-01-01 00:00:00",
]
JSON_VALUES = [
    "null", '{"a": 1,  "b" : [1, 2, null]}', '"str"', "[]", "{}", '{"ü": "x\\"y", "n": null}', "1.50",
    "true", '[{"deep": {"er": [0.1]}}]',
]  # fmt: skip
INTERVALS = [
    "1 year 2 mons 3 days 04:05:06.789",
    "-1 days",
    "P1Y2M",
    "0",
    "00:00:00.000001",
    "-178000000 years",
]


def array_literal(elements: list[str | None]) -> str:
    """A one-dimensional array's input text, every element quoted (NULL unquoted)."""
    quoted = [
        "NULL" if e is None else '"' + e.replace("\\", "\\\\").replace('"', '\\"') + '"' for e in elements
    ]
    return "{" + ",".join(quoted) + "}"


def _array(element: Gen, special: list[str] | None = None) -> Gen:
    def gen(rng: Random) -> str:
        if special and rng.random() < 0.08:
            return rng.choice(special)
        n = rng.choice([0, 1, 2, 3, 5])
        return array_literal([None if rng.random() < 0.2 else element(rng) for _ in range(n)])

    return gen


@dataclass(frozen=True)
class PgType:
    """One catalogue entry: the SQL type, a value generator, and what the workload may do with it."""

    label: str
    sql: sql.Composable
    gen: Gen
    key: bool = False  # usable in a primary key
    widens_to: str | None = None  # a safe ALTER COLUMN … TYPE target


def _t(label: str, type_sql: str, gen: Gen, **kw: object) -> PgType:
    return PgType(label, sql.SQL(type_sql), gen, **kw)  # type: ignore[arg-type]


CATALOGUE = [
    _t("int2", "int2", _int(16)),
    _t("int4", "int4", _int(32), key=True, widens_to="int8"),
    _t("int8", "int8", _int(64), key=True),
    _t("numeric(12,3)", "numeric(12,3)", _decimal(9, 3, ["NaN", "0.000", "-0.001"])),
    _t(
        "numeric(38,10)",
        "numeric(38,10)",
        _decimal(28, 10, ["NaN", "9999999999999999999999999999.9999999999"]),
    ),
    _t(
        "numeric",
        "numeric",
        _decimal(45, 25, ["NaN", "Infinity", "-Infinity", "1.500", "0.00000000000000000001"]),
    ),
    _t("float4", "float4", _float(3e38)),
    _t("float8", "float8", _float(1e300)),
    _t("bool", "bool", lambda r: r.choice(["t", "f"])),
    _t("text", "text", hostile_text, key=True),
    _t("varchar(40)", "varchar(40)", lambda r: hostile_text(r)[:40]),
    _t("bpchar(8)", "char(8)", lambda r: hostile_text(r)[:8]),
    _t("bytea", "bytea", lambda r: "\\x" + r.randbytes(r.choice([0, 1, 16, 40])).hex()),
    _t("date", "date", lambda r: _pick(r, DATE_SPECIAL, 0.25, _date)),
    _t("timestamp", "timestamp", lambda r: _pick(r, TS_SPECIAL, 0.25, lambda r: f"{_date(r)} {_clock(r)}")),
    _t(
        "timestamptz",
        "timestamptz",
        lambda r: _pick(
            r, TS_SPECIAL, 0.25, lambda r: f"{_date(r)} {_clock(r)}{r.choice(['+00', '+05:30', '-08', ''])}"
        ),
    ),
    _t("time", "time", lambda r: _pick(r, ["24:00:00", "00:00:00", "23:59:59.999999"], 0.25, _clock)),
    _t("uuid", "uuid", lambda r: str(uuid.UUID(int=r.getrandbits(128))), key=True),
    _t("json", "json", lambda r: r.choice(JSON_VALUES)),
    _t("jsonb", "jsonb", lambda r: r.choice(JSON_VALUES)),
    _t("interval", "interval", lambda r: r.choice(INTERVALS)),
    _t("int4[]", "int4[]", _array(lambda r: str(r.randint(-(2**31), 2**31 - 1)), ["{{1,2},{3,NULL}}"])),
    _t("text[]", "text[]", _array(hostile_text)),
    _t("float8[]", "float8[]", _array(lambda r: r.choice(["NaN", "-Infinity", "1.5", "-0", "2.5e-310"]))),
    _t("numeric(8,2)[]", "numeric(8,2)[]", _array(_decimal(6, 2, ["0.00"]))),
]

ENUM_LABELS = ["happy", "so-so", "it's", "Ünï", "with space", "UPPER"]


def custom_types(schema: str) -> tuple[list[sql.Composable], list[PgType]]:
    """DDL for an enum and two domains in ``schema``, and their catalogue entries."""
    mood = sql.Identifier(schema, "Mood ënum")
    positive = sql.Identifier(schema, "positive int")
    label = sql.Identifier(schema, "short label")
    ddl: list[sql.Composable] = [
        sql.SQL("CREATE TYPE {} AS ENUM ({})").format(
            mood, sql.SQL(", ").join(map(sql.Literal, ENUM_LABELS))
        ),
        sql.SQL("CREATE DOMAIN {} AS int4 CHECK (VALUE > 0)").format(positive),
        sql.SQL("CREATE DOMAIN {} AS varchar(20)").format(label),
    ]
    types = [
        PgType("enum", mood, lambda r: r.choice(ENUM_LABELS)),
        PgType("domain int4", positive, lambda r: str(r.randint(1, 2**31 - 1))),
        PgType("domain varchar", label, lambda r: hostile_text(r)[:20]),
    ]
    return ddl, types
