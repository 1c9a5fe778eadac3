"""Values a lake type cannot hold, and ``time``, through snapshot and CDC into Iceberg.

Real PostgreSQL, the real drain, the real apply job in the test's Spark session. Every value the
typed column cannot hold (±infinity, BC, year 10000, NaN/±Infinity in numeric(p,s), arrays with
more dimensions or other bounds than a list holds) must end in the lake's ``<column>__pgl_text``
sibling with the typed column NULL; the lake must equal the source (``verify``), and every lake
value, typed or text, must be what PostgreSQL prints for the source value (cast back by the server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
import pyarrow.parquet as pq
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
from airflow_provider_postgres_cdc.engine.snapshot import SnapshotRun, jdbc_connection, take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import sibling_name
from airflow_provider_postgres_cdc.spark import snapshot_jdbc
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.spark.pg_text import lake_vs_postgres

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCALARS = {
    "d": "date", "ts": "timestamp", "tstz": "timestamptz", "n10": "numeric(10,2)",
    "n60": "numeric(60,2)", "nn": "numeric", "t": "time",
}  # fmt: skip
ARRAYS = {"ia": "int[]", "da": "date[]", "ta": "time[]", "big": "int[]"}
FITTING = {
    "d": "2024-02-29", "ts": "2024-01-02 03:04:05.5", "tstz": "2024-01-02 03:04:05.123456+00",
    "n10": "12.34", "n60": "123456789012345678901234567890123456789012345678.50", "nn": "1.5",
    "t": "12:34:56.5", "ia": "{1,NULL,3}", "da": "{2024-01-01,NULL}", "ta": "{00:00:00,12:00:00.25}",
    "big": "{1,2}",
}  # fmt: skip
# Every value here but times and plain numerics (text in the lake) overflows its typed column.
# PostgreSQL 15 allows ±Infinity only in unconstrained numeric, NaN in numeric(p,s) too.
OVERFLOWING = [
    {"d": "infinity", "ts": "-infinity", "tstz": "infinity", "n10": "NaN", "t": "24:00:00",
     "ia": "{{1,2},{3,4}}", "da": "{2024-01-01,infinity}", "ta": "{24:00:00}"},
    {"d": "-infinity", "ts": "0044-03-15 BC", "tstz": "10000-01-01 00:00:00+00", "n10": "NaN",
     "nn": "Infinity", "ia": "[0:1]={1,2}", "da": "{-infinity}", "t": "00:00:00"},
    {"d": "0044-03-15 BC", "ts": "10000-01-01", "tstz": "0044-03-15 12:00:00+00 BC", "n10": "NaN",
     "nn": "-Infinity", "da": "[2:2]={2024-01-01}"},
    {"d": "10000-01-01", "ts": "infinity", "tstz": "-infinity", "n10": "NaN", "nn": "NaN", "n60": "NaN"},
]  # fmt: skip
BIG_2D = "{" + ",".join("{" + ",".join(str(i * 3000 + j) for j in range(3000)) + "}" for i in range(2)) + "}"


def _create(pg: PostgresCluster, db: str, table: str, columns: dict[str, str]) -> None:
    body = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns.items()
    )
    name = sql.Identifier(table)
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, {})").format(name, body), db)
    if "big" in columns:  # out of line and uncompressed, so an UPDATE of note sends big as 'u'
        pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(name), db)
    pg.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(f"{table}_pub"), name), db)


def _write(dsn: str, table: str, rows: dict[int, dict[str, str | None]], columns: dict[str, str]) -> None:
    """Upsert rows given as PostgreSQL text (missing columns NULL)."""
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        for key, row in rows.items():
            names = [sql.Identifier(n) for n in ("id", "note", *columns)]
            values = [key, row.get("note", f"n{key}"), *[row.get(c) for c in columns]]
            sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(n) for n in names[1:])
            statement = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}").format(
                sql.Identifier(table),
                sql.SQL(", ").join(names),
                sql.SQL(", ").join([sql.Placeholder()] * len(names)),
                sets,
            )
            cur.execute(statement, values)
    conn.close()


def _execute(dsn: str, statements: list[str]) -> None:
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    conn.close()


def assert_lake_is_postgres_text(dsn: str, lake: LakeConfig, table: str, columns: dict[str, str]) -> int:
    """Every lake value is the source's ``col::text`` (pg_text.py); returns how many are siblings."""
    verdicts = lake_vs_postgres(dsn, lake, table, columns)
    assert {name: v.differences for name, v in verdicts.items() if v.differences} == {}
    return sum(v.via_sibling for v in verdicts.values())


