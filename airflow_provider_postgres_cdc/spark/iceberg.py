"""Iceberg tables through Spark's Iceberg runtime: every commit the apply job makes, in one place.

Spark SQL does the data work (``MERGE INTO``, ``writeTo``); Iceberg's Java API, reached through
py4j, does what SQL cannot say: commit properties on a ``MERGE`` (``CommitMetadata``, Iceberg's
documented way), reading the snapshot history a table's pipeline state lives in, empty commits
that record a batch with nothing to write, schema changes on names SQL would parse, and tags.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import (
    DataType,
    StringType,
    StructField,
    StructType,
)

from airflow_provider_postgres_cdc.errors import BACKFILL, ApplyError, CatalogError, SchemaConflictError
from airflow_provider_postgres_cdc.formats import lake, lake_index
from airflow_provider_postgres_cdc.formats.column_transforms import TRANSFORMS_PROPERTY
from airflow_provider_postgres_cdc.formats.deletes import DELETES_PROPERTY, DeleteMode
from airflow_provider_postgres_cdc.formats.history import HISTORY_PROPERTY, HistoryMode
from airflow_provider_postgres_cdc.formats.lake import WRITE_MODES, LakeConfig, TableState
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.partitioning import PARTITION_PROPERTY, PartitionField, spec_text
from airflow_provider_postgres_cdc.spark.changes import OLD
from airflow_provider_postgres_cdc.spark.lake_failures import root_cause
from airflow_provider_postgres_cdc.spark.partitioning import conform_spec, drop_columns, partition_clause
from airflow_provider_postgres_cdc.spark.soft_deletes import conform_mode
from airflow_provider_postgres_cdc.spark.widening import widened

log = logging.getLogger("postgres_cdc.apply")

TARGET_FILE_BYTES = 64 << 20
MERGE_BRANCH = "pgl_merge"
# Exceptions of a commit that lost to another writer (or whose outcome is unknown): the table's
# state is read again and the work redone, which is safe because every step checks that state.
# Fast-forwarding main to the merge branch fails with an IllegalArgumentException when main moved.
_CONFLICTS = (
    "ValidationException",
    "CommitFailedException",
    "CommitStateUnknownException",
    "Cannot fast-forward: main is not an ancestor",
)
# A table, or the namespace it would be in, does not exist (Spark's and Iceberg's names for it).
_MISSING = ("NoSuchTableException", "TABLE_OR_VIEW_NOT_FOUND", "NoSuchNamespaceException")


def quote(name: str) -> str:
    """A Spark SQL identifier part: backticks, with backticks inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal (backslashes and quotes escaped: Spark unescapes literals)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Iceberg's optimistic-concurrency failure (redo the table) rather than a bug."""
    text = f"{type(exc).__name__}: {exc}"
    return any(name in text for name in _CONFLICTS)


