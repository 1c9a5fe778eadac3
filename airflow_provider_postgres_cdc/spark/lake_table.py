"""One lake table as the apply job reads it: properties, refs, snapshots and partition spec, by SQL.

Everything here is read through Spark SQL and Iceberg's metadata tables (``SHOW TBLPROPERTIES``,
``<table>.snapshots``, ``<table>.refs``, ``DESCRIBE TABLE``), never through Iceberg's Java API,
so a job reads the same way in a spark-submit driver and as a Spark Connect client. A
:class:`LakeTable` is one read of the table: it holds what it read, and a commit made after it
is seen by reading the table again (the catalog's table cache is off: ``formats/lake.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import TableState
from airflow_provider_postgres_cdc.formats.partitioning import TEMPORAL, PartitionField

# A table, or the namespace it would be in, does not exist (Spark's and Iceberg's names for it).
MISSING = ("NoSuchTableException", "TABLE_OR_VIEW_NOT_FOUND", "NoSuchNamespaceException", "SCHEMA_NOT_FOUND")
# Iceberg's property holding the main branch's snapshot id (absent before the first commit).
CURRENT_SNAPSHOT = "current-snapshot-id"
_DESCRIBED = re.compile(r"^\s*([a-z]+)\((?:(\d+),\s*)?(.+)\)\s*$")


def is_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the table (or its namespace) does not exist."""
    return any(name in str(exc) for name in MISSING)


class LakeTable:
    """What one read of an existing lake table found; :func:`read_table` makes it.

    The properties come with the read (they say whether the table exists); the snapshots, refs,
    partition spec and location are read when first asked for.
    """

    def __init__(self, spark: SparkSession, name: str, properties: dict[str, str]) -> None:
        self.spark = spark
        self.name = name  # ``catalog.namespace.table``, quoted for Spark SQL
        self.properties = properties

    @property
    def snapshot_id(self) -> int | None:
        """The main branch's snapshot when the table was read; None before its first commit."""
        current = self.properties.get(CURRENT_SNAPSHOT, "none")
        return None if current in ("", "none", "-1") else int(current)

    @functools.cached_property
    def snapshots(self) -> dict[int, tuple[int | None, dict[str, str]]]:
        """Every snapshot the table keeps: id -> (parent id, summary)."""
        rows = self.spark.sql(f"SELECT snapshot_id, parent_id, summary FROM {self.name}.snapshots").collect()
        return {
            int(row[0]): (
                None if row[1] is None else int(row[1]),
                {str(k): str(v) for k, v in row[2].items()},
            )
            for row in rows
        }

    @functools.cached_property
    def refs(self) -> dict[str, int]:
        """The table's branches and tags: name -> snapshot id."""
        rows = self.spark.sql(f"SELECT name, snapshot_id FROM {self.name}.refs").collect()
        return {str(row[0]): int(row[1]) for row in rows}

    def history(self, start: int | None = None) -> Iterator[tuple[int, dict[str, str]]]:
        """The snapshots from ``start`` (default: main's) back to the first, newest first, as (id,
        summary): the walk a table's pipeline state, its cuts and its changelog's logged end read."""
        snapshot = self.snapshot_id if start is None else start
        while snapshot is not None and snapshot in self.snapshots:
            parent, summary = self.snapshots[snapshot]
            yield snapshot, summary
            snapshot = parent

    @property
    def state(self) -> TableState | None:
        """What the pipeline has put into the table: its newest pipeline commit's summary."""
        return lake.state_of(self.history())

    @property
    def total_records(self) -> int:
        """Rows in main's snapshot by Iceberg's own count (merge-on-read deletes not netted out)."""
        if self.snapshot_id is None:
            return 0
        return int(self.snapshots[self.snapshot_id][1].get("total-records") or 0)

    @functools.cached_property
    def _described(self) -> list[Any]:
        return self.spark.sql(f"DESCRIBE TABLE EXTENDED {self.name}").collect()

    @property
    def partition_fields(self) -> list[PartitionField]:
        """The current partition spec's fields, as ``DESCRIBE TABLE`` states them."""
        fields, inside = [], False
        for row in self._described:
            title = str(row[0] or "")
            if title.startswith("#"):
                inside = title.strip() == "# Partitioning"
            elif inside and title.startswith("Part "):
                fields.append(described_field(str(row[1])))
        return fields

    @property
    def location(self) -> str:
        """The table's base location."""
        return next(str(row[1]) for row in self._described if str(row[0]) == "Location")


def read_table(spark: SparkSession, name: str) -> LakeTable | None:
    """The table ``name`` (quoted ``catalog.namespace.table``) as it is now; None when it does not exist."""
    try:
        rows = spark.sql(f"SHOW TBLPROPERTIES {name}").collect()
    except PySparkException as exc:
        if is_missing(exc):
            return None
        raise
    return LakeTable(spark, name, {str(row[0]): str(row[1]) for row in rows})


def described_field(text: str) -> PartitionField:
    """A partition field from ``DESCRIBE TABLE``'s text: ``days(ts)``, ``bucket(16, id)``,
    ``truncate(4, name)``, or a column alone for identity; names with other characters come
    in backticks."""
    match = _DESCRIBED.match(text)
    if match is None:
        return PartitionField("identity", _unquoted(text))
    transform, width, name = match.groups()
    return PartitionField(TEMPORAL.get(transform, transform), _unquoted(name), int(width) if width else None)


def _unquoted(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "`":
        return text[1:-1].replace("``", "`")
    return text
