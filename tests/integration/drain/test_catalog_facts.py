"""Catalog facts of a partitioned table published via its root (found by the crash soak, seed 3).

PostgreSQL keeps an ``ADD COLUMN ... DEFAULT <constant>``'s missing value on each partition,
not on the partitioned root, which stores no rows. Read from the root alone, the column looked
like one with a volatile default, and the apply job asked for a needless re-snapshot.
"""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.engine.catalog_facts import read_facts
from airflow_provider_postgres_cdc.formats.schema_changes import ColumnFacts
from airflow_provider_postgres_cdc.replication import connect
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = pytest.mark.integration


def test_a_partitioned_root_reads_the_missing_value_its_partitions_keep(
    pg_cluster: PostgresCluster, pg_dbname: str
) -> None:
    pg_cluster.execute(
        "CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY HASH (id);"
        "CREATE TABLE m0 PARTITION OF m FOR VALUES WITH (MODULUS 2, REMAINDER 0);"
        "CREATE TABLE m1 PARTITION OF m FOR VALUES WITH (MODULUS 2, REMAINDER 1);"
        "INSERT INTO m SELECT g, 'x' FROM generate_series(1, 10) g;"
        "ALTER TABLE m ADD COLUMN c int DEFAULT 7;"
        "CREATE TABLE v (id int PRIMARY KEY) PARTITION BY HASH (id);"
        "CREATE TABLE v0 PARTITION OF v FOR VALUES WITH (MODULUS 1, REMAINDER 0);"
        "INSERT INTO v VALUES (1);"
        "ALTER TABLE v ADD COLUMN t timestamptz DEFAULT clock_timestamp();",
        dbname=pg_dbname,
    )
    conn = connect(pg_cluster.dsn(pg_dbname))
    try:
        facts = read_facts(conn, "public", "m")
        leaf = read_facts(conn, "public", "m0")
        volatile = read_facts(conn, "public", "v")
    finally:
        conn.close()
    assert leaf["c"] == ColumnFacts(has_missing=True, has_default=True, missing="7")
    assert facts["c"] == ColumnFacts(has_missing=True, has_default=True, missing="7")
    assert volatile["t"] == ColumnFacts(has_missing=False, has_default=True, missing=None)
    assert facts["id"] == ColumnFacts(has_missing=False, has_default=False, missing=None)
