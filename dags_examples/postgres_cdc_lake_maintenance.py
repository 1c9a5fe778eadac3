"""Daily staging retention and Iceberg maintenance of one pipeline: ``dag_factories.lake_maintenance_dag``.

The only DAG that deletes data. Like the CDC DAG it is scheduled, so its staging root is set
here (``STAGING``: the same as the pipeline's); a manual run may override every param::

    airflow dags test postgres_cdc_lake_maintenance --conf '{"slot_name": "shop_cdc",
        "staging": "/data/staging", "lake_conn_id": "shop_lake", "postgres_conn_id": "shop_db",
        "spark_conn_id": "spark_local",
        "keep_cuts": 48, "older_than_hours": 24, "staging_retention_hours": 72}'
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.dag_factories import lake_maintenance_dag

STAGING = "s3://postgres-cdc/staging"  # the pipeline's staging root: edit to yours

dag = lake_maintenance_dag(staging=STAGING)
