"""The local lake's SQLite catalog shared by several Spark catalogs at once (a re-snapshot load racing
the apply, a test's session beside a spark-submit job): every writer waits its turn, none fails."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.spark.session import register_lake


def test_a_catalog_opened_on_an_existing_database_does_not_lock_out_other_writers(
    spark: SparkSession, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    first = local_lake(str(tmp_path), catalog=f"first_{suffix}")
    second = replace(first, catalog=f"second_{suffix}")  # the same database file, another catalog
    register_lake(spark, first)
    spark.sql(f"CREATE NAMESPACE {first.catalog}.ns")  # the catalog's tables exist from here on
    register_lake(spark, second)
    assert spark.sql(f"SHOW NAMESPACES IN {second.catalog}").collect() == []  # opened on them
    spark.sql(f"CREATE TABLE {first.catalog}.ns.t (i int) USING iceberg")
    spark.sql(f"INSERT INTO {first.catalog}.ns.t VALUES (1)")
    spark.sql(f"CREATE NAMESPACE {second.catalog}.ns")
    spark.sql(f"CREATE TABLE {second.catalog}.ns.t (i int) USING iceberg")
    spark.sql(f"INSERT INTO {second.catalog}.ns.t VALUES (2)")
    rows = [spark.table(f"{lake.catalog}.ns.t").collect()[0][0] for lake in (first, second)]
    assert rows == [1, 2]
