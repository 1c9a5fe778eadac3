"""``PostgresCdcDrainOperator``: stage one bounded micro-batch of a slot's changes as Parquet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_postgres_cdc import metrics
from airflow_provider_postgres_cdc.engine.choices import TRANSPORTS, Transport
from airflow_provider_postgres_cdc.formats.column_transforms import parse_column_transforms
from airflow_provider_postgres_cdc.hooks.hash_key import column_transformer
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.hooks.staging import staging_options
from airflow_provider_postgres_cdc.operators.arguments import check_choice, check_staging, is_template


class PostgresCdcDrainOperator(BaseOperator):
    """Read a slot from its confirmed position up to a bound fixed at start, decode, stage; never move it.

    Returns (XCom) a small JSON summary: ``manifest`` (URI of the batch's ``_manifest.json``),
    the LSN window, per-table counts and whether a retry reused an earlier complete attempt.

    :param slot_name: replication slot name (templated).
    :param publications: publication name(s) the slot is read with (templated).
    :param staging: staging root: local path, ``file://``, ``s3://``, ``gs://`` or ``hdfs://`` (templated).
    :param postgres_conn_id: Airflow connection of the source database (templated).
    :param transport: ``"peek"`` (SQL interface, default, fastest for batches) or ``"stream"`` (templated).
    :param max_messages: end the batch at the first commit after this many messages (templated).
    :param max_bytes: bound the WAL window read to this many bytes (templated).
    :param max_memory_bytes: the drain's memory budget, whatever the transaction sizes; larger
        undecided transactions spill to ``spill_dir``; ``None``: the engine's default (templated).
    :param spill_dir: local directory for spill files (default ``$TMPDIR``) (templated).
    :param staging_conn_id: an ``aws`` connection with the ``s3://`` staging store's endpoint and
        credentials (:class:`PostgresCdcStagingHook`); ``None``: pyarrow's environment chain (templated).
    :param lake_conn_id: the lake's ``postgres_cdc_lake`` connection: every published table's lake
        names are checked against its name rule before anything is staged (docs/LAKE.md, "Names");
        ``None`` checks nothing (templated).
    :param column_transforms: ``{"public.customers": {"email": "hash", "ssn": "drop"}}``: columns
        hashed (HMAC-SHA256 of their text form, hex) or dropped before anything of them is staged
        (docs/LAKE.md, "Column transforms"); a JSON text of it too (templated).
    :param hash_key_conn_id: the connection whose password is the hash key
        (:class:`PostgresCdcHashKeyHook`; default ``postgres_cdc_hash_key``) (templated).
    :param spark_conn_id: the Spark connection of the apply that follows: when it is a
        ``spark_connect`` one, its server is checked before anything is drained (it answers and takes
        the token; Spark 4 with Iceberg 1.11 or later and Iceberg's SQL extensions; it can read
        ``staging``: docs/LAKE.md, "Spark Connect"); ``None`` or another type checks nothing. Needs
        the ``spark`` extra (templated).
    :param connect_python: the Spark Connect client's Python that check runs, as the apply's
        ``connect_python`` (templated).
    """

    template_fields: Sequence[str] = (
        "postgres_conn_id",
        "slot_name",
        "publications",
        "staging",
        "transport",
        "max_messages",
        "max_bytes",
        "max_memory_bytes",
        "spill_dir",
        "staging_conn_id",
        "lake_conn_id",
        "column_transforms",
        "hash_key_conn_id",
        "spark_conn_id",
        "connect_python",
    )
    ui_color = "#c6e2ff"

    def __init__(
        self,
        *,
        slot_name: str,
        publications: str | Sequence[str],
        staging: str,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        transport: Transport = "peek",
        max_messages: int | None = 1_000_000,
        max_bytes: int | None = None,
        max_memory_bytes: int | None = None,
        spill_dir: str | None = None,
        staging_conn_id: str | None = None,
        lake_conn_id: str | None = None,
        column_transforms: Mapping[str, Mapping[str, str]] | str | None = None,
        hash_key_conn_id: str | None = None,
        spark_conn_id: str | None = None,
        connect_python: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not is_template(column_transforms):
            parse_column_transforms(column_transforms)  # a malformed option fails the DAG's import
        check_staging(staging)
        check_choice("transport", transport, TRANSPORTS)
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.publications = publications
        self.staging = staging
        self.postgres_conn_id = postgres_conn_id
        self.transport = transport
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_memory_bytes = max_memory_bytes
        self.spill_dir = spill_dir
        self.staging_conn_id = staging_conn_id
        self.lake_conn_id = lake_conn_id
        self.column_transforms = column_transforms
        self.hash_key_conn_id = hash_key_conn_id
        self.spark_conn_id = spark_conn_id
        self.connect_python = connect_python

    def execute(self, context: Context) -> dict[str, Any]:
        # The engine (pyarrow) loads when the task runs, not when its DAG is parsed.
        from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
        from airflow_provider_postgres_cdc.engine.sequencing import DEFAULT_MAX_MEMORY_BYTES

        check_staging(self.staging)
        check_choice("transport", self.transport, TRANSPORTS)
        if self.spark_conn_id:
            # The Spark provider is imported only now: the drain alone does not need the `spark` extra.
            from airflow_provider_postgres_cdc.operators.lake_job import check_spark_connect

            found = check_spark_connect(
                self.spark_conn_id, lake_conn_id=self.lake_conn_id, staging=self.staging,
                python=self.connect_python or None,
            )  # fmt: skip
            if found:
                self.log.info("%s", found)
        publications = [self.publications] if isinstance(self.publications, str) else list(self.publications)
        settings = DrainSettings(
            slot=self.slot_name,
            publications=tuple(publications),
            staging=self.staging,
            transport=self.transport,
            max_messages=None if self.max_messages is None else int(self.max_messages),
            max_bytes=None if self.max_bytes is None else int(self.max_bytes),
            max_memory_bytes=int(self.max_memory_bytes or DEFAULT_MAX_MEMORY_BYTES),
            spill_dir=self.spill_dir or None,
            staging_options=staging_options(self.staging_conn_id),
            lake=PostgresCdcLakeHook(self.lake_conn_id).get_conn() if self.lake_conn_id else None,
            transforms=column_transformer(self.column_transforms, self.hash_key_conn_id),
        )
        result = drain_batch(self._get_hook().connection_params(), settings)
        if not result.reused:  # a retry that found its batch staged drained nothing now
            metrics.gauge(metrics.BATCH_CHANGES, result.manifest.stats.changes, slot=self.slot_name)
            metrics.timing(metrics.DRAIN_SECONDS, result.manifest.stats.seconds, slot=self.slot_name)
        return result.summary()

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): nothing before the batch is staged; its COMPLETE event says it all."""
        from airflow_provider_postgres_cdc.lineage.tasks import nothing_yet

        return nothing_yet()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source tables drained, and the batch's LSN window (lineage/tasks.py)."""
        from airflow_provider_postgres_cdc.lineage.tasks import staged_lineage

        return staged_lineage(self, task_instance)
