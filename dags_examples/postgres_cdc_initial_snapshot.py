"""Initial load of a pipeline: ``dag_factories.initial_snapshot_dag`` (its docstring documents the DAG).

Run once per pipeline, then the CDC DAG (``postgres_cdc_microbatch``) continues where it ends::

    airflow dags test postgres_cdc_initial_snapshot --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.dag_factories import initial_snapshot_dag

dag = initial_snapshot_dag()
