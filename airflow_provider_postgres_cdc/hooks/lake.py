"""``PostgresCdcLakeHook``: the Iceberg lake (catalog) a pipeline writes, from an Airflow connection."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

# Which catalog property the connection's password fills, by catalog type.
_SECRET_PROPERTY = {"jdbc": "jdbc.password", "rest": "token", "nessie": "token"}


class PostgresCdcLakeHook(BaseHook):
    """The lake's Iceberg catalog as Spark and pyiceberg name it, from a ``postgres_cdc_lake`` connection.

    The connection's extras hold ``catalog`` (the Spark catalog name, default ``lake``),
    ``properties`` (the catalog's Spark properties without the ``spark.sql.catalog.<name>.``
    prefix: ``type``, ``uri``, ``warehouse``, ``io-impl``, ...) and ``namespace_prefix``. Login and
    password, when set, become ``jdbc.user``/``jdbc.password`` of a JDBC catalog (``token`` of a
    REST one), so the secret stays in the connection's password field, which Airflow masks::

        AIRFLOW_CONN_LAKE='{"conn_type": "postgres_cdc_lake", "login": "iceberg", "password": "...",
          "extra": {"catalog": "lake", "properties": {"type": "jdbc",
            "uri": "jdbc:postgresql://db:5432/iceberg", "warehouse": "s3a://bucket/lake"}}}'

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
        """The lake's :class:`LakeConfig` (nothing is contacted)."""
        conn = self.get_connection(self.lake_conn_id)
        try:
            config = LakeConfig.from_mapping(conn.extra_dejson)
        except LakeConfigError as exc:
            raise LakeConfigError(f"connection {self.lake_conn_id!r}: {exc}") from None
        properties = dict(config.properties)
        kind = config.catalog_type
        if conn.login and kind == "jdbc":
            properties.setdefault("jdbc.user", conn.login)
        if conn.password:
            key = _SECRET_PROPERTY.get(kind)
            if key is None:
                raise LakeConfigError(
                    f"connection {self.lake_conn_id!r} has a password, but a {kind or 'typeless'} catalog "
                    "takes its credentials as properties: put them in the extras' properties"
                )
            properties[key] = conn.password
        return LakeConfig(config.catalog, properties, config.namespace_prefix)


def connection_json(config: LakeConfig) -> str:
    """``config`` as a ``postgres_cdc_lake`` connection in Airflow's JSON form (``AIRFLOW_CONN_<ID>``)."""
    return json.dumps({"conn_type": "postgres_cdc_lake", "extra": json.loads(config.to_json())})
