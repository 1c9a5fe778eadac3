"""Publications on a real server: filters, column lists, options, and how filters combine."""

from __future__ import annotations

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.errors import ColumnListConflictError, PublicationNotFoundError
from airflow_provider_postgres_cdc.replication import (
    TableSpec,
    alter_publication,
    connect,
    create_publication,
    describe_publications,
    drop_publication,
)
from airflow_provider_postgres_cdc.replication.publications import published_tables
from airflow_provider_postgres_cdc.testing import PostgresCluster


@pytest.fixture
def conn(pg_cluster: PostgresCluster, pg_dbname: str):  # type: ignore[no-untyped-def]
    pg_cluster.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric, region text, note text);"
        "CREATE TABLE customers (id int PRIMARY KEY, name text);"
        "CREATE SCHEMA audit; CREATE TABLE audit.events (id bigint PRIMARY KEY, payload jsonb);"
        "INSERT INTO orders SELECT g, g * 10, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'n' || g "
        "FROM generate_series(1, 20) g",
        pg_dbname,
    )
    connection = connect(pg_cluster.dsn(pg_dbname))
    yield connection
    connection.close()


def _count(conn, table: str, row_filter: str | None) -> int:  # type: ignore[no-untyped-def]
    with conn.cursor() as cur:
        where = sql.SQL(" WHERE {}").format(sql.SQL(row_filter)) if row_filter else sql.SQL("")
        cur.execute(sql.SQL("SELECT count(*) FROM {}{}").format(sql.Identifier(table), where))
        return int(cur.fetchone()[0])


def test_row_filter_and_column_list(conn) -> None:  # type: ignore[no-untyped-def]
    spec = TableSpec("orders", columns=["id", "amount"], row_filter="amount > 100")
    create_publication(conn, "big_orders", [spec], publish=["insert", "update"])
    (pub,) = describe_publications(conn, ["big_orders"])
    assert pub.publish == ("insert", "update")
    assert not pub.all_tables
    (table,) = pub.tables
    assert (table.schema, table.table, table.columns) == ("public", "orders", ("id", "amount"))
    assert table.row_filter is not None and "100" in table.row_filter
    assert _count(conn, "orders", table.row_filter) == 10


def test_filters_are_ored_across_publications(conn) -> None:  # type: ignore[no-untyped-def]
    create_publication(conn, "p_big", [TableSpec("orders", row_filter="amount > 150")])
    create_publication(conn, "p_eu", [TableSpec("orders", row_filter="region = 'eu'")])
    (combined,) = published_tables(conn, ["p_big", "p_eu"])
    assert combined.publications == ("p_big", "p_eu")
    assert combined.row_filter is not None and " OR " in combined.row_filter
    # ids 16..20 are big, even ids are eu: 10 even + the odd big ids 17 and 19 = 12.
    assert _count(conn, "orders", combined.row_filter) == 12


@pytest.mark.parametrize(
    "unfiltered",
    [
        lambda c: create_publication(c, "p_plain", [TableSpec("orders")]),
        lambda c: create_publication(c, "p_plain", schemas=["public"]),
        lambda c: create_publication(c, "p_plain", all_tables=True),
    ],
    ids=["table", "tables-in-schema", "all-tables"],
)
def test_an_unfiltered_publication_makes_filters_redundant(conn, unfiltered) -> None:  # type: ignore[no-untyped-def]
    create_publication(conn, "p_big", [TableSpec("orders", row_filter="amount > 150")])
    unfiltered(conn)
    tables = {t.qualified: t for t in published_tables(conn, ["p_big", "p_plain"])}
    assert tables["public.orders"].row_filter is None
    assert set(tables["public.orders"].publications) == {"p_big", "p_plain"}


def test_different_column_lists_are_refused(conn) -> None:  # type: ignore[no-untyped-def]
    create_publication(conn, "p_a", [TableSpec("orders", columns=["id", "amount"])])
    create_publication(conn, "p_b", [TableSpec("orders", columns=["id", "region"])])
    with pytest.raises(ColumnListConflictError, match="different column lists"):
        published_tables(conn, ["p_a", "p_b"])


def test_alter_and_drop(conn) -> None:  # type: ignore[no-untyped-def]
    create_publication(conn, "p", [TableSpec("orders")])
    alter_publication(
        conn,
        "p",
        add_tables=[TableSpec("events", schema="audit"), TableSpec("customers", columns=["id"])],
        publish=["insert"],
        publish_via_partition_root=True,
    )
    (pub,) = describe_publications(conn, ["p"])
    assert {t.qualified for t in pub.tables} == {"public.orders", "audit.events", "public.customers"}
    assert pub.publish == ("insert",)
    assert pub.publish_via_partition_root
    assert next(t for t in pub.tables if t.table == "customers").columns == ("id",)
    alter_publication(conn, "p", drop_tables=[TableSpec("orders")])
    alter_publication(conn, "p", set_tables=[TableSpec("orders", row_filter="id < 5")])
    (pub,) = describe_publications(conn, ["p"])
    assert [t.qualified for t in pub.tables] == ["public.orders"]
    drop_publication(conn, "p")
    drop_publication(conn, "p")  # IF EXISTS: a retry is harmless
    with pytest.raises(psycopg2.errors.UndefinedObject):
        drop_publication(conn, "p", if_exists=False)


def test_missing_publication(conn) -> None:  # type: ignore[no-untyped-def]
    create_publication(conn, "exists", [TableSpec("orders")])
    with pytest.raises(PublicationNotFoundError, match=r"nope.*CREATE PUBLICATION"):
        describe_publications(conn, ["exists", "nope"])


def test_unknown_publish_operation(conn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown publish operations"):
        create_publication(conn, "p", [TableSpec("orders")], publish=["insert", "upsert"])
