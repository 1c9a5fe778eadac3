"""A LATIN1 and a SQL_ASCII database end in the lake equal to their source.

Snapshot and one drained batch (inserts, an update, a delete; non-ASCII names and values) are
applied by the apply job's ``apply_manifest`` in the shared Spark session (the job spark-submit
runs; ``spark-submit`` itself is exercised by test_cdc_pipeline and test_apply_batch, and here
would cost ~25 s per apply), then ``verify.compare_tables`` compares the lake with the source.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.values.raw_text import raw_bytes

pytestmark = [pytest.mark.integration, pytest.mark.spark]
TABLE = '"schéma"."tablé"'

# Text as the client sends it: str through a UTF8 session, bytes as stored through a SQL_ASCII one.
VALUES = {
    "LATIN1": ["café ÿ", "Grüße «» Ã©", "Ñandú"],
    "SQL_ASCII": [b"caf\xe9", "été €".encode(), b"x\\\xff"],
}


@pytest.mark.parametrize("encoding", list(VALUES))
def test_encoded_database_reaches_the_lake_equal(
    pg_cluster: PostgresCluster, spark: SparkSession, tmp_path: Path, encoding: str
) -> None:
    db = f"l_{uuid.uuid4().hex[:10]}"
    pg_cluster.execute(
        sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
            sql.Identifier(db), sql.Literal(encoding)
        )
    )
    client = "SQL_ASCII" if encoding == "SQL_ASCII" else "UTF8"
    conn = psycopg2.connect(pg_cluster.dsn(db), options=f"-c client_encoding={client}")
    conn.autocommit = True
    values = VALUES[encoding]

    def literal(value: str | bytes) -> bytes:
        raw = value if isinstance(value, bytes) else value.encode()
        return b"'" + raw.replace(b"'", b"''") + b"'"

    def run(statement: bytes) -> None:
        with conn.cursor() as cur:
            cur.execute(statement)

    run(f'CREATE SCHEMA "schéma"; CREATE TABLE {TABLE} (id int PRIMARY KEY, "colonne_ø" text)'.encode())
    run(f"CREATE PUBLICATION pub FOR TABLE {TABLE}".encode())
    for i, value in enumerate(values):
        run(b"INSERT INTO %s VALUES (%d, %s)" % (TABLE.encode(), i, literal(value)))
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"), catalog=f"enc_{uuid.uuid4().hex[:8]}")
    register_lake(spark, lake)
    dsn = pg_cluster.dsn(db)
    path, _ = take_snapshot(dsn, "encl", ["pub"], str(tmp_path / "staging"))
    apply_manifest(spark, path, lake)
    for i, value in enumerate(values, start=10):
        run(b"INSERT INTO %s VALUES (%d, %s)" % (TABLE.encode(), i, literal(value)))
    run(b'UPDATE %s SET "colonne_\xc3\xb8" = %s WHERE id = 0' % (TABLE.encode(), literal(values[1])))
    run(b"DELETE FROM %s WHERE id = 2" % TABLE.encode())
    batch = drain_batch(dsn, DrainSettings("encl", ("pub",), str(tmp_path / "staging"), transport="stream"))
    apply_manifest(spark, batch.manifest_uri, lake)

    results = compare_tables(dsn, ["pub"], lake)
    assert [r.table for r in results] == ["schéma.tablé"]
    assert all(r.equal for r in results), format_report(results)
    rows = sorted(read_table(lake, "schéma", "tablé").to_pylist(), key=lambda r: r["id"])
    stored = [v if isinstance(v, bytes) else v.encode() for v in values]
    expected = [stored[1], stored[1], *stored]
    assert [raw_bytes(r["colonne_ø"]) for r in rows] == expected
    conn.close()
    pg_cluster.drop_database(db)
