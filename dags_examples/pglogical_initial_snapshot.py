"""Initial load: create the slot with an exported snapshot, copy the published tables, load them with Spark.

Run once per pipeline (the CDC DAG ``pglogical_cdc_microbatch`` continues exactly where it ends)::

    airflow dags test pglogical_initial_snapshot --conf '{"slot": "shop_cdc", "publication": "shop",
        "staging": "/data/staging", "target": "/data/lake", "pglogical_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

The snapshot task refuses an existing slot (a re-snapshot is the backfill DAG's job) unless
``recreate_slot`` is true, which drops the slot and everything it had not delivered yet.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_pglogical.operators.snapshot import PgLogicalSnapshotOperator
from airflow_provider_pglogical.operators.spark_apply import PgLogicalSparkApplyOperator
from airflow_provider_pglogical.task_groups import pipeline_params

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
    snapshot = PgLogicalSnapshotOperator(
        task_id="snapshot",
        slot_name="{{ params.slot }}",
        publications="{{ params.publication }}",
        staging="{{ params.staging }}",
        tables="{{ params.tables }}",
        pglogical_conn_id="{{ params.pglogical_conn_id }}",
    )
    load = PgLogicalSparkApplyOperator(
        task_id="load",
        manifest="{{ ti.xcom_pull(task_ids='snapshot')['manifest'] }}",
        target="{{ params.target }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
    snapshot >> load
