"""Scheduled micro-batch CDC: drain a slot, apply the batch with Spark, then advance the slot.

Configured entirely by DAG params, so it runs unchanged against any database::

    airflow dags test postgres_cdc_microbatch --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

Run the initial snapshot DAG (``postgres_cdc_initial_snapshot``) once first: it creates the slot
and loads the tables at the slot's consistent point. ``max_active_runs=1`` is required: a slot
has one consumer, and each run starts where the previous run's ack left it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_postgres_cdc.task_groups import cdc_microbatch_task_group, pipeline_params

with DAG(
    dag_id="postgres_cdc_microbatch",
    schedule=timedelta(minutes=15),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params=pipeline_params(
        max_messages=Param(1_000_000, type="integer", minimum=1),
        min_lag_bytes=Param(0, type="integer", minimum=0),
    ),
    tags=["postgres-cdc", "cdc"],
    doc_md=__doc__,
) as dag:
    cdc_microbatch_task_group(
        slot_name="{{ params.slot_name }}",
        publications="{{ params.publications }}",
        staging="{{ params.staging }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        max_messages="{{ params.max_messages }}",
        lag_sensor={"min_lag_bytes": "{{ params.min_lag_bytes }}", "poke_interval": 10, "timeout": 3600},
    )
