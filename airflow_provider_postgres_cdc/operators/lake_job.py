"""``LakeSparkJobOperator``: the base of the operators that run one of the package's Spark jobs.

The job is spark-submitted, or, when the Spark connection is a ``spark_connect`` one, run as a
Spark Connect client process against that server (docs/LAKE.md, "Spark Connect").

Needs the ``spark`` extra (``pip install 'airflow-provider-postgres-cdc[spark]'``): the Spark provider.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

try:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the Postgres CDC Spark operators need the Spark provider: "
        "pip install 'airflow-provider-postgres-cdc[spark]'"
    ) from exc
from airflow.sdk import BaseHook, Context
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.spark import job_py_files, local_jars

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.spark_connect import ClientProcess

# Seconds a Spark Connect client gets after SIGTERM (it interrupts its server-side work) before SIGKILL.
CONNECT_KILL_GRACE = 5.0


class LakeSparkJobOperator(SparkSubmitOperator):
    """Run a job of ``airflow_provider_postgres_cdc/spark`` against the lake of ``lake_conn_id``.

    With a Spark connection of type ``spark`` the job is spark-submitted: everything of
    :class:`SparkSubmitOperator` applies (``conf``, ``jars``, ``packages``, ``spark_binary``,
    ``env_vars``, ...). The lake's catalog properties are added to ``conf`` (explicit ``conf``
    entries win); settings holding a secret (catalog passwords, tokens, client credentials, S3
    secret keys) go to spark-submit in a private ``properties_file`` instead, so no command line
    or log shows them (``engine/spark_conf.py``); the job's package modules go with ``py_files``;
    the Iceberg runtime comes from ``jars`` or ``packages`` (on a connected cluster
    ``packages="org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1"``), and when neither is
    given from ``POSTGRES_CDC_SPARK_JARS`` (set by ``make``). Subclasses say what the job is told.

    With a ``spark_connect`` connection (the Spark provider's: host, port, the token as password,
    ``use_ssl`` in extras) the job runs on that server, as ``<connect_python> <job script>
    <arguments>`` on the worker: the server's URL reaches it in ``SPARK_REMOTE`` and the settings
    above in a mode-0600 file named by ``POSTGRES_CDC_SESSION_CONF``, both by environment, and it
    sets them on a session of its own. Settings only a server's start can take (``spark.sql.extensions``,
    ``spark.jars*``, ``spark.driver.*``, ``spark.executor.*``, ...) are left to the server, which
    must hold Iceberg's runtime (1.11 or later, on Spark 4) and its SQL extensions; ``jars``,
    ``packages`` and ``properties_file`` are not used. The client's output is the task log, its
    exit status the task's outcome, and ``on_kill`` ends it (its operations on the server are
    interrupted).

    :param connect_python: the Spark Connect client's Python: one with ``pyspark-client`` (or
        ``pyspark[connect]``) of the server's Spark version, since the worker's own pyspark may be
        older; default ``POSTGRES_CDC_CONNECT_PYTHON`` from the worker's environment, else the
        worker's Python (templated).
    """

    # The Spark provider keeps its connection id in ``_conn_id`` without templating it; listed here,
    # Airflow renders it like every other field, so a DAG param can choose the Spark connection.
    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "lake_conn_id", "_conn_id", "connect_python",
    )  # fmt: skip

    def __init__(
        self,
        *,
        application: str,
        lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
        spark_conn_id: str = "spark_default",
        connect_python: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, conn_id=spark_conn_id, **kwargs)
        self.lake_conn_id = lake_conn_id
        self.connect_python = connect_python
        self._client: ClientProcess | None = None

    def job_arguments(self, lake: LakeConfig) -> list[str]:
        """The job's command-line arguments after the lake's own (``--catalog``, ``--namespace-prefix``)."""
        raise NotImplementedError

    def staging_conf(self) -> dict[str, str]:
        """Spark settings for the staging store the job reads (none unless a subclass reads staging)."""
        return {}

    def staged_data(self) -> str | None:
        """Where the job reads staged files, which a Spark Connect server on another machine must reach
        (``engine/spark_connect.check_staging``): the manifest it is given, if any."""
        args = list(self.application_args or [])
        return str(args[args.index("--manifest") + 1]) if "--manifest" in args[:-1] else None

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
        args = ["--catalog", lake.catalog]
        if lake.namespace_prefix:
            args += ["--namespace-prefix", lake.namespace_prefix]
        self.application_args = args + self.job_arguments(lake)
        conf = {**self.job_conf(), **lake.spark_conf(), **self.staging_conf(), **(self.conf or {})}
        url = spark_connect_url(self._conn_id)
        if url is not None:
            self._run_on_spark_connect(url, conf)
            return
        if not self.jars and not self.packages:
            self.jars = local_jars() or None
        conf = with_defaults(conf, self.driver_defaults(), self.properties_file)
        # The private directory (and the secrets file in it) is deleted when the job has ended.
        with tempfile.TemporaryDirectory(prefix="postgres-cdc-job-") as scratch:
            self.conf, self.properties_file = submit_settings(conf, scratch, self.properties_file)
            shipped = job_py_files(scratch)
            self.py_files = f"{self.py_files},{shipped}" if self.py_files else shipped
            super().execute(context)

    def _run_on_spark_connect(self, url: str, conf: dict[str, str]) -> None:
        """Run the job as a Spark Connect client of ``url``; fail with what the job said (spark/job.py)."""
        from airflow.sdk.log import mask_secret

        from airflow_provider_postgres_cdc.engine.spark_conf import is_secret_key
        from airflow_provider_postgres_cdc.engine.spark_connect import (
            ClientProcess,
            check_reachable,
            check_staging,
            client_environment,
            job_failure,
            session_settings,
            shown,
            write_session_conf,
        )

        where = f"Spark connection {self._conn_id!r}"
        staged = self.staged_data()
        if staged:
            check_staging(staged, url)
        check_reachable(url, where)
        settings, left = session_settings(conf)
        for key, value in settings.items():
            if is_secret_key(key):
                mask_secret(value)
        if left:
            self.log.info("left to the Spark Connect server's start: %s", ", ".join(sorted(left)))
        prog = os.path.basename(self.application)
        command = [connect_python(self.connect_python), self.application, *(self.application_args or [])]
        # The private directory (and the settings file with its secrets) is deleted when the job has ended.
        with tempfile.TemporaryDirectory(prefix="postgres-cdc-job-") as scratch:
            env = client_environment(
                os.environ, url, write_session_conf(scratch, settings), job_py_files(scratch), self.env_vars
            )
            self.log.info("Spark Connect client of %s: %s", shown(url), " ".join(command))
            self._client = client = ClientProcess(command, env)
            status = client.run(lambda line: self.log.info("%s", line))
        failure = job_failure(prog, status, list(client.tail), shown(url))
        if failure is not None:
            raise AirflowException(failure)

    def on_kill(self) -> None:
        """End the job: the Spark Connect client's process group (SIGTERM, then SIGKILL), or spark-submit."""
        if self._client is not None:
            self._client.terminate(CONNECT_KILL_GRACE)
            return
        super().on_kill()

    def _get_lake_hook(self) -> PostgresCdcLakeHook:
        return PostgresCdcLakeHook(self.lake_conn_id)


