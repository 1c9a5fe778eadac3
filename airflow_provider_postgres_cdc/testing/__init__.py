"""The public test kit: real PostgreSQL and real Airflow for tests of CDC pipelines, ours and our users'.

:mod:`.postgres` runs a throwaway PostgreSQL cluster of 15 to 18 (:class:`PostgresCluster`;
:mod:`.pg_binaries` picks the major), :mod:`.standby` a hot standby of one (:class:`PostgresStandby`);
:mod:`.airflow_cli` a private ``AIRFLOW_HOME`` for ``airflow dags test`` (:class:`AirflowSandbox`, on
:mod:`.airflow_home`); :mod:`.airflow_services` the scheduler and API server for backfills and
re-runs (:class:`AirflowServices`), whose runs :mod:`.airflow_runs` describes; :mod:`.spark_cluster`
a Spark standalone master and workers (:class:`SparkStandaloneCluster`); :mod:`.spark_connect` a
Spark 4 Connect server whose clients run jobs as sessions (:class:`SparkConnectServer`); :mod:`.s3`
an S3 server on SeaweedFS (:class:`S3Server`); :mod:`.processes` the process helpers they share, and
:mod:`.errors` the kit's exceptions.

Example::

    with PostgresCluster() as pg:
        dsn = pg.create_database("shop")
        ...
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.testing.airflow_cli import AirflowSandbox, AssetEventRecord, DagRunResult
from airflow_provider_postgres_cdc.testing.airflow_runs import DagRunRecord, SchedulerResult
from airflow_provider_postgres_cdc.testing.airflow_services import AirflowServices
from airflow_provider_postgres_cdc.testing.errors import (
    AirflowApiError,
    PostgresNotFoundError,
    SeaweedFsNotFoundError,
    SparkNotFoundError,
)
from airflow_provider_postgres_cdc.testing.postgres import PostgresCluster, find_postgres_bindir
from airflow_provider_postgres_cdc.testing.s3 import S3Server
from airflow_provider_postgres_cdc.testing.spark_cluster import SparkStandaloneCluster
from airflow_provider_postgres_cdc.testing.spark_connect import SparkConnectServer
from airflow_provider_postgres_cdc.testing.standby import PostgresStandby

__all__ = [
    "AirflowApiError",
    "AirflowSandbox",
    "AirflowServices",
    "AssetEventRecord",
    "DagRunRecord",
    "DagRunResult",
    "PostgresCluster",
    "PostgresNotFoundError",
    "PostgresStandby",
    "S3Server",
    "SchedulerResult",
    "SeaweedFsNotFoundError",
    "SparkConnectServer",
    "SparkNotFoundError",
    "SparkStandaloneCluster",
    "find_postgres_bindir",
]
