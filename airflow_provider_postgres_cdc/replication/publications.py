"""Publications: create, alter, drop and describe them, including row filters and column lists.

Every schema, table, column and publication name goes through ``psycopg2.sql.Identifier``.
Row filters are SQL expressions by nature (``WHERE (...)``): they are passed through as SQL
and must come from the pipeline's author, never from data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2.errors
from psycopg2 import sql

from airflow_provider_postgres_cdc.errors import (
    ColumnListConflictError,
    NameEncodingError,
    PrivilegeError,
    PublicationAllTablesError,
    PublicationNotFoundError,
    ReplicaIdentityFilterError,
)

PUBLISH_OPERATIONS = ("insert", "update", "delete", "truncate")


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table to put in a publication, optionally with a column list and a row filter."""

    table: str
    schema: str = "public"
    columns: Sequence[str] | None = None
    row_filter: str | None = None

    @classmethod
    def parse(cls, name: str, **kwargs: Any) -> TableSpec:
        """``"schema.table"`` or ``"table"`` (schema public); for names with dots, build directly."""
        schema, _, table = name.rpartition(".")
        return cls(table=table, schema=schema or "public", **kwargs)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_sql(self) -> sql.Composable:
        parts: list[sql.Composable] = [sql.Identifier(self.schema, self.table)]
        if self.columns:
            parts.append(sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Identifier, self.columns))))
        if self.row_filter:
            parts.append(sql.SQL("WHERE ({})").format(sql.SQL(self.row_filter)))
        return sql.SQL(" ").join(parts)


@dataclass(frozen=True, slots=True)
class PublishedTable:
    """One table as published, for one publication or combined across several.

    ``row_filter`` is ``None`` when every row is published (no filter, or, when combined,
    any publication publishes the table unfiltered); several filters are OR-ed, as
    PostgreSQL's initial synchronization does.
    """

    schema: str
    table: str
    columns: tuple[str, ...]
    row_filter: str | None
    publications: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    """A publication's settings and the tables it publishes (each with its own filter)."""

    name: str
    all_tables: bool
    publish: tuple[str, ...]
    publish_via_partition_root: bool
    schemas: tuple[str, ...]
    tables: tuple[PublishedTable, ...]


def _options(publish: Sequence[str] | None, via_root: bool | None) -> sql.Composable | None:
    """The ``publish = …, publish_via_partition_root = …`` list, or None when neither is set."""
    options: list[sql.Composable] = []
    if publish is not None:
        unknown = set(publish) - set(PUBLISH_OPERATIONS)
        if unknown:
            raise ValueError(f"unknown publish operations {sorted(unknown)}; allowed: {PUBLISH_OPERATIONS}")
        options.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(publish))))
    if via_root is not None:
        options.append(sql.SQL("publish_via_partition_root = {}").format(sql.Literal(via_root)))
    return sql.SQL(", ").join(options) if options else None


def _objects(tables: Iterable[TableSpec], schemas: Iterable[str]) -> sql.Composable:
    table_list = [spec.to_sql() for spec in tables]
    schema_list = [sql.Identifier(schema) for schema in schemas]
    parts: list[sql.Composable] = []
    if table_list:
        parts.append(sql.SQL("TABLE {}").format(sql.SQL(", ").join(table_list)))
    if schema_list:
        parts.append(sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(schema_list)))
    return sql.SQL(", ").join(parts)


def create_publication(
    conn: Any,
    name: str,
    tables: Sequence[TableSpec] = (),
    *,
    schemas: Sequence[str] = (),
    all_tables: bool = False,
    publish: Sequence[str] | None = None,
    publish_via_partition_root: bool | None = None,
) -> None:
    """``CREATE PUBLICATION`` for the given tables (with column lists and filters) or schemas."""
    statement: sql.Composable = sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(name))
    if all_tables:
        if tables or schemas:
            raise ValueError("all_tables=True cannot be combined with tables or schemas")
        statement = sql.SQL("{} FOR ALL TABLES").format(statement)
    elif tables or schemas:
        statement = sql.SQL("{} FOR {}").format(statement, _objects(tables, schemas))
    options = _options(publish, publish_via_partition_root)
    if options is not None:
        statement = sql.SQL("{} WITH ({})").format(statement, options)
    with conn.cursor() as cur:
        cur.execute(statement)


