"""Recover a pipeline whose slot is lost (``wal_status = lost``) or was dropped.

The lag sensor and the drain fail on such a slot and point here. This DAG recreates the slot
with an exported snapshot and reloads every published table at its new consistent point, so
the targets are equal to the source again and the CDC DAG (``postgres_cdc_microbatch``)
continues from the new slot without manual steps::

    airflow dags trigger postgres_cdc_recover_slot --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

A healthy slot is refused (reload tables of a running pipeline with ``postgres_cdc_backfill_tables``).
Pause the CDC DAG while this runs: its runs fail on the lost slot anyway. Re-running a finished
recovery changes nothing: its snapshot is handed to the load again only while the new slot has
not moved past it, and a table already loaded is skipped.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_postgres_cdc.task_groups import pipeline_params, snapshot_task_group

with DAG(
    dag_id="postgres_cdc_recover_slot",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=pipeline_params(),
    tags=["postgres-cdc", "cdc", "snapshot", "recovery"],
    doc_md=__doc__,
) as dag:
    snapshot_task_group(
        slot_mode="recover",
        slot_name="{{ params.slot_name }}",
        publications="{{ params.publications }}",
        staging="{{ params.staging }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
