"""Iceberg tables through Spark SQL: every commit the jobs make, in one place.

Modules elsewhere compute *what* to write (a ``MERGE`` statement, a partition spec, the marks'
columns); this one writes it. Everything goes through Spark SQL and ``DataFrameWriterV2`` alone
(reads through ``spark/lake_table.py``), so the jobs run the same as a spark-submit driver and
as a Spark Connect client. A commit's summary keys (docs/LAKE.md) reach Iceberg one of two ways,
chosen once per job by the catalog's Iceberg runtime (:func:`summary_writer`): from the session's
``spark.sql.iceberg.snapshot-property.<key>`` settings (Iceberg 1.11 and later), or through
Iceberg's ``CommitMetadata`` in the driver's JVM (earlier runtimes: Spark 3.5's, spark-submit only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import StringType, StructField, StructType

from airflow_provider_postgres_cdc.errors import (
    ApplyError,
    CatalogError,
)
from airflow_provider_postgres_cdc.formats import lake, lake_index
from airflow_provider_postgres_cdc.formats.column_transforms import TRANSFORMS_PROPERTY
from airflow_provider_postgres_cdc.formats.deletes import DELETES_PROPERTY, DeleteMode
from airflow_provider_postgres_cdc.formats.history import HISTORY_PROPERTY, HistoryMode
from airflow_provider_postgres_cdc.formats.lake import WRITE_MODES, LakeConfig, TableState
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.partitioning import PARTITION_PROPERTY, PartitionField, spec_text
from airflow_provider_postgres_cdc.spark import TABLE_PARALLELISM
from airflow_provider_postgres_cdc.spark.commit_summaries import SummaryWriter, summary_writer
from airflow_provider_postgres_cdc.spark.lake_failures import root_cause
from airflow_provider_postgres_cdc.spark.lake_table import LakeTable, is_missing, read_table
from airflow_provider_postgres_cdc.spark.partitioning import (
    SOURCES_PROPERTY,
    partition_clause,
    sources_text,
)
from airflow_provider_postgres_cdc.spark.runtime import (
    SPARK_ERRORS,
)
from airflow_provider_postgres_cdc.spark.sql_text import literal, quote, temp_view
from airflow_provider_postgres_cdc.spark.table_changes import TableChanges

__all__ = ["IcebergTables", "is_conflict", "literal", "quote", "summary_writer", "temp_view"]

log = logging.getLogger("postgres_cdc.apply")

TARGET_FILE_BYTES = 64 << 20
MERGE_BRANCH = "pgl_merge"
SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
# Exceptions of a commit that lost to another writer (or whose outcome is unknown): the table's
# state is read again and the work redone, which is safe because every step checks that state.
# Fast-forwarding main to the merge branch fails when main moved since the branch was opened.
_CONFLICTS = (
    "ValidationException",
    "CommitFailedException",
    "CommitStateUnknownException",
    "Cannot fast-forward: main is not an ancestor",
)


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Iceberg's optimistic-concurrency failure (redo the table) rather than a bug."""
    text = f"{type(exc).__name__}: {exc}"
    return any(name in text for name in _CONFLICTS)


