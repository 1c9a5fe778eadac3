"""What PostgreSQL 16-18 add, on 18, and the specific errors an older server gives for them.

* published generated columns (18: ``publish_generated_columns = stored``) are copied by the
  snapshot and carried by the drain like any other column;
* protocol 4 with ``streaming = parallel`` in the stream transport stages what the peek stages (that the
  server streamed them in progress is not asserted), an aborted subtransaction included;
* on the default server, when it is older than a feature, asking for the feature fails before any
  slot exists, with ``ServerFeatureError``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.errors import ServerFeatureError
from airflow_provider_postgres_cdc.replication import connect, list_slots
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.drain.staged import staged_tables


def _database(cluster: PostgresCluster, name: str) -> str:
    cluster.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    cluster.create_database(name)
    return name


def test_published_generated_columns_are_copied_and_drained(
    pg18_cluster: PostgresCluster, tmp_path: Path
) -> None:
    db = _database(pg18_cluster, "generated_columns")
    pg18_cluster.execute(
        "CREATE TABLE g (id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED);"
        "CREATE PUBLICATION pub FOR TABLE g WITH (publish_generated_columns = stored);"
        "INSERT INTO g (id, a) SELECT i, i FROM generate_series(1, 5) i",
        db,
    )
    path, manifest = take_snapshot(pg18_cluster.dsn(db), "gen", ["pub"], str(tmp_path))
    (entry,) = manifest.tables
    assert [c.name for c in entry.columns] == ["id", "a", "doubled"]
    copied = pq.read_table(Path(path).parent / entry.files[0]).sort_by("id")
    assert copied.column("doubled").to_pylist() == [2, 4, 6, 8, 10]
    pg18_cluster.execute("UPDATE g SET a = 100 WHERE id = 1; INSERT INTO g (id, a) VALUES (6, 7)", db)
    result = drain_batch(pg18_cluster.dsn(db), DrainSettings("gen", ("pub",), str(tmp_path)))
    changes = staged_tables(result)["public.g"]
    assert changes.column("doubled").to_pylist() == [200, 14]


def test_protocol_4_parallel_streaming_stages_what_the_peek_stages(
    pg18_cluster: PostgresCluster, tmp_path: Path
) -> None:
    db = _database(pg18_cluster, "protocol_four")
    pg18_cluster.execute(
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(db))
    )
    pg18_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, note text); CREATE PUBLICATION pub FOR TABLE t", db
    )
    pg18_cluster.execute("SELECT pg_create_logical_replication_slot('p4', 'pgoutput')", db)
    pg18_cluster.execute(
        "BEGIN; INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g; SAVEPOINT s;"
        " INSERT INTO t SELECT g, 'gone' FROM generate_series(3001, 4000) g; ROLLBACK TO SAVEPOINT s;"
        " UPDATE t SET note = 'kept' WHERE id <= 500; COMMIT;"
        "BEGIN; INSERT INTO t SELECT g, 'aborted' FROM generate_series(5001, 8000) g; ROLLBACK",
        db,
    )
    staged = {}
    for name, settings in {
        "peek": DrainSettings("p4", ("pub",), str(tmp_path / "peek")),
        "parallel": DrainSettings(
            "p4", ("pub",), str(tmp_path / "p4"), transport="stream", streaming="parallel"
        ),
    }.items():
        result = drain_batch(pg18_cluster.dsn(db), settings)
        assert result.manifest.stats.changes == 3500
        staged[name] = staged_tables(result)
    assert staged["peek"] == staged["parallel"]


def test_an_older_server_refuses_newer_features_by_name(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    if pg_cluster.major >= 17:
        pytest.skip(f"the default server is PostgreSQL {pg_cluster.major}: it has these features")
    dsn = pg_cluster.dsn(pg_dbname)
    pg_cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t", pg_dbname)
    with pytest.raises(ServerFeatureError, match="failover slots need PostgreSQL 17 or later"):
        take_snapshot(dsn, "too_old", ["pub"], str(tmp_path), failover=True)
    conn = connect(dsn)
    assert [s.slot_name for s in list_slots(conn, database=pg_dbname)] == []  # refused before creating
    conn.close()
    take_snapshot(dsn, "too_old", ["pub"], str(tmp_path))  # the default: an ordinary slot
    if pg_cluster.major < 16:
        parallel = DrainSettings("too_old", ("pub",), str(tmp_path), transport="stream", streaming="parallel")
        with pytest.raises(ServerFeatureError, match="protocol 4"):
            drain_batch(dsn, parallel)
