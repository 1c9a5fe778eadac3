"""The merge algebra of tables without a key: a batch's changes as a count per distinct row.

A keyless table (replica identity NOTHING, or DEFAULT without a primary key: only INSERTs and
TRUNCATEs reach it) and a REPLICA IDENTITY FULL table hold a multiset of rows: two identical rows
are two rows, and a DELETE removes one of them. Such a table's batch is therefore reduced to a
count per distinct row value (``delta`` = inserts - deletes, an UPDATE being -old +new), not to
one event per key as ``changes.py`` does for keyed tables.

With REPLICA IDENTITY FULL the server logs the whole old row, external TOAST values inlined, so
an UPDATE's old tuple (``_pgl_old``) carries every value and only its new tuple has unchanged
(``'u'``) columns: those are the same change's old values. No lookup in the table or in earlier
changes is needed.

Pure functions over DataFrames plus the SQL text of the one ``MERGE INTO`` that applies the
result; the Iceberg commit itself stays in ``apply_batch.py`` (as pyiceberg's ``upsert_util``
keeps its algebra apart from the transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, MapType, StructField, StructType

from airflow_provider_postgres_cdc.errors import ApplyError
from airflow_provider_postgres_cdc.formats.manifest import SIBLING_SUFFIX, TableManifest
from airflow_provider_postgres_cdc.spark.changes import (
    OLD,
    OP,
    ROW_KEY,
    UNCHANGED,
    column,
    materialize,
    order_after,
)
from airflow_provider_postgres_cdc.spark.sql_text import quote, temp_view

DELTA = "_pgl_x_delta"  # inserts - deletes of one distinct row value
COUNT = "_pgl_x_count"  # rows of that value the table holds before the batch
FLAG = "_pgl_x_flag"  # REPLACE: delete every equal row; INSERT: a row to add (never matches)
REPLACE, INSERT = "R", "I"
_MARK = "_pgl_x_mark"


@dataclass(frozen=True)
class MultisetEffect:
    """A batch's net effect on a multiset table.

    ``deltas`` has the table columns plus ``DELTA`` (never 0), one row per distinct row value the
    batch changed the count of; ``truncated`` means a TRUNCATE came first, so the table starts
    empty and every delta is a final count.
    """

    deltas: DataFrame
    truncated: bool


def live_columns(columns: Sequence[StructField], spec: TableManifest) -> list[StructField]:
    """The batch's columns a multiset compares rows by: those its newest relation version still has.

    After a DROP COLUMN the changes' old tuples (and the source) lack the column while the lake's
    rows and the batch's earlier changes hold values in it, so a row removed after the DROP would
    never be found equal to its copy. Left out, the column is written as null in the rows this
    batch writes, as one dropped in an earlier batch is (the lake keeps it, no longer written).
    """
    if not spec.versions:  # a manifest from before relation versions were recorded
        return list(columns)
    live = {c.name for c in spec.versions[-1].columns}
    kept = [c for c in columns if c.name.removesuffix(SIBLING_SUFFIX) in live]
    return kept or list(columns)


def _has_float(dtype: DataType) -> bool:
    if isinstance(dtype, FloatType | DoubleType):
        return True
    if isinstance(dtype, ArrayType):
        return _has_float(dtype.elementType)
    if isinstance(dtype, MapType):
        return _has_float(dtype.keyType) or _has_float(dtype.valueType)
    if isinstance(dtype, StructType):
        return any(_has_float(f.dataType) for f in dtype.fields)
    return False


def _exact(reference: str, dtype: DataType) -> str:
    """A column as the multiset compares it: floats by their text, since Spark's equality, grouping
    and joins take ``-0.0`` for ``0.0`` (PostgreSQL keeps them apart in a row's text)."""
    return f"CAST({reference} AS STRING)" if _has_float(dtype) else reference


def _equal(columns: Sequence[StructField], left: str, right: str) -> Column:
    """Null-safe equality of every column (NULL equals NULL, NaN equals NaN, -0.0 is not 0.0)."""
    return sf.expr(" AND ".join(_pairs(columns, left, right)) or "TRUE")


def _pairs(columns: Sequence[StructField], left: str, right: str) -> list[str]:
    """SQL ``<=>`` terms comparing each column of ``left`` and ``right`` exactly."""
    terms = []
    for c in columns:
        name = quote(c.name)
        terms.append(f"{_exact(f'{left}.{name}', c.dataType)} <=> {_exact(f'{right}.{name}', c.dataType)}")
    return terms


def _count_by_row(rows: DataFrame, columns: Sequence[StructField], measure: Column, alias: str) -> DataFrame:
    """``measure`` aggregated per distinct row, the rows compared as :func:`_equal` does."""
    keys = [f"_pgl_x_k{i}" for i in range(len(columns))]
    keyed = rows.select(
        "*",
        *[sf.expr(_exact(quote(c.name), c.dataType)).alias(k) for c, k in zip(columns, keys, strict=True)],
    )
    return (
        keyed.groupBy(*keys)
        .agg(*[sf.first(column(c.name)).alias(c.name) for c in columns], measure.alias(alias))
        .drop(*keys)
    )


def net_counts(
    changes: DataFrame, columns: Sequence[StructField], table: str, truncate: tuple[int, int] | None
) -> MultisetEffect:
    """Reduce ordered changes to a count delta per distinct row value (after the last TRUNCATE).

    Order within the batch does not matter to a count, except for a TRUNCATE (``truncate``, the
    last one's position, from ``changes.batch_facts``): the changes before it are dropped (it
    removed their rows) and the table starts empty.
    """
    live = changes if truncate is None else changes.where(order_after(*truncate))
    blind = live.where(sf.col(OP).isin("U", "D") & sf.col(OLD).isNull()).limit(1).count()
    if blind:
        raise ApplyError(
            f"table {table}: an UPDATE or DELETE arrived without its old row, so the row it changed "
            "cannot be found in a table without a key; set REPLICA IDENTITY FULL (or add a primary "
            "key) on the source table and re-snapshot it"
        )
    old_type = live.schema[OLD].dataType
    old_fields = set(old_type.fieldNames()) if isinstance(old_type, StructType) else set()

    def old(field: StructField) -> Column:
        if field.name in old_fields:
            return sf.col(OLD).getField(field.name)
        return sf.lit(None).cast(field.dataType)

    new_row = [
        sf.when(sf.array_contains(UNCHANGED, c.name), old(c)).otherwise(column(c.name)).alias(c.name)
        for c in columns
    ]
    added = live.where(sf.col(OP).isin("I", "U")).select(*new_row, sf.lit(1).alias(DELTA))
    removed = live.where(sf.col(OP).isin("U", "D")).select(
        *[old(c).alias(c.name) for c in columns], sf.lit(-1).alias(DELTA)
    )
    deltas = _count_by_row(added.unionByName(removed), columns, sf.sum(DELTA), DELTA)
    return MultisetEffect(materialize(deltas.where(sf.col(DELTA) != 0)), truncate is not None)


def removals(effect: MultisetEffect, names: Sequence[str]) -> DataFrame:
    """The values whose count the batch lowers, with their row as ``ROW_KEY`` (for key bounds)."""
    rows = effect.deltas.where(sf.col(DELTA) < 0)
    return rows.withColumn(ROW_KEY, sf.struct(*[column(n).alias(n) for n in names]))


def _with_counts(decreased: DataFrame, existing: DataFrame, columns: Sequence[StructField]) -> DataFrame:
    """``decreased`` plus ``COUNT``: how many rows of ``existing`` equal each value.

    The values (few) are broadcast and the table scanned once; a left join of the small side
    afterwards keeps values the table does not hold (count 0, which the caller refuses).
    """
    names = [c.name for c in columns]
    values = decreased.select(*[column(n) for n in names]).alias("v")
    matched = (
        existing.select(*[column(n) for n in names])
        .alias("t")
        .join(sf.broadcast(values), _equal(columns, "t", "v"))
        .select(*[sf.col("v." + quote(n)).alias(n) for n in names])
    )
    held = _count_by_row(matched, columns, sf.count(sf.lit(1)), COUNT).withColumn(_MARK, sf.lit(True))
    joined = decreased.alias("d").join(held.alias("h"), _equal(columns, "d", "h"), "left")
    return joined.select(
        *[sf.col("d." + quote(n)).alias(n) for n in names],
        sf.col("d." + DELTA).alias(DELTA),
        sf.when(sf.col("h." + _MARK), sf.col("h." + COUNT)).otherwise(sf.lit(0)).alias(COUNT),
    )


def _copies(rows: DataFrame, how_many: Column, names: Sequence[str], flag: str) -> DataFrame:
    """Each row repeated ``how_many`` times (0 drops it)."""
    repeated = rows.withColumn(_MARK, sf.explode(sf.array_repeat(sf.lit(True), how_many.cast("int"))))
    return repeated.select(*[column(n) for n in names], sf.lit(flag).alias(FLAG))


def merge_source(
    effect: MultisetEffect,
    existing: DataFrame,
    columns: Sequence[StructField],
    table: str,
    bounds: tuple[str, str] | None = None,
) -> DataFrame:
    """The rows one MERGE applies the effect with: per lowered value, one ``REPLACE`` row that
    deletes every equal row of the table and ``count + delta`` ``INSERT`` rows that put the
    survivors back; per raised value, ``delta`` ``INSERT`` rows (no lookup needed).

    ``existing`` is the table as of the read snapshot (ignored when truncated: it starts empty);
    ``bounds`` (SQL literals of the lowered values' first column) restrict the rows scanned for counts.
    Raises :class:`ApplyError` when a value would end below zero: the stream removes rows the
    table does not hold, so the table diverged from its source.
    """
    names = [c.name for c in columns]
    added = effect.deltas.where(sf.col(DELTA) > 0)
    inserts = _copies(added, sf.col(DELTA), names, INSERT)
    decreased = effect.deltas.where(sf.col(DELTA) < 0)
    if effect.truncated:
        if decreased.limit(1).count():
            _diverged(table)
        return inserts
    scanned = existing
    if bounds is not None:
        scanned = existing.where(f"{quote(names[0])} BETWEEN {bounds[0]} AND {bounds[1]}")
    counted = materialize(_with_counts(decreased, scanned, columns))
    if counted.where(sf.col(COUNT) + sf.col(DELTA) < 0).limit(1).count():
        _diverged(table)
    replaced = counted.select(*[column(n) for n in names], sf.lit(REPLACE).alias(FLAG))
    survivors = _copies(counted, sf.col(COUNT) + sf.col(DELTA), names, INSERT)
    return replaced.unionByName(survivors).unionByName(inserts)


def _diverged(table: str) -> None:
    raise ApplyError(
        f"table {table}: the batch deletes more copies of a row than the lake table holds, so the lake "
        "no longer equals its source (written by something other than this pipeline?); re-snapshot "
        "the table (the re-snapshot task group) and re-run the apply"
    )


def replay(
    rows: DataFrame,
    changes: DataFrame,
    columns: Sequence[StructField],
    table: str,
    truncate: tuple[int, int] | None,
) -> DataFrame:
    """A snapshot's rows with logged changes applied (``truncate`` as in :func:`net_counts`): the
    catch-up of a re-snapshot load.

    Logged columns the snapshot lacks (dropped before it, or added after it) are null in its
    rows, as the changes' old tuples hold them.
    """
    held = set(rows.columns)
    rows = rows.select(
        "*", *[sf.lit(None).cast(c.dataType).alias(c.name) for c in columns if c.name not in held]
    )
    effect = net_counts(changes, columns, table, truncate)
    source = merge_source(effect, rows, columns, table)
    kept = rows.limit(0) if effect.truncated else rows
    replaced = source.where(sf.col(FLAG) == REPLACE)
    kept = kept.alias("k").join(replaced.alias("r"), _equal(columns, "k", "r"), "left_anti")
    added = source.where(sf.col(FLAG) == INSERT).drop(FLAG)
    return kept.unionByName(added, allowMissingColumns=True)


def merge_statement(
    effect: MultisetEffect,
    existing: DataFrame,
    target: str,
    schema: StructType,
    columns: Sequence[StructField],
    table: str,
    bounds: tuple[str, str] | None = None,
) -> str | None:
    """The SQL that applies ``effect`` to ``target`` in one commit, or None when it changes nothing.

    With rows to remove (or a TRUNCATE): one ``MERGE INTO`` whose ON clause only ``REPLACE`` rows
    can satisfy (the flag is in it); each target row equals at most one of them (their values are
    distinct), so Spark never sees several source rows matching one target row. ``bounds``
    restrict the first column of the rows a ``REPLACE`` can match, so Iceberg skips files outside
    the batch's range. With inserts only: an ``INSERT INTO``, which reads nothing of the table.
    Columns the batch does not carry (dropped at the source) are written as null, as in the
    keyed merge.
    """
    if not effect.truncated and not effect.deltas.limit(1).count():
        return None
    names = [c.name for c in columns]
    source = materialize(merge_source(effect, existing, columns, table, bounds))
    view = temp_view(source)
    carried = set(names)
    values = ", ".join(f"s.{quote(f.name)}" if f.name in carried else "NULL" for f in schema.fields)
    if not effect.truncated and not source.where(sf.col(FLAG) == REPLACE).limit(1).count():
        return f"INSERT INTO {target} SELECT {values} FROM {view} s"
    on = f"s.{FLAG} = '{REPLACE}' AND " + " AND ".join(_pairs(columns, "t", "s"))
    if bounds is not None:
        on += f" AND t.{quote(names[0])} BETWEEN {bounds[0]} AND {bounds[1]}"
    listed = ", ".join(quote(f.name) for f in schema.fields)
    statement = (
        f"MERGE INTO {target} t USING {view} s ON {on} WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s.{FLAG} = '{INSERT}' THEN INSERT ({listed}) VALUES ({values})"
    )
    return statement + (" WHEN NOT MATCHED BY SOURCE THEN DELETE" if effect.truncated else "")
