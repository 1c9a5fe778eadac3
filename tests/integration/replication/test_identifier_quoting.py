"""Hostile names must be quoted or refused, never executed."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.replication import (
    TableSpec,
    alter_publication,
    connect,
    create_publication,
    create_slot,
    describe_publications,
    drop_publication,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster

EVIL_TABLE = 'x"; DROP TABLE victims; --'
EVIL_COLUMN = 'c"); DROP TABLE victims; --'
EVIL_SCHEMA = "s'; DROP TABLE victims; --"
EVIL_PUB = 'p"; DROP TABLE victims; --'


def _victims_exist(pg_cluster: PostgresCluster, db: str) -> bool:
    return bool(pg_cluster.execute("SELECT to_regclass('public.victims') IS NOT NULL", db)[0][0])


def test_hostile_publication_table_column_and_schema_names(
    pg_cluster: PostgresCluster, pg_dbname: str
) -> None:
    conn = connect(pg_cluster.dsn(pg_dbname))
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE victims (id int)")
            cur.execute(f'CREATE SCHEMA "{EVIL_SCHEMA}"')
            quoted_table = EVIL_TABLE.replace('"', '""')
            quoted_column = EVIL_COLUMN.replace('"', '""')
            cur.execute(
                f'CREATE TABLE "{EVIL_SCHEMA}"."{quoted_table}" (id int PRIMARY KEY, "{quoted_column}" text)'
            )
        spec = TableSpec(EVIL_TABLE, schema=EVIL_SCHEMA, columns=["id", EVIL_COLUMN])
        create_publication(conn, EVIL_PUB, [spec])
        alter_publication(conn, EVIL_PUB, publish=["insert"])
        (pub,) = describe_publications(conn, [EVIL_PUB])
        assert pub.name == EVIL_PUB
        assert [(t.schema, t.table, t.columns) for t in pub.tables] == [
            (EVIL_SCHEMA, EVIL_TABLE, ("id", EVIL_COLUMN))
        ]
        drop_publication(conn, EVIL_PUB)
        assert _victims_exist(pg_cluster, pg_dbname)
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["x'); DROP TABLE victims; --", 'a"b', "UPPER", "", "a" * 64])
def test_hostile_slot_names_are_refused(pg_cluster: PostgresCluster, pg_dbname: str, name: str) -> None:
    pg_cluster.execute("CREATE TABLE victims (id int)", pg_dbname)
    conn = connect(pg_cluster.dsn(pg_dbname))
    try:
        with pytest.raises(ValueError, match="invalid replication slot name"):
            create_slot(conn, name)
    finally:
        conn.close()
    assert _victims_exist(pg_cluster, pg_dbname)
    assert (
        pg_cluster.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()", pg_dbname
        )[0][0]
        == 0
    )
