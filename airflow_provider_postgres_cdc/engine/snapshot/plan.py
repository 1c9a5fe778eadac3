"""Planning the copy: which tables and columns, read from the catalogs inside the exported snapshot.

Each published table becomes a :class:`TablePlan`: its published columns and types, its replica
identity, its row filter, and ``ctid`` block ranges that let several workers share a large table.
Planning refuses what would copy silently wrong (row-level security the role cannot bypass,
columns it may not read) before any data moves. :class:`TableCopy` is what an engine staged for
one plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.snapshot.exported import WORKER_OPTIONS, import_snapshot
from airflow_provider_postgres_cdc.errors import (
    PrivilegeError,
    PublicationEmptyError,
    RowSecurityError,
    TableDroppedError,
    TableNotPublishedError,
)
from airflow_provider_postgres_cdc.formats.layout import table_dir_name
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, TableManifest
from airflow_provider_postgres_cdc.replication import connect
from airflow_provider_postgres_cdc.replication.connection import ConnParams
from airflow_provider_postgres_cdc.replication.features import GENERATED_COLUMNS, supports
from airflow_provider_postgres_cdc.replication.publications import PublishedTable, published_tables
from airflow_provider_postgres_cdc.values import overflow
from airflow_provider_postgres_cdc.values.arrow_types import arrow_type, pg_type_name

DEFAULT_PARALLELISM = 2
DEFAULT_RANGE_BYTES = 256 * 1024 * 1024
DEFAULT_MIN_RANGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """A published column: name, type OID, typmod, and whether it belongs to the replica identity."""

    name: str
    type_oid: int
    typmod: int
    key: bool

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type_oid, self.typmod)

    def manifest(self) -> ColumnManifest:
        return ColumnManifest(
            self.name, pg_type_name(self.type_oid), self.type_oid, self.typmod, str(self.arrow_type), self.key
        )


@dataclass(frozen=True, slots=True)
class TablePlan:
    """What to copy from one table, read from the catalogs inside the exported snapshot.

    ``block_ranges`` split the table by ``ctid``: ``(None, b)`` is everything before block
    ``b``, ``(a, None)`` everything from block ``a`` on, so the ranges cover the table even
    if it grew after it was measured. A partitioned table (published via its root) is ranged
    by its largest partition: the predicate applies to each partition's own ctids.
    """

    schema: str
    table: str
    relkind: str
    columns: tuple[ColumnPlan, ...]
    key_columns: tuple[str, ...]
    replica_identity: str
    row_filter: str | None
    column_list: tuple[str, ...] | None
    publications: tuple[str, ...]
    blocks: int
    block_ranges: tuple[tuple[int | None, int | None], ...]
    warnings: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def dir_name(self) -> str:
        return table_dir_name(self.schema, self.table)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(column.name, column.arrow_type) for column in self.columns])

    def select(self, block_range: tuple[int | None, int | None], *, as_text: bool = False) -> sql.Composed:
        """``SELECT <columns> FROM [ONLY] t WHERE (<row filter>) AND <ctid range>``.

        ``ONLY`` for plain tables, as PostgreSQL's own table sync does, so inheritance
        children are not copied into their parent; a partitioned root reads its partitions.
        ``as_text`` selects every column in its output-function text form, exactly as COPY
        writes it (for the Spark engine): ``format('%s', …)`` calls the output function, where a
        ``::text`` cast would differ for some types (``bpchar`` loses its padding, ``bool``
        becomes ``true``, ``inet`` gains a ``/32``).
        """
        if as_text:
            items = [
                sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE format('%s', {0}) END AS {0}").format(
                    sql.Identifier(column.name)
                )
                for column in self.columns
            ]
        else:
            items = [sql.Identifier(column.name) for column in self.columns]
        conditions: list[sql.Composable] = []
        if self.row_filter:
            conditions.append(sql.SQL("({})").format(sql.SQL(self.row_filter)))
        low, high = block_range
        if low is not None:
            conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({low},0)")))
        if high is not None:
            conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({high},0)")))
        query = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(items),
            sql.SQL("" if self.relkind == "p" else "ONLY "),
            sql.Identifier(self.schema, self.table),
        )
        if conditions:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(conditions))
        return query

    def manifest(self, rows: int, files: Sequence[str], staged: Sequence[str] = ()) -> TableManifest:
        """The table's manifest entry; ``staged`` are the field names of its files (for siblings)."""
        columns = [column.manifest() for column in self.columns]
        columns += overflow.sibling_manifests([column.name for column in self.columns], staged)
        return TableManifest(
            schema=self.schema,
            table=self.table,
            columns=tuple(columns),
            key_columns=self.key_columns,
            replica_identity=self.replica_identity,  # type: ignore[arg-type]
            rows=rows,
            files=tuple(files),
            row_filter=self.row_filter,
            column_list=self.column_list,
            warnings=self.warnings,
        )


