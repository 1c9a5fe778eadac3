"""An UPDATE that a row filter turns into an INSERT carries its untouched TOAST values as 'u' (soak seed 14).

PostgreSQL sends such an UPDATE (old row outside the filter, new row inside) as an INSERT, and a
TOAST value the UPDATE left alone as "unchanged" ('u'): the stream never shows it, and the lake
holds no earlier row to keep it from. Found by the crash soak (seed 14, ``make soak SEEDS=14-14
ROUNDS=3``): the apply job inserted the row with NULL there, where the source holds the value
(docs/DESIGN.md, invariant 6). Now it refuses to guess: the table stops for a re-snapshot, which reads the
value, and the re-run converges.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import ResnapshotNeededError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_an_update_entering_a_row_filter_stops_for_a_resnapshot_instead_of_losing_its_toast_value(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    dsn, staging = pg_cluster.dsn(pg_dbname), str(tmp_path / "staging")
    big = "".join(random.Random(0).choices(string.ascii_letters, k=5000))  # stored out of line
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, big text, v int);"
        "CREATE PUBLICATION pub FOR TABLE t WHERE (id % 3 <> 0);"
        f"INSERT INTO t VALUES (3, '{big}', 0)",  # outside the filter: not in the lake
        pg_dbname,
    )
    path, _ = take_snapshot(dsn, "s", ["pub"], staging)
    apply_manifest(spark, path, lake_config)
    pg_cluster.execute("UPDATE t SET id = 4, v = 1 WHERE id = 3", pg_dbname)  # enters the filter
    batch = drain_batch(dsn, DrainSettings("s", ("pub",), staging))
    with pytest.raises(
        ResnapshotNeededError, match=r"row filter.*id=4.*\(big\).*postgres_cdc_backfill_tables"
    ):
        apply_manifest(spark, batch.manifest_uri, lake_config)
    assert lake_rows(lake_config) == []  # nothing of the batch reached the table
    # What the backfill DAG does: the table re-snapshotted from a temporary slot and loaded; then
    # the failed apply runs again and finds the batch below the table's new base.
    path, _ = take_snapshot(dsn, "s", ["pub"], staging, tables=["public.t"], slot_mode="temporary")
    apply_manifest(spark, path, lake_config)
    apply_manifest(spark, batch.manifest_uri, lake_config)
    results = compare_tables(dsn, ["pub"], lake_config)
    assert all(r.equal for r in results), format_report(results)
    assert lake_rows(lake_config) == [(4, big, 1)]


def lake_rows(lake_config: LakeConfig) -> list[tuple[object, ...]]:
    table = read_table(lake_config, "public", "t")
    return sorted(zip(*(table.column(name).to_pylist() for name in ("id", "big", "v")), strict=True))
