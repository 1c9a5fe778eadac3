"""A batch's source schema changes carried out on a lake table, or refused with the re-snapshot to run.

The rule lives in ``schema_changes.py`` (shipped with the job); this module feeds it the batch's
live relation versions and the column list the lake applied last (the ``pgl.source-columns``
snapshot summary value), and turns its plan into Spark work: the missing value of an added column
is filled into the batch's rows staged under earlier relation versions (before the merge algebra
sees them) and into the lake's existing rows (a ``MERGE`` on the merge branch, published with the
batch's own ``MERGE`` in one fast-forward, so readers never see one without the other).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import StructType

from airflow_provider_postgres_cdc.errors import ResnapshotNeededError
from airflow_provider_postgres_cdc.formats.lake import TableState
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest, sibling_name
from airflow_provider_postgres_cdc.formats.schema_changes import (
    Fill,
    Plan,
    backfill_command,
    decode_columns,
    encode_columns,
    plan,
)
from airflow_provider_postgres_cdc.spark.changes import OLD, column
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.sql_text import quote, temp_view
from airflow_provider_postgres_cdc.spark.staged import files_reaching, parquet_reader

log = logging.getLogger("postgres_cdc.apply")


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class SchemaSteps:
    """One table's schema plan for a batch, as the apply job carries it out.

    ``earlier_files[i]`` are the staged file names of the versions before the ``i``-th fill's.
    ``source_columns`` is what the batch's commit records as the last applied column list.
    """

    fills: tuple[Fill, ...]
    earlier_files: tuple[frozenset[str], ...]
    missing_values: str | None  # the staged one-row file of missing values
    source_columns: str | None

    def fill_staged(self, staged: DataFrame, spark: SparkSession) -> DataFrame:
        """The staged changes with every fill applied to the rows of versions before it.

        Must be applied to the staged scan itself (it tells versions apart by file name).
        """
        if not any(self.earlier_files):
            return staged
        values = self._values(spark, staged.schema)
        name = sf.element_at(sf.split(sf.input_file_name(), "/"), -1)
        for fill, files in zip(self.fills, self.earlier_files, strict=True):
            if not files:
                continue
            earlier = name.isin(*sorted(files))
            value = values[fill.column]
            staged = staged.withColumn(fill.column, sf.when(earlier, value).otherwise(column(fill.column)))
            # The earlier incarnation's overflow text is gone with it (the filled value fits).
            sibling = sibling_name(fill.column)
            if sibling in staged.columns:
                cleared = sf.when(earlier, sf.lit(None).cast("string")).otherwise(column(sibling))
                staged = staged.withColumn(sibling, cleared)
            if OLD in staged.columns:
                old = sf.col(OLD)
                filled = old.withField(quote(fill.column), value)
                if sibling in staged.schema[OLD].dataType.fieldNames():  # type: ignore[attr-defined]
                    filled = filled.withField(quote(sibling), sf.lit(None).cast("string"))
                staged = staged.withColumn(OLD, sf.when(earlier & old.isNotNull(), filled).otherwise(old))
        return staged

    def fill_lake(self, tables: IcebergTables, target: str, lake_columns: Sequence[str]) -> None:
        """Give the lake's existing rows (on the merge branch ``target``) each added column's value.

        A NULL fill is needed only where the lake already had the column (re-added after a drop).
        """
        fills = [f for f in self.fills if f.missing or f.column in lake_columns]
        if not fills:
            return
        schema = tables.spark.table(target).schema
        values = self._values(tables.spark, schema)
        source = tables.spark.range(1).select(*[values[f.column].alias(f.column) for f in fills])
        sets = ", ".join(f"t.{quote(f.column)} = s.{quote(f.column)}" for f in fills)
        # A re-added column's earlier overflow text (docs/TYPES.md) is gone with the old column.
        stale = [sibling_name(f.column) for f in fills if sibling_name(f.column) in schema.fieldNames()]
        sets += "".join(f", t.{quote(name)} = NULL" for name in stale)
        tables.merge(
            f"MERGE INTO {target} t USING {temp_view(source)} s ON TRUE WHEN MATCHED THEN UPDATE SET {sets}",
            {},
        )
        log.info(
            "%s: existing rows given the values of added column(s) %s", target, [f.column for f in fills]
        )

    def _values(self, spark: SparkSession, schema: StructType) -> dict[str, Column]:
        """Each fill's value as a column of the type ``schema`` gives it (NULL, or the missing value)."""
        row = None
        if self.missing_values is not None and any(f.missing for f in self.fills):
            row = parquet_reader(spark).parquet(self.missing_values).first()
        values = {}
        for fill in self.fills:
            dtype = schema[fill.column].dataType
            value = row[fill.column] if fill.missing and row is not None else None
            values[fill.column] = sf.lit(value).cast(dtype)
        return values