@dataclass(frozen=True, slots=True)
class TableCopy:
    """The staged result of one table: files relative to the snapshot directory, rows, bytes, and
    the names of the fields its files hold (overflow siblings only where needed)."""

    plan: TablePlan
    files: tuple[str, ...]
    rows: int
    bytes: int
    fields: tuple[str, ...] = ()


_TABLE_SQL = """
SELECT c.oid, c.relkind, c.relreplident,
       c.relrowsecurity AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
           AND NOT (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = current_user),
       (CASE WHEN c.relkind = 'p'
             THEN (SELECT coalesce(max(pg_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t
                   WHERE t.isleaf)
             ELSE pg_relation_size(c.oid) END) / current_setting('block_size')::bigint,
       current_setting('block_size')::int,
       current_user::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_COLUMNS_SQL = """
SELECT a.attname::text, a.atttypid::int, a.atttypmod, has_column_privilege(a.attrelid, a.attnum, 'SELECT')
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND (a.attgenerated = '' OR %s)
ORDER BY a.attnum
"""

_KEY_SQL = """
SELECT a.attname::text
FROM pg_index i
JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END)
ORDER BY k.pos
"""


def _block_ranges(
    blocks: int, parallelism: int, range_bytes: int, min_range_bytes: int, block_size: int
) -> tuple[tuple[int | None, int | None], ...]:
    """Split ``blocks`` into equal ranges: at least ``min_range_bytes`` each, at most ``range_bytes``.

    Tables big enough get two ranges per worker, so the largest-first schedule balances.
    """
    if blocks <= 0:
        return ((None, None),)
    most = max(1, math.ceil(blocks * block_size / min_range_bytes))
    wanted = max(2 * parallelism, math.ceil(blocks * block_size / range_bytes))
    count = min(most, wanted)
    if count <= 1:
        return ((None, None),)
    step = math.ceil(blocks / count)
    bounds = list(range(step, blocks, step))
    lows: list[int | None] = [None, *bounds]
    highs: list[int | None] = [*bounds, None]
    return tuple(zip(lows, highs, strict=True))


def _plan_table(
    cur: Any, published: PublishedTable, parallelism: int, range_bytes: int, min_range_bytes: int
) -> TablePlan:
    """Read one published table's plan from the catalogs; refuse what the role could not copy whole."""
    name = published.qualified
    cur.execute(_TABLE_SQL, (published.schema, published.table))
    row = cur.fetchone()
    if row is None:
        raise TableDroppedError(f"published table {name} does not exist in the snapshot")
    oid, relkind, identity, rls_applies, blocks, block_size, role = row
    if rls_applies:
        raise RowSecurityError(
            f'table {name} has row-level security and role "{role}" may not bypass it, so a policy could '
            f'silently hide rows from the copy. Run ALTER ROLE "{role}" BYPASSRLS; or copy as the table\'s '
            "owner (without FORCE ROW LEVEL SECURITY). The copy runs with row_security = off, as the "
            "PostgreSQL docs advise for dumps (options=-crow_security=off)."
        )
    # PostgreSQL 18 publishes stored generated columns (publish_generated_columns = stored, or named
    # in a column list): then they are among the published names and are copied like the others.
    cur.execute(_COLUMNS_SQL, (oid, supports(cur.connection, GENERATED_COLUMNS)))
    all_columns = cur.fetchall()
    wanted = set(published.columns)
    # (name, type OID, typmod, whether the role may SELECT it) of each published column
    chosen = [column for column in all_columns if column[0] in wanted]
    denied = [name for name, _, _, readable in chosen if not readable]
    if denied:
        raise PrivilegeError(
            f'role "{role}" lacks SELECT on published table {name} (columns {", ".join(denied)}). '
            f'As the table\'s owner run: GRANT SELECT ON {name} TO "{role}";'
        )
    cur.execute(_KEY_SQL, (oid, identity))
    index_keys = tuple(name for (name,) in cur.fetchall())
    all_published = tuple(name for name, _, _, _ in chosen)
    key_columns = all_published if identity == "f" else () if identity == "n" else index_keys
    warnings: list[str] = []
    if not key_columns:
        warnings.append(
            f"table {name} has no primary key or replica identity (REPLICA IDENTITY "
            f"{'NOTHING' if identity == 'n' else 'DEFAULT without a primary key'}): it is copied, but its "
            "UPDATEs and DELETEs cannot be replicated. Add a primary key or run ALTER TABLE … REPLICA "
            "IDENTITY FULL (or USING INDEX)."
        )
    keys = set(key_columns)
    columns = tuple(ColumnPlan(name, type_oid, typmod, name in keys) for name, type_oid, typmod, _ in chosen)
    column_list = None if len(chosen) == len(all_columns) else tuple(column.name for column in columns)
    return TablePlan(
        schema=published.schema,
        table=published.table,
        relkind=relkind,
        columns=columns,
        key_columns=key_columns,
        replica_identity=identity,
        row_filter=published.row_filter,
        column_list=column_list,
        publications=published.publications,
        blocks=int(blocks),
        block_ranges=_block_ranges(int(blocks), parallelism, range_bytes, min_range_bytes, block_size),
        warnings=tuple(warnings),
    )


