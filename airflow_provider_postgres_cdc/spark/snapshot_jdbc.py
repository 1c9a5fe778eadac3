"""Copy an exported PostgreSQL snapshot into staged Parquet with Spark's JDBC source: the Spark copy engine.

Runs anywhere pyspark runs: it imports nothing from Airflow, and the package modules it does
import (``errors``) reach it in the zip every job of the package gets (``spark.job_py_files``)::

    spark-submit --packages org.postgresql:postgresql:42.7.8 --py-files postgres_cdc_job.zip \
        snapshot_jdbc.py --spec <job spec JSON file>

The spec is written by ``SnapshotRun.spark_job_spec`` while the slot's replication connection
holds the snapshot open. Every table is read as one JDBC query per ``ctid`` range (each is one
Spark partition), and every partition's connection first runs the spec's ``session_init``,
which imports the exported snapshot, so all partitions of all tables see the database at the
slot's consistent point. Columns arrive as their PostgreSQL text form and are cast here to the
types the local engine and the drain produce (``types.arrow_type``), with ANSI casts so a value
that does not fit fails the job instead of becoming null. A column whose values may not fit its
type (dates, timestamps, decimals: the spec names its ``sibling``) casts only text of the exact
shape the type holds; other values (``infinity``, BC, year 10000, ``NaN``) stay NULL there and
go, as their exact text, to the overflow sibling column, which this engine writes for every such
column (all NULL when nothing overflows; docs/TYPES.md). The JDBC password is read from the
environment variable ``POSTGRES_CDC_JDBC_PASSWORD``, never from the spec.

Exit status 0 on success (a JSON summary on stdout), 2 on an error a user must act on (message
on stderr), 1 on anything unexpected.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from typing import Any

from pyspark import SparkFiles
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf

from airflow_provider_postgres_cdc.errors import JobSpecError

PASSWORD_ENV = "POSTGRES_CDC_JDBC_PASSWORD"  # snapshot.SPARK_PASSWORD_ENV (the engine side imports pyarrow)
FETCH_SIZE = "10000"

_SIMPLE = {
    "bool": "boolean",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float": "float",
    "double": "double",
    "string": "string",
    "date32[day]": "date",
    "timestamp[us]": "timestamp_ntz",
    "timestamp[us, tz=UTC]": "timestamp",
}
_DECIMAL = re.compile(r"^decimal128\((\d+), (-?\d+)\)$")
# Text the typed column holds exactly, per Spark type; anything else overflows (Java regexes).
_FITS = {
    "date": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    "timestamp_ntz": r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?$",
    "timestamp": (
        r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?[+-][0-9]{2}(:[0-9]{2})?$"
    ),
    "decimal": r"^-?[0-9]+(\.[0-9]+)?$",
}


def spark_type(arrow_type: str) -> str | None:
    """The Spark SQL type for an Arrow type string of the staged format, or None if unsupported."""
    if arrow_type in _SIMPLE:
        return _SIMPLE[arrow_type]
    match = _DECIMAL.match(arrow_type)
    if match:
        return f"decimal({match.group(1)}, {match.group(2)})"
    if arrow_type == "binary":
        return "binary"
    return None


def typed_column(name: str, arrow_type: str) -> Column:
    """Cast one text column to its staged type (bytea's hex text ``\\x0a1b`` through ``unhex``)."""
    text = sf.col(f"`{name.replace('`', '``')}`")
    if arrow_type == "binary":
        return sf.unhex(sf.substring(text, 3, 2**31 - 1)).alias(name)
    target = spark_type(arrow_type)
    if target is None:
        raise JobSpecError(f"column {name!r}: staged type {arrow_type} is not supported by the Spark engine")
    return text.cast(target).alias(name)


def typed_columns(column: dict[str, Any]) -> list[Column]:
    """A spec column's typed column, then its overflow sibling if the spec names one."""
    name, sibling = column["name"], column.get("sibling")
    if not sibling:
        return [typed_column(name, column["arrow_type"])]
    target = spark_type(column["arrow_type"])
    if target is None:
        raise JobSpecError(f"column {name!r}: staged type {column['arrow_type']} is not supported")
    text = sf.col(f"`{name.replace('`', '``')}`")
    fits = text.rlike(_FITS[target.split("(")[0]])
    return [
        sf.when(fits, text.cast(target)).alias(name),
        sf.when(text.isNotNull() & ~fits, text).alias(sibling),
    ]


def check_spec(spec: dict[str, Any]) -> None:
    """Refuse unsupported column types before reading anything."""
    problems = [
        f"{table['name']}.{column['name']} ({column['arrow_type']})"
        for table in spec["tables"]
        for column in table["columns"]
        if spark_type(column["arrow_type"]) is None
    ]
    if problems:
        raise JobSpecError(
            "the Spark copy engine cannot type these columns: "
            + ", ".join(problems)
            + "; use the local copy engine for these tables"
        )


def read_table(spark: SparkSession, spec: dict[str, Any], table: dict[str, Any]) -> DataFrame:
    """One JDBC read per ctid range, unioned: each range is one partition on the shared snapshot."""
    properties = {
        **spec["properties"],
        "driver": "org.postgresql.Driver",
        "sessionInitStatement": spec["session_init"],
        "fetchsize": FETCH_SIZE,
    }
    password = os.environ.get(PASSWORD_ENV)
    if password:
        properties["password"] = password
    parts = [
        spark.read.jdbc(spec["jdbc_url"], f"({query}) AS pgl_range", properties=properties)
        for query in table["queries"]
    ]
    frame = functools.reduce(DataFrame.unionAll, parts)
    return frame.select(*[typed for c in table["columns"] for typed in typed_columns(c)])


def load_spec(path: str) -> dict[str, Any]:
    """The spec from a local path, or from the files shipped with ``--files`` (cluster mode)."""
    if not os.path.exists(path):
        path = SparkFiles.get(os.path.basename(path))
    with open(path, encoding="utf-8") as handle:
        spec: dict[str, Any] = json.load(handle)
    return spec


def run(spark: SparkSession, spec: dict[str, Any]) -> dict[str, Any]:
    check_spec(spec)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # Proleptic Gregorian, like every other writer of staged files (no rebase, no refusal pre-1582).
    spark.conf.set("spark.sql.parquet.datetimeRebaseModeInWrite", "CORRECTED")
    spark.conf.set("spark.sql.parquet.compression.codec", "snappy")
    written = {}
    for table in spec["tables"]:
        read_table(spark, spec, table).write.mode("overwrite").parquet(table["output"])
        written[table["name"]] = table["output"]
    return {"tables": written}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy an exported snapshot to staged Parquet via JDBC.")
    parser.add_argument("--spec", required=True, help="job spec JSON written by SnapshotRun.spark_job_spec")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("postgres-cdc-snapshot").getOrCreate()
    try:
        summary = run(spark, load_spec(args.spec))
    except JobSpecError as exc:
        print(f"snapshot_jdbc: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
