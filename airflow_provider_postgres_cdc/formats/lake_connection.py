"""An Airflow connection as the lake's :class:`LakeConfig`: this package's type or the standard ``iceberg``.

Two connection types describe a lake (docs/LAKE.md, "Configuring the catalog"):

* ``postgres_cdc_lake`` (this package's): the extras hold ``catalog``, ``properties`` (the catalog's
  Iceberg properties, as Spark names them) and ``namespace_prefix``;
* ``iceberg`` (apache-airflow-providers-apache-iceberg's): host is the REST catalog's base URL,
  login and password its OAuth2 client id and secret, and the extras are the catalog's
  properties themselves (``warehouse``, ``s3.endpoint``, ...). ``catalog``, ``namespace_prefix``
  and ``names`` in its extras are the pipeline's settings, not catalog properties. So a user
  who already has an ``iceberg`` connection passes it as ``lake_conn_id``.

In both, the secret stays in the connection's password field, which Airflow masks: a JDBC
catalog gets it as ``jdbc.password`` (login as ``jdbc.user``), a REST catalog as OAuth2 client
credentials ``credential=<login>:<password>``, or as a bearer ``token`` when there is no login.

Standard library only, like the rest of ``formats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.formats.lake import LAKE_SETTINGS, LakeConfig

LAKE_CONN_TYPE = "postgres_cdc_lake"
ICEBERG_CONN_TYPE = "iceberg"
# The Iceberg provider's catalogs that Spark's Iceberg runtime opens too (pyiceberg's `sql` has no
# Spark counterpart of that name: Spark's is `jdbc`, through a postgres_cdc_lake connection).
_ICEBERG_TYPES = ("rest", "glue", "hive")


def lake_config(
    conn_id: str,
    conn_type: str | None,
    *,
    host: str | None,
    login: str | None,
    password: str | None,
    extra: Mapping[str, Any],
) -> LakeConfig:
    """The lake an Airflow connection describes; :class:`LakeConfigError` names the connection and the fix."""
    try:
        if conn_type == ICEBERG_CONN_TYPE:
            settings = {key: extra[key] for key in LAKE_SETTINGS if key in extra and key != "properties"}
            properties = {key: value for key, value in extra.items() if key not in LAKE_SETTINGS}
            config = LakeConfig.from_mapping({**settings, "properties": {"type": "rest", **properties}})
            if config.catalog_type not in _ICEBERG_TYPES:
                raise LakeConfigError(
                    f"an iceberg connection's catalog type must be one of {list(_ICEBERG_TYPES)}, not "
                    f"{config.catalog_type!r}: for a JDBC catalog use a {LAKE_CONN_TYPE} connection with "
                    '"properties": {"type": "jdbc", ...}'
                )
        else:
            config = LakeConfig.from_mapping(extra)
        return _with_credentials(config, host, login, password)
    except LakeConfigError as exc:
        raise LakeConfigError(f"connection {conn_id!r}: {exc}") from None


def _with_credentials(
    config: LakeConfig, host: str | None, login: str | None, password: str | None
) -> LakeConfig:
    """``config`` with the connection's host, login and password put where its catalog type takes them."""
    properties = dict(config.properties)
    kind = config.catalog_type
    if kind == "rest":
        if host:
            properties["uri"] = host.rstrip("/")
        if login and password:
            properties["credential"] = f"{login}:{password}"
        elif password:
            properties["token"] = password
        elif login:
            raise LakeConfigError(
                "it has a client id (login) but no client secret (password): a REST catalog takes both as "
                "OAuth2 client credentials, or a bearer token in the password alone"
            )
    elif kind == "jdbc":
        if login:
            properties.setdefault("jdbc.user", login)
        if password:
            properties["jdbc.password"] = password
    elif password:
        raise LakeConfigError(
            f"it has a password, but a {kind or 'typeless'} catalog takes its credentials as catalog "
            "properties: put them in the extras"
        )
    return dataclasses.replace(config, properties=properties)
