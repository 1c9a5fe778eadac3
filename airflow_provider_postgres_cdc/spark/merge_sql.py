"""The ``MERGE INTO`` that applies a batch's net effect to an Iceberg table, and its key-range pruning.

The statement is built as text for Spark SQL: names are quoted with :func:`~.sql_text.quote`, and
the key bounds are literals written exactly (strings as bytes, so no quote needs escaping).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import (
    ByteType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from airflow_provider_postgres_cdc.formats.deletes import DELETED_AT, DELETED_LSN
from airflow_provider_postgres_cdc.spark.changes import COMMIT_LSN, COMMIT_TIME, EVENT_KIND, ROW_KEY, UPSERT
from airflow_provider_postgres_cdc.spark.sql_text import quote

_EXACT = (ByteType, ShortType, IntegerType, LongType, DecimalType, StringType, DateType)


def key_bounds(key_range: tuple[Any, Any] | None, dtype: DataType) -> tuple[str, str] | None:
    """SQL literals of a batch's first-key range (lowest, highest), or None.

    None when a bound could not prune anything or not be written exactly: no range (no rows, or
    a null key: REPLICA IDENTITY FULL rows match on null too), or a type without an exact literal.
    """
    if key_range is None or not isinstance(dtype, _EXACT):
        return None
    return _literal(key_range[0], dtype), _literal(key_range[1], dtype)


def row_key_range(rows: DataFrame, key: str) -> tuple[Any, Any] | None:
    """The lowest and highest ``key`` field of ``rows``' ``ROW_KEY`` (one Spark job), None when a
    row has none."""
    field = sf.col(ROW_KEY).getField(key)
    row = rows.agg(sf.min(field), sf.max(field), sf.count(sf.lit(1)), sf.count(field)).first()
    if row is None or row[2] == 0 or row[2] != row[3]:
        return None
    return row[0], row[1]


def _literal(value: Any, dtype: DataType) -> str:
    if isinstance(dtype, StringType):  # bytes, so no quote or backslash in the name needs escaping
        return f"CAST(X'{str(value).encode('utf-8').hex()}' AS STRING)"
    if isinstance(dtype, DateType):
        return f"DATE '{value.isoformat()}'"
    return f"CAST('{value}' AS {dtype.simpleString()})"


def merge_sql(
    target: str,
    source: str,
    schema: StructType,
    columns: Sequence[StructField],
    keys: Sequence[str],
    truncated: bool,
    bounds: tuple[str, str] | None = None,
    soft: bool = False,
    truncate_mark: tuple[int, int] | None = None,
) -> str:
    """One ``MERGE INTO`` of a batch's net effect: delete, update, insert, and for a TRUNCATE the rest.

    Columns the batch does not carry (dropped at the source) are written as null in its rows.
    ``soft`` (a soft-deletes table, ``spark/soft_deletes.py``) marks deleted rows instead, with
    ``truncate_mark`` (the TRUNCATE's commit LSN and time in µs) when ``truncated``; the marks are
    columns the batch does not carry, so an upsert clears them.
    ``bounds`` (the batch's first-key range) restrict the target rows the MERGE reads: no row
    outside it can match, and with key-ordered files Iceberg skips every file outside it, so an
    OLTP batch (recent keys) reads a few files however large the table is.
    """
    carried = {c.name for c in columns}

    def value(name: str) -> str:
        return f"s.{quote(name)}" if name in carried else "NULL"

    on = " AND ".join(f"t.{quote(k)} <=> s.{ROW_KEY}.{quote(k)}" for k in keys)
    if bounds is not None:
        on += f" AND t.{quote(keys[0])} BETWEEN {bounds[0]} AND {bounds[1]}"
    sets = ", ".join(f"t.{quote(f.name)} = {value(f.name)}" for f in schema.fields)
    names = ", ".join(quote(f.name) for f in schema.fields)
    values = ", ".join(value(f.name) for f in schema.fields)
    kind = f"s.{EVENT_KIND}"
    at, lsn = quote(DELETED_AT), quote(DELETED_LSN)
    delete = f"UPDATE SET t.{at} = s.{COMMIT_TIME}, t.{lsn} = s.{COMMIT_LSN}" if soft else "DELETE"
    statement = (
        f"MERGE INTO {target} t USING {source} s ON {on} "
        f"WHEN MATCHED AND {kind} = 'D' THEN {delete} "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND {kind} = '{UPSERT}' THEN INSERT ({names}) VALUES ({values})"
    )
    if not truncated:
        return statement
    if soft:  # every row the TRUNCATE found and no later change touched
        if truncate_mark is None:
            raise ValueError("a soft-deletes MERGE of a TRUNCATE needs the TRUNCATE's commit LSN and time")
        mark = f"t.{at} = timestamp_micros({int(truncate_mark[1])}), t.{lsn} = {int(truncate_mark[0])}"
        return statement + f" WHEN NOT MATCHED BY SOURCE AND t.{lsn} IS NULL THEN UPDATE SET {mark}"
    return statement + " WHEN NOT MATCHED BY SOURCE THEN DELETE"
