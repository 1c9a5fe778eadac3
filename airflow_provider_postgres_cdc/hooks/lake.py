"""``PostgresCdcLakeHook``: the Iceberg lake (catalog) a pipeline writes, from an Airflow connection."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_postgres_cdc.formats.lake import LakeConfig


class PostgresCdcLakeHook(BaseHook):
    """The lake's Iceberg catalog as Spark and pyiceberg name it, from a ``postgres_cdc_lake`` connection
    or the Iceberg provider's standard ``iceberg`` connection (``formats/lake_connection.py``).

    A ``postgres_cdc_lake`` connection's extras hold ``catalog`` (the Spark catalog name, default
    ``lake``), ``properties`` (the catalog's properties without the ``spark.sql.catalog.<name>.``
    prefix: ``type``, ``uri``, ``warehouse``, ``io-impl``, ...) and ``namespace_prefix``. An
    ``iceberg`` connection has the REST catalog's URL as host, its OAuth2 client id and secret as
    login and password, and the catalog's properties as extras. The secret stays in the password
    field, which Airflow masks, and reaches Spark jobs only through a private properties file::

        AIRFLOW_CONN_LAKE='{"conn_type": "iceberg", "host": "https://catalog.example.com/api/catalog",
          "login": "<client id>", "password": "<client secret>",
          "extra": {"warehouse": "s3://lake/", "s3.region": "eu-west-1"}}'

    :param lake_conn_id: the Airflow connection id.
    """

    conn_name_attr = "lake_conn_id"
    default_conn_name = "postgres_cdc_lake_default"
    conn_type = "postgres_cdc_lake"
    hook_name = "Iceberg lake (Postgres CDC)"

    def __init__(self, lake_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lake_conn_id = lake_conn_id

    def get_conn(self) -> LakeConfig:
        """The lake's :class:`LakeConfig` (nothing is contacted); its secrets are masked in task logs."""
        from airflow.sdk.log import mask_secret

        from airflow_provider_postgres_cdc.engine.spark_conf import is_secret_key
        from airflow_provider_postgres_cdc.formats.lake_connection import lake_config

        conn = self.get_connection(self.lake_conn_id)
        config = lake_config(
            self.lake_conn_id,
            conn.conn_type,
            host=conn.host,
            login=conn.login,
            password=conn.password,
            extra=conn.extra_dejson,
        )
        for key, value in config.properties.items():
            if is_secret_key(key):
                mask_secret(value)
        return config


def connection_json(config: LakeConfig) -> str:
    """``config`` as a ``postgres_cdc_lake`` connection in Airflow's JSON form (``AIRFLOW_CONN_<ID>``)."""
    return json.dumps({"conn_type": "postgres_cdc_lake", "extra": json.loads(config.to_json())})
