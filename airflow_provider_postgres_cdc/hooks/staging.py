"""``PostgresCdcStagingHook``: the staging object store's endpoint and keys, from an ``aws`` connection.

The connection follows the Amazon provider's ``aws`` connection conventions (its
``AwsConnectionWrapper``), so one connection serves this package and the Amazon operators alike:
login and password are the access key id and secret (else the extras ``aws_access_key_id`` and
``aws_secret_access_key``), the extras ``aws_session_token``, ``region_name`` and ``endpoint_url``
(``service_config.s3.endpoint_url`` wins for S3), and an empty connection means boto's and
pyarrow's default chain (environment, profile, instance role). Role assumption and profiles are
not read: give such a worker no connection and let the default chain find its role. The Amazon
provider itself is not required (pyarrow speaks S3 on its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

if TYPE_CHECKING:  # the engine's module loads pyarrow: imported when a connection is read, not at parse
    from airflow_provider_postgres_cdc.engine.object_store import S3Options


class PostgresCdcStagingHook(BaseHook):
    """The ``s3://`` staging store of a pipeline, as :class:`S3Options`, from an ``aws`` connection::

        AIRFLOW_CONN_STAGING_STORE='{"conn_type": "aws", "login": "AKIA...", "password": "...",
          "extra": {"region_name": "eu-west-1", "endpoint_url": "https://s3.example.internal"}}'

    :param staging_conn_id: the Airflow connection id.
    """

    conn_name_attr = "staging_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Staging object store (Postgres CDC)"

    def __init__(self, staging_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staging_conn_id = staging_conn_id

    def get_conn(self) -> S3Options:
        """The store's :class:`S3Options` (nothing is contacted)."""
        from airflow_provider_postgres_cdc.engine.object_store import S3Options

        conn = self.get_connection(self.staging_conn_id)
        extra = conn.extra_dejson
        access_key: str | None = conn.login
        secret_key: str | None = conn.password
        if not (access_key and secret_key):
            access_key, secret_key = extra.get("aws_access_key_id"), extra.get("aws_secret_access_key")
        service = (extra.get("service_config") or {}).get("s3") or {}
        return S3Options(
            access_key=access_key or None,
            secret_key=secret_key or None,
            session_token=extra.get("aws_session_token") or None,
            region=extra.get("region_name") or None,
            endpoint_url=service.get("endpoint_url") or extra.get("endpoint_url") or None,
        )


def staging_options(staging_conn_id: str | None) -> S3Options | None:
    """The :class:`S3Options` of ``staging_conn_id``, or ``None`` (pyarrow's environment chain) when unset."""
    return PostgresCdcStagingHook(staging_conn_id).get_conn() if staging_conn_id else None


def staging_spark_conf(staging_conn_id: str | None, uri: str) -> dict[str, str]:
    """The Spark settings with which a job's executors read and write the ``s3://`` staging at ``uri``
    through ``s3a``, from ``staging_conn_id``; none for other stores or without a connection."""
    options = staging_options(staging_conn_id)
    scheme, _, rest = uri.partition("://")
    if options is None or scheme not in ("s3", "s3a"):
        return {}
    return options.spark_hadoop_conf(rest.split("/", 1)[0])
