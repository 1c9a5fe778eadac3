"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_postgres_cdc import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-postgres-cdc",
        "name": "PostgreSQL CDC (logical replication with pgoutput)",
        "description": (
            "Batch change-data-capture from PostgreSQL logical replication into lake tables with Spark."
        ),
        "versions": [__version__],
        # The source is a standard ``postgres`` connection (the Postgres provider registers that
        # type); only the lake's connection type is this package's own.
        "connection-types": [
            {
                "connection-type": "postgres_cdc_lake",
                "hook-class-name": "airflow_provider_postgres_cdc.hooks.lake.PostgresCdcLakeHook",
                "hook-name": "Iceberg lake (Postgres CDC)",
            },
        ],
        # The lake's tables and the pipelines' cuts as Assets (formats/assets.py defines the URIs).
        "asset-uris": [
            {
                "schemes": ["iceberg", "postgres-cdc"],
                "handler": "airflow_provider_postgres_cdc.assets.sanitize_uri",
                "to_openlineage_converter": (
                    "airflow_provider_postgres_cdc.assets.convert_asset_to_openlineage"
                ),
            }
        ],
        "hook-class-names": [
            "airflow_provider_postgres_cdc.hooks.lake.PostgresCdcLakeHook",
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": [
                    "airflow_provider_postgres_cdc.operators.snapshot",
                    "airflow_provider_postgres_cdc.operators.drain",
                    "airflow_provider_postgres_cdc.operators.spark_apply",
                    "airflow_provider_postgres_cdc.operators.ack",
                    "airflow_provider_postgres_cdc.operators.catch_up",
                    "airflow_provider_postgres_cdc.operators.publication",
                    "airflow_provider_postgres_cdc.operators.maintenance",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_postgres_cdc.sensors.slot_lag"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": [
                    "airflow_provider_postgres_cdc.triggers.slot_lag",
                    "airflow_provider_postgres_cdc.triggers.slot_lag_event",
                ],
            }
        ],
    }