def alter_publication(
    conn: Any,
    name: str,
    *,
    add_tables: Sequence[TableSpec] = (),
    drop_tables: Sequence[TableSpec] = (),
    set_tables: Sequence[TableSpec] | None = None,
    publish: Sequence[str] | None = None,
    publish_via_partition_root: bool | None = None,
) -> None:
    """``ALTER PUBLICATION``: add, drop or replace tables, and change its options."""
    ident = sql.Identifier(name)
    statements: list[sql.Composable] = []
    if set_tables is not None:
        statements.append(sql.SQL("ALTER PUBLICATION {} SET {}").format(ident, _objects(set_tables, ())))
    if add_tables:
        statements.append(sql.SQL("ALTER PUBLICATION {} ADD {}").format(ident, _objects(add_tables, ())))
    if drop_tables:
        names = sql.SQL(", ").join(sql.Identifier(t.schema, t.table) for t in drop_tables)
        statements.append(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(ident, names))
    options = _options(publish, publish_via_partition_root)
    if options is not None:
        statements.append(sql.SQL("ALTER PUBLICATION {} SET ({})").format(ident, options))
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def drop_publication(conn: Any, name: str, *, if_exists: bool = True) -> None:
    """``DROP PUBLICATION`` (``IF EXISTS`` by default, so retries are harmless)."""
    template = "DROP PUBLICATION IF EXISTS {}" if if_exists else "DROP PUBLICATION {}"
    with conn.cursor() as cur:
        cur.execute(sql.SQL(template).format(sql.Identifier(name)))


_PUBLICATIONS_SQL = """
SELECT p.pubname, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,
       coalesce((SELECT array_agg(n.nspname::text ORDER BY n.nspname)
                 FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid
                 WHERE pn.pnpubid = p.oid), '{}')
FROM pg_publication p
WHERE p.pubname = ANY(%s)
"""

_TABLES_SQL = """
SELECT pubname, schemaname, tablename, attnames::text[], rowfilter
FROM pg_publication_tables
WHERE pubname = ANY(%s)
ORDER BY schemaname, tablename, pubname
"""


def describe_publications(conn: Any, names: Sequence[str]) -> list[PublicationInfo]:
    """Each named publication with its tables, in the order given; missing ones raise."""
    names = list(dict.fromkeys(names))
    with conn.cursor() as cur:
        cur.execute(_PUBLICATIONS_SQL, (names,))
        pubs = {row[0]: row for row in cur.fetchall()}
        missing = [name for name in names if name not in pubs]
        if missing:
            with_db = conn.get_dsn_parameters().get("dbname", "?")
            raise PublicationNotFoundError(
                f"publication(s) {', '.join(missing)} not found in database {with_db!r}. Create them "
                "with CREATE PUBLICATION (or PostgresCdcHook.create_publication) in that database."
            )
        try:
            cur.execute(_TABLES_SQL, (names,))
        except psycopg2.errors.CharacterNotInRepertoire as exc:
            # Only a SQL_ASCII database can hold such a name: the others convert every name.
            raise NameEncodingError(
                f"a schema, table or column name (or a row filter) published by {', '.join(names)} is not "
                f"valid UTF-8 ({(exc.pgerror or str(exc)).strip()}); the database is SQL_ASCII, which "
                "stores text as unchecked bytes, and the lake holds Unicode names only. Rename it to valid "
                "UTF-8 (ALTER SCHEMA/TABLE ... RENAME TO, ALTER TABLE ... RENAME COLUMN) or rewrite the "
                "filter with ASCII literals."
            ) from None
        rows = cur.fetchall()
    result = []
    for name in names:
        pubname, all_tables, ins, upd, dele, trunc, via_root, schemas = pubs[name]
        publish = tuple(op for op, on in zip(PUBLISH_OPERATIONS, (ins, upd, dele, trunc), strict=True) if on)
        tables = tuple(
            PublishedTable(schema, table, tuple(cols), row_filter, (name,))
            for pub, schema, table, cols, row_filter in rows
            if pub == name
        )
        result.append(PublicationInfo(pubname, all_tables, publish, via_root, tuple(schemas), tables))
    return result


def published_tables(conn: Any, names: Sequence[str]) -> list[PublishedTable]:
    """The tables the publications publish together, with filters combined as PostgreSQL does.

    Filters of several publications are OR-ed; a table published anywhere without a filter
    (including through ``FOR ALL TABLES`` or ``FOR TABLES IN SCHEMA``) has no filter at all.
    Column lists must agree across publications (PostgreSQL refuses to replicate otherwise).
    """
    combined: dict[tuple[str, str], list[PublishedTable]] = {}
    for pub in describe_publications(conn, names):
        for table in pub.tables:
            combined.setdefault((table.schema, table.table), []).append(table)
    result = []
    for (schema, name), entries in sorted(combined.items()):
        column_lists = {entry.columns for entry in entries}
        if len(column_lists) > 1:
            raise ColumnListConflictError(
                f"table {schema}.{name} has different column lists in publications "
                f"{', '.join(e.publications[0] for e in entries)}; PostgreSQL cannot replicate it that way. "
                "Give it the same column list in every publication."
            )
        filters = [entry.row_filter for entry in entries]
        row_filter = None if any(f is None for f in filters) else " OR ".join(f"({f})" for f in filters)
        pubs = tuple(entry.publications[0] for entry in entries)
        result.append(PublishedTable(schema, name, entries[0].columns, row_filter, pubs))
    return result


_MEMBER_SQL = """
SELECT attnames::text[], rowfilter FROM pg_publication_tables
WHERE pubname = %s AND schemaname = %s AND tablename = %s
"""


