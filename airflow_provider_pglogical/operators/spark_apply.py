"""``PgLogicalSparkApplyOperator``: submit the package's PySpark apply job for a staged manifest.

Needs the ``spark`` extra (``pip install 'airflow-provider-pglogical[spark]'``): the Spark provider.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

try:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "PgLogicalSparkApplyOperator needs the Spark provider: "
        "pip install 'airflow-provider-pglogical[spark]'"
    ) from exc
from airflow.sdk import Context

from airflow_provider_pglogical.hooks.lake import PgLogicalLakeHook
from airflow_provider_pglogical.spark import APPLY_JOB_PATH, job_py_files, local_jars
from airflow_provider_pglogical.staging import read_manifest


class PgLogicalSparkApplyOperator(SparkSubmitOperator):
    """Apply a snapshot or change batch to the Iceberg lake with ``spark-submit`` (no hand-written command).

    Everything of :class:`SparkSubmitOperator` applies (``conn_id``, ``conf``, ``jars``, ``packages``,
    ``spark_binary``, ``env_vars``, ...). The lake's catalog properties come from the
    ``pglogical_lake`` connection and are added to ``conf`` (explicit ``conf`` entries win). The
    Iceberg runtime reaches the job through ``jars`` or ``packages`` (on a connected cluster
    ``packages="org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"``); when neither is given,
    ``PGLOGICAL_SPARK_JARS`` (set by ``make``) is used. The job is idempotent: a table that already
    holds the batch is skipped, and a re-run after a crash converges.

    :param manifest: URI or path of the ``_manifest.json`` to apply (templated).
    :param lake_conn_id: the lake's ``pglogical_lake`` connection (templated).
    :param tables: optional ``schema.table`` names restricting the run (templated).
    :param write_mode: row-level write mode of tables the job creates: ``merge-on-read`` (default:
        docs/LAKE.md says why) or ``copy-on-write``.
    :param spark_conn_id: the Spark connection (``spark://local%5B2%5D`` for local mode) (templated).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "manifest",
        "lake_conn_id",
        "tables",
        "spark_conn_id",
    )

    def __init__(
        self,
        *,
        manifest: str,
        lake_conn_id: str = PgLogicalLakeHook.default_conn_name,
        tables: Sequence[str] | None = None,
        write_mode: str = "merge-on-read",
        spark_conn_id: str = "spark_default",
        name: str = "pglogical-apply",
        **kwargs: Any,
    ) -> None:
        super().__init__(application=APPLY_JOB_PATH, conn_id=spark_conn_id, name=name, **kwargs)
        self.manifest = manifest
        self.lake_conn_id = lake_conn_id
        self.tables = tables
        self.write_mode = write_mode
        self.spark_conn_id = spark_conn_id

    def execute(self, context: Context) -> None:
        manifest = read_manifest(self.manifest)
        if not manifest.tables:
            # An empty batch changes no table: nothing to submit, and the ack needs no commit.
            self.log.info("batch %s holds no changes; nothing to apply", manifest.batch_id)
            return
        lake = PgLogicalLakeHook(self.lake_conn_id).get_conn()
        self._conn_id = self.spark_conn_id  # templated: may come from DAG params
        self.conf = {**lake.spark_conf(), **(self.conf or {})}
        if not self.jars and not self.packages:
            self.jars = local_jars() or None
        args = ["--manifest", str(self.manifest), "--catalog", lake.catalog, "--write-mode", self.write_mode]
        if lake.namespace_prefix:
            args += ["--namespace-prefix", lake.namespace_prefix]
        if self.tables:
            args += ["--tables", ",".join(self.tables)]
        self.application_args = args
        with tempfile.TemporaryDirectory(prefix="pglogical-apply-") as scratch:
            shipped = job_py_files(scratch)
            self.py_files = f"{self.py_files},{shipped}" if self.py_files else shipped
            super().execute(context)
