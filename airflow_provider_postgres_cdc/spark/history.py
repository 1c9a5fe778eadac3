"""SCD type 2 history tables in the apply job (the ``history`` option, ``formats/history.py``).

A history table holds one row per version of a keyed table's rows. A batch reaches it in one
``MERGE``, before the table's own merge (as the changelog is appended before it), with the changes
its commits have not logged yet (``formats/window.py``): the current versions of the keys those
changes touch end at their first change (every current version at a TRUNCATE before it), and every
insert and update opens a version, intermediate ones included. A key change ends the old key's
version and opens the new key's. Unchanged out-of-line (TOAST) values are taken from the version
before, as the table's merge takes them (``changes.fill_unchanged``).

A load creates the history from its snapshot's rows, then takes the logged changes it replays on
them; a history whose logged end already reaches the table's (a re-snapshot of a table that kept
its history) is kept as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf
from pyspark.sql.types import LongType, StringType, StructField, TimestampType

from airflow_provider_postgres_cdc.formats.history import (
    ENDED_BY,
    ENDINGS,
    IS_CURRENT,
    VALID_FROM,
    VALID_FROM_LSN,
    VALID_TO,
    VALID_TO_LSN,
)
from airflow_provider_postgres_cdc.spark.changes import (
    COMMIT_LSN,
    COMMIT_TIME,
    EVENT_KIND,
    OP,
    ROW_KEY,
    SEQ,
    SUB,
    UNFILLED,
    UPSERT,
    BatchFacts,
    batch_facts,
    build_events,
    column,
    fill_unchanged,
    key_struct,
)
from airflow_provider_postgres_cdc.spark.sql_text import quote

FLAG = "_pgl_x_flag"  # END: ends the current version of its key; VERSION: a version to insert
END, VERSION = "E", "V"
_NEXT = "_pgl_x_next"  # prefix of the next event's columns on the version's key


def opened(rows: DataFrame, lsn: int, at: datetime, first_key: str | None = None) -> DataFrame:
    """``rows`` (a snapshot's) as current versions valid from commit LSN ``lsn`` and time ``at``,
    ordered by ``first_key`` (key-ordered files: a batch's MERGE reads only those of its key range)."""
    rows = rows.orderBy(column(first_key)) if first_key is not None else rows
    return rows.select(
        *[column(name) for name in rows.columns],
        sf.lit(lsn).cast(LongType()).alias(VALID_FROM_LSN),
        sf.lit(None).cast(LongType()).alias(VALID_TO_LSN),
        sf.lit(at).cast(TimestampType()).alias(VALID_FROM),
        sf.lit(None).cast(TimestampType()).alias(VALID_TO),
        sf.lit(True).alias(IS_CURRENT),
        sf.lit(None).cast(StringType()).alias(ENDED_BY),
    )


@dataclass(frozen=True)
class VersionStep:
    """What a run of changes does to a history: ``rows`` to merge (``FLAG`` says which are ends of
    current versions, keyed by their key columns, and which new versions), ``unfilled`` the upserts
    whose unchanged TOAST values no earlier version holds (``changes.NetEffect``), ``changes``, and
    ``key_range``, the first key's range of the versions it ends (None: all of them, at a TRUNCATE)."""

    rows: DataFrame
    unfilled: DataFrame | None
    changes: int
    key_range: tuple[Any, Any] | None


def _truncates(changes: DataFrame) -> list[tuple[int, int, int]]:
    """(commit LSN, seq, commit time in µs) of every TRUNCATE, in order: a batch holds few."""
    found = changes.where(sf.col(OP) == "T").select(COMMIT_LSN, SEQ, sf.unix_micros(COMMIT_TIME))
    return sorted((int(r[0]), int(r[1]), int(r[2])) for r in found.collect())


def _truncate_at(lsn: int, seq: int, micros: int) -> Column:
    return sf.struct(sf.lit(lsn).alias("lsn"), sf.lit(seq).alias("seq"), sf.lit(micros).alias("micros"))


def _first_truncate_after(lsn: Column, seq: Column, truncates: Sequence[tuple[int, int, int]]) -> Column:
    """The first of ``truncates`` after the change at (``lsn``, ``seq``) (null: none)."""
    after = [sf.when((lsn < t[0]) | ((lsn == t[0]) & (seq < t[1])), _truncate_at(*t)) for t in truncates]
    return sf.coalesce(*after) if after else sf.lit(None)


def _ending(lsn: Column, seq: Column, time: Column, op: Column, truncate: Column | None) -> list[Column]:
    """``VALID_TO_LSN``, ``VALID_TO`` and ``ENDED_BY`` of a version that the change at (``lsn``,
    ``seq``, null: none) or the TRUNCATE ``truncate`` (null or None: none) ends, whichever is first."""
    ended_by = sf.when(op == "D", ENDINGS["D"]).otherwise(ENDINGS["U"])  # U: also a key change's end
    if truncate is None:
        return [
            lsn.alias(VALID_TO_LSN),
            time.alias(VALID_TO),
            sf.when(lsn.isNotNull(), ended_by).alias(ENDED_BY),
        ]
    first = truncate.isNotNull() & (
        lsn.isNull() | (truncate["lsn"] < lsn) | ((truncate["lsn"] == lsn) & (truncate["seq"] < seq))
    )
    return [
        sf.when(first, truncate["lsn"]).otherwise(lsn).alias(VALID_TO_LSN),
        sf.when(first, sf.timestamp_micros(truncate["micros"])).otherwise(time).alias(VALID_TO),
        sf.when(first, ENDINGS["T"]).when(lsn.isNotNull(), ended_by).alias(ENDED_BY),
    ]


def version_step(
    changes: DataFrame,
    columns: Sequence[StructField],
    keys: Sequence[str],
    current: DataFrame,
    facts: BatchFacts | None = None,
) -> VersionStep:
    """The rows that take ``changes`` (one table's, in commit order) into a history whose current
    versions are ``current`` (with the table's columns, whose values fill unchanged TOAST ones);
    ``facts``: the changes' :func:`~.changes.batch_facts` by the first key, when known already."""
    facts = facts or batch_facts(changes, keys[0])
    truncates = _truncates(changes) if facts.truncate is not None else []
    events = build_events(changes, columns, keys)
    filled = sorted(facts.unchanged & {c.name for c in columns})
    unfilled = None
    if filled:
        events = fill_unchanged(events, current, keys, filled)
        unfilled = events.where((sf.col(EVENT_KIND) == UPSERT) & (sf.size(UNFILLED) > 0)).select(
            ROW_KEY, UNFILLED
        )
    order = Window.partitionBy(ROW_KEY).orderBy(COMMIT_LSN, SEQ, SUB)
    # The next event on the key, over every event (a delete ends the version before it).
    following = {f"{_NEXT}{name}": sf.lead(name).over(order) for name in (COMMIT_LSN, SEQ, COMMIT_TIME, OP)}
    lsn, seq, at, op = (sf.col(f"{_NEXT}{name}") for name in (COMMIT_LSN, SEQ, COMMIT_TIME, OP))
    truncate = _first_truncate_after(sf.col(COMMIT_LSN), sf.col(SEQ), truncates) if truncates else None
    versions = (
        events.withColumns(following)
        .where(sf.col(EVENT_KIND) == UPSERT)
        .select(
            *[column(c.name) for c in columns],
            sf.col(COMMIT_LSN).alias(VALID_FROM_LSN),
            *_ending(lsn, seq, at, op, truncate),
            sf.col(COMMIT_TIME).alias(VALID_FROM),
        )
    )
    versions = versions.withColumn(IS_CURRENT, sf.col(VALID_TO_LSN).isNull()).withColumn(
        FLAG, sf.lit(VERSION)
    )
    first = events.withColumn("_rn", sf.row_number().over(order)).where(sf.col("_rn") == 1)
    at_first: Column | None = None
    if truncates:  # every current version ends: at its key's first change, or at the first TRUNCATE
        touched = first.select(ROW_KEY, COMMIT_LSN, SEQ, COMMIT_TIME, OP)
        first = current.select(key_struct(keys).alias(ROW_KEY)).join(touched, ROW_KEY, "left")
        at_first = _truncate_at(*truncates[0])
    ends = first.select(
        *[sf.col(ROW_KEY).getField(k).alias(k) for k in keys],
        *_ending(sf.col(COMMIT_LSN), sf.col(SEQ), sf.col(COMMIT_TIME), sf.col(OP), at_first),
        sf.lit(END).alias(FLAG),
    )
    rows = versions.unionByName(ends, allowMissingColumns=True)
    return VersionStep(rows, unfilled, facts.changes, None if truncates else facts.key_range)


def merge_sql(
    target: str,
    source: str,
    schema: Sequence[StructField],
    carried: Sequence[str],
    keys: Sequence[str],
    bounds: tuple[str, str] | None,
) -> str:
    """The ``MERGE INTO`` of a :class:`VersionStep`'s rows (which carry the columns ``carried``):
    ends update current versions, versions are inserted (a column they lack is NULL). ``bounds``
    (``merge_sql.key_bounds`` of its key range) restrict the versions it reads, as the table's."""
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
    if bounds is not None:
        on += f" AND t.{quote(keys[0])} BETWEEN {bounds[0]} AND {bounds[1]}"
    ends = ", ".join(f"t.{quote(name)} = s.{quote(name)}" for name in (VALID_TO_LSN, VALID_TO, ENDED_BY))
    names = ", ".join(quote(f.name) for f in schema)
    values = ", ".join(f"s.{quote(f.name)}" if f.name in carried else "NULL" for f in schema)
    return (
        f"MERGE INTO {target} t USING {source} s ON s.{FLAG} = '{END}' AND t.{quote(IS_CURRENT)} AND {on} "
        f"WHEN MATCHED THEN UPDATE SET {ends}, t.{quote(IS_CURRENT)} = false "
        f"WHEN NOT MATCHED AND s.{FLAG} = '{VERSION}' THEN INSERT ({names}) VALUES ({values})"
    )