def publish_tables(conn: Any, publication: str, tables: Sequence[TableSpec]) -> list[str]:
    """Make each table a member of ``publication`` with exactly its column list and row filter.

    Idempotent, so a retried or cleared task changes nothing twice: a table already published
    this way is left alone; a table published with another column list or filter is dropped
    and re-added in the same transaction (subscribers see one change). Returns the tables whose
    membership changed, which need a (re-)snapshot. ``conn`` must not be in autocommit mode.
    The row filter is compared as PostgreSQL stores it, by applying it and reading it back.
    """
    if conn.autocommit:
        raise ValueError("publish_tables needs a transaction: pass a connection with autocommit off")
    info = describe_publications(conn, [publication])[0]
    if info.all_tables:
        raise PublicationAllTablesError(
            f"publication {publication!r} is FOR ALL TABLES: every table is already published; "
            "re-snapshot the table instead of adding it"
        )
    changed = []
    try:
        with conn.cursor() as cur:
            for spec in tables:
                cur.execute(_MEMBER_SQL, (publication, spec.schema, spec.table))
                before = cur.fetchone()
                if before is not None:
                    alter_publication(conn, publication, drop_tables=[spec])
                alter_publication(conn, publication, add_tables=[spec])
                cur.execute(_MEMBER_SQL, (publication, spec.schema, spec.table))
                if cur.fetchone() != before:
                    changed.append(spec.qualified)
                    _probe_writes(cur, publication, spec, info.publish)
        if changed:
            conn.commit()
        else:
            conn.rollback()
    except psycopg2.errors.InsufficientPrivilege as exc:
        conn.rollback()
        raise _publish_privilege_error(conn, publication, tables, exc) from None
    except BaseException:
        conn.rollback()
        raise
    return changed


def _publish_privilege_error(
    conn: Any, publication: str, tables: Sequence[TableSpec], exc: psycopg2.Error
) -> PrivilegeError:
    """What to grant when the pipeline's role may not change the publication (the rest needs no more)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT current_user::text, pg_get_userbyid(pubowner)::text "
            "FROM pg_publication WHERE pubname = %s",
            (publication,),
        )
        role, owner = cur.fetchone()
    conn.rollback()
    names = ", ".join(t.qualified for t in tables)
    return PrivilegeError(
        f'role "{role}" may not add {names} to publication "{publication}" '
        f"({str(exc.pgerror or exc).strip()}): ALTER PUBLICATION needs the publication's owner "
        f'("{owner}"), who must also own each table. Either add the tables as that owner, or make '
        f'the pipeline role a member of the owning role (GRANT "{owner}" TO "{role}";). Nothing was '
        "changed; the snapshot, drain and ack need only LOGIN REPLICATION and SELECT."
    )


def _probe_writes(cur: Any, publication: str, spec: TableSpec, publish: Sequence[str]) -> None:
    """Refuse a membership that would make the table's own UPDATEs or DELETEs fail.

    PostgreSQL accepts a row filter or column list that the replica identity does not cover,
    and then rejects every UPDATE or DELETE of the table: the application writing it breaks.
    An ``UPDATE … WHERE false`` runs the same check without touching a row; it is rolled back
    (with any statement trigger's effects) whatever happens.
    """
    table = sql.Identifier(spec.schema, spec.table)
    cur.execute(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum LIMIT 1",
        (table.as_string(cur),),
    )
    column = sql.Identifier(cur.fetchone()[0])
    probes = []
    if "update" in publish:
        probes.append(sql.SQL("UPDATE {} SET {} = {} WHERE false").format(table, column, column))
    if "delete" in publish:
        probes.append(sql.SQL("DELETE FROM {} WHERE false").format(table))
    for probe in probes:
        cur.execute("SAVEPOINT postgres_cdc_probe")
        try:
            cur.execute(probe)
        except psycopg2.errors.InvalidColumnReference as exc:
            raise ReplicaIdentityFilterError(
                f"publishing {spec.qualified} in {publication!r} with this row filter or column list would "
                f"make every UPDATE and DELETE of the table fail ({str(exc.pgerror or exc).strip()}). Filter "
                "only on replica identity columns and keep them in the column list, or change the table's "
                "replica identity (ALTER TABLE … REPLICA IDENTITY USING INDEX …); nothing was changed."
            ) from None
        finally:
            cur.execute("ROLLBACK TO SAVEPOINT postgres_cdc_probe")


def publication_names_option(publications: Sequence[str]) -> str:
    """pgoutput's ``publication_names`` value: each name double-quoted, so any name survives.

    pgoutput splits the option as a list of SQL identifiers (``SplitIdentifierString``): an
    unquoted name would be folded to lower case and one with a comma split in two.
    """
    if not publications:
        raise ValueError("at least one publication name is needed to peek a pgoutput slot")
    return ",".join('"' + name.replace('"', '""') + '"' for name in publications)