class IcebergTables:
    """The lake's tables in one Spark session: names, state, schema, commits and tags."""

    def __init__(
        self,
        spark: SparkSession,
        config: LakeConfig,
        write_mode: str = "merge-on-read",
        summaries: SummaryWriter | None = None,
    ) -> None:
        if write_mode not in WRITE_MODES:
            raise ApplyError(f"write mode must be one of {WRITE_MODES}, not {write_mode!r}")
        self.spark = spark
        self.config = config
        self.write_mode = write_mode
        if summaries is None:
            self._check_catalog()
            summaries = summary_writer(spark, config.catalog)
        self.summaries = summaries

    def on(self, spark: SparkSession) -> IcebergTables:
        """The same lake in another session (a table's thread's own: ``spark/runtime.fork_session``)."""
        return IcebergTables(spark, self.config, self.write_mode, self.summaries)

    def _check_catalog(self) -> None:
        name = self.config.catalog
        if self.spark.conf.get(f"spark.sql.catalog.{name}", None) is None:
            raise CatalogError(
                f"Spark has no catalog {name!r}: pass the lake's catalog properties to spark-submit "
                f"(spark.sql.catalog.{name}=org.apache.iceberg.spark.SparkCatalog and its type, uri and "
                "warehouse; the apply operator adds them from its lake connection) and the Iceberg "
                "runtime jar"
            )
        try:  # any answer will do, "no such namespace" too: the catalog is reachable
            self.spark.sql(
                f"DESCRIBE NAMESPACE {quote(name)}.{quote(lake_index.index_namespace(self.config))}"
            )
        except SPARK_ERRORS as exc:
            if is_missing(exc):
                return
            cause = root_cause(str(exc)) or type(exc).__name__
            raise CatalogError(
                f"cannot reach Iceberg catalog {name!r} ({cause}): check its uri and credentials "
                "and that the Iceberg runtime jar (and a JDBC driver for a JDBC catalog) is on spark.jars; "
                "nothing was applied"
            ) from exc

    # ----------------------------------------------------------------------------------- names

    def name(self, identifier: tuple[str, str]) -> str:
        """``catalog.namespace.table`` quoted for Spark SQL."""
        return ".".join(quote(part) for part in (self.config.catalog, *identifier))

    def _procedure_table(self, identifier: tuple[str, str]) -> str:
        """The table as a stored procedure's ``table`` argument: ``'namespace.table'``, parts quoted."""
        return literal(".".join(quote(part) for part in identifier))

    def ensure_namespace(self, namespace: str) -> None:
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.config.catalog)}.{quote(namespace)}")

    # ----------------------------------------------------------------------------------- state

    def table(self, identifier: tuple[str, str]) -> LakeTable | None:
        """The table as it is now; None when it does not exist."""
        return read_table(self.spark, self.name(identifier))

    def state(self, table: LakeTable | None) -> TableState | None:
        return None if table is None else table.state

    def schema(self, identifier: tuple[str, str]) -> StructType:
        return self.spark.table(self.name(identifier)).schema

    # ---------------------------------------------------------------------------------- schema

    def table_properties(self, slot: str) -> dict[str, str]:
        """Properties of a new lake table: format v2, the write mode, the owning slot, file size.

        Files of at most 64 MB, written in key order by the load, keep each file's key range narrow,
        so a batch's MERGE reads only the files its key range overlaps (docs/LAKE.md).
        """
        properties = {
            "format-version": "2",
            lake.OWNER_PROPERTY: slot,
            "write.target-file-size-bytes": str(TARGET_FILE_BYTES),
        }
        for operation in ("merge", "update", "delete"):
            properties[f"write.{operation}.mode"] = self.write_mode
        return properties

    def evolve(self, identifier: tuple[str, str], incoming: Sequence[StructField]) -> None:
        """Add the batch's new columns and widen promoted ones (``TableChanges.evolve``)."""
        self._changes(identifier).evolve(incoming)

    def replace_column_types(
        self, identifier: tuple[str, str], incoming: Sequence[StructField], suffix: str
    ) -> list[str]:
        """For a load: drop (or rename) columns whose type cannot be promoted; returns their names."""
        return self._changes(identifier).replace_column_types(incoming, suffix)

    def retire_changelog_columns(self, changelog: tuple[str, str], names: Sequence[str], suffix: str) -> None:
        """Rename changelog columns whose type the source changed (``TableChanges.retire_columns``)."""
        if names and self.table(changelog) is not None:
            self._changes(changelog).retire_columns(names, suffix)

    def conform_spec(self, identifier: tuple[str, str], partition: Sequence[PartitionField] | None) -> None:
        """Move an existing table to the spec ``partition`` names (None: it keeps its spec)."""
        if partition is not None:
            self._changes(identifier).conform_spec(partition)

    def conform_recorded(
        self, identifier: tuple[str, str], mode: DeleteMode, transforms: str, history: HistoryMode
    ) -> None:
        """Switch a table a load rewrites to delete ``mode`` and record its transforms and history mode."""
        self._changes(identifier).conform_recorded(mode, transforms, history)

    def _changes(self, identifier: tuple[str, str]) -> TableChanges:
        return TableChanges(self.spark, self.name(identifier), lambda: self.table(identifier))

    # --------------------------------------------------------------------------------- commits

    def _commit_options(self, summary: Mapping[str, str]) -> dict[str, str]:
        return {f"snapshot-property.{key}": value for key, value in summary.items()}

    def create(
        self,
        identifier: tuple[str, str],
        rows: DataFrame,
        summary: Mapping[str, str],
        slot: str,
        partition: Sequence[PartitionField] | None = None,
        deletes: DeleteMode = "hard",
        transforms: str = "",
        history: HistoryMode = "none",
    ) -> None:
        """Create the table with its first rows in one commit (an atomic CREATE TABLE AS SELECT),
        under the partition spec ``partition`` names (``spark/partitioning.py``; None: unpartitioned),
        recording its delete mode (``spark/soft_deletes.py``), column transforms and history mode."""
        self.ensure_namespace(identifier[0])
        properties = {**self.table_properties(slot), DELETES_PROPERTY: deletes}
        properties.update({TRANSFORMS_PROPERTY: transforms} if transforms else {})
        properties.update({HISTORY_PROPERTY: history} if history != "none" else {})
        if partition is not None:
            properties[PARTITION_PROPERTY] = spec_text(partition)
            properties[SOURCES_PROPERTY] = sources_text(None, partition)
        if partition:  # Spark's DataFrame writer has no truncate transform: SQL has them all
            settings = ", ".join(f"{literal(key)} = {literal(value)}" for key, value in properties.items())
            self.summaries(
                self.spark,
                summary,
                f"CREATE TABLE {self.name(identifier)} USING iceberg {partition_clause(partition)} "
                f"TBLPROPERTIES ({settings}) AS SELECT * FROM {temp_view(rows)}",
            )
            return
        writer = rows.writeTo(self.name(identifier)).using("iceberg").options(**self._commit_options(summary))
        for key, value in properties.items():
            writer = writer.tableProperty(key, value)
        writer.create()

    def overwrite(
        self,
        identifier: tuple[str, str],
        rows: DataFrame,
        summary: Mapping[str, str],
        read_snapshot: int | None,
    ) -> None:
        """Replace every row in one commit that fails if anyone committed since ``read_snapshot``."""
        options = self._commit_options(summary)
        options["isolation-level"] = "serializable"
        if read_snapshot is not None:
            options["validate-from-snapshot-id"] = str(read_snapshot)
        rows.writeTo(self.name(identifier)).options(**options).overwrite(sf.lit(True))

    def append(self, identifier: tuple[str, str], rows: DataFrame, summary: Mapping[str, str]) -> None:
        """Append rows (the changelog), creating the table or adding new columns as needed."""
        # New columns land after the ``_pgl_*`` ones in the table: match by name, not position.
        options = {**self._commit_options(summary), "mergeSchema": "true", "check-ordering": "false"}
        if self.table(identifier) is None:
            self.ensure_namespace(identifier[0])
            rows.writeTo(self.name(identifier)).using("iceberg").tableProperty(
                "format-version", "2"
            ).tableProperty("write.spark.accept-any-schema", "true").options(**options).create()
        else:
            rows.writeTo(self.name(identifier)).options(**options).append()

    def drop(self, identifier: tuple[str, str]) -> None:
        """Drop the table (a history table rebuilt by a load)."""
        self.spark.sql(f"DROP TABLE IF EXISTS {self.name(identifier)}")

    def branch_name(self, identifier: tuple[str, str]) -> str:
        """The table's merge branch as Spark SQL names it (``<table>.branch_<name>``)."""
        return f"{self.name(identifier)}.{quote('branch_' + MERGE_BRANCH)}"

    def open_branch(self, identifier: tuple[str, str], snapshot_id: int) -> None:
        """Point the merge branch at ``snapshot_id``: the snapshot the batch's state was read from.

        A MERGE validates only against commits made after it planned; merging into this branch and
        fast-forwarding main to it (:meth:`publish_branch`) also refuses commits made since the
        state was read (a re-snapshot load in between would otherwise get the batch's old base LSN).
        A branch left by a crashed run is replaced.
        """
        branch, name = quote(MERGE_BRANCH), self.name(identifier)
        self.spark.sql(f"ALTER TABLE {name} CREATE OR REPLACE BRANCH {branch} AS OF VERSION {snapshot_id}")

    def publish_branch(self, identifier: tuple[str, str]) -> None:
        """Fast-forward main to the merge branch, then remove the branch.

        Fails (a conflict: :func:`is_conflict`) when main moved since the branch was opened.
        """
        catalog, table = quote(self.config.catalog), self._procedure_table(identifier)
        self.spark.sql(
            f"CALL {catalog}.system.fast_forward(table => {table}, branch => 'main', "
            f"to => {literal(MERGE_BRANCH)})"
        ).collect()
        self.spark.sql(f"ALTER TABLE {self.name(identifier)} DROP BRANCH IF EXISTS {quote(MERGE_BRANCH)}")

    def merge(self, sql: str, summary: Mapping[str, str]) -> None:
        """Run a ``MERGE INTO`` whose commit carries ``summary`` in its snapshot (none: no keys)."""
        if summary:
            self.summaries(self.spark, summary, sql)
        else:
            self.spark.sql(sql)

    def record_on(self, target: str, summary: Mapping[str, str]) -> None:
        """An empty commit on ``target`` (a table or its merge branch) carrying ``summary``: a batch
        with nothing to write still moves the state."""
        self.spark.table(target).limit(0).writeTo(target).options(**self._commit_options(summary)).append()

    def record(
        self, identifier: tuple[str, str], summary: Mapping[str, str], read_snapshot: int | None
    ) -> None:
        """:meth:`record_on` the table, failing like a MERGE (through the merge branch) when anyone
        committed since ``read_snapshot``, the snapshot the batch read its state from (a racing
        load would otherwise get this older view's base)."""
        if read_snapshot is None:
            self.record_on(self.name(identifier), summary)
            return
        self.open_branch(identifier, read_snapshot)
        self.record_on(self.branch_name(identifier), summary)
        self.publish_branch(identifier)

    def holds(self, identifier: tuple[str, str], end: Lsn, on_branch: bool) -> bool:
        """Whether main (or, ``on_branch``, the merge branch) has a pipeline commit applied to ``end``
        (a MERGE that changed no file makes no snapshot)."""
        table = self.table(identifier)
        if table is None:
            return False
        head = table.refs.get(MERGE_BRANCH) if on_branch else table.snapshot_id
        state = lake.state_of(table.history(head)) if head is not None else None
        return state is not None and state.applied_end_lsn >= end

    def procedure(self, procedure: str, identifier: tuple[str, str], **args: str) -> list[Row]:
        """``CALL <catalog>.system.<procedure>(table => ..., <args>)`` (maintenance's commits);
        returns its result rows."""
        named = "".join(f", {name} => {value}" for name, value in args.items())
        table = self._procedure_table(identifier)
        catalog = quote(self.config.catalog)
        return self.spark.sql(f"CALL {catalog}.system.{procedure}(table => {table}{named})").collect()

    def drop_tag(self, identifier: tuple[str, str], tag: str) -> None:
        self.spark.sql(f"ALTER TABLE {self.name(identifier)} DROP TAG IF EXISTS {quote(tag)}")

    # ----------------------------------------------------------------------------------- index

    def indexed(self, slot: str) -> list[tuple[str, str]]:
        """The tables ``slot``'s index names (``formats/lake_index.py``), read fresh: another job
        may have registered tables since this one started."""
        index = lake_index.index_identifier(self.config, slot)
        if self.table(index) is None:
            return []
        rows = self.spark.table(self.name(index)).select(*lake_index.COLUMNS).collect()
        return lake_index.indexed_tables((row[0], row[1]) for row in rows)

    def register(self, slot: str, identifiers: Sequence[tuple[str, str]]) -> int:
        """Add the tables ``slot``'s index lacks, in one append; returns how many were added.

        The job registers a run's tables before it creates or commits to any of them, so no table
        it writes is ever missing from the index (an entry whose table a crash kept from being
        created is skipped by readers). The index is created empty, then appended to: Iceberg
        appends never conflict, so jobs registering at once all land, each retrying its commit on
        the other's; creating it is idempotent (``IF NOT EXISTS``), so a job that loses that race
        goes on to append.
        """
        new = lake_index.unregistered(identifiers, self.indexed(slot)) if identifiers else []
        if not new:
            return 0
        index = lake_index.index_identifier(self.config, slot)
        if self.table(index) is None:
            self.ensure_namespace(index[0])
            columns = ", ".join(f"{quote(name)} STRING" for name in lake_index.COLUMNS)
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self.name(index)} ({columns}) USING iceberg "
                f"COMMENT {literal(lake_index.index_comment(slot))} TBLPROPERTIES ('format-version' = '2')"
            )
        schema = StructType([StructField(name, StringType(), True) for name in lake_index.COLUMNS])
        self.spark.createDataFrame(new, schema).writeTo(self.name(index)).append()
        return len(new)

    # ------------------------------------------------------------------------------------ tags

    def owned_tables(self, slot: str) -> list[tuple[str, str]]:
        """The data tables of ``slot``'s pipeline: those its index names that exist and carry the
        slot's table property (the index narrows, the property confirms). The catalog is never
        listed, so other tables in it cost nothing."""
        return [identifier for identifier, _ in self._owned(slot)]

    def _owned(self, slot: str) -> list[tuple[tuple[str, str], LakeTable]]:
        """:meth:`owned_tables` with each table as read, the reads overlapping (each is a round trip
        to the catalog, and a pipeline may have hundreds of tables)."""
        indexed = self.indexed(slot)
        with ThreadPoolExecutor(max_workers=TABLE_PARALLELISM, thread_name_prefix="pgl-read") as pool:
            read = list(pool.map(self.table, indexed))
        return [
            (identifier, table)
            for identifier, table in zip(indexed, read, strict=True)
            if table is not None and table.properties.get(lake.OWNER_PROPERTY) == slot
        ]

    def tag_cut(self, slot: str, end_lsn: Lsn) -> int:
        """Tag every owned table at its snapshot as of ``end_lsn``; returns how many tables carry the
        tag now, several at once.

        Idempotent: an existing tag is kept. A table with no pipeline commit by then is left out.
        """
        tag = lake.tag_name(end_lsn)

        def one(owned: tuple[tuple[str, str], LakeTable]) -> bool:
            identifier, table = owned
            snapshot_id = lake.snapshot_at(table.history(), end_lsn)
            if snapshot_id is None:
                return False
            self.spark.sql(
                f"ALTER TABLE {self.name(identifier)} CREATE TAG IF NOT EXISTS {quote(tag)} "
                f"AS OF VERSION {snapshot_id}"
            )
            return True

        with ThreadPoolExecutor(max_workers=TABLE_PARALLELISM, thread_name_prefix="pgl-tag") as pool:
            return sum(pool.map(one, self._owned(slot)))
