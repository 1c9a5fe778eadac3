"""Re-snapshot tables of a running pipeline, optionally adding them to its publication first.

The CDC DAG (``postgres_cdc_microbatch``) keeps running: the snapshot comes from a temporary
slot, the pipeline's slot is untouched, and the apply job makes each reloaded table skip the
changes its snapshot holds (docs/FORMATS.md). Use it to repair or reload tables, to pick up a
changed row filter or column list, or to add a table to the pipeline::

    airflow dags test postgres_cdc_backfill_tables --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local", "tables": ["public.orders"],
        "add_tables": [{"table": "public.refunds", "row_filter": "amount > 0"}]}'

``tables`` names tables to reload; every ``add_tables`` entry (``"schema.table"`` or an object
with ``table`` and optional ``columns`` and ``row_filter``) is first put in the publication with
exactly that column list and filter, then reloaded too. Both empty: every published table is
reloaded. Re-running a run is safe: the publication change is idempotent, and a snapshot is
never loaded over a newer one.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_postgres_cdc.task_groups import pipeline_params, snapshot_task_group

with DAG(
    dag_id="postgres_cdc_backfill_tables",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=pipeline_params(
        tables=Param([], type="array", description="schema.table names to reload"),
        add_tables=Param(
            [],
            type="array",
            description='tables to add to the publication first: "schema.table" or '
            '{"table": "schema.table", "columns": [...], "row_filter": "..."}',
        ),
    ),
    render_template_as_native_obj=True,
    tags=["postgres-cdc", "cdc", "snapshot", "backfill"],
    doc_md=__doc__,
) as dag:
    snapshot_task_group(
        slot_mode="temporary",
        group_id="postgres_cdc_resnapshot",
        slot_name="{{ params.slot_name }}",
        publications="{{ params.publications }}",
        staging="{{ params.staging }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        tables="{{ params.tables + params.add_tables }}",
        publish="{{ params.add_tables }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
