"""Re-snapshot tables of a running pipeline: ``dag_factories.backfill_tables_dag``.

The CDC DAG keeps running; ``add_tables`` are first added to the publication::

    airflow dags test postgres_cdc_backfill_tables --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local", "tables": ["public.orders"],
        "add_tables": [{"table": "public.refunds", "row_filter": "amount > 0"}]}'
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.dag_factories import backfill_tables_dag

dag = backfill_tables_dag()
