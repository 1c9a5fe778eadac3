"""The example DAGs on Spark 4.1 with Iceberg 1.12, deployed as a user would: the lake equals the source.

Airflow runs in the test virtualenv (Spark provider 5.6, pyspark 3.5); the worker's environment
points at Spark 4.1 elsewhere, as it would at a Spark distribution: ``SPARK_HOME`` with its
``bin`` first on ``PATH`` (so the Spark connection's plain ``spark-submit`` is 4.1's), the jobs'
Python a virtualenv holding pyspark alone, and the 4.1 lake jars (tests/spark_lines.py). The
initial snapshot's load, then a CDC run's apply, each a real ``spark-submit`` from
``airflow dags test``; Iceberg's own snapshot summaries say which Spark and Iceberg wrote them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.lake_catalog import latest_cut, open_catalog, owned_tables
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.e2e.e2e_support import make_lake, pipeline_conf, pipeline_sandbox
from tests.spark_lines import SPARK_41, spark_line_named

SLOT = "shop_cdc"
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


def test_snapshot_and_cdc_on_spark_41_end_equal(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    line = spark_line_named(SPARK_41)
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=41)
    shop.create_schema()
    shop.initial_load()
    lake, lake_conn = make_lake(tmp_path / "lake")
    sandbox = pipeline_sandbox(
        tmp_path / "airflow", pg_cluster.uri(pg_dbname), lake_conn, env=line.worker_env()
    )
    conf = pipeline_conf(SLOT, tmp_path / "staging")

    sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()

    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == set(TABLES)
    conn = connect(dsn)
    acked = describe_slot(conn, SLOT).confirmed_flush_lsn
    conn.close()
    cut = latest_cut(lake, SLOT)  # tagged by the 4.1 apply, then acknowledged
    assert cut is not None and cut.lsn == acked
    for table in owned_tables(open_catalog(lake), lake, SLOT):
        summary = table.current_snapshot().summary
        assert summary["engine-name"] == "spark" and summary["engine-version"].startswith("4.1."), summary
        assert summary["iceberg-version"].startswith("Apache Iceberg 1.12."), summary
