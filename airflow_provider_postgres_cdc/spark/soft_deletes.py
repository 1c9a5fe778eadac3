"""Soft deletes in the apply job (the ``deletes`` option, ``formats/deletes.py``).

A soft-deletes table carries two more columns, :data:`DELETED_AT` and :data:`DELETED_LSN`. A
batch's MERGE marks a deleted key's row instead of deleting it and clears the marks of a key
written again (``merge_sql.py``); a TRUNCATE marks every row not marked yet. A re-snapshot keeps
the lake's rows the snapshot no longer holds, marked at its consistent point, and replays the
changelog the same way. Only a load may switch a table's mode: a batch cannot know which rows a
hard-deletes table already lost.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import LongType, NumericType, TimestampType

from airflow_provider_postgres_cdc.formats.deletes import (
    DELETED_AT,
    DELETED_LSN,
    DeleteMode,
)
from airflow_provider_postgres_cdc.spark.changes import (
    COMMIT_LSN,
    COMMIT_TIME,
    DELETE,
    EVENT_KIND,
    ROW_KEY,
    UPSERT,
    NetEffect,
    column,
    key_struct,
    materialize,
)

MARKS = (DELETED_AT, DELETED_LSN)
_MARK_TYPES = ((DELETED_AT, "timestamp"), (DELETED_LSN, "bigint"))  # Iceberg: timestamptz, long


def unmarked(rows: DataFrame) -> DataFrame:
    """``rows`` as live rows of a soft-deletes table: both marks NULL."""
    data = [column(name) for name in rows.columns if name not in MARKS]
    return rows.select(
        *data,
        sf.lit(None).cast(TimestampType()).alias(DELETED_AT),
        sf.lit(None).cast(LongType()).alias(DELETED_LSN),
    )


def _mark(rows: DataFrame, lsn: Column, at: Column) -> DataFrame:
    """``rows`` marked deleted at (``lsn``, ``at``) unless marked already (the earlier delete stays)."""
    return rows.withColumn(DELETED_AT, sf.coalesce(sf.col(DELETED_AT), at)).withColumn(
        DELETED_LSN, sf.coalesce(sf.col(DELETED_LSN), lsn)
    )


def reloaded(
    snapshot: DataFrame, lake: DataFrame, keys: Sequence[str], point: int, at: datetime
) -> DataFrame:
    """A re-snapshot's rows for a soft-deletes table: the snapshot's live, and the lake's rows whose
    key it lacks kept and marked at its consistent point ``point`` and time ``at`` (they were
    deleted before it; when exactly, the snapshot cannot tell). Where the source changed a
    column's type, those rows keep their values if numbers widened, and lose them otherwise."""
    gone = lake.join(
        snapshot.select(key_struct(keys).alias(ROW_KEY)), key_struct(keys) == sf.col(ROW_KEY), "left_anti"
    )
    if DELETED_LSN not in lake.columns:  # a hard-deletes table switching to soft
        gone = unmarked(gone)
    lake_types = {f.name: f.dataType for f in gone.schema.fields}
    for field in snapshot.schema.fields:  # a type the source changed: numbers widen, the rest is lost
        old = lake_types.get(field.name, field.dataType)
        if old != field.dataType and not (
            isinstance(old, NumericType) and isinstance(field.dataType, NumericType)
        ):
            gone = gone.withColumn(field.name, sf.lit(None).cast(field.dataType))
    marked = _mark(gone, sf.lit(point), sf.lit(at).cast(TimestampType()))
    # Computed now: the load changes the table's schema (retyped columns, the marks) before it writes.
    return materialize(unmarked(snapshot).unionByName(marked, allowMissingColumns=True))


def replayed(
    rows: DataFrame, net: NetEffect, keys: Sequence[str], truncate: tuple[int, int] | None
) -> DataFrame:
    """``rows`` (with marks) after a replayed net effect, for a load's catch-up of the changes past
    its snapshot: deletes mark, upserts replace and unmark, and a TRUNCATE (its commit LSN and time
    in µs) marks every row it found."""
    events = net.rows.select(ROW_KEY, EVENT_KIND, COMMIT_LSN, COMMIT_TIME)
    hit = rows.join(events, key_struct(keys) == sf.col(ROW_KEY), "left")
    kind = sf.col(EVENT_KIND)
    if truncate is not None:
        hit = _mark(hit, sf.lit(truncate[0]), sf.timestamp_micros(sf.lit(truncate[1])))
    deleted = _mark(hit.where(kind == DELETE), sf.col(COMMIT_LSN), sf.col(COMMIT_TIME))
    kept = hit.where(kind.isNull()).select(*rows.columns).unionByName(deleted.select(*rows.columns))
    upserts = unmarked(net.rows.where(kind == UPSERT).drop(*events.columns))
    return kept.unionByName(upserts, allowMissingColumns=True)


def mode_columns(present: Collection[str], mode: DeleteMode) -> tuple[list[tuple[str, str]], list[str]]:
    """The marks' columns a table of columns ``present`` gains (name, DDL type) and loses to be in
    delete ``mode``: a load switching a table's mode writes every row right after."""
    if mode == "soft":
        return [(name, ddl) for name, ddl in _MARK_TYPES if name not in present], []
    return [], [name for name in MARKS if name in present]