def connect_python(given: str | None) -> str:
    """The Spark Connect client's Python: ``given``, else ``POSTGRES_CDC_CONNECT_PYTHON``, else this one."""
    from airflow_provider_postgres_cdc.engine.spark_connect import PYTHON_ENV

    return given or os.environ.get(PYTHON_ENV) or sys.executable


def spark_connect_url(conn_id: str) -> str | None:
    """The ``sc://`` URL of ``conn_id`` when it is a ``spark_connect`` connection (built by the Spark
    provider's ``SparkConnectHook``, its token masked in logs); None for any other connection or none."""
    from airflow.sdk.log import mask_secret

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None  # spark-submit's own fallback (yarn) applies
    if conn.conn_type != SparkConnectHook.conn_type:
        return None
    url = SparkConnectHook(conn_id).get_connection_url()
    if conn.password:
        mask_secret(conn.password)
        mask_secret(url)
    return url


def check_spark_connect(
    spark_conn_id: str, *, lake_conn_id: str | None, staging: str, python: str | None
) -> str | None:
    """Refuse a ``spark_connect`` server the jobs cannot run on, before anything is drained
    (``engine/spark_connect.check_server``); what it found, to log. None for any other Spark connection."""
    from airflow_provider_postgres_cdc.engine.spark_connect import check_server, check_staging, shown

    url = spark_connect_url(spark_conn_id)
    if url is None:
        return None
    check_staging(staging, url)
    lake = PostgresCdcLakeHook(lake_conn_id or PostgresCdcLakeHook.default_conn_name).get_conn()
    prefix = f"spark.sql.catalog.{lake.catalog}"
    catalog = {
        key: value
        for key, value in lake.spark_conf().items()
        if key == prefix or key.startswith(prefix + ".")
    }
    where = f"Spark connection {spark_conn_id!r}"
    facts = check_server(connect_python(python), url, catalog, lake.catalog, where)
    return (
        f"Spark Connect server {shown(url)} of {where}: Spark {facts.spark}, Iceberg {facts.iceberg}; "
        f"client pyspark {facts.client}"
    )