def _drain_and_apply(
    spark: SparkSession, dsn: str, slot: str, pub: str, staging: Path, lake: LakeConfig
) -> Any:
    batch = drain_batch(dsn, DrainSettings(slot, (pub,), str(staging)))
    apply_manifest(spark, batch.manifest_uri, lake)
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT pg_replication_slot_advance(%s, %s)", (slot, str(batch.manifest.end_lsn)))
    conn.close()
    return batch


@pytest.mark.timeout(900)
def test_overflowing_values_and_time_reach_the_lake_exactly(
    spark: SparkSession, lake_config: LakeConfig, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    columns = {**SCALARS, **ARRAYS}
    _create(pg_cluster, pg_dbname, "vals", columns)
    initial: dict[int, dict[str, str | None]] = {0: FITTING, 5: {}, 6: {**FITTING, "big": BIG_2D}}
    initial[7] = {"d": "0001-01-01", "ts": "1500-06-01 12:00:00", "da": "{1000-01-01}"}  # before 1582
    initial |= {i + 1: row for i, row in enumerate(OVERFLOWING)}
    _write(dsn, "vals", initial, columns)
    staging = tmp_path / "staging"

    path, manifest = take_snapshot(dsn, "vals_slot", ["vals_pub"], str(staging))
    (entry,) = manifest.tables
    staged = {
        name
        for f in entry.files
        for name in pq.read_schema(f"{staging}/vals_slot/{manifest.batch_id}/{f}").names
    }
    assert {sibling_name(c) for c in ("d", "ts", "tstz", "n10", "ia", "da", "big")} <= staged
    assert not {sibling_name(c) for c in ("t", "ta", "nn", "n60", "note")} & staged  # text: never overflow
    assert [c.name for c in entry.columns if c.arrow_type == "string"][:1] == ["note"]
    assert {c.name for c in entry.columns} >= staged
    apply_manifest(spark, path, lake_config)
    assert assert_lake_is_postgres_text(dsn, lake_config, "vals", columns) > 0

    # Batch 1: new overflowing and fitting rows, fitting -> overflowing, overflowing -> fitting.
    _write(dsn, "vals", {10: OVERFLOWING[0], 11: FITTING, 0: OVERFLOWING[1], 2: FITTING}, columns)
    _write(dsn, "vals", {20: {**FITTING, "big": BIG_2D}, 21: FITTING}, columns)
    first = _drain_and_apply(spark, dsn, "vals_slot", "vals_pub", staging, lake_config)
    assert sibling_name("d") in {c.name for c in first.manifest.tables[0].columns}

    # Batch 2: back to fitting values, and unchanged-TOAST updates (big sent as 'u'), chained twice.
    _write(dsn, "vals", {10: FITTING, 0: FITTING}, columns)
    _execute(
        dsn,
        [
            "UPDATE vals SET note = 'toast-1' WHERE id IN (6, 20, 21)",
            "UPDATE vals SET note = 'toast-2' WHERE id = 20",
            "UPDATE vals SET note = 'toast-3', n10 = 'NaN' WHERE id = 21",
        ],
    )
    second = _drain_and_apply(spark, dsn, "vals_slot", "vals_pub", staging, lake_config)
    (changes,) = second.manifest.tables
    staged_changes = pq.read_table(f"{second.batch_uri}/{changes.files[0]}").to_pylist()
    toasted = [r["_pgl_unchanged"] for r in staged_changes if r["note"] == "toast-2"]
    assert toasted == [["big", sibling_name("big")]]

    results = compare_tables(dsn, ["vals_pub"], lake_config, scratch=str(tmp_path / "verify"))
    assert all(r.equal for r in results), format_report(results)
    lake_big = {
        r["id"]: r[sibling_name("big")] for r in read_table(lake_config, "public", "vals").to_pylist()
    }
    assert lake_big[20] == lake_big[6] == BIG_2D
    assert assert_lake_is_postgres_text(dsn, lake_config, "vals", columns) > 0


@pytest.mark.timeout(900)
def test_spark_snapshot_engine_stages_the_same_values(
    spark: SparkSession, lake_config: LakeConfig, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    _create(pg_cluster, pg_dbname, "scal", SCALARS)
    ancient = {"d": "0001-01-01", "ts": "1500-06-01 12:00:00", "tstz": "0001-01-01 00:00:00+00"}
    rows: dict[int, dict[str, str | None]] = {0: FITTING, 5: {}, 6: ancient}
    rows |= {i + 1: {k: v for k, v in row.items() if k in SCALARS} for i, row in enumerate(OVERFLOWING)}
    _write(dsn, "scal", rows, SCALARS)
    url, properties, _ = jdbc_connection(dsn)
    saved = {key: spark.conf.get(key) for key in ("spark.sql.ansi.enabled",)}
    try:
        with SnapshotRun(dsn, "scal_slot", ["scal_pub"], str(tmp_path / "staging")) as run:
            snapshot_jdbc.run(spark, run.spark_job_spec(url, properties))
            path, manifest = run.finish(run.collect_staged())
    finally:
        for key, value in saved.items():
            spark.conf.set(key, value)
    names = {c.name for c in manifest.tables[0].columns}
    assert {sibling_name(c) for c in ("d", "ts", "tstz", "n10")} <= names
    apply_manifest(spark, path, lake_config)
    assert assert_lake_is_postgres_text(dsn, lake_config, "scal", SCALARS) == sum(
        1 for row in OVERFLOWING for k in row if k in ("d", "ts", "tstz", "n10")
    )
    _write(dsn, "scal", {1: FITTING, 0: {k: v for k, v in OVERFLOWING[0].items() if k in SCALARS}}, SCALARS)
    _drain_and_apply(spark, dsn, "scal_slot", "scal_pub", tmp_path / "staging", lake_config)
    results = compare_tables(dsn, ["scal_pub"], lake_config, scratch=str(tmp_path / "verify"))
    assert all(r.equal for r in results), format_report(results)
    assert_lake_is_postgres_text(dsn, lake_config, "scal", SCALARS)


@pytest.mark.timeout(900)
def test_replica_identity_full_matches_rows_on_their_siblings(
    spark: SparkSession, lake_config: LakeConfig, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    """FULL tables match old rows on every column: an overflowing old value is matched by its sibling
    (in ``_pgl_old``), so updates and deletes of such rows reach the lake."""
    dsn = pg_cluster.dsn(pg_dbname)
    _create(pg_cluster, pg_dbname, "fullt", SCALARS)
    pg_cluster.execute("ALTER TABLE fullt REPLICA IDENTITY FULL", pg_dbname)
    rows: dict[int, dict[str, str | None]] = {0: FITTING, 5: {}}
    rows |= {i + 1: {k: v for k, v in row.items() if k in SCALARS} for i, row in enumerate(OVERFLOWING)}
    _write(dsn, "fullt", rows, SCALARS)
    path, _ = take_snapshot(dsn, "full_slot", ["fullt_pub"], str(tmp_path / "staging"))
    apply_manifest(spark, path, lake_config)
    _write(
        dsn, "fullt", {1: {**FITTING, "note": "fits now"}, 0: {"d": "infinity", "note": "overflows"}}, SCALARS
    )
    _execute(dsn, ["DELETE FROM fullt WHERE id = 2", "UPDATE fullt SET note = 'kept' WHERE id = 3"])
    batch = _drain_and_apply(spark, dsn, "full_slot", "fullt_pub", tmp_path / "staging", lake_config)
    old_fields = (
        pq.read_schema(f"{batch.batch_uri}/{batch.manifest.tables[0].files[0]}").field("_pgl_old").type
    )
    assert sibling_name("d") in [f.name for f in old_fields]
    results = compare_tables(dsn, ["fullt_pub"], lake_config, scratch=str(tmp_path / "verify"))
    assert all(r.equal for r in results), format_report(results)
    assert_lake_is_postgres_text(dsn, lake_config, "fullt", SCALARS)
