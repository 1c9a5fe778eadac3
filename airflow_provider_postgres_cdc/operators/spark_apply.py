"""``PostgresCdcSparkApplyOperator``: submit the package's PySpark apply job for a staged manifest.

Needs the ``spark`` extra (``pip install 'airflow-provider-postgres-cdc[spark]'``): the Spark provider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_provider_postgres_cdc import metrics
from airflow_provider_postgres_cdc.assets import TABLES_ALIAS, alias, table_asset
from airflow_provider_postgres_cdc.errors import LakeCatalogError
from airflow_provider_postgres_cdc.formats import deletes as deletes_option
from airflow_provider_postgres_cdc.formats import history as history_option
from airflow_provider_postgres_cdc.formats.lake import WRITE_MODES, LakeConfig, WriteMode
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.formats.partitioning import check_manifest, option_text, parse_partition_by
from airflow_provider_postgres_cdc.hooks.staging import staging_options, staging_spark_conf
from airflow_provider_postgres_cdc.operators.arguments import (
    check_choice,
    check_positive,
    is_template,
    rendered_positive,
)
from airflow_provider_postgres_cdc.operators.lake_job import LakeSparkJobOperator
from airflow_provider_postgres_cdc.spark import APPLY_JOB_PATH, TABLE_PARALLELISM


class PostgresCdcSparkApplyOperator(LakeSparkJobOperator):
    """Apply a snapshot or change batch to the Iceberg lake: ``spark-submit``, or on a Spark Connect server.

    See :class:`LakeSparkJobOperator` for the Spark and lake settings. The job is idempotent: a
    table that already holds the batch is skipped, and a re-run after a crash converges.

    :param manifest: URI or path of the ``_manifest.json`` to apply (templated).
    :param lake_conn_id: the lake's ``postgres_cdc_lake`` connection (templated).
    :param tables: optional ``schema.table`` names restricting the run (templated).
    :param write_mode: row-level write mode of tables the job creates: ``merge-on-read`` (default:
        docs/LAKE.md says why) or ``copy-on-write`` (templated).
    :param spark_conn_id: the Spark connection (``spark://local%5B2%5D`` for local mode), or a
        ``spark_connect`` one: the job then runs on that Spark Connect server, as a client started
        with ``connect_python`` (:class:`LakeSparkJobOperator`; docs/LAKE.md, "Spark Connect") (templated).
    :param connect_python: the Spark Connect client's Python (templated).
    :param staging_conn_id: the ``aws`` connection of an ``s3://`` staging store: the manifest is read
        here with it, and the job's executors read the staged files with its endpoint and keys through
        ``s3a`` (the secret in the job's private properties file); ``None``: the worker's and the
        cluster's own S3 settings (templated).
    :param table_parallelism: how many tables the job applies at once (default 4), each in a pool
        of Spark's FAIR scheduler so a large table does not hold up the small ones; 1 applies them
        one after another (templated).
    :param partition_by: the Iceberg partition spec of lake tables, by source table:
        ``{"public.orders": ["days(placed_at)", "bucket(16, customer_id)"]}`` (or that as JSON
        text). A table gets its spec when created and moves to a changed one; a table not named
        keeps its own; ``[]`` makes one unpartitioned (docs/LAKE.md "Partitioned tables"). Checked
        when the DAG is parsed, and against the batch's columns before the job is submitted (templated).
    :param deletes: ``"soft"`` keeps deleted rows in the lake tables, marked with the deleting
        commit's time and LSN (``_pgl_deleted_at``, ``_pgl_deleted_lsn``); ``"hard"`` (what a new
        table gets by default) removes them; ``{"public.orders": "soft"}`` names tables, and a table
        it does not name keeps its mode. Only a load may switch a table's mode (docs/LAKE.md "Soft
        deletes"); tables without a key cannot be soft (templated).
    :param history: ``"scd2"`` keeps every version of the rows of lake tables in a history table
        beside each (``<table>__pgl_history``: the validity of each version as commit LSNs and
        times, and what ended it); ``"none"`` (the default of a new table) keeps none;
        ``{"public.orders": "scd2"}`` names tables, and a table it does not name keeps its mode.
        Only a load may switch it (docs/LAKE.md "History tables"); tables without a key cannot
        keep history (templated).
    :param asset_alias: the :class:`~airflow.sdk.AssetAlias` (added to ``outlets``) through which
        one Asset event per lake table written is emitted, carrying the batch, its LSN window, the
        cut tag, the Iceberg snapshot id and the rows inserted, updated and deleted (README "Assets").
    """

    template_fields: Sequence[str] = (
        *LakeSparkJobOperator.template_fields,
        "manifest",
        "tables",
        "write_mode",
        "staging_conn_id",
        "table_parallelism",
        "partition_by",
        "deletes",
        "history",
    )

    def __init__(
        self,
        *,
        manifest: str,
        tables: Sequence[str] | None = None,
        write_mode: WriteMode = "merge-on-read",
        name: str = "postgres-cdc-apply",
        staging_conn_id: str | None = None,
        asset_alias: str = TABLES_ALIAS,
        table_parallelism: int | str = TABLE_PARALLELISM,
        partition_by: Mapping[str, Sequence[str]] | str | None = None,
        deletes: Mapping[str, str] | str | None = None,
        history: Mapping[str, str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        check_choice("write_mode", write_mode, WRITE_MODES)
        check_positive("table_parallelism", table_parallelism)
        if not is_template(partition_by):
            parse_partition_by(partition_by)  # a typo fails the DAG file's import
        if not is_template(deletes):
            deletes_option.parse_deletes(deletes)
        if not is_template(history):
            history_option.HISTORY.parse(history)
        # Which tables a batch writes is known only once it is drained: the events go through an alias.
        kwargs["outlets"] = [*(kwargs.get("outlets") or ()), alias(asset_alias)]
        super().__init__(application=APPLY_JOB_PATH, name=name, **kwargs)
        self.manifest = manifest
        self.tables = tables
        self.write_mode = write_mode
        self.staging_conn_id = staging_conn_id
        self.asset_alias = asset_alias
        self.table_parallelism = table_parallelism
        self.partition_by = partition_by
        self.deletes = deletes
        self.history = history
        self._manifest: Manifest | None = None  # read when the task runs
        self._job_options: list[str] = []  # the rendered options, checked, as the job takes them

    def job_arguments(self, lake: LakeConfig) -> list[str]:
        args = ["--manifest", str(self.manifest), "--write-mode", self.write_mode]
        args += ["--table-parallelism", str(self.table_parallelism)]
        args += self._job_options
        return args + (["--tables", ",".join(self.tables)] if self.tables else [])

    def staging_conf(self) -> dict[str, str]:
        return staging_spark_conf(self.staging_conn_id, str(self.manifest))

    def job_conf(self) -> dict[str, str]:
        return {"spark.scheduler.mode": "FAIR"}  # the tables' scheduler pools share the executors

    def driver_defaults(self) -> dict[str, str]:
        from airflow_provider_postgres_cdc.engine.spark_conf import SHORT_DRIVER_CONF

        short = self._manifest is not None and self._manifest.short_job
        return {**super().driver_defaults(), **(SHORT_DRIVER_CONF if short else {})}

    def execute(self, context: Context) -> None:
        from airflow_provider_postgres_cdc.engine.staging import read_manifest  # loads pyarrow: at run time

        check_choice("write_mode", self.write_mode, WRITE_MODES)
        self.table_parallelism = rendered_positive("table_parallelism", self.table_parallelism)
        partitions, deletes = (
            parse_partition_by(self.partition_by),
            deletes_option.parse_deletes(self.deletes),
        )
        self._manifest = manifest = read_manifest(self.manifest, staging_options(self.staging_conn_id))
        if not manifest.tables:
            # An empty batch changes no table: nothing to submit, and the ack needs no commit.
            self.log.info("batch %s holds no changes; nothing to apply", manifest.batch_id)
            return
        check_manifest(manifest, partitions)  # before the job is submitted: nothing is committed
        deletes_option.check_manifest(manifest, deletes)
        history = history_option.HISTORY.parse(self.history)
        history_option.HISTORY.check_manifest(manifest, history)
        self._job_options = ["--partition-by", option_text(partitions)] if partitions else []
        self._job_options += ["--deletes", deletes_option.option_text(deletes)] if deletes else []
        self._job_options += ["--history", history_option.option_text(history)] if history else []
        super().execute(context)
        self._emit_table_events(context, manifest)

    def _emit_table_events(self, context: Context, manifest: Manifest) -> None:
        """One Asset event per lake table holding a commit of this batch (also after a re-run that
        found them applied: events count only once a task succeeds), and its apply time as a metric."""
        from airflow_provider_postgres_cdc.engine.lake_events import batch_writes, table_event_extra

        lake = self._get_lake_hook().get_conn()
        try:
            writes = batch_writes(lake, manifest)
        except LakeCatalogError as exc:  # a Spark-only catalog: the lake holds the batch all the same
            self.log.warning("no Asset events for batch %s: %s", manifest.batch_id, exc)
            return
        events = context["outlet_events"][alias(self.asset_alias)]
        for write in writes:
            events.add(table_asset(lake, write.schema, write.table), extra=table_event_extra(manifest, write))
            if write.apply_seconds is not None:
                qualified = f"{write.schema}.{write.table}"
                metrics.timing(
                    metrics.APPLY_SECONDS, write.apply_seconds, slot=manifest.slot, table=qualified
                )
        self.log.info("batch %s: Asset events for %d lake table(s)", manifest.batch_id, len(writes))

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): the lake tables the batch writes and its LSN window (lineage/tasks.py)."""
        from airflow_provider_postgres_cdc.lineage.tasks import apply_lineage

        return apply_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: source tables in, lake tables out, with column lineage and rows written."""
        from airflow_provider_postgres_cdc.lineage.tasks import apply_lineage

        return apply_lineage(self, task_instance)
