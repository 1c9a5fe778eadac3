"""Partitioned lake tables in the apply job: created with their spec, moved to a new one when asked.

The option and its rules are ``formats/partitioning.py``'s. A table is created partitioned with
one ``CREATE TABLE ... PARTITIONED BY ... AS SELECT`` (atomic, like an unpartitioned create); an
existing table whose recorded spec differs from the one asked for is moved to it, and the spec
recorded last (``spark/iceberg.py`` commits): a run that dies half-way leaves the old spec
recorded, and the next run finishes the move.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from airflow_provider_postgres_cdc.formats.partitioning import PARTITION_PROPERTY, PartitionField, parse_field

SOURCES_PROPERTY = "pgl.partition-sources"
"""The lake table property listing every column a partition spec of the table used (JSON)."""


def partition_clause(fields: Sequence[PartitionField]) -> str:
    """The ``PARTITIONED BY (...)`` clause of a ``CREATE TABLE`` (Spark SQL's transforms)."""
    return f"PARTITIONED BY ({', '.join(field.spark_sql() for field in fields)})"


def spec_changes(
    current: Sequence[PartitionField], wanted: Sequence[PartitionField]
) -> tuple[list[PartitionField], list[PartitionField]]:
    """The fields to drop from the table's ``current`` spec and those to add, to reach ``wanted``.

    Iceberg keeps each data file under the spec it was written with, so a new spec rewrites nothing:
    later commits use it, and maintenance's compaction rewrites older files into it.
    """
    return [f for f in current if f not in wanted], [f for f in wanted if f not in current]


def sources_text(previous: str | None, fields: Sequence[PartitionField]) -> str:
    """The recorded columns any spec of the table used (:data:`SOURCES_PROPERTY`), with ``fields``'."""
    return json.dumps(sorted(set(json.loads(previous or "[]")) | {f.column for f in fields}))


def partition_sources(properties: Mapping[str, str], current: Sequence[PartitionField]) -> set[str]:
    """The columns a partition spec of the table used, current or older (Iceberg keeps them all):
    those the table records, the current spec's and the recorded option's."""
    used = set(json.loads(properties.get(SOURCES_PROPERTY) or "[]")) | {f.column for f in current}
    recorded = properties.get(PARTITION_PROPERTY)
    if recorded:
        used |= {parse_field(text).column for text in json.loads(recorded)}
    return used
