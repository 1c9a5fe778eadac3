"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_pglogical import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-pglogical",
        "name": "PostgreSQL logical replication (pglogical CDC)",
        "description": (
            "Batch change-data-capture from PostgreSQL logical replication into lake tables with Spark."
        ),
        "versions": [__version__],
        "connection-types": [
            {
                "connection-type": "pglogical",
                "hook-class-name": "airflow_provider_pglogical.hooks.pglogical.PgLogicalHook",
                "hook-name": "PostgreSQL logical replication",
            },
            {
                "connection-type": "pglogical_lake",
                "hook-class-name": "airflow_provider_pglogical.hooks.lake.PgLogicalLakeHook",
                "hook-name": "Iceberg lake (pglogical)",
            },
        ],
        # The lake's tables and the pipelines' cuts as Assets (formats/assets.py defines the URIs).
        "asset-uris": [
            {
                "schemes": ["iceberg", "pglogical"],
                "handler": "airflow_provider_pglogical.assets.sanitize_uri",
                "to_openlineage_converter": "airflow_provider_pglogical.assets.convert_asset_to_openlineage",
            }
        ],
        "hook-class-names": [
            "airflow_provider_pglogical.hooks.pglogical.PgLogicalHook",
            "airflow_provider_pglogical.hooks.lake.PgLogicalLakeHook",
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": [
                    "airflow_provider_pglogical.operators.snapshot",
                    "airflow_provider_pglogical.operators.drain",
                    "airflow_provider_pglogical.operators.spark_apply",
                    "airflow_provider_pglogical.operators.ack",
                    "airflow_provider_pglogical.operators.publication",
                    "airflow_provider_pglogical.operators.maintenance",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_pglogical.sensors.slot_lag"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_pglogical.triggers.slot_lag"],
            }
        ],
    }
