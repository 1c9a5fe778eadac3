"""``PgLogicalSparkApplyOperator``: submit the package's PySpark apply job for a staged manifest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context

from airflow_provider_pglogical.ledger import read_manifest
from airflow_provider_pglogical.spark import APPLY_JOB_PATH


class PgLogicalSparkApplyOperator(SparkSubmitOperator):
    """Apply a snapshot or change batch to the lake tables with ``spark-submit`` (no hand-written command).

    Everything of :class:`SparkSubmitOperator` applies (``conn_id``, ``conf``, ``spark_binary``,
    ``env_vars``, ...). The job is idempotent: a batch already in the target's ledger is skipped,
    and a re-run after a crash converges.

    :param manifest: URI or path of the ``_manifest.json`` to apply (templated).
    :param target: root of the target lake tables (templated).
    :param tables: optional ``schema.table`` names restricting the run (templated).
    :param spark_conn_id: the Spark connection (``spark://local%5B%2A%5D`` for local mode) (templated).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "manifest",
        "target",
        "tables",
        "spark_conn_id",
    )

    def __init__(
        self,
        *,
        manifest: str,
        target: str,
        tables: Sequence[str] | None = None,
        spark_conn_id: str = "spark_default",
        name: str = "pglogical-apply",
        **kwargs: Any,
    ) -> None:
        super().__init__(application=APPLY_JOB_PATH, conn_id=spark_conn_id, name=name, **kwargs)
        self.manifest = manifest
        self.target = target
        self.tables = tables
        self.spark_conn_id = spark_conn_id

    def execute(self, context: Context) -> None:
        manifest = read_manifest(self.manifest)
        if not manifest.tables:
            # An empty batch changes no table: nothing to submit, and the ack needs no ledger row.
            self.log.info("batch %s holds no changes; nothing to apply", manifest.batch_id)
            return
        self._conn_id = self.spark_conn_id  # templated: may come from DAG params
        args = ["--manifest", str(self.manifest), "--target", str(self.target)]
        if self.tables:
            args += ["--tables", ",".join(self.tables)]
        self.application_args = args
        super().execute(context)
