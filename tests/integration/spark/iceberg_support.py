"""Reading the Iceberg lake the apply job writes, for the tests: rows, pipeline state, history, tags.

The tests check the job against ``spark_staging``'s reference model through the lake's own facts
(snapshot summaries, metadata tables, tags), never through the job's code paths, so a reader that
agrees with the job by construction cannot hide a bug.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import BooleanType

from airflow_provider_postgres_cdc.formats.lake import LakeConfig, TableState, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from tests.integration.spark.spark_staging import TableDef


def table_name(config: LakeConfig, identifier: tuple[str, str]) -> str:
    """``catalog.namespace.table`` quoted for Spark SQL, built independently of ``IcebergTables.name``."""
    return ".".join("`" + p.replace("`", "``") + "`" for p in (config.catalog, *identifier))


class LakeReader:
    """One lake's tables as Spark sees them."""

    def __init__(self, spark: SparkSession, config: LakeConfig) -> None:
        self.spark = spark
        self.config = config

    def name(self, tdef: TableDef) -> str:
        return table_name(self.config, self.config.identifier(tdef.schema, tdef.table))

    def rows(
        self, tdef: TableDef, names: list[str] | None = None, *, tag: str | None = None
    ) -> list[tuple[Any, ...]]:
        """The table's rows (at a tag when given) as sorted tuples of ``names`` (default: the tdef's)."""
        version = "" if tag is None else f" VERSION AS OF '{tag}'"
        df = self.spark.sql(f"SELECT * FROM {self.name(tdef)}{version}")
        names = names or tdef.names
        return sorted((tuple(r[n] for n in names) for r in df.collect()), key=repr)

    def columns(self, tdef: TableDef) -> list[str]:
        return self.spark.table(self.name(tdef)).columns

    def changelog_name(self, tdef: TableDef) -> str:
        return table_name(self.config, self.config.changelog_identifier(tdef.schema, tdef.table))

    def changelog(self, tdef: TableDef) -> list[tuple[int, int, str]]:
        """(commit LSN, seq, batch id) of every logged change, sorted."""
        name = self.changelog_name(tdef)
        rows = self.spark.sql(f"SELECT _pgl_commit_lsn, _pgl_seq, _pgl_batch_id FROM {name}").collect()
        return sorted((r[0], r[1], r[2]) for r in rows)

    def state(self, tdef: TableDef) -> TableState:
        tables = IcebergTables(self.spark, self.config)
        state = tables.state(tables.table(self.config.identifier(tdef.schema, tdef.table)))
        assert state is not None, f"{tdef.dirname} has no pipeline commit"
        return state

    def snapshots(self, tdef: TableDef) -> list[tuple[int, str, dict[str, str]]]:
        """(snapshot id, operation, summary) of every snapshot, oldest first (the metadata table)."""
        rows = self.spark.sql(
            f"SELECT snapshot_id, operation, summary FROM {self.name(tdef)}.snapshots ORDER BY committed_at"
        ).collect()
        return [(r[0], r[1], dict(r[2])) for r in rows]

    def current(self, tdef: TableDef) -> tuple[int, int]:
        """(current snapshot id, number of snapshots): both unchanged means nothing was committed."""
        tables = IcebergTables(self.spark, self.config)
        table = tables.table(self.config.identifier(tdef.schema, tdef.table))
        assert table is not None and table.snapshot_id is not None
        return table.snapshot_id, len(self.snapshots(tdef))

    def tags(self, tdef: TableDef) -> dict[str, int]:
        rows = self.spark.sql(f"SELECT name, type, snapshot_id FROM {self.name(tdef)}.refs").collect()
        return {r[0]: r[2] for r in rows if r[1] == "TAG"}

    def has_cut(self, tdef: TableDef, end_lsn: int) -> bool:
        return tag_name(Lsn(end_lsn)) in self.tags(tdef)


def pyiceberg_catalog(config: LakeConfig) -> SqlCatalog:
    """pyiceberg's own client on a ``local_lake`` catalog database (same name as the Spark catalog)."""
    return SqlCatalog(config.catalog, **_sql_catalog_properties(config))


def _sql_catalog_properties(config: LakeConfig) -> dict[str, str]:
    uri = config.properties["uri"]
    assert uri.startswith("jdbc:sqlite:"), uri
    return {
        "uri": f"sqlite:///{uri.removeprefix('jdbc:sqlite:')}",
        "warehouse": f"file://{config.properties['warehouse']}",
    }


def competing_writer(config: LakeConfig, identifier: tuple[str, str], key: int) -> Column:
    """A filter keeping every row that, evaluated in a Python worker, commits twice to the table.

    It appends a row under ``id = key`` and deletes it again through pyiceberg: two real commits by
    another process, leaving the rows as they were. The key must be one the MERGE touches: Iceberg
    only checks new files that can hold rows matching the MERGE's (runtime-filtered) condition.
    Non-deterministic, so Spark neither folds nor reorders it away. Self-contained: the worker
    cannot import this test module.
    """
    name, properties = config.catalog, _sql_catalog_properties(config)

    def commit_elsewhere() -> bool:
        import pyarrow as pa
        from pyiceberg.catalog.sql import SqlCatalog

        table = SqlCatalog(name, **properties).load_table(identifier)
        table.append(pa.Table.from_pylist([{"id": key}], schema=table.schema().as_arrow()))
        table.delete(f"id = {key}")
        return True

    return sf.udf(commit_elsewhere, BooleanType()).asNondeterministic()()
