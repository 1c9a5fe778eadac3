"""``PostgresCdcSnapshotOperator``: a consistent copy of published tables (initial, re-snapshot, recovery)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_postgres_cdc.engine.choices import COPY_ENGINES, SLOT_MODES, CopyEngine, SlotMode
from airflow_provider_postgres_cdc.errors import SlotExistsError
from airflow_provider_postgres_cdc.formats.column_transforms import check_copy_engine, parse_column_transforms
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.hooks.hash_key import column_transformer
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.hooks.staging import staging_options, staging_spark_conf
from airflow_provider_postgres_cdc.operators.arguments import check_choice, check_staging, is_template
from airflow_provider_postgres_cdc.spark import job_py_files, local_jars

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.snapshot import SnapshotRun, TableCopy


class PostgresCdcSnapshotOperator(BaseOperator):
    """Create a replication slot with an exported snapshot and stage a consistent copy of its tables.

    The slot's replication connection stays open and idle for the whole copy (the snapshot
    lives only as long as it does); the copy shows the database exactly at the slot's
    consistent point, so the first drain continues where it ends. Tables are read with the
    publications' column lists and row filters, as PostgreSQL's own initial sync does, into
    ``<staging>/<slot>/snapshot-<lsn>/<schema>.<table>/part-*.parquet`` and ``_manifest.json``.

    ``copy_engine="local"`` copies in this worker with ``parallelism`` connections, splitting
    large tables into ctid ranges. ``copy_engine="spark"`` submits ``spark/snapshot_jdbc.py``
    through the Spark provider's ``SparkSubmitHook``: every JDBC partition imports the same
    snapshot; the package modules the job imports go with it as ``--py-files``, so the job's Python
    needs pyspark alone. Both stage the same data and the same manifest.

    ``slot_mode="temporary"`` re-snapshots tables of a running pipeline: a temporary slot exports
    the snapshot and ``slot_name`` (the pipeline's slot) is untouched; the apply job then skips
    each table's changes below the new consistent point. ``slot_mode="recover"`` recreates a slot
    whose WAL was lost (or that was dropped) and copies every table again.

    On failure the slot this run created and its staged files are removed, so a retry starts
    clean. A re-run of an initial or recovery snapshot whose slot exists (a cleared or retried
    past run, or one whose worker was killed) converges wherever the last run died
    (``engine/snapshot/rerun.py``): while the slot has not moved past the snapshot it exported,
    that staged snapshot is returned again, so its load resumes (a table already loaded is
    skipped); once the pipeline has moved on, the task is skipped; a slot with no staged snapshot
    from which no lake table holds changes (the copy died) is dropped and the snapshot taken
    again. Only where lake tables hold changes from the slot and no snapshot of it is staged is
    the re-run refused, naming the backfill. ``recreate_slot`` instead drops the slot and starts
    over. Returns (XCom) the manifest's URI and a small summary.

    :param slot_name: replication slot to create. (templated)
    :param publications: publication name or names whose tables are copied. (templated)
    :param staging: staging root: a local path or ``file://``, ``s3://``, ``gs://``, ``hdfs://`` URI.
        (templated)
    :param tables: subset of the published tables (``schema.table``, or objects with a ``table``
        key as :class:`PostgresCdcPublishTablesOperator` takes them); all when empty. (templated)
    :param postgres_conn_id: Airflow connection of the source database. (templated)
    :param copy_engine: ``"local"`` (default) or ``"spark"``. (templated)
    :param parallelism: local engine: worker connections (tables and ranges copied at once);
        Spark engine: ranges per large table are sized from it too.
    :param slot_mode: ``"create"`` (initial snapshot), ``"temporary"`` (re-snapshot of a running
        pipeline) or ``"recover"`` (recreate a lost slot and copy every table). (templated)
    :param recreate_slot: ``"create"`` only: drop an existing slot of that name first; its
        unconsumed changes are lost.
    :param max_file_bytes: local engine: size at which a Parquet part file is closed.
    :param max_memory_bytes: local engine: the memory budget shared with the drain; a single row
        larger than a quarter of it stops the copy with a message naming this setting.
    :param range_bytes: largest ctid range of a table, in bytes of heap.
    :param min_range_bytes: smallest ctid range: tables smaller than this are read whole. These
        five sizes (from ``parallelism`` on) left at ``None`` take the engine's defaults.
    :param spark_conn_id: Spark connection for ``copy_engine="spark"`` (``spark://local%5B2%5D``
        for local mode: an unencoded ``local[*]`` silently becomes yarn). (templated)
    :param spark_binary: ``spark-submit`` to run; default: the connection's, or PATH's, or the one
        next to this Python when PATH has none.
    :param spark_jars: jars for the job (comma-separated paths or URLs).
    :param spark_packages: Maven coordinates for the job. With neither ``spark_jars`` nor
        ``spark_packages``, the jars of ``POSTGRES_CDC_SPARK_JARS`` when it is set, else
        PostgreSQL's official JDBC driver from Maven Central (``org.postgresql:postgresql:42.7.8``,
        ``engine.snapshot.spark_engine.POSTGRESQL_JDBC_PACKAGE``; Spark caches it in its Ivy cache).
    :param spark_conf: extra Spark configuration for the job.
    :param progress_interval: seconds between progress log lines.
    :param staging_conn_id: an ``aws`` connection with the ``s3://`` staging store's endpoint and
        credentials (:class:`PostgresCdcStagingHook`); ``None``: pyarrow's environment chain (templated).
        The local engine writes with it; the Spark engine's executors write through Hadoop's
        ``s3a`` with its endpoint and keys (the secret in the job's private properties file).
    :param lake_conn_id: the lake's connection: every published table's lake names are checked
        against its name rule before a slot is created (docs/LAKE.md, "Names"), and a re-run whose
        slot exists asks it whether anything was loaded from the slot; ``None`` checks nothing, and
        such a re-run is refused unless a snapshot of the slot is staged (templated).
    :param column_transforms: ``{"public.customers": {"email": "hash", "ssn": "drop"}}``: columns
        hashed (HMAC-SHA256 of their text form, hex) or dropped before anything of them is staged
        (docs/LAKE.md, "Column transforms"; the local engine only); a JSON text of it too (templated).
    :param hash_key_conn_id: the connection whose password is the hash key
        (:class:`PostgresCdcHashKeyHook`; default ``postgres_cdc_hash_key``) (templated).
    """

    template_fields: Sequence[str] = (
        "slot_name",
        "publications",
        "staging",
        "tables",
        "postgres_conn_id",
        "copy_engine",
        "slot_mode",
        "spark_conn_id",
        "staging_conn_id",
        "lake_conn_id",
        "column_transforms",
        "hash_key_conn_id",
    )

    def __init__(
        self,
        *,
        slot_name: str,
        publications: str | Sequence[str],
        staging: str,
        tables: Sequence[str | Mapping[str, Any]] | None = None,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        copy_engine: CopyEngine = "local",
        parallelism: int | None = None,
        slot_mode: SlotMode = "create",
        recreate_slot: bool = False,
        max_file_bytes: int | None = None,
        max_memory_bytes: int | None = None,
        range_bytes: int | None = None,
        min_range_bytes: int | None = None,
        spark_conn_id: str = "spark_default",
        spark_binary: str | None = None,
        spark_jars: str | None = None,
        spark_packages: str | None = None,
        spark_conf: dict[str, Any] | None = None,
        progress_interval: float = 5.0,
        staging_conn_id: str | None = None,
        lake_conn_id: str | None = None,
        column_transforms: Mapping[str, Mapping[str, str]] | str | None = None,
        hash_key_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not is_template(column_transforms) and not is_template(copy_engine):
            # A malformed option, or hashing in the Spark engine, fails the DAG's import.
            check_copy_engine(parse_column_transforms(column_transforms), copy_engine)
        check_staging(staging)
        check_choice("copy_engine", copy_engine, COPY_ENGINES)
        check_choice("slot_mode", slot_mode, SLOT_MODES)
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.publications = publications
        self.staging = staging
        self.tables = tables
        self.postgres_conn_id = postgres_conn_id
        self.copy_engine = copy_engine
        self.parallelism = parallelism
        self.slot_mode = slot_mode
        self.recreate_slot = recreate_slot
        self.max_file_bytes = max_file_bytes
        self.max_memory_bytes = max_memory_bytes
        self.range_bytes = range_bytes
        self.min_range_bytes = min_range_bytes
        self.spark_conn_id = spark_conn_id
        self.spark_binary = spark_binary
        self.spark_jars = spark_jars
        self.spark_packages = spark_packages
        self.spark_conf = spark_conf
        self.progress_interval = progress_interval
        self.staging_conn_id = staging_conn_id
        self.lake_conn_id = lake_conn_id
        self.column_transforms = column_transforms
        self.hash_key_conn_id = hash_key_conn_id
        self._spark_hook: Any = None

    def execute(self, context: Context) -> dict[str, Any]:
        check_staging(self.staging)
        check_choice("copy_engine", self.copy_engine, COPY_ENGINES)
        check_choice("slot_mode", self.slot_mode, SLOT_MODES)
        check_copy_engine(parse_column_transforms(self.column_transforms), self.copy_engine)
        publications = [self.publications] if isinstance(self.publications, str) else list(self.publications)
        params = self._get_hook().connection_params()
        try:
            return self._snapshot(params, publications)
        except SlotExistsError as exc:
            if self.slot_mode == "temporary" or self.recreate_slot:
                raise
            return self._rerun(params, publications, exc)

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    def _rerun(self, params: dict[str, Any], publications: list[str], exc: SlotExistsError) -> dict[str, Any]:
        """The slot exists: resume its staged snapshot's load, skip, or start over (see class doc)."""
        from airflow_provider_postgres_cdc.engine.snapshot import rerun_snapshot

        rerun = rerun_snapshot(
            params,
            self.slot_name,
            self.staging,
            exc,
            lake=self._lake(),
            staging_options=staging_options(self.staging_conn_id),
            every_table=not self.tables,
        )
        if rerun.action == "skip":
            raise AirflowSkipException(rerun.reason)
        self.log.warning("%s", rerun.reason)
        if rerun.staged is not None:
            return summarize(*rerun.staged)
        return self._snapshot(params, publications)

    def _lake(self) -> LakeConfig | None:
        return PostgresCdcLakeHook(self.lake_conn_id).get_conn() if self.lake_conn_id else None

    def _snapshot(self, params: dict[str, Any], publications: list[str]) -> dict[str, Any]:
        # The engine (pyarrow) loads when the task runs, not when its DAG is parsed.
        from airflow_provider_postgres_cdc.engine.sequencing import DEFAULT_MAX_MEMORY_BYTES
        from airflow_provider_postgres_cdc.engine.snapshot import (
            DEFAULT_MIN_RANGE_BYTES,
            DEFAULT_PARALLELISM,
            DEFAULT_RANGE_BYTES,
            SnapshotRun,
        )
        from airflow_provider_postgres_cdc.engine.staging import DEFAULT_MAX_FILE_BYTES

        with SnapshotRun(
            params,
            self.slot_name,
            publications,
            self.staging,
            tables=[t if isinstance(t, str) else t["table"] for t in self.tables or ()] or None,
            slot_mode=self.slot_mode,
            recreate_slot=self.recreate_slot,
            progress_interval=self.progress_interval,
            staging_options=staging_options(self.staging_conn_id),
            parallelism=self.parallelism or DEFAULT_PARALLELISM,
            range_bytes=self.range_bytes or DEFAULT_RANGE_BYTES,
            min_range_bytes=self.min_range_bytes or DEFAULT_MIN_RANGE_BYTES,
            lake=self._lake(),
            transforms=column_transformer(self.column_transforms, self.hash_key_conn_id),
        ) as run:
            if self.copy_engine == "spark":
                copies = self._copy_with_spark(run, params)
            else:
                copies = run.copy_local(
                    max_file_bytes=self.max_file_bytes or DEFAULT_MAX_FILE_BYTES,
                    max_memory_bytes=self.max_memory_bytes or DEFAULT_MAX_MEMORY_BYTES,
                )
            path, manifest = run.finish(copies)
            uri = run.location.uri_of(path)
        return summarize(uri, manifest)

    def _copy_with_spark(self, run: SnapshotRun, params: dict[str, Any]) -> list[TableCopy]:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_provider_postgres_cdc.engine.snapshot import (
            SPARK_JOB_PATH,
            SPARK_PASSWORD_ENV,
            jdbc_connection,
        )
        from airflow_provider_postgres_cdc.engine.spark_conf import (
            DRIVER_LOG_CONF,
            submit_settings,
            with_defaults,
        )

        url, properties, password = jdbc_connection(params)
        spec = run.spark_job_spec(url, properties)
        jars, packages = spark_jars_and_packages(self.spark_jars, self.spark_packages)
        with tempfile.TemporaryDirectory(prefix="postgres-cdc-snapshot-") as scratch:
            spec_path = os.path.join(scratch, "snapshot_job.json")
            with open(spec_path, "w", encoding="utf-8") as handle:
                json.dump(spec, handle)
            staging = staging_spark_conf(self.staging_conn_id, str(self.staging))
            settings = with_defaults({**staging, **(self.spark_conf or {})}, DRIVER_LOG_CONF, None)
            conf, properties_file = submit_settings(settings, scratch)
            self._spark_hook = hook = SparkSubmitHook(
                conn_id=self.spark_conn_id,
                name=f"postgres-cdc-snapshot-{run.slot}",
                application_args=["--spec", spec_path],
                files=spec_path,
                py_files=job_py_files(scratch),
                jars=jars,
                packages=packages,
                conf=conf,
                properties_file=properties_file,
                env_vars={SPARK_PASSWORD_ENV: password} if password else None,
                spark_binary=self.spark_binary or _default_spark_submit(),
            )
            hook.submit(application=SPARK_JOB_PATH)
        return run.collect_staged()

    def on_kill(self) -> None:
        """Stop a running Spark copy; the slot and staged files are removed as the run unwinds."""
        if self._spark_hook is not None:
            self._spark_hook.on_kill()

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): nothing before the copy is staged; its COMPLETE event says it all."""
        from airflow_provider_postgres_cdc.lineage.tasks import nothing_yet

        return nothing_yet()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source tables copied, and the batch's LSN window (lineage/tasks.py)."""
        from airflow_provider_postgres_cdc.lineage.tasks import staged_lineage

        return staged_lineage(self, task_instance)