def _live_versions(
    spark: SparkSession, base_dir: str, spec: TableManifest, held: Lsn, start: Lsn
) -> list[int]:
    """Indexes of the relation versions with a change at or above ``held`` (the rest is in the table).

    Every change of a batch commits at or above its start LSN: when that is at or above ``held``
    (a batch that starts where the table ends), every version is live without reading a file.
    """
    if held <= start:
        return list(range(len(spec.versions)))
    live = []
    for index, version in enumerate(spec.versions):
        if files_reaching(spark, [f"{base_dir}/{f}" for f in version.files], int(held)):
            live.append(index)
    return live


def plan_schema_changes(
    spark: SparkSession,
    base_dir: str,
    manifest: Manifest,
    spec: TableManifest,
    state: TableState | None,
    held: Lsn,
) -> SchemaSteps:
    """Classify the batch's relation versions against the lake's last ones; raise when only a
    re-snapshot can tell the rows' values (:class:`ResnapshotNeededError`, naming the command).

    ``held``: the table holds every change below it already (its snapshot, batches applied), so
    only the versions of changes at or above it count.
    """
    slot, start = manifest.slot, manifest.start_lsn
    previous_text = state.source_columns if state is not None else None
    if not spec.versions:  # a manifest from before relation versions were recorded
        return SchemaSteps((), (), None, previous_text)
    previous = decode_columns(previous_text) if previous_text else None
    indexes = list(range(len(spec.versions)))
    result: Plan = plan(previous, [v.columns for v in spec.versions], spec.catalog)
    if result.problem is not None or result.fills or held > start:
        # Versions whose changes are all below ``held`` are in the table already (and must not be
        # recorded as the last applied one: the snapshot's or the applied batch's columns are newer).
        indexes = _live_versions(spark, base_dir, spec, held, start)
        result = plan(previous, [spec.versions[i].columns for i in indexes], spec.catalog)
    if result.problem is not None:
        problem = f"{result.problem}. The stream cannot show what this did to the rows already in the table"
        raise resnapshot_needed(spec, slot, base_dir, problem)
    earlier = tuple(
        frozenset(_basename(f) for i in indexes[: fill.version] for f in spec.versions[i].files)
        for fill in result.fills
    )
    missing = spec.catalog.missing_values_file if spec.catalog is not None else None
    last = encode_columns(spec.versions[indexes[-1]].columns) if indexes else previous_text
    if result.widened or result.fills:
        added = [(f.column, "missing value" if f.missing else "NULL") for f in result.fills]
        log.info("%s: schema changes: widened %s, added %s", spec.qualified, list(result.widened), added)
    return SchemaSteps(result.fills, earlier, None if missing is None else f"{base_dir}/{missing}", last)


def resnapshot_needed(spec: TableManifest, slot: str, base_dir: str, problem: str) -> ResnapshotNeededError:
    """The error that stops a table's apply for a re-snapshot, with the command that starts one."""
    staging = base_dir.rsplit("/", 2)[0] if base_dir.count("/") >= 2 else None
    return ResnapshotNeededError(
        f"table {spec.qualified}: {problem}, so nothing of this batch was applied to it and the slot is "
        f"not acknowledged. Re-snapshot the table, then re-run this task: "
        f"{backfill_command(slot, staging, spec.qualified)}"
    )
