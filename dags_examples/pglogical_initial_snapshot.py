"""Initial load: create the slot with an exported snapshot, copy the published tables, load them with Spark.

Run once per pipeline (the CDC DAG ``pglogical_cdc_microbatch`` continues exactly where it ends)::

    airflow dags test pglogical_initial_snapshot --conf '{"slot": "shop_cdc", "publication": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "pglogical_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

Re-running a run (cleared, retried) creates nothing: while the slot has not moved past the
snapshot it exported, that staged snapshot goes to the load again (tables already loaded are
skipped); once the CDC has moved on, the run is skipped. Reloading tables of a running pipeline
is ``pglogical_backfill_tables``; a lost slot is ``pglogical_recover_slot``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_pglogical.task_groups import pipeline_params, snapshot_task_group

with DAG(
    dag_id="pglogical_initial_snapshot",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=pipeline_params(
        tables=Param([], type="array", description="schema.table names; empty: every published table"),
    ),
    render_template_as_native_obj=True,
    tags=["pglogical", "cdc", "snapshot"],
    doc_md=__doc__,
) as dag:
    snapshot_task_group(
        slot_mode="create",
        slot="{{ params.slot }}",
        publications="{{ params.publication }}",
        staging="{{ params.staging }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        tables="{{ params.tables }}",
        pglogical_conn_id="{{ params.pglogical_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