class _Call:
    """A ``java.util.concurrent.Callable`` running a Python function (py4j callback)."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.error: BaseException | None = None

    def call(self) -> int:
        try:
            self.fn()
        except BaseException as exc:  # re-raised on the Python side with its own type
            self.error = exc
        return 0

    class Java:
        implements = ["java.util.concurrent.Callable"]


class IcebergTables:
    """The lake's tables in one Spark session: names, state, schema, commits and tags."""

    def __init__(self, spark: SparkSession, config: LakeConfig, write_mode: str = "merge-on-read") -> None:
        if write_mode not in WRITE_MODES:
            raise ApplyError(f"write mode must be one of {WRITE_MODES}, not {write_mode!r}")
        self.spark = spark
        self.config = config
        self.write_mode = write_mode
        self._jvm: Any = spark._jvm
        self._check_catalog()

    def _check_catalog(self) -> None:
        name = self.config.catalog
        if self.spark.conf.get(f"spark.sql.catalog.{name}", None) is None:
            raise CatalogError(
                f"Spark has no catalog {name!r}: pass the lake's catalog properties to spark-submit "
                f"(spark.sql.catalog.{name}=org.apache.iceberg.spark.SparkCatalog and its type, uri and "
                "warehouse; the apply operator adds them from its lake connection) and the Iceberg "
                "runtime jar"
            )
        try:
            catalog = self.spark._jsparkSession.sessionState().catalogManager().catalog(name)
            gateway: Any = self.spark.sparkContext._gateway
            levels = gateway.new_array(self._jvm.java.lang.String, 1)
            levels[0] = lake_index.index_namespace(self.config)
            catalog.namespaceExists(levels)  # any answer will do: the catalog is reachable
        except (PySparkException, Py4JJavaError) as exc:
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

    def ensure_namespace(self, namespace: str) -> None:
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.config.catalog)}.{quote(namespace)}")

    # ----------------------------------------------------------------------------------- state

    def java_table(self, identifier: tuple[str, str]) -> Any:
        """Iceberg's ``Table`` for ``identifier``, refreshed; None when it does not exist."""
        try:
            table = self._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
                self.spark._jsparkSession, self.name(identifier)
            )
        except (PySparkException, Py4JJavaError) as exc:
            if any(name in str(exc) for name in _MISSING):
                return None
            raise
        table.refresh()
        return table

    def history(self, table: Any) -> Iterator[tuple[int, dict[str, str]]]:
        """The main branch's snapshots, newest first, as (snapshot id, summary).

        Lazy: the state, the cut and the changelog check stop at the first pipeline commit, however
        long the history is. Each snapshot crosses from the JVM as one JSON text (Iceberg's own
        ``SnapshotParser``): reading its summary entry by entry would cost a round trip each.
        """
        parser = self._jvm.org.apache.iceberg.SnapshotParser
        snapshot = table.currentSnapshot()
        while snapshot is not None:
            fields = json.loads(parser.toJson(snapshot))
            summary = {str(k): str(v) for k, v in (fields.get("summary") or {}).items() if k != "operation"}
            yield int(fields["snapshot-id"]), summary
            parent = fields.get("parent-snapshot-id")
            snapshot = table.snapshot(parent) if parent is not None else None

    def state(self, table: Any | None) -> TableState | None:
        return None if table is None else lake.state_of(self.history(table))

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
        """Add the batch's new columns and widen promoted ones before its data is merged.

        A type the lake column cannot be promoted to stops the table with a message naming the
        column and the fix: guessing a cast could lose data silently.
        """
        table = self.java_table(identifier)
        current = {f.name: f.dataType for f in self.schema(identifier).fields}
        update = table.updateSchema()
        changed = False
        for field in incoming:
            if field.name not in current:
                update = update.addColumn(None, field.name, self._iceberg_type(field.dataType))
                changed = True
                continue
            try:
                target = widened(current[field.name], field.dataType)
            except ValueError as exc:
                raise SchemaConflictError(
                    f"table {self.name(identifier)}: column {field.name!r} changed type ({exc}), which "
                    f"Iceberg cannot promote; re-snapshot the table ({BACKFILL}: the load "
                    "replaces the column with the new type), or revert the type change. Nothing of this "
                    "batch was applied."
                ) from None
            if target is not None:
                update = update.updateColumn(field.name, self._iceberg_type(target))
                changed = True
        if changed:
            update.commit()
            log.info("%s: schema evolved for %s", self.name(identifier), [f.name for f in incoming])

    def replace_column_types(
        self, identifier: tuple[str, str], incoming: Sequence[StructField], suffix: str
    ) -> list[str]:
        """For a snapshot load: columns whose type cannot be promoted are dropped (re-added by
        :meth:`evolve` with the new type); returns their names.

        The load overwrites every row right after, so the column's old values are not needed;
        readers see the column empty between the two commits. A column a partition spec of the
        table ever used is renamed ``<name><suffix>`` instead, and stays empty: Iceberg keeps every
        spec, and writes fail once one's source column is gone. Partition fields on such a column
        are removed with it; :meth:`conform_spec` sets the spec the option names again.
        """
        current = {f.name: f.dataType for f in self.schema(identifier).fields}
        stale = []
        for field in incoming:
            if field.name in current:
                try:
                    widened(current[field.name], field.dataType)
                except ValueError:
                    stale.append(field.name)
        if stale:
            drop_columns(self.java_table(identifier), stale, suffix)
            log.warning(
                "%s: columns %s changed type; reloaded with the new type", self.name(identifier), stale
            )
        return stale

    def retire_changelog_columns(self, changelog: tuple[str, str], names: Sequence[str], suffix: str) -> None:
        """Rename changelog columns (and their ``_pgl_old`` fields) whose type the source changed.

        The changelog keeps its history under ``<name><suffix>``, and later batches append the
        column again with its new type (Iceberg cannot change the type in place).
        """
        table = self.java_table(changelog)
        if table is None or not names:
            return
        schema = table.schema()
        update = table.updateSchema()
        for name in names:
            for path in (name, f"{OLD}.{name}"):
                if schema.findField(path) is not None:
                    update = update.renameColumn(path, name + suffix)
        update.commit()

    def _iceberg_type(self, dtype: DataType) -> Any:
        jtype = self.spark._jsparkSession.parseDataType(dtype.json())
        return self._jvm.org.apache.iceberg.spark.SparkSchemaUtil.convert(jtype)

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
        if partition:  # Spark's DataFrame writer has no truncate transform: SQL has them all
            settings = ", ".join(f"{literal(key)} = {literal(value)}" for key, value in properties.items())
            self.sql_commit(
                f"CREATE TABLE {self.name(identifier)} USING iceberg {partition_clause(partition)} "
                f"TBLPROPERTIES ({settings}) AS SELECT * FROM {temp_view(rows)}",
                summary,
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
        if self.java_table(identifier) is None:
            self.ensure_namespace(identifier[0])
            rows.writeTo(self.name(identifier)).using("iceberg").tableProperty(
                "format-version", "2"
            ).tableProperty("write.spark.accept-any-schema", "true").options(**options).create()
        else:
            rows.writeTo(self.name(identifier)).options(**options).append()

    def branch_name(self, identifier: tuple[str, str]) -> str:
        """The table's merge branch as Spark SQL names it (``<table>.branch_<name>``)."""
        return f"{self.name(identifier)}.{quote('branch_' + MERGE_BRANCH)}"

    def open_branch(self, table: Any, snapshot_id: int) -> None:
        """Point the merge branch at ``snapshot_id``: the snapshot the batch's state was read from.

        A MERGE validates only against commits made after it planned; merging into this branch and
        fast-forwarding main to it (:meth:`publish_branch`) also refuses commits made since the
        state was read (a re-snapshot load in between would otherwise get the batch's old base LSN).
        """
        manage = table.manageSnapshots()
        if table.refs().containsKey(MERGE_BRANCH):  # left by a crashed run
            manage.replaceBranch(MERGE_BRANCH, snapshot_id).commit()
        else:
            manage.createBranch(MERGE_BRANCH, snapshot_id).commit()

    def publish_branch(self, identifier: tuple[str, str]) -> None:
        """Fast-forward main to the merge branch and remove it, in one commit.

        Fails with Iceberg's ``ValidationException`` when main moved since the branch was opened.
        """
        table = self.java_table(identifier)
        table.manageSnapshots().fastForwardBranch("main", MERGE_BRANCH).removeBranch(MERGE_BRANCH).commit()

    def conform_spec(self, identifier: tuple[str, str], partition: Sequence[PartitionField] | None) -> None:
        """Move an existing table to the spec ``partition`` names, after its schema took the batch's
        columns (``spark/partitioning.py``); None: the table keeps its spec."""
        if partition is not None:
            conform_spec(self._jvm, self.java_table(identifier), partition)

    def conform_recorded(
        self, identifier: tuple[str, str], mode: DeleteMode, transforms: str, history: HistoryMode
    ) -> None:
        """Switch a table a load rewrites to delete ``mode`` (``spark/soft_deletes.py``) and record the
        column ``transforms`` its rows are staged under (``formats/column_transforms.py``) and its
        ``history`` mode (``formats/history.py``)."""
        conform_mode(self._jvm, self.java_table(identifier), mode)
        table = self.java_table(identifier)
        wanted = {TRANSFORMS_PROPERTY: transforms, HISTORY_PROPERTY: "" if history == "none" else history}
        changed = {k: v for k, v in wanted.items() if (table.properties().get(k) or "") != v}
        if changed:
            update = table.updateProperties()
            for key, value in changed.items():
                update = update.set(key, value) if value else update.remove(key)
            update.commit()

    def merge(self, sql: str, summary: Mapping[str, str]) -> None:
        """Run a batch's ``MERGE INTO``, its commit carrying ``summary`` (:meth:`sql_commit`)."""
        self.sql_commit(sql, summary)

    def sql_commit(self, sql: str, summary: Mapping[str, str]) -> None:
        """Run a statement (``MERGE INTO``, ``CREATE TABLE AS SELECT``) whose commit carries
        ``summary`` in its snapshot (CommitMetadata)."""
        props = self._jvm.java.util.HashMap()
        for key, value in summary.items():
            props.put(key, value)
        from pyspark.java_gateway import ensure_callback_server_started

        ensure_callback_server_started(self.spark.sparkContext._gateway)  # type: ignore[no-untyped-call]
        call = _Call(lambda: self.spark.sql(sql))
        error_class = self._jvm.java.lang.Class.forName("java.lang.RuntimeException")
        self._jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(props, call, error_class)
        if call.error is not None:
            raise call.error

    def record(self, table: Any, summary: Mapping[str, str], read_snapshot: int | None) -> None:
        """An empty commit carrying ``summary``: a batch with nothing to write still moves the state.

        It fails like a data commit if anyone committed data since ``read_snapshot``, the snapshot
        the batch read its state from (a racing load would otherwise get this older view's base).
        """
        expressions = self._jvm.org.apache.iceberg.expressions.Expressions
        commit = table.newOverwrite().conflictDetectionFilter(expressions.alwaysTrue())
        if read_snapshot is not None:
            commit = commit.validateFromSnapshot(read_snapshot)
        commit = commit.validateNoConflictingData().validateNoConflictingDeletes()
        for key, value in summary.items():
            commit = commit.set(key, value)
        commit.commit()

    # ----------------------------------------------------------------------------------- index

    def indexed(self, slot: str) -> list[tuple[str, str]]:
        """The tables ``slot``'s index names (``formats/lake_index.py``), read fresh: another job
        may have registered tables since this one started."""
        index = lake_index.index_identifier(self.config, slot)
        if self.java_table(index) is None:
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
        if self.java_table(index) is None:
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
        owned = []
        for identifier in self.indexed(slot):
            table = self.java_table(identifier)
            if table is not None and table.properties().get(lake.OWNER_PROPERTY) == slot:
                owned.append(identifier)
        return owned

    def tag_cut(self, slot: str, end_lsn: Lsn) -> int:
        """Tag every owned table at its snapshot as of ``end_lsn``; returns the tags created.

        Idempotent: an existing tag is kept. A table with no pipeline commit by then is left out.
        """
        name = lake.tag_name(end_lsn)
        created = 0
        for identifier in self.owned_tables(slot):
            table = self.java_table(identifier)
            if table.refs().containsKey(name):
                continue
            snapshot_id = lake.snapshot_at(self.history(table), end_lsn)
            if snapshot_id is None:
                continue
            table.manageSnapshots().createTag(name, snapshot_id).commit()
            created += 1
        return created


def temp_view(df: DataFrame) -> str:
    """Register ``df`` under a fresh temporary view name."""
    name = f"pgl_src_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(name)
    return name
