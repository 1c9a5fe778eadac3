"""``LakeSparkJobOperator``: the base of the operators that submit one of the package's Spark jobs.

Needs the ``spark`` extra (``pip install 'airflow-provider-postgres-cdc[spark]'``): the Spark provider.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

try:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the Postgres CDC Spark operators need the Spark provider: "
        "pip install 'airflow-provider-postgres-cdc[spark]'"
    ) from exc
from airflow.sdk import Context

from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.spark import job_py_files, local_jars


class LakeSparkJobOperator(SparkSubmitOperator):
    """Submit a job of ``airflow_provider_postgres_cdc/spark`` against the lake of ``lake_conn_id``.

    Everything of :class:`SparkSubmitOperator` applies (``conf``, ``jars``, ``packages``,
    ``spark_binary``, ``env_vars``, ...). The lake's catalog properties are added to ``conf``
    (explicit ``conf`` entries win); settings holding a secret (catalog passwords, tokens, client
    credentials, S3 secret keys) go to spark-submit in a private ``properties_file`` instead, so no
    command line or log shows them (``engine/spark_conf.py``); the job's package modules go with
    ``py_files``; the Iceberg runtime comes from ``jars`` or ``packages`` (on a connected cluster
    ``packages="org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1"``), and when neither is
    given from ``POSTGRES_CDC_SPARK_JARS`` (set by ``make``). Subclasses say what the job is told.
    """

    # The Spark provider keeps its connection id in ``_conn_id`` without templating it; listed here,
    # Airflow renders it like every other field, so a DAG param can choose the Spark connection.
    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "lake_conn_id", "_conn_id")

    def __init__(
        self,
        *,
        application: str,
        lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
        spark_conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, conn_id=spark_conn_id, **kwargs)
        self.lake_conn_id = lake_conn_id

    def job_arguments(self, lake: LakeConfig) -> list[str]:
        """The job's command-line arguments after the lake's own (``--catalog``, ``--namespace-prefix``)."""
        raise NotImplementedError

    def staging_conf(self) -> dict[str, str]:
        """Spark settings for the staging store the job reads (none unless a subclass reads staging)."""
        return {}

    def job_conf(self) -> dict[str, str]:
        """Spark settings the job itself wants (explicit ``conf`` entries still win)."""
        return {}

    def driver_defaults(self) -> dict[str, str]:
        """Settings for the job's driver that the user's ``conf``, ``properties_file`` or
        ``spark-defaults.conf`` override (``engine/spark_conf.with_defaults``): a quiet log."""
        from airflow_provider_postgres_cdc.engine.spark_conf import DRIVER_LOG_CONF

        return dict(DRIVER_LOG_CONF)

    def execute(self, context: Context) -> None:
        from airflow_provider_postgres_cdc.engine.lake_catalog import check_catalog, check_warehouse
        from airflow_provider_postgres_cdc.engine.spark_conf import submit_settings, with_defaults

        lake = self._get_lake_hook().get_conn()
        # A catalog that is down or refuses the credentials, or a warehouse bucket that is missing or
        # refuses them, fails here, in a second, naming the connection, not after a spark-submit's start-up.
        check_catalog(lake, f"lake connection {self.lake_conn_id!r}")
        check_warehouse(lake, f"lake connection {self.lake_conn_id!r}")
        if not self.jars and not self.packages:
            self.jars = local_jars() or None
        args = ["--catalog", lake.catalog]
        if lake.namespace_prefix:
            args += ["--namespace-prefix", lake.namespace_prefix]
        self.application_args = args + self.job_arguments(lake)
        conf = with_defaults(
            {**self.job_conf(), **lake.spark_conf(), **self.staging_conf(), **(self.conf or {})},
            self.driver_defaults(),
            self.properties_file,
        )
        # The private directory (and the secrets file in it) is deleted when the job has ended.
        with tempfile.TemporaryDirectory(prefix="postgres-cdc-job-") as scratch:
            self.conf, self.properties_file = submit_settings(conf, scratch, self.properties_file)
            shipped = job_py_files(scratch)
            self.py_files = f"{self.py_files},{shipped}" if self.py_files else shipped
            super().execute(context)

    def _get_lake_hook(self) -> PostgresCdcLakeHook:
        return PostgresCdcLakeHook(self.lake_conn_id)
