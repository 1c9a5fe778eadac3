"""Changes to a lake table's schema, partition spec and properties: metadata, never data.

``spark/iceberg.py`` calls these (it is where the jobs' writes start); each change is one
``ALTER TABLE`` of Iceberg's SQL, so it runs the same in a spark-submit driver and as a Spark
Connect client. A change in several statements makes its record (a table property) last: a run
that dies half-way leaves the old record, and the next run compares the table again and finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

from airflow_provider_postgres_cdc.errors import BACKFILL, SchemaConflictError
from airflow_provider_postgres_cdc.formats.column_transforms import TRANSFORMS_PROPERTY
from airflow_provider_postgres_cdc.formats.deletes import DELETES, DELETES_PROPERTY, DeleteMode
from airflow_provider_postgres_cdc.formats.history import HISTORY_PROPERTY, HistoryMode
from airflow_provider_postgres_cdc.formats.partitioning import PARTITION_PROPERTY, PartitionField, spec_text
from airflow_provider_postgres_cdc.spark.changes import OLD
from airflow_provider_postgres_cdc.spark.lake_table import LakeTable
from airflow_provider_postgres_cdc.spark.partitioning import (
    SOURCES_PROPERTY,
    partition_sources,
    sources_text,
    spec_changes,
)
from airflow_provider_postgres_cdc.spark.soft_deletes import mode_columns
from airflow_provider_postgres_cdc.spark.sql_text import ddl_type, literal, quote
from airflow_provider_postgres_cdc.spark.widening import widened

log = logging.getLogger("postgres_cdc.apply")


class TableChanges:
    """The metadata changes of one existing table, named ``name`` (quoted) in ``spark``."""

    def __init__(self, spark: SparkSession, name: str, read: Callable[[], LakeTable | None]) -> None:
        self.spark = spark
        self.name = name
        self._read = read

    def _table(self) -> LakeTable:
        table = self._read()
        if table is None:
            raise LookupError(f"lake table {self.name} does not exist")
        return table

    def _schema(self) -> StructType:
        return self.spark.table(self.name).schema

    def evolve(self, incoming: Sequence[StructField]) -> None:
        """Add the batch's new columns and widen promoted ones before its data is merged.

        A type the lake column cannot be promoted to stops the table with a message naming the
        column and the fix: guessing a cast could lose data silently. Each statement is a schema
        change of its own; a run that dies between them does the rest when it runs again.
        """
        current = {f.name: f.dataType for f in self._schema().fields}
        added, widen = [], []
        for field in incoming:
            if field.name not in current:
                added.append(f"{quote(field.name)} {ddl_type(field.dataType)}")
                continue
            try:
                target = widened(current[field.name], field.dataType)
            except ValueError as exc:
                raise SchemaConflictError(
                    f"table {self.name}: column {field.name!r} changed type ({exc}), which "
                    f"Iceberg cannot promote; re-snapshot the table ({BACKFILL}: the load "
                    "replaces the column with the new type), or revert the type change. Nothing of this "
                    "batch was applied."
                ) from None
            if target is not None:
                widen.append(f"ALTER COLUMN {quote(field.name)} TYPE {ddl_type(target)}")
        name = self.name
        if added:
            self.spark.sql(f"ALTER TABLE {name} ADD COLUMNS ({', '.join(added)})")
        for change in widen:
            self.spark.sql(f"ALTER TABLE {name} {change}")
        if added or widen:
            log.info("%s: schema evolved for %s", name, [f.name for f in incoming])

    def replace_column_types(self, incoming: Sequence[StructField], suffix: str) -> list[str]:
        """For a snapshot load: columns whose type cannot be promoted are dropped (re-added by
        :meth:`evolve` with the new type); returns their names.

        The load overwrites every row right after, so the column's old values are not needed;
        readers see the column empty between the two commits. A column a partition spec of the
        table ever used is renamed ``<name><suffix>`` instead, and stays empty: Iceberg keeps every
        spec, and writes fail once one's source column is gone. Partition fields on such a column
        are removed with it, and the recorded spec first; :meth:`conform_spec` sets the spec the
        option names again.
        """
        current = {f.name: f.dataType for f in self._schema().fields}
        stale = []
        for field in incoming:
            if field.name in current:
                try:
                    widened(current[field.name], field.dataType)
                except ValueError:
                    stale.append(field.name)
        if not stale:
            return stale
        table = self._table()
        fields = table.partition_fields
        doomed = [part for part in fields if part.column in stale]
        name = self.name
        if doomed:
            self.spark.sql(
                f"ALTER TABLE {name} UNSET TBLPROPERTIES IF EXISTS ({literal(PARTITION_PROPERTY)})"
            )
            for part in doomed:
                self.spark.sql(f"ALTER TABLE {name} DROP PARTITION FIELD {part.spark_sql()}")
            log.warning(
                "%s: partition fields %s dropped with their columns; a table partition_by names gets "
                "them back", name, [str(part) for part in doomed],
            )  # fmt: skip
        used = partition_sources(table.properties, fields)
        for column in stale:
            if column in used:
                self.spark.sql(
                    f"ALTER TABLE {name} RENAME COLUMN {quote(column)} TO {quote(column + suffix)}"
                )
            else:
                self.spark.sql(f"ALTER TABLE {name} DROP COLUMN {quote(column)}")
        log.warning("%s: columns %s changed type; reloaded with the new type", name, stale)
        return stale

    def retire_columns(self, names: Sequence[str], suffix: str) -> None:
        """Rename changelog columns (and their ``_pgl_old`` fields) whose type the source changed.

        The changelog keeps its history under ``<name><suffix>``, and later batches append the
        column again with its new type (Iceberg cannot change the type in place).
        """
        schema = self._schema()
        old = schema[OLD].dataType if OLD in schema.fieldNames() else None
        old_names = old.fieldNames() if isinstance(old, StructType) else []
        for name in names:
            if name in schema.fieldNames():
                self.spark.sql(
                    f"ALTER TABLE {self.name} RENAME COLUMN {quote(name)} TO {quote(name + suffix)}"
                )
            if name in old_names:
                path = f"{quote(OLD)}.{quote(name)}"
                self.spark.sql(f"ALTER TABLE {self.name} RENAME COLUMN {path} TO {quote(name + suffix)}")

    def _set_properties(self, wanted: Mapping[str, str]) -> None:
        """Set the non-empty ``wanted`` properties and remove the empty ones, in one change each."""
        name = self.name
        kept = {key: value for key, value in wanted.items() if value}
        gone = [key for key, value in wanted.items() if not value]
        if kept:
            settings = ", ".join(f"{literal(key)} = {literal(value)}" for key, value in kept.items())
            self.spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ({settings})")
        if gone:
            keys = ", ".join(literal(key) for key in gone)
            self.spark.sql(f"ALTER TABLE {name} UNSET TBLPROPERTIES IF EXISTS ({keys})")

    def conform_spec(self, partition: Sequence[PartitionField]) -> None:
        """Move an existing table to the spec ``partition`` names unless its recorded spec is that
        one (None: the table keeps its spec), after its schema took the batch's columns.

        The spec is recorded last: a run that dies half-way leaves the old one recorded, and the
        next run compares the table's actual fields again and finishes the move.
        """
        table = self._table()
        wanted = spec_text(partition)
        if table.properties.get(PARTITION_PROPERTY) == wanted:
            return
        name = self.name
        dropped, added = spec_changes(table.partition_fields, partition)
        for field in dropped:
            self.spark.sql(f"ALTER TABLE {name} DROP PARTITION FIELD {field.spark_sql()}")
        for field in added:
            self.spark.sql(f"ALTER TABLE {name} ADD PARTITION FIELD {field.spark_sql()}")
        sources = sources_text(table.properties.get(SOURCES_PROPERTY), partition)
        self._set_properties({SOURCES_PROPERTY: sources, PARTITION_PROPERTY: wanted})
        log.info("%s: partition spec is now %s", name, wanted)

    def conform_recorded(self, mode: DeleteMode, transforms: str, history: HistoryMode) -> None:
        """Switch a table a load rewrites to delete ``mode`` (``spark/soft_deletes.py``: the marks'
        columns, then the mode recorded) and record the column ``transforms`` its rows are staged
        under (``formats/column_transforms.py``) and its ``history`` mode (``formats/history.py``)."""
        table = self._table()
        wanted = {TRANSFORMS_PROPERTY: transforms, HISTORY_PROPERTY: "" if history == "none" else history}
        if DELETES.recorded(table.properties) != mode:
            added, dropped = mode_columns(self._schema().fieldNames(), mode)
            name = self.name
            if added:
                columns = ", ".join(f"{quote(column)} {ddl}" for column, ddl in added)
                self.spark.sql(f"ALTER TABLE {name} ADD COLUMNS ({columns})")
            for column in dropped:
                self.spark.sql(f"ALTER TABLE {name} DROP COLUMN {quote(column)}")
            wanted[DELETES_PROPERTY] = mode
        changed = {k: v for k, v in wanted.items() if (table.properties.get(k) or "") != v}
        if changed:
            self._set_properties(changed)
