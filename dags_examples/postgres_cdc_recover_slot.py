"""Recover a pipeline whose slot is lost or was dropped: ``dag_factories.recover_slot_dag``.

The lag sensor and the drain point here when the slot's WAL is gone::

    airflow dags trigger postgres_cdc_recover_slot --conf '{"slot_name": "shop_cdc", "publications": "shop",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local"}'
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.dag_factories import recover_slot_dag

dag = recover_slot_dag()
