"""An exact comparison of a lake table with its source, judged by PostgreSQL itself.

``verify.compare_tables`` compares the lake with the source through the product's own type
mapping (the snapshot's Arrow types): a mapping bug made on both sides hides there. Here the
lake's rows, read with pyiceberg, are rendered as PostgreSQL input text by a renderer that shares
nothing with the product (``render``), copied into a scratch table of the source's column types,
and PostgreSQL prints both sides with its own output functions: the multisets of
``md5(row::text)`` must be equal. A value stored as NULL with its exact text in the documented
sibling column ``<col>__pgl_text`` is read from that column.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

TEXT_SUFFIX = "__pgl_text"
SCRATCH = "pgl_fidelity_lake"


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day count from 1970-01-01, proleptic Gregorian, year 0 = 1 BC."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _date_text(days: int, clock: str = "") -> str:
    year, month, day = _civil(days)
    era = ""
    if year <= 0:
        year, era = 1 - year, " BC"
    return f"{year:04d}-{month:02d}-{day:02d}{clock}{era}"


def _clock(micros: int) -> str:
    seconds, frac = divmod(micros, 1_000_000)
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{frac:06d}"


def _micros(array: pa.Array) -> list[int | None]:
    unit = array.type.unit
    scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}[unit]
    raw = array.cast(pa.int64()).to_pylist()
    if scale == 0:
        return [None if v is None else v // 1000 for v in raw]
    return [None if v is None else v * scale for v in raw]


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, int | str):
        return str(value)
    raise TypeError(f"no PostgreSQL text for {type(value).__name__} {value!r}")


def render(array: pa.Array) -> list[str | None]:
    """Every value of an Arrow column as PostgreSQL input text (None for NULL)."""
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        elements = render(array.flatten())
        offsets = [int(o) for o in pc.list_value_length(array).fill_null(0).to_pylist()]
        out: list[str | None] = []
        position = 0
        for valid, length in zip(array.is_valid().to_pylist(), offsets, strict=True):
            items = elements[position : position + length]
            position += length
            quoted = [
                "NULL" if e is None else '"' + e.replace("\\", "\\\\").replace('"', '\\"') + '"'
                for e in items
            ]
            out.append("{" + ",".join(quoted) + "}" if valid else None)
        return out
    if pa.types.is_date32(kind):
        return [None if d is None else _date_text(d) for d in array.cast(pa.int32()).to_pylist()]
    if pa.types.is_timestamp(kind):
        zone = "+00" if kind.tz is not None else ""
        return [
            None if m is None else _date_text(m // 86_400_000_000, " " + _clock(m % 86_400_000_000) + zone)
            for m in _micros(array)
        ]
    if pa.types.is_time(kind):
        return [None if m is None else _clock(m) for m in _micros(array)]
    return [None if v is None else _scalar_text(v) for v in array.to_pylist()]


def _copy_escape(value: str | None) -> str:
    if value is None:
        return "\\N"
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


@dataclass
class ExactResult:
    """One table: rows on each side and the row texts found on one side only (truncated samples)."""

    table: str
    source_rows: int
    lake_rows: int
    problem: str = ""
    only_in_source: list[str] = field(default_factory=list)
    only_in_lake: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return len(self.only_in_source) + len(self.only_in_lake) + (1 if self.problem else 0)

    def report(self, limit: int = 4) -> str:
        """The counts, then a few differing rows, each shown where it departs from its closest peer."""
        lines = [f"{self.table}: source {self.source_rows} rows, lake {self.lake_rows} rows {self.problem}"]
        for label, rows, others in (
            ("only in source", self.only_in_source, self.only_in_lake),
            ("only in lake", self.only_in_lake, self.only_in_source),
        ):
            lines += [f"    {label}: {_excerpt(row, others)}" for row in rows[:limit]]
            if len(rows) > limit:
                lines.append(f"    ... {len(rows) - limit} more {label}")
        return "\n".join(lines)


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _excerpt(row: str, others: list[str], width: int = 160) -> str:
    """``row`` shortened around where it first differs from the most similar row of ``others``."""
    if not others:
        return repr(row) if len(row) <= width else repr(row[:width]) + " ..."
    common = max(_common_prefix(row, o) for o in others)
    if len(row) <= width:
        return f"{row!r} (differs at char {common})"
    head = repr(row[:60])
    return f"{head} ... at char {common}: {row[max(common - 30, 60) : common + width - 60]!r}"


def _row_texts(cur: Any, relation: sql.Composable) -> Counter[str]:
    """Row text -> copies, grouped by md5 in the server (only the distinct rows travel)."""
    cur.execute(sql.SQL("SELECT min(t::text), count(*) FROM {} t GROUP BY md5(t::text)").format(relation))
    return Counter({text: count for text, count in cur.fetchall()})


def _published(cur: Any, publication: str, source: sql.Identifier) -> sql.Composable:
    """``SELECT <published columns> FROM [ONLY] t [WHERE <row filter>]``, as PostgreSQL states them.

    ``pg_publication_tables`` gives the column list (every column without one) and the row
    filter; ``ONLY`` for all but a partitioned root, which reads its partitions.
    """
    cur.execute(
        "SELECT attnames::text[], rowfilter, c.relkind::text FROM pg_publication_tables p "
        "JOIN pg_namespace n ON n.nspname = p.schemaname "
        "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename "
        "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, *source.strings),
    )
    found = cur.fetchone()
    if found is None:
        raise AssertionError(f"{'.'.join(source.strings)} is not in publication {publication!r}")
    names, row_filter, relkind = found
    query = sql.SQL("SELECT {} FROM {}{}").format(
        sql.SQL(", ").join(map(sql.Identifier, names)), sql.SQL("" if relkind == "p" else "ONLY "), source
    )
    if row_filter is None:
        return query
    return sql.SQL("{} WHERE {}").format(query, sql.SQL(row_filter))


def compare_exact(dsn: str, lake: LakeConfig, publication: str, schema: str, table: str) -> ExactResult:
    """Compare one published table with its lake table through PostgreSQL's own text output."""
    source = sql.Identifier(schema, table)
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            published = _published(cur, publication, source)
            cur.execute(sql.SQL("SELECT * FROM ({}) t LIMIT 0").format(published))
            names = [d.name for d in cur.description]
            expected = _row_texts(cur, sql.SQL("({})").format(published))
            rows = sum(expected.values())
            try:
                data = read_table(lake, schema, table)
            except Exception as exc:  # the lake lacks the table: a finding
                return ExactResult(f"{schema}.{table}", rows, 0, f"lake unreadable: {exc}")
            result = ExactResult(f"{schema}.{table}", rows, data.num_rows)
            missing = [n for n in names if n not in data.column_names]
            if missing:
                result.problem = f"lake lacks columns {missing}"
                return result
            columns = []
            for name in names:
                values = render(data.column(name).combine_chunks())
                if name + TEXT_SUFFIX in data.column_names:
                    exact = data.column(name + TEXT_SUFFIX).to_pylist()
                    values = [e if e is not None else v for v, e in zip(values, exact, strict=True)]
                columns.append(values)
            cur.execute(
                sql.SQL("CREATE TEMP TABLE {} AS {} WITH NO DATA").format(sql.Identifier(SCRATCH), published)
            )
            lines = "".join("\t".join(map(_copy_escape, row)) + "\n" for row in zip(*columns, strict=True))
            try:
                cur.copy_expert(
                    sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(SCRATCH)).as_string(conn),
                    io.StringIO(lines),
                )
            except psycopg2.Error as exc:
                result.problem = f"PostgreSQL cannot read the lake's values back: {exc.pgerror or exc}"
                return result
            actual = _row_texts(cur, sql.Identifier(SCRATCH))
            result.only_in_source = sorted((expected - actual).elements())
            result.only_in_lake = sorted((actual - expected).elements())
            return result
    finally:
        conn.rollback()
        conn.close()


def compare_all(
    dsn: str, publication: str, lake: LakeConfig, tables: list[tuple[str, str]]
) -> tuple[int, list[str]]:
    """(rows compared, problems): verify's multiset comparison and the exact one, every table."""
    problems: list[str] = []
    results = compare_tables(dsn, [publication], lake)
    if not all(r.equal for r in results):
        problems.append("verify.compare_tables:\n" + format_report(results))
    unverified = {f"{s}.{t}" for s, t in tables} - {r.table for r in results}
    if unverified:
        problems.append(f"verify.compare_tables did not compare {sorted(unverified)}")
    exact = [compare_exact(dsn, lake, publication, schema, table) for schema, table in tables]
    problems += ["exact: " + r.report() for r in exact if r.differences]
    return sum(r.source_rows for r in exact), problems
