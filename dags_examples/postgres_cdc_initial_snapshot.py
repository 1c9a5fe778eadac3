"""Initial load: create the slot with an exported snapshot, copy the published tables, load them with Spark.

Run once per pipeline (the CDC DAG ``postgres_cdc_microbatch`` continues exactly where it ends)::

    airflow dags test postgres_cdc_initial_snapshot --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

Re-running a run (cleared, retried) creates nothing: while the slot has not moved past the
snapshot it exported, that staged snapshot goes to the load again (tables already loaded are
skipped); once the CDC has moved on, the run is skipped. Reloading tables of a running pipeline
is ``postgres_cdc_backfill_tables``; a lost slot is ``postgres_cdc_recover_slot``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_postgres_cdc.task_groups import pipeline_params, snapshot_task_group

with DAG(
    dag_id="postgres_cdc_initial_snapshot",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=pipeline_params(
        tables=Param([], type="array", description="schema.table names; empty: every published table"),
    ),
    render_template_as_native_obj=True,
    tags=["postgres-cdc", "cdc", "snapshot"],
    doc_md=__doc__,
) as dag:
    snapshot_task_group(
        slot_mode="create",
        slot_name="{{ params.slot_name }}",
        publications="{{ params.publications }}",
        staging="{{ params.staging }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        tables="{{ params.tables }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