def spark_jars_and_packages(jars: str | None, packages: str | None) -> tuple[str | None, str | None]:
    """The Spark copy's ``--jars`` and ``--packages``: those given, else the jars of
    ``POSTGRES_CDC_SPARK_JARS``, else PostgreSQL's JDBC driver from Maven (any OS, any cluster)."""
    from airflow_provider_postgres_cdc.engine.snapshot.spark_engine import POSTGRESQL_JDBC_PACKAGE

    if jars or packages:
        return jars or None, packages or None
    return (local_jars(), None) if local_jars() else (None, POSTGRESQL_JDBC_PACKAGE)


def _default_spark_submit() -> str | None:
    """None (the connection's ``spark-binary`` or PATH decides) unless PATH lacks ``spark-submit``:
    then the one pyspark installed next to this Python, as in a virtualenv that is not activated."""
    if shutil.which("spark-submit"):
        return None
    beside = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    return beside if os.path.exists(beside) else None


def summarize(manifest_uri: str, manifest: Manifest) -> dict[str, Any]:
    """The XCom value: where the manifest is and what it holds, small enough for any XCom backend."""
    return {
        "manifest": manifest_uri,
        "slot": manifest.slot,
        "batch_id": manifest.batch_id,
        "consistent_point": str(manifest.end_lsn),
        "snapshot_name": manifest.snapshot_name,
        "tables": len(manifest.tables),
        "rows": manifest.total_rows,
        "bytes": manifest.stats.bytes,
        "seconds": manifest.stats.seconds,
        "tables_without_key": [t.qualified for t in manifest.tables if not t.key_columns],
    }
