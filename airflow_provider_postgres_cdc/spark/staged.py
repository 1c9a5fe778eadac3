"""The staged input of the apply job: manifests and Parquet files (docs/FORMATS.md) as Spark reads them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from airflow_provider_postgres_cdc.errors import ApplyError, SchemaConflictError
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest
from airflow_provider_postgres_cdc.spark.changes import COMMIT_LSN, OLD, column
from airflow_provider_postgres_cdc.spark.runtime import SPARK_ERRORS, is_connect
from airflow_provider_postgres_cdc.spark.widening import widened


def read_text(spark: SparkSession, path: str) -> str | None:
    """A small file's text from a local path or any Hadoop file system URI; None when missing."""
    scheme = urlparse(path).scheme
    if scheme in ("", "file") or len(scheme) == 1:
        local = urlparse(path).path if path.startswith("file:") else path
        try:
            with open(local, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
    if is_connect(spark):
        return _client_read(spark, path)
    jvm: Any = spark._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = jpath.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if not fs.exists(jpath):
        return None
    stream = fs.open(jpath)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def _client_read(spark: SparkSession, path: str) -> str | None:
    """A small file read by a Spark Connect client itself, with pyarrow: Spark's readers skip files
    named ``_*`` (the manifest), and the client has no Hadoop. An ``s3``/``s3a`` path is read with
    the ``fs.s3a`` settings the session holds for its bucket (or for every bucket)."""
    from pyarrow import fs as pafs

    parsed = urlparse(path)
    filesystem: Any
    if parsed.scheme in ("s3", "s3a"):

        def setting(name: str) -> str | None:
            for key in (f"fs.s3a.bucket.{parsed.netloc}.{name}", f"fs.s3a.{name}"):
                value = spark.conf.get(key, None)
                if value:
                    return str(value)
            return None

        filesystem = pafs.S3FileSystem(
            access_key=setting("access.key"),
            secret_key=setting("secret.key"),
            session_token=setting("session.token"),
            endpoint_override=setting("endpoint"),
            region=setting("endpoint.region") or "us-east-1",
        )
        where = parsed.netloc + parsed.path
    else:
        filesystem, where = pafs.FileSystem.from_uri(path)
    try:
        with filesystem.open_input_stream(where) as stream:
            return bytes(stream.read()).decode("utf-8")
    except FileNotFoundError:
        return None


def load_manifest(spark: SparkSession, path: str) -> Manifest:
    text = read_text(spark, path)
    if text is None:
        raise ApplyError(
            f"manifest {path} does not exist (an incomplete batch has no manifest: redo its drain)"
        )
    return Manifest.from_json(text)


def base_dir(manifest_path: str) -> str:
    return manifest_path.rsplit("/", 1)[0] if "/" in manifest_path else "."


def key_columns(spec: TableManifest, columns: Sequence[str]) -> list[str]:
    """Replica identity columns; every column for FULL (and NOTHING, which only sees inserts)."""
    if spec.replica_identity in ("f", "n") or not spec.key_columns:
        return list(columns)
    return list(spec.key_columns)


def parquet_reader(spark: SparkSession) -> DataFrameReader:
    """A Parquet reader of staged files, which are proleptic Gregorian (pyarrow, Spark 3 writers)."""
    return spark.read.option("datetimeRebaseMode", "CORRECTED").option("int96RebaseMode", "CORRECTED")


def read_staged(spark: SparkSession, table: str, paths: Sequence[str]) -> DataFrame:
    """Staged files as one frame; files of several relation versions merge to the union of columns.

    A column widened between versions (int to bigint, float4 to float8, a larger numeric
    precision: Spark's schema merge refuses these) is read at its widest type; any other type
    change within one batch is a :class:`SchemaConflictError`.
    Staged dates and timestamps are proleptic Gregorian (pyarrow, and Spark 3 writers): read as
    they are (``CORRECTED``), not refused, as Spark does by default for dates before 1582-10-15.
    """
    try:
        return parquet_reader(spark).option("mergeSchema", "true").parquet(*paths)
    except SPARK_ERRORS:  # CANNOT_MERGE_SCHEMAS arrives unconverted
        pass
    frames = [parquet_reader(spark).parquet(path) for path in paths]
    widest: dict[str, tuple[DataType, str]] = {}
    for path, frame in zip(paths, frames, strict=True):
        fields = [f for f in frame.schema.fields if f.name != OLD]
        if OLD in frame.columns:
            fields += [StructField(f"{OLD}.{f.name}", f.dataType) for f in frame.schema[OLD].dataType.fields]  # type: ignore[attr-defined]
        for col in fields:
            first = widest.setdefault(col.name, (col.dataType, path))
            try:
                wider = widened(first[0], col.dataType)
            except ValueError:  # name the column and the files, rather than Spark's schema dump
                raise SchemaConflictError(
                    f"table {table}: column {col.name!r} changed type from {first[0].simpleString()} "
                    f"({first[1]}) to {col.dataType.simpleString()} ({path}) within one batch; re-snapshot "
                    "the table, or revert the type change"
                ) from None
            if wider is not None:
                widest[col.name] = (wider, first[1])
    cast = [frame.select(*[_widest(frame, name, widest) for name in frame.columns]) for frame in frames]
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), cast)


def _widest(frame: DataFrame, name: str, widest: dict[str, tuple[DataType, str]]) -> Column:
    """Column ``name`` of one staged file at the widest type its versions reach (``_pgl_old`` fields too)."""
    if name == OLD:
        old: StructType = frame.schema[OLD].dataType  # type: ignore[assignment]
        fields = [
            sf.col(OLD).getField(f.name).cast(widest[f"{OLD}.{f.name}"][0]).alias(f.name) for f in old.fields
        ]
        return sf.when(sf.col(OLD).isNull(), sf.lit(None)).otherwise(sf.struct(*fields)).alias(OLD)
    return column(name).cast(widest[name][0]).alias(name)


def files_reaching(spark: SparkSession, paths: Sequence[str], base: int) -> list[str]:
    """The staged files holding a change at or above ``base`` (only the commit LSN column is read)."""
    live = []
    for path in paths:
        row = parquet_reader(spark).parquet(path).agg(sf.max(COMMIT_LSN)).first()
        if row is not None and row[0] is not None and row[0] >= base:
            live.append(path)
    return live


_ARROW_TO_SPARK: dict[str, DataType] = {
    "int16": ShortType(), "int32": IntegerType(), "int64": LongType(), "float": FloatType(),
    "float32": FloatType(), "double": DoubleType(), "float64": DoubleType(), "bool": BooleanType(),
    "string": StringType(), "large_string": StringType(), "binary": BinaryType(),
    "large_binary": BinaryType(), "date32": DateType(), "date32[day]": DateType(),
}  # fmt: skip


def _spark_type(arrow_type: str) -> DataType:
    """Spark type of a manifest ``arrow_type`` (only needed when a table has no staged file at all)."""
    if arrow_type in _ARROW_TO_SPARK:
        return _ARROW_TO_SPARK[arrow_type]
    if arrow_type.startswith("timestamp"):
        return TimestampType() if "tz=" in arrow_type else TimestampNTZType()
    if arrow_type.startswith("decimal"):
        precision, scale = arrow_type[arrow_type.index("(") + 1 : -1].split(",")
        return DecimalType(int(precision), int(scale))
    return StringType()


def declared_schema(spec: TableManifest) -> StructType:
    """Schema of a snapshot table with no staged file, from the manifest's Arrow types."""
    return StructType([StructField(c.name, _spark_type(c.arrow_type), True) for c in spec.columns])
