"""Daily upkeep of one pipeline: staging retention, then Iceberg maintenance of its lake tables.

The only DAG that deletes data. Configured by the same params as the pipeline's other DAGs::

    airflow dags test postgres_cdc_lake_maintenance --conf '{"slot_name": "shop_cdc",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local",
        "keep_cuts": 48, "older_than_hours": 24, "staging_retention_hours": 72}'

* ``staging_retention`` deletes staged batches the slot is acknowledged past and older than
  ``staging_retention_hours`` (and superseded snapshots); it never touches a batch the slot
  has not passed, nor a directory a drain may still be writing.
* ``lake_maintenance`` compacts the slot's tables and changelogs, keeps the newest ``keep_cuts``
  consistent cuts (``pgl_<LSN>`` tags), expires snapshots and deletes orphan files older than
  ``older_than_hours``: keep that above the longest apply or load (a running job's files are not
  committed yet and would look orphaned). The tables' pipeline state is always kept.

Give ``lake_maintenance`` the pool of the pipeline's apply and load tasks (``pool=``) so a
compaction and an apply do not race for the same commit; either would redo its work if they did.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_postgres_cdc.operators.maintenance import (
    PostgresCdcLakeMaintenanceOperator,
    PostgresCdcStagingRetentionOperator,
)
from airflow_provider_postgres_cdc.task_groups import pipeline_params

with DAG(
    dag_id="postgres_cdc_lake_maintenance",
    schedule=timedelta(days=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=10)},
    params=pipeline_params(
        keep_cuts=Param(48, type="integer", minimum=1, description="newest consistent cuts kept"),
        older_than_hours=Param(
            24, type="number", minimum=1, description="snapshot and orphan file age; above the longest apply"
        ),
        staging_retention_hours=Param(72, type="number", minimum=0, description="age of staged batches kept"),
    ),
    tags=["postgres-cdc", "maintenance", "iceberg"],
    doc_md=__doc__,
) as dag:
    retention = PostgresCdcStagingRetentionOperator(
        task_id="staging_retention",
        slot_name="{{ params.slot_name }}",
        staging="{{ params.staging }}",
        retention_hours="{{ params.staging_retention_hours }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
    )
    maintenance = PostgresCdcLakeMaintenanceOperator(
        task_id="lake_maintenance",
        slot_name="{{ params.slot_name }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        keep_cuts="{{ params.keep_cuts }}",
        older_than_hours="{{ params.older_than_hours }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
    retention >> maintenance