def _select_tables(published: list[PublishedTable], tables: Sequence[str] | None) -> list[PublishedTable]:
    """The subset named in ``tables`` (``schema.table`` or ``table`` for public), all when None."""
    if not tables:
        return published
    by_name = {entry.qualified: entry for entry in published}
    chosen, unknown = [], []
    for name in tables:
        qualified = name if "." in name else f"public.{name}"
        if qualified in by_name:
            chosen.append(by_name[qualified])
        else:
            unknown.append(name)
    if unknown:
        raise TableNotPublishedError(
            f"table(s) {', '.join(unknown)} are not published by the given publication(s); published: "
            f"{', '.join(sorted(by_name)) or 'none'}. Add them with ALTER PUBLICATION … ADD TABLE."
        )
    return chosen


def published_subset(
    conn: Any, publications: Sequence[str], tables: Sequence[str] | None
) -> list[PublishedTable]:
    """The tables ``publications`` publish, or the subset named in ``tables``; refuses an empty set."""
    published = published_tables(conn, publications)
    if not published:
        raise PublicationEmptyError(
            f"publication(s) {', '.join(publications)} publish no table; add tables with "
            "ALTER PUBLICATION … ADD TABLE (or FOR TABLES IN SCHEMA)"
        )
    return _select_tables(published, tables)


def plan_tables(
    conn_params: ConnParams,
    snapshot_name: str,
    publications: Sequence[str],
    tables: Sequence[str] | None,
    *,
    parallelism: int,
    range_bytes: int,
    min_range_bytes: int,
) -> list[TablePlan]:
    """Plan every table to copy from the catalogs as the exported snapshot ``snapshot_name`` sees them."""
    conn = connect(conn_params, options=WORKER_OPTIONS)
    try:
        import_snapshot(conn, snapshot_name)
        with conn.cursor() as cur:
            published = published_subset(conn, publications, tables)
            plans = [
                _plan_table(cur, entry, parallelism, range_bytes, min_range_bytes) for entry in published
            ]
    finally:
        # Ends the transaction: it must not hold locks (pg_relation_size takes one) during the copy.
        conn.close()
    for plan in plans:
        overflow.check_names(plan.qualified, [column.name for column in plan.columns])
    return plans
