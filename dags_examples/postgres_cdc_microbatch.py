"""Scheduled micro-batch CDC every 15 minutes: ``dag_factories.cdc_microbatch_dag``.

A scheduled DAG needs its staging root in the DAG file (scheduled runs carry no conf): set
``STAGING`` to a location every worker reaches. A manual run may still override every param::

    airflow dags test postgres_cdc_microbatch --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'

Run the initial snapshot DAG (``postgres_cdc_initial_snapshot``) once first: it creates the slot.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.dag_factories import cdc_microbatch_dag

STAGING = "s3://postgres-cdc/staging"  # the pipeline's staging root: edit to yours

dag = cdc_microbatch_dag(staging=STAGING)
