"""The lake its users run: a REST catalog, the warehouse and staging on S3, the official Iceberg runtime,
and the jobs on a Spark standalone cluster.

Real PostgreSQL, real ``airflow dags test`` on the example DAGs, SeaweedFS serving S3 and its
Iceberg REST catalog (a table bucket, OAuth2 client credentials), and ``spark-submit`` in client
mode to a standalone master with one two-core worker (one executor per job), with the official
``iceberg-spark-runtime``, ``iceberg-aws-bundle`` and ``hadoop-aws`` jars: the executors read the
staged files through ``s3a`` and write the warehouse through Iceberg's ``S3FileIO``. The lake
connection is the Iceberg provider's standard ``iceberg`` connection; staging is ``s3://`` through
an ``aws`` connection, read by Spark's executors through ``s3a``. One batch is applied to one
table only, as a killed apply leaves it, before the next run converges.

Then the lake must equal its source (read back by pyiceberg), Spark must read the same rows, every
staged change must be in its changelog once, the latest cut must be tagged on every table, and
the S3 secret (which is also the catalog's client secret) must be on no process's command line
while the jobs run, in no DAG run's output, task log or the metadata database, and in no staged
or lake object.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lake_connection import lake_config
from airflow_provider_postgres_cdc.testing import PostgresCluster, SparkStandaloneCluster
from airflow_provider_postgres_cdc.testing.s3 import REGION, S3Server
from tests.integration.e2e.e2e_support import (
    CommandLineWatch,
    assert_acked_end_is_the_latest_cut,
    assert_changelog_holds,
    objects_containing,
    pipeline_conf,
    pipeline_sandbox,
    spark_apply,
    staged_changes,
)

SLOT = "rest_cdc"
CATALOG = "rest_lake"
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


def lake_of(connection: str) -> LakeConfig:
    """The lake an ``iceberg`` connection (Airflow's JSON form) describes, as the lake hook reads it."""
    conn = json.loads(connection)
    return lake_config(
        "lake", conn["conn_type"], host=conn["host"], login=conn["login"], password=conn["password"],
        extra=conn["extra"],
    )  # fmt: skip


def spark_row_counts(lake: LakeConfig, tables: list[str]) -> dict[str, int]:
    """Each table's row count as Spark reads it through the same REST catalog (a second engine)."""
    from airflow_provider_postgres_cdc.spark.session import local_session, register_lake

    spark = local_session("postgres-cdc-rest-read")
    register_lake(spark, lake)
    counts = {}
    for qualified in tables:
        namespace, table = lake.identifier(*qualified.split(".", 1))
        counts[qualified] = spark.table(f"`{lake.catalog}`.`{namespace}`.`{table}`").count()
    return counts


@pytest.mark.timeout(1800)
def test_rest_catalog_and_s3_pipeline_with_a_crash_ends_equal_and_leaks_no_secret(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=23)
    shop.create_schema()
    shop.initial_load()
    with (
        S3Server(buckets=["staging"], table_buckets=["warehouse"]) as s3,
        SparkStandaloneCluster(workers=1, cores_per_worker=2, memory_per_worker="1g") as spark_cluster,
    ):
        # The catalog restricts names: the lake names them portably (docs/LAKE.md, "Names").
        connection = json.loads(s3.iceberg_connection_json("warehouse", catalog=CATALOG))
        connection["extra"]["names"] = "portable"
        lake_conn = json.dumps(connection)
        lake = lake_of(lake_conn)
        store = S3Options(s3.access_key, s3.secret_key, region=REGION, endpoint_url=s3.endpoint_url)
        sandbox = pipeline_sandbox(
            tmp_path / "airflow", pg_cluster.uri(pg_dbname), lake_conn,
            connections={
                "staging_store": s3.connection_json(), "spark_cluster": spark_cluster.connection_uri(),
            },
        )  # fmt: skip
        staging = "s3://staging/cdc"
        conf = {
            **pipeline_conf(SLOT, staging),
            "staging_conn_id": "staging_store",
            "spark_conn_id": "spark_cluster",
        }
        outputs = []
        with CommandLineWatch([s3.secret_key]) as watch:
            outputs.append(sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check().output)
            # The first batch's apply dies after its first table: the others untouched, nothing acked.
            shop.step()
            batch = drain_batch(dsn, DrainSettings(SLOT, (PUBLICATION,), staging, staging_options=store))
            assert len(batch.manifest.tables) > 2
            spark_apply(batch.manifest_uri, lake, tables=batch.manifest.tables[0].qualified, staging=store)
            # The next run finishes that batch on the other tables and acknowledges it. (A CDC run
            # draining to S3 through the staging connection is test_least_privilege's.)
            outputs.append(sandbox.dags_test("postgres_cdc_microbatch", conf).check().output)
        assert watch.spark_submits > 0  # it sampled while the jobs ran,
        assert watch.executors > 0  # and they ran on the cluster's executors

        results = compare_tables(dsn, [PUBLICATION], lake)
        assert all(r.equal for r in results), format_report(results)
        assert {r.table for r in results} == set(TABLES)
        counts = spark_row_counts(lake, list(TABLES))
        assert counts == {r.table: r.target_rows for r in results}
        assert_changelog_holds(lake, staged_changes(s3.filesystem(), f"staging/cdc/{SLOT}"))
        assert_acked_end_is_the_latest_cut(dsn, lake, SLOT, TABLES)

        secret = s3.secret_key.encode()
        assert watch.leaks == []
        assert not [i for i, text in enumerate(outputs) if s3.secret_key in text]
        assert [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret in p.read_bytes()] == []
        filesystem = s3.filesystem()
        assert objects_containing(filesystem, "staging", secret) == []
        assert objects_containing(filesystem, "warehouse", secret) == []
