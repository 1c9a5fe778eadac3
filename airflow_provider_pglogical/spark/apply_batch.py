"""Apply a staged snapshot or change batch (docs/FORMATS.md) to lake tables: the PySpark apply job.

Runs anywhere pyspark runs: it imports nothing from Airflow or from the rest of its package, so it
can be shipped as this single file::

    spark-submit apply_batch.py --manifest <staging>/<slot>/<batch id>/_manifest.json \
        --target <target root> [--tables public.orders,public.items] [--rows-per-range 250000]

Exit status 0 on success (a JSON summary is printed on stdout), 2 on an error a user must act on
(message on stderr, e.g. an incompatible column type change), 1 on anything unexpected.

Target layout (why: docs/TARGET_LAYOUT.md). ``<target>/<schema>.<table>/`` holds

* ``data/<batch id>-<attempt>/_pgl_x_range=<i>/part-*.parquet``: the table's rows, split into key
  ranges on its first key column; each load or batch writes new files only for the ranges it touched;
* ``_state/<version>.json``: the table's current state, the highest version wins: schema, key,
  range boundaries, the file directory of every range, the base LSN (end LSN of the newest
  snapshot load) and the end LSN of the last applied batch. A new version is written to a
  temporary name and renamed, so a crash leaves either the old or the new state, never a mix.

Older ``data/`` directories are superseded, not deleted, so a plain ``spark.read.parquet`` of the
table directory would see stale rows: read a table with :func:`read_table` (current rows, the
current schema, null for columns a file predates) or :func:`table_files`.

``<target>/_changelog/<schema>.<table>/batch_id=<batch id>/`` holds every change of a batch above
the table's base LSN, as staged (the row, then ``_pgl_*`` metadata), overwritten by a re-run so each
change is there once; ``spark.read.option("mergeSchema", "true").parquet(<that directory's parent>)`` reads
them all, with a ``batch_id`` column.
``<target>/_ledger/<slot>/<batch id>/<schema>.<table>.json`` records an applied batch or snapshot
load per table (slot, batch_id, kind, start_lsn, end_lsn, table, applied_at); it is written after
every table of the run is switched, so a batch in the ledger is durably applied and may be acked.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlparse

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import Column, DataFrame, SparkSession, Window
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
    TimestampType,
)

log = logging.getLogger("pglogical.apply")

FORMAT_VERSION = 1
DEFAULT_ROWS_PER_RANGE = 250_000
# A range is split once it holds this many times the target rows (inserts with growing keys land
# in the last range, which would otherwise grow without bound and be rewritten by every batch).
SPLIT_FACTOR = 2
# Times one table is redone when another job publishes its state first.
CONFLICT_ATTEMPTS = 5

# Working columns; staged table columns never start with the reserved ``_pgl_`` prefix.
RANGE = "_pgl_x_range"
_C, _S, _SUB, _KIND, _K, _L = (
    "_pgl_commit_lsn",
    "_pgl_seq",
    "_pgl_x_sub",
    "_pgl_x_kind",
    "_pgl_x_k",
    "_pgl_x_l",
)
_ID, _PRED, _PROBE, _KEY, _ORD = "_pgl_x_id", "_pgl_x_pred", "_pgl_x_probe", "_pgl_x_key", "_pgl_x_ord"
_V, _U, _PTR, _TL = "_pgl_x_v", "_pgl_x_u", "_pgl_x_ptr", "_pgl_x_tl"
UPSERT, DELETE = "U", "D"


class ApplyError(Exception):
    """A failure the user must act on; ``main`` prints the message and exits with status 2."""


class SchemaConflictError(ApplyError):
    """A column's type changed in a way the target cannot hold."""


class ConcurrentWriteError(ApplyError):
    """Another job published the state version this job meant to write: redo the table from the new one."""


# ---------------------------------------------------------------------------------------- LSNs


def parse_lsn(text: str) -> int:
    """PostgreSQL ``X/Y`` text to the 64-bit WAL position."""
    high, sep, low = text.strip().partition("/")
    if not sep:
        raise ApplyError(f"not an LSN: {text!r} (expected the form 'X/Y', e.g. '0/16B3748')")
    return (int(high, 16) << 32) | int(low, 16)


# ------------------------------------------------------------------------------------- storage


class Storage:
    """Small-file I/O for manifests, states and the ledger: Python for local paths, Hadoop FS otherwise.

    Renaming a finished temporary file is the one atomic step everything relies on: ``os.replace``
    locally, ``FileSystem.rename`` on HDFS (object stores copy, but each object appears whole).
    """

    def __init__(self, spark: SparkSession | None = None) -> None:
        self._spark = spark  # only needed for non-local paths

    @staticmethod
    def is_local(path: str) -> bool:
        """Whether ``path`` is on the local filesystem (no scheme, or ``file:``)."""
        scheme = urlparse(path).scheme
        return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter is not a scheme

    @staticmethod
    def local(path: str) -> str:
        """The OS path of a local path or ``file:`` URI."""
        return urlparse(path).path if path.startswith("file:") else path

    def _fs(self, path: str) -> tuple[Any, Any]:
        if self._spark is None:
            raise ApplyError(f"{path} is not a local path: pass a SparkSession to use Hadoop's FileSystem")
        jvm: Any = self._spark._jvm
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        return jpath.getFileSystem(self._spark._jsc.hadoopConfiguration()), jpath  # type: ignore[union-attr]

    def read_text(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        if self.is_local(path):
            try:
                with open(self.local(path), encoding="utf-8") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return None
        stream = fs.open(jpath)
        try:
            jvm: Any = self._spark._jvm  # type: ignore[union-attr]
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_atomic(self, path: str, text: str, *, replace: bool) -> None:
        """Write ``text`` to a temporary sibling, then rename it onto ``path``.

        With ``replace=False`` an existing ``path`` is an error (two writers raced for one state
        version); with ``replace=True`` it is overwritten (ledger rows are rewritten by re-runs).
        """
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        if self.is_local(path):
            final, tmp = self.local(path), self.local(tmp)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            if replace:
                os.replace(tmp, final)
                return
            try:
                os.link(tmp, final)  # atomic and exclusive: exactly one of two racing writers wins
            except FileExistsError:
                raise ConcurrentWriteError(f"{path} already exists: another job wrote this table") from None
            finally:
                os.unlink(tmp)
            return
        fs, jfinal = self._fs(path)
        _, jtmp = self._fs(tmp)
        stream = fs.create(jtmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        if fs.exists(jfinal):
            if not replace:
                fs.delete(jtmp, False)
                raise ConcurrentWriteError(f"{path} already exists: another job wrote this table")
            fs.delete(jfinal, False)
        if not fs.rename(jtmp, jfinal):
            if not replace and fs.exists(jfinal):  # another writer's version landed between check and rename
                fs.delete(jtmp, False)
                raise ConcurrentWriteError(f"{path} already exists: another job wrote this table")
            raise ApplyError(f"could not rename {tmp} to {path}")

    def list_names(self, path: str) -> list[str]:
        """Names of the entries of directory ``path`` (empty when it does not exist)."""
        if self.is_local(path):
            try:
                return sorted(os.listdir(self.local(path)))
            except FileNotFoundError:
                return []
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return []
        return sorted(str(status.getPath().getName()) for status in fs.listStatus(jpath))


def join_path(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (also right for URIs)."""
    return "/".join([base.rstrip("/"), *parts])


def table_dir_name(schema: str, table: str) -> str:
    """``<schema>.<table>`` with ``/``, ``%`` and ``.`` percent-encoded inside either part (FORMATS.md)."""

    def enc(part: str) -> str:
        return quote(part, safe="").replace(".", "%2E") if any(c in part for c in "/%.") else part

    return f"{enc(schema)}.{enc(table)}"


# ------------------------------------------------------------------------------------ manifest


@dataclass(frozen=True)
class TableSpec:
    """One table entry of a manifest."""

    schema: str
    table: str
    columns: list[dict[str, Any]]
    key_columns: list[str]
    replica_identity: str
    files: list[str]

    @property
    def name(self) -> str:
        return table_dir_name(self.schema, self.table)


@dataclass(frozen=True)
class Manifest:
    """A staged snapshot or batch, as read from its ``_manifest.json``."""

    kind: str
    slot: str
    batch_id: str
    start_lsn: str
    end_lsn: str
    tables: list[TableSpec]
    base_dir: str


def load_manifest(storage: Storage, path: str) -> Manifest:
    """Read and check a ``_manifest.json``; staged file paths are relative to its directory."""
    text = storage.read_text(path)
    if text is None:
        raise ApplyError(
            f"manifest {path} does not exist (an incomplete batch has no manifest: redo its drain)"
        )
    try:
        raw = json.loads(text)
        if raw.get("format_version") != FORMAT_VERSION:
            raise ApplyError(
                f"manifest {path} has format_version {raw.get('format_version')!r}; this job reads "
                f"{FORMAT_VERSION}: use the apply job shipped with the provider that staged it"
            )
        if raw["kind"] not in ("snapshot", "batch"):
            raise ApplyError(f"manifest {path}: kind must be 'snapshot' or 'batch', not {raw['kind']!r}")
        tables = [
            TableSpec(
                schema=t["schema"],
                table=t["table"],
                columns=list(t.get("columns") or []),
                key_columns=list(t.get("key_columns") or []),
                replica_identity=t.get("replica_identity") or "d",
                files=list(t.get("files") or []),
            )
            for t in raw["tables"]
        ]
        return Manifest(
            kind=raw["kind"],
            slot=raw["slot"],
            batch_id=raw["batch_id"],
            start_lsn=raw["start_lsn"],
            end_lsn=raw["end_lsn"],
            tables=tables,
            base_dir=path.rsplit("/", 1)[0] if "/" in path else ".",
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ApplyError(f"manifest {path} is malformed ({exc!r}); see docs/FORMATS.md") from exc


# --------------------------------------------------------------------------------- table state


@dataclass
class KeyRange:
    """Rows whose range column is >= ``lo`` (encoded, None = lowest) and below the next range's ``lo``."""

    lo: str | None
    path: str | None  # relative to the table directory; None when the range holds no rows
    rows: int


@dataclass
class TableState:
    """One ``_state/<version>.json`` of a target table."""

    schema: str
    table: str
    columns: dict[str, Any]  # StructType.jsonValue()
    key_columns: list[str]
    replica_identity: str
    range_column: str
    base_lsn: str
    snapshot_id: str | None
    applied_end_lsn: str
    applied_batch_id: str
    ranges: list[KeyRange]
    version: int = 0
    updated_at: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def struct(self) -> StructType:
        return StructType.fromJson(self.columns)


def _state_dir(root: str) -> str:
    return join_path(root, "_state")


def read_state(storage: Storage, root: str) -> TableState | None:
    """The newest complete state version of the table at ``root``, or None for a new table."""
    versions = [name for name in storage.list_names(_state_dir(root)) if name.endswith(".json")]
    if not versions:
        return None
    text = storage.read_text(join_path(_state_dir(root), max(versions)))
    if text is None:
        raise ApplyError(
            f"state {max(versions)} of {root} vanished while being read: is another job running?"
        )
    raw = json.loads(text)
    raw["ranges"] = [KeyRange(**r) for r in raw["ranges"]]
    return TableState(**raw)


def write_state(storage: Storage, root: str, state: TableState) -> None:
    """Publish ``state`` as the next version: this rename is the table's commit point."""
    state.version += 1
    state.updated_at = datetime.now(UTC).isoformat(timespec="seconds")
    storage.write_atomic(
        join_path(_state_dir(root), f"{state.version:020d}.json"),
        json.dumps(asdict(state), indent=1),
        replace=False,
    )


def table_files(spark: SparkSession, target: str, schema: str, table: str) -> tuple[StructType, list[str]]:
    """The current schema and range directories of a target table (for readers other than Spark)."""
    root = join_path(target, table_dir_name(schema, table))
    state = read_state(Storage(spark), root)
    if state is None:
        raise ApplyError(f"no table {schema}.{table} under {target} (no snapshot load or batch applied yet)")
    return state.struct, [join_path(root, r.path) for r in state.ranges if r.path]


def read_table(spark: SparkSession, target: str, schema: str, table: str) -> DataFrame:
    """The current rows of a target table: ``read_table(spark, "/lake", "public", "orders")``."""
    struct, paths = table_files(spark, target, schema, table)
    if not paths:
        return spark.createDataFrame([], struct)
    return spark.read.schema(struct).parquet(*paths)


# ------------------------------------------------------------------------------ ranges routing


def _encode(column: Column, dtype: DataType) -> Column:
    """A range boundary as text that round-trips exactly and independently of the session time zone."""
    if isinstance(dtype, TimestampType):
        return sf.unix_micros(column).cast("string")
    if isinstance(dtype, BinaryType):
        return sf.base64(column)
    return column.cast("string")


def _decode(text: str, dtype: DataType) -> Column:
    if isinstance(dtype, TimestampType):
        return sf.timestamp_micros(sf.lit(int(text)))
    if isinstance(dtype, BinaryType):
        return sf.unbase64(sf.lit(text))
    return sf.lit(text).cast(dtype)


def route(column: Column, dtype: DataType, ranges: Sequence[KeyRange]) -> Column:
    """The index of the range holding ``column``: a binary search of CASE expressions (depth log n).

    A null (only possible in REPLICA IDENTITY FULL tables) compares as unknown and lands in range 0.
    """
    bounds = [_decode(r.lo, dtype) if r.lo is not None else sf.lit(None) for r in ranges]

    def search(lo: int, hi: int) -> Column:
        if lo == hi:
            return sf.lit(lo)
        mid = (lo + hi + 1) // 2
        return sf.when(column >= bounds[mid], search(mid, hi)).otherwise(search(lo, mid - 1))

    return search(0, len(ranges) - 1)


def split_points(df: DataFrame, column: str, rows: int, parts: int) -> list[str]:
    """Encoded lower bounds splitting ``df`` (``rows`` rows) into about ``parts`` ranges of ``column``.

    Quantiles of a sample of ~200 values per part, sorted by Spark (so in Spark's order for any
    type); the lowest range's bound is implicit and not returned.
    """
    if parts <= 1 or rows <= 0:
        return []
    dtype = df.schema[column].dataType
    sample = [
        row[0]
        for row in df.select(column)
        .where(sf.col(column).isNotNull())
        .sample(fraction=min(1.0, 200 * parts / rows), seed=17)
        .orderBy(column)
        .select(_encode(sf.col(column), dtype))
        .collect()
    ]
    points: list[str] = []
    for j in range(1, parts):
        value = sample[len(sample) * j // parts] if sample else None
        if value is not None and (not points or value != points[-1]):
            points.append(value)
    return points


# ------------------------------------------------------------------------------------- columns


def _key_columns(spec: TableSpec, columns: Sequence[str]) -> list[str]:
    """Replica identity columns; every column for FULL (and NOTHING, which only sees inserts)."""
    if spec.replica_identity in ("f", "n") or not spec.key_columns:
        return list(columns)
    return list(spec.key_columns)


_ARROW_TO_SPARK: dict[str, DataType] = {
    "int16": ShortType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "float": FloatType(),
    "float32": FloatType(),
    "double": DoubleType(),
    "float64": DoubleType(),
    "bool": BooleanType(),
    "string": StringType(),
    "large_string": StringType(),
    "binary": BinaryType(),
    "large_binary": BinaryType(),
    "date32": DateType(),
    "date32[day]": DateType(),
}


def _spark_type(arrow_type: str) -> DataType:
    """Spark type of a manifest ``arrow_type`` (only needed when a table has no staged file at all)."""
    if arrow_type in _ARROW_TO_SPARK:
        return _ARROW_TO_SPARK[arrow_type]
    if arrow_type.startswith("timestamp"):
        return TimestampType()
    if arrow_type.startswith("decimal"):
        precision, scale = arrow_type[arrow_type.index("(") + 1 : -1].split(",")
        return DecimalType(int(precision), int(scale))
    return StringType()


def evolve_schema(table: str, current: StructType, incoming: Sequence[StructField]) -> StructType:
    """The target schema after a batch: new columns appended, dropped ones kept, types unchanged.

    Raises :class:`SchemaConflictError` when a column's type changed: old files and new rows could
    no longer be read as one column, and guessing a cast could lose data silently.
    """
    fields = list(current.fields)
    known = {f.name: f for f in fields}
    for col in incoming:
        old = known.get(col.name)
        if old is None:
            fields.append(StructField(col.name, col.dataType, True))
        elif old.dataType.simpleString() != col.dataType.simpleString():
            raise SchemaConflictError(
                f"table {table}: column {col.name!r} changed type from {old.dataType.simpleString()} to "
                f"{col.dataType.simpleString()}, which the target cannot hold in one column; re-snapshot "
                f"the table (the snapshot load replaces it with the new type), or revert the type change"
            )
    return StructType(fields)


# ---------------------------------------------------------------------------------- batch logic


def _order_after(commit: int, seq: int) -> Column:
    return (sf.col(_C) > commit) | ((sf.col(_C) == commit) & (sf.col(_S) > seq))


def _id() -> Column:
    return sf.struct(sf.col(_C), sf.col(_S), sf.col(_SUB))


def build_events(changes: DataFrame, columns: Sequence[StructField], keys: Sequence[str]) -> DataFrame:
    """Row events in apply order: an upsert per I/U, a delete per D and per U that changed the key.

    ``_K`` is the row's key after the event; ``_L`` is where the row's earlier values live (the old
    key for a key change), which is where unchanged TOAST values are looked up. A key change's delete
    sorts before its upsert (``_SUB`` 0 before 1) so an unchanged key still ends as an upsert.
    """
    names = [c.name for c in columns]
    new_key = sf.struct(*[sf.col(k).alias(k) for k in keys])
    old_key = sf.struct(*[sf.col("_pgl_old").getField(k).alias(k) for k in keys])
    has_old = sf.col("_pgl_old").isNotNull()
    nulls = [sf.lit(None).cast(c.dataType).alias(c.name) for c in columns]
    meta = [sf.col(_C), sf.col(_S), sf.col("_pgl_unchanged")]
    upserts = changes.where(sf.col("_pgl_op").isin("I", "U")).select(
        *meta,
        sf.lit(1).alias(_SUB),
        sf.lit(UPSERT).alias(_KIND),
        new_key.alias(_K),
        sf.when(has_old, old_key).otherwise(new_key).alias(_L),
        *[sf.col(n) for n in names],
    )
    deletes = changes.where(sf.col("_pgl_op") == "D").select(
        *meta,
        sf.lit(0).alias(_SUB),
        sf.lit(DELETE).alias(_KIND),
        old_key.alias(_K),
        old_key.alias(_L),
        *nulls,
    )
    key_changes = changes.where((sf.col("_pgl_op") == "U") & has_old & ~old_key.eqNullSafe(new_key)).select(
        *meta,
        sf.lit(0).alias(_SUB),
        sf.lit(DELETE).alias(_KIND),
        old_key.alias(_K),
        old_key.alias(_L),
        *nulls,
    )
    return upserts.unionByName(deletes).unionByName(key_changes)


def _predecessors(events: DataFrame) -> DataFrame:
    """For each upsert with unchanged columns: the id of the latest earlier event on its ``_L`` key.

    Probes (sub -1) are unioned with the events and a running ``last`` over each key's events finds
    the latest one before the probe's change, in one pass however long the chains are.
    """
    needs = events.where((sf.col(_KIND) == UPSERT) & (sf.size("_pgl_unchanged") > 0))
    probes = needs.select(
        sf.col(_L).alias(_KEY),
        sf.struct(sf.col(_C), sf.col(_S), sf.lit(-1).alias(_SUB)).alias(_ORD),
        sf.lit(True).alias(_PROBE),
        _id().alias(_ID),
    )
    states = events.select(
        sf.col(_K).alias(_KEY), _id().alias(_ORD), sf.lit(False).alias(_PROBE), _id().alias(_ID)
    )
    window = Window.partitionBy(_KEY).orderBy(_ORD).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (
        probes.unionByName(states)
        .withColumn(_PRED, sf.last(sf.when(~sf.col(_PROBE), sf.col(_ID)), ignorenulls=True).over(window))
        .where(sf.col(_PROBE))
        .select(_ID, _PRED)
    )


def fill_unchanged(
    events: DataFrame, target: DataFrame, keys: Sequence[str], filled: Sequence[str]
) -> DataFrame:
    """Replace unchanged-TOAST nulls by the value the row had just before the change.

    That value is the predecessor event's (itself possibly unchanged: pointer jumping follows such
    chains in log2(length) rounds, each round checkpointed to keep plans small), or, when no earlier
    event touched the row in this batch, the target's current row under the looked-up key.
    """
    preds = _predecessors(events)
    base = events.withColumn(_ID, _id()).join(preds, _ID, "left")
    target_keyed = target.select(sf.struct(*[sf.col(k).alias(k) for k in keys]).alias(_TL), *filled)
    for name in filled:
        unchanged = sf.array_contains("_pgl_unchanged", name) & (sf.col(_KIND) == UPSERT)
        cells = base.select(
            _ID,
            sf.col(name).alias(_V),
            unchanged.alias(_U),
            sf.when(unchanged, sf.col(_PRED)).alias(_PTR),
            sf.when(unchanged, sf.col(_L)).alias(_TL),
        ).localCheckpoint()
        for _ in range(64):  # each round doubles the chain length resolved: 2**64 is never reached
            if not cells.where(sf.col(_U) & sf.col(_PTR).isNotNull()).limit(1).count():
                break
            prev = cells.select(*[sf.col(c).alias(f"p{c}") for c in (_ID, _V, _U, _PTR, _TL)])
            jump = sf.col(_U) & sf.col(_PTR).isNotNull()
            cells = (
                cells.join(prev, sf.col(_PTR) == sf.col(f"p{_ID}"), "left")
                .select(
                    _ID,
                    *[
                        sf.when(jump, sf.col(f"p{c}")).otherwise(sf.col(c)).alias(c)
                        for c in (_V, _U, _PTR, _TL)
                    ],
                )
                .localCheckpoint()
            )
        else:
            raise RuntimeError(f"unchanged TOAST column {name!r}: its predecessor chain does not end")
        from_target = target_keyed.select(_TL, sf.col(name).alias("_t")).dropDuplicates([_TL])
        resolved = cells.join(from_target, _TL, "left").select(
            _ID, sf.when(sf.col(_U), sf.col("_t")).otherwise(sf.col(_V)).alias(name)
        )
        base = base.drop(name).join(resolved, _ID, "left")
    return base.drop(_ID, _PRED)


def final_rows(events: DataFrame) -> DataFrame:
    """The last event per key: what the batch leaves there (an upsert's row, or a delete)."""
    window = Window.partitionBy(_K).orderBy(sf.col(_C).desc(), sf.col(_S).desc(), sf.col(_SUB).desc())
    return events.withColumn("_rn", sf.row_number().over(window)).where(sf.col("_rn") == 1).drop("_rn")


# ---------------------------------------------------------------------------------- apply steps


@dataclass
class TableResult:
    """What one table's load or apply did (the job's JSON summary)."""

    table: str
    status: str  # "applied", "loaded", or "skipped" (already in the state: a re-run)
    changes: int = 0
    rows: int = 0
    ranges_written: int = 0
    ranges_total: int = 0
    seconds: float = 0.0


def _read_parquet(spark: SparkSession, table: str, paths: list[str]) -> DataFrame:
    """Staged files as one frame; files of several relation versions merge to the union of columns."""
    try:
        return spark.read.option("mergeSchema", "true").parquet(*paths)
    except (PySparkException, Py4JJavaError):  # CANNOT_MERGE_SCHEMAS arrives unconverted
        seen: dict[str, tuple[str, str]] = {}
        for path in paths:  # name the column and the files, rather than Spark's schema dump
            for col in spark.read.parquet(path).schema.fields:
                first = seen.setdefault(col.name, (col.dataType.simpleString(), path))
                if first[0] != col.dataType.simpleString():
                    raise SchemaConflictError(
                        f"table {table}: column {col.name!r} changed type from {first[0]} ({first[1]}) "
                        f"to {col.dataType.simpleString()} ({path}) within one batch; re-snapshot the "
                        f"table, or revert the type change"
                    ) from None
        raise


def _files_reaching(spark: SparkSession, paths: Sequence[str], base: int) -> list[str]:
    """The staged files holding a change at or above ``base`` (only the commit LSN column is read)."""
    live = []
    for path in paths:
        row = spark.read.parquet(path).agg(sf.max(_C)).first()
        if row is not None and row[0] is not None and row[0] >= base:
            live.append(path)
    return live


def _version_dir(manifest: Manifest) -> str:
    """A fresh data directory per attempt: a retry racing a stuck attempt never overwrites its files."""
    return f"data/{manifest.batch_id}-{uuid.uuid4().hex[:8]}"


def _write_ranges(
    spark: SparkSession,
    parts: Sequence[tuple[DataFrame, bool]],
    root: str,
    version_dir: str,
    dtype: DataType,
    state: TableState,
    touched: set[int],
    rpr: int,
) -> tuple[list[KeyRange], int]:
    """Write the rows of the touched ranges under ``version_dir``, about one file per range.

    ``parts`` are frames whose union is the new content of the touched ranges, each with whether it
    must be shuffled by range first: rows read from range files already arrive grouped by range,
    so only the batch's own rows (and unordered input such as a snapshot) are moved.
    Rows are counted afterwards from the files' footers (no caching: a batch touching every range
    is as big as the table). A range grown past ``SPLIT_FACTOR * rpr`` (inserts with increasing keys
    all land in the last one) is then rewritten once more as several ranges, so no range, and so no
    batch's rewrite, grows with the table. Returns the new range list (untouched ranges keep their
    files) and how many ranges were written.
    """
    rc = state.range_column
    ranges = list(state.ranges)
    _write_routed(parts, rc, dtype, ranges, join_path(root, version_dir))
    counts = _range_counts(spark, join_path(root, version_dir))
    placed = _place(ranges, touched, counts, version_dir)
    written = len(touched)
    for i in sorted((i for i in touched if counts.get(i, 0) > SPLIT_FACTOR * rpr), reverse=True):
        grown = spark.read.parquet(join_path(root, placed[i].path or ""))
        pieces = [placed[i].lo, *split_points(grown, rc, counts[i], math.ceil(counts[i] / rpr))]
        sub = [KeyRange(lo, None, 0) for lo in pieces]
        split_dir = f"{version_dir}/split-{i}"
        _write_routed([(grown, True)], rc, dtype, sub, join_path(root, split_dir))
        sub = _place(sub, set(range(len(sub))), _range_counts(spark, join_path(root, split_dir)), split_dir)
        placed[i : i + 1] = sub  # descending i: the indices still to visit are unaffected
        written += len(sub)
    return placed, written


def _write_routed(
    parts: Sequence[tuple[DataFrame, bool]], rc: str, dtype: DataType, ranges: Sequence[KeyRange], path: str
) -> None:
    routed = [df.withColumn(RANGE, route(sf.col(rc), dtype, ranges)) for df, _ in parts]
    routed = [
        df.repartition(RANGE) if shuffle else df for df, (_, shuffle) in zip(routed, parts, strict=True)
    ]
    union = routed[0]
    for df in routed[1:]:
        union = union.unionByName(df)
    union.write.mode("overwrite").partitionBy(RANGE).parquet(path)


def _range_counts(spark: SparkSession, path: str) -> dict[int, int]:
    """Rows per range directory under ``path``: Parquet footers only, no column is read."""
    try:
        df = spark.read.parquet(path)
    except AnalysisException:  # nothing was written: every touched range is now empty
        return {}
    return {int(row[0]): int(row[1]) for row in df.groupBy(RANGE).count().collect()}


def _place(
    ranges: list[KeyRange], written: set[int], counts: dict[int, int], version_dir: str
) -> list[KeyRange]:
    """Point the written ranges at their new directories (an emptied range has none)."""
    placed = list(ranges)
    for i in written:
        rows = counts.get(i, 0)
        placed[i] = KeyRange(ranges[i].lo, f"{version_dir}/{RANGE}={i}" if rows else None, rows)
    return placed


def load_snapshot_table(
    spark: SparkSession, storage: Storage, manifest: Manifest, spec: TableSpec, target: str, rpr: int
) -> TableResult:
    """Load (or re-load, replacing the table) one snapshot table; its base LSN is the consistent point.

    A target never moves backwards: a snapshot at or below the table's base LSN (an old snapshot
    loaded again, e.g. a cleared past run) is skipped. When batches were already applied past the
    consistent point (a re-snapshot's copy ran while the CDC kept applying), the changes of those
    batches at or above the consistent point are replayed from the table's changelog on top of
    the snapshot, so the new state ends exactly where the old one was.
    """
    started = time.monotonic()
    root = join_path(target, spec.name)
    previous = read_state(storage, root)
    snapshot_lsn = parse_lsn(manifest.end_lsn)
    if previous is not None and (
        previous.snapshot_id == manifest.batch_id or snapshot_lsn <= parse_lsn(previous.base_lsn)
    ):
        if previous.snapshot_id != manifest.batch_id:
            log.warning(
                "%s: snapshot %s is not newer than the table's base LSN %s: skipped (never load backwards)",
                spec.name, manifest.batch_id, previous.base_lsn,
            )  # fmt: skip
        return TableResult(spec.name, "skipped", ranges_total=len(previous.ranges))
    if spec.files:
        df = _read_parquet(spark, spec.name, [join_path(manifest.base_dir, f) for f in spec.files])
    else:
        struct = StructType(
            [StructField(c["name"], _spark_type(c.get("arrow_type", "string"))) for c in spec.columns]
        )
        df = spark.createDataFrame([], struct)
    struct = StructType([StructField(f.name, f.dataType, True) for f in df.schema.fields])
    keys = _key_columns(spec, struct.fieldNames())
    rows = df.count()
    dtype = struct[keys[0]].dataType
    ranges = [KeyRange(None, None, 0)] + [
        KeyRange(p, None, 0) for p in split_points(df, keys[0], rows, math.ceil(rows / rpr))
    ]
    state = TableState(
        schema=spec.schema,
        table=spec.table,
        columns=struct.jsonValue(),
        key_columns=keys,
        replica_identity=spec.replica_identity,
        range_column=keys[0],
        base_lsn=manifest.end_lsn,
        snapshot_id=manifest.batch_id,
        applied_end_lsn=manifest.end_lsn,
        applied_batch_id=manifest.batch_id,
        ranges=ranges,
        version=previous.version if previous else 0,
    )
    if rows:
        state.ranges, _ = _write_ranges(
            spark, [(df, True)], root, _version_dir(manifest), dtype, state, set(range(len(ranges))), rpr
        )
    replayed = 0
    if previous is not None and parse_lsn(previous.applied_end_lsn) > snapshot_lsn:
        replayed = _catch_up(spark, storage, manifest, spec, target, state, previous, rpr)
    write_state(storage, root, state)
    rows = sum(r.rows for r in state.ranges)
    # "changes": the logged changes replayed on top of the snapshot (0 unless batches were ahead).
    return TableResult(
        spec.name, "loaded", replayed, rows, len(ranges), len(state.ranges), time.monotonic() - started
    )


def _catch_up(
    spark: SparkSession,
    storage: Storage,
    manifest: Manifest,
    spec: TableSpec,
    target: str,
    state: TableState,
    previous: TableState,
    rpr: int,
) -> int:
    """Replay the changelog's changes in [consistent point, previous applied end) onto ``state``.

    Every change the table received above its base LSN is in its changelog, once per applied
    batch; changes at or above the previous applied end belong to batches not applied yet (a
    crashed attempt's changelog), which their own apply brings later. Returns the changes replayed.
    """
    since, until = parse_lsn(manifest.end_lsn), parse_lsn(previous.applied_end_lsn)
    # The table stays where it was even when no batch left changes to replay.
    state.applied_end_lsn, state.applied_batch_id = previous.applied_end_lsn, previous.applied_batch_id
    paths = _changelog_paths(storage, target, spec.name, since)
    if not paths:
        return 0
    logged = _read_parquet(spark, spec.name, paths)
    changes = logged.where((sf.col(_C) >= since) & (sf.col(_C) < until)).localCheckpoint()
    n_changes = changes.count()
    log.info(
        "%s: snapshot %s is older than the applied end %s: replaying %d logged change(s)",
        spec.name, manifest.batch_id, previous.applied_end_lsn, n_changes,
    )  # fmt: skip
    if n_changes:
        columns = [f for f in logged.schema.fields if not f.name.startswith("_pgl_")]
        _merge_changes(
            spark, join_path(target, spec.name), state, changes, columns, _version_dir(manifest), rpr
        )
    return n_changes


def _changelog_paths(storage: Storage, target: str, table: str, since: int) -> list[str]:
    """The changelog batch directories that can hold changes at or above ``since``.

    Batch ids are ``batch-<start LSN as 16 hex digits>`` and a slot's batches do not overlap, so a
    batch starting below ``since`` can hold such changes only if it is the last one starting there.
    """
    base = join_path(target, "_changelog", table)
    starts: list[tuple[int, str]] = []
    for name in storage.list_names(base):
        if not name.startswith("batch_id="):
            continue
        batch_id = name[len("batch_id=") :]
        digits = batch_id[len("batch-") :] if batch_id.startswith("batch-") else ""
        try:
            starts.append((int(digits, 16), name))
        except ValueError:
            starts.append((since, name))  # not a batch id this job names: keep it, the filter decides
    earlier = [item for item in starts if item[0] < since]
    keep = [item for item in starts if item[0] >= since] + ([max(earlier)] if earlier else [])
    return [join_path(base, name) for _, name in sorted(keep)]


def _new_table_state(spec: TableSpec, struct: StructType) -> TableState:
    """State of a table first seen in a batch (created after the snapshot): empty, base LSN 0."""
    keys = _key_columns(spec, struct.fieldNames())
    log.warning(
        "table %s has no snapshot load under the target: creating it empty from this batch", spec.name
    )
    return TableState(
        schema=spec.schema,
        table=spec.table,
        columns=StructType([]).jsonValue(),
        key_columns=keys,
        replica_identity=spec.replica_identity,
        range_column=keys[0],
        base_lsn="0/0",
        snapshot_id=None,
        applied_end_lsn="0/0",
        applied_batch_id="",
        ranges=[KeyRange(None, None, 0)],
    )


def _last_truncate(changes: DataFrame) -> tuple[int, int] | None:
    row = (
        changes.where(sf.col("_pgl_op") == "T")
        .agg(sf.max(sf.struct(sf.col(_C), sf.col(_S))).alias("t"))
        .first()
    )
    return None if row is None or row["t"] is None else (int(row["t"][0]), int(row["t"][1]))


def _read_ranges(spark: SparkSession, root: str, struct: StructType, ranges: Sequence[KeyRange]) -> DataFrame:
    paths = [join_path(root, r.path) for r in ranges if r.path]
    return spark.read.schema(struct).parquet(*paths) if paths else spark.createDataFrame([], struct)


def apply_batch_table(
    spark: SparkSession, storage: Storage, manifest: Manifest, spec: TableSpec, target: str, rpr: int
) -> TableResult:
    """Merge one table's changes of a batch into its target table and write its changelog.

    Order: the changelog (at a path a re-run overwrites), then the new range files (in a fresh
    directory, unreferenced until the switch), then the new state version: a crash before the
    switch leaves the old table intact, after it the table is done and a re-run skips it (the
    batch's end LSN is in its state). Changes below the table's base LSN are already in its
    snapshot and are skipped: a snapshot at consistent point S holds exactly the transactions
    whose commit record starts below S (PostgreSQL decodes a commit at S or later, not earlier).
    """
    started = time.monotonic()
    root = join_path(target, spec.name)
    state = read_state(storage, root)
    if state is not None and parse_lsn(manifest.end_lsn) <= parse_lsn(state.applied_end_lsn):
        return TableResult(spec.name, "skipped", ranges_total=len(state.ranges))
    if not spec.files:
        if state is not None:
            state.applied_end_lsn, state.applied_batch_id = manifest.end_lsn, manifest.batch_id
            write_state(storage, root, state)
        return TableResult(spec.name, "applied", ranges_total=len(state.ranges) if state else 0)
    paths = [join_path(manifest.base_dir, f) for f in spec.files]
    try:
        staged = _read_parquet(spark, spec.name, paths)
    except SchemaConflictError:
        # The conflicting relation version may hold only changes below the base LSN (a re-snapshot
        # taken after the type change): those files are skipped anyway, so leave them out.
        if state is None:
            raise
        live = _files_reaching(spark, paths, parse_lsn(state.base_lsn))
        if len(live) == len(paths):
            raise
        log.info(
            "%s: %d staged file(s) hold only changes below its base LSN", spec.name, len(paths) - len(live)
        )
        if not live:
            state.applied_end_lsn, state.applied_batch_id = manifest.end_lsn, manifest.batch_id
            write_state(storage, root, state)
            return TableResult(spec.name, "applied", ranges_total=len(state.ranges))
        staged = _read_parquet(spark, spec.name, live)
    columns = [f for f in staged.schema.fields if not f.name.startswith("_pgl_")]
    if state is None:
        state = _new_table_state(spec, StructType(columns))
    changes = staged.where(sf.col(_C) >= parse_lsn(state.base_lsn)).localCheckpoint()
    n_changes = changes.count()
    changes.write.mode("overwrite").parquet(
        join_path(target, "_changelog", spec.name, f"batch_id={manifest.batch_id}")
    )
    log.info("%s: %d changes, changelog written (%.1f s)", spec.name, n_changes, time.monotonic() - started)
    written = _merge_changes(spark, root, state, changes, columns, _version_dir(manifest), rpr)
    state.applied_end_lsn, state.applied_batch_id = manifest.end_lsn, manifest.batch_id
    write_state(storage, root, state)
    rows = sum(r.rows for r in state.ranges)
    return TableResult(
        spec.name, "applied", n_changes, rows, written, len(state.ranges), time.monotonic() - started
    )


def _merge_changes(
    spark: SparkSession,
    root: str,
    state: TableState,
    changes: DataFrame,
    columns: Sequence[StructField],
    version_dir: str,
    rpr: int,
) -> int:
    """Merge ordered changes into the ranges of ``state`` (updated in place, not yet published).

    Only the ranges the changes touch are read and rewritten (all of them after a TRUNCATE), into
    ``version_dir``; returns how many ranges were written.
    """
    struct = evolve_schema(f"{state.schema}.{state.table}", state.struct, columns)
    keys = [f.name for f in columns] if state.replica_identity in ("f", "n") else state.key_columns
    truncate = _last_truncate(changes)
    live = changes if truncate is None else changes.where(_order_after(*truncate))
    events = build_events(live, columns, keys)
    dtype = struct[state.range_column].dataType
    touched_ranges = (
        set(range(len(state.ranges)))
        if truncate is not None
        else {
            int(r[0])
            for r in events.select(route(sf.col(_K)[state.range_column], dtype, state.ranges))
            .distinct()
            .collect()
        }
    )
    log.info(
        "%s.%s: rewriting %d of %d ranges", state.schema, state.table, len(touched_ranges), len(state.ranges)
    )
    current = (
        spark.createDataFrame([], struct)
        if truncate is not None
        else _read_ranges(spark, root, struct, [state.ranges[i] for i in sorted(touched_ranges)])
    )
    filled = sorted(
        {r[0] for r in live.select(sf.explode("_pgl_unchanged")).distinct().collect()}
        & {c.name for c in columns}
    )
    if filled:
        events = fill_unchanged(events, current, keys, filled)
    final = final_rows(events)
    kept = current.join(
        final.select(_K), sf.struct(*[sf.col(k).alias(k) for k in keys]) == sf.col(_K), "left_anti"
    )
    names = {c.name for c in columns}
    upserts = final.where(sf.col(_KIND) == UPSERT).select(
        *[
            sf.col(f.name) if f.name in names else sf.lit(None).cast(f.dataType).alias(f.name)
            for f in struct.fields
        ]
    )
    state.columns = struct.jsonValue()
    state.ranges, written = _write_ranges(
        spark, [(kept, False), (upserts, True)], root, version_dir, dtype, state, touched_ranges, rpr
    )
    return written


# ------------------------------------------------------------------------------------- ledger


def ledger_dir(target: str, slot: str, batch_id: str) -> str:
    return join_path(target, "_ledger", slot, batch_id)


def write_ledger(storage: Storage, target: str, manifest: Manifest, tables: Sequence[TableSpec]) -> None:
    """Record the batch as applied, one row per table: the last step, the ack's green light."""
    applied_at = datetime.now(UTC).isoformat(timespec="seconds")
    for spec in tables:
        row = {
            "slot": manifest.slot,
            "batch_id": manifest.batch_id,
            "kind": manifest.kind,
            "start_lsn": manifest.start_lsn,
            "end_lsn": manifest.end_lsn,
            "table": f"{spec.schema}.{spec.table}",
            "applied_at": applied_at,
        }
        path = join_path(ledger_dir(target, manifest.slot, manifest.batch_id), f"{spec.name}.json")
        storage.write_atomic(path, json.dumps(row), replace=True)


def read_ledger(storage: Storage, target: str, slot: str, batch_id: str) -> list[dict[str, Any]]:
    """The ledger rows of one batch (one per applied table; empty when the batch is not applied)."""
    directory = ledger_dir(target, slot, batch_id)
    rows = []
    for name in storage.list_names(directory):
        if name.endswith(".json"):
            text = storage.read_text(join_path(directory, name))
            if text is not None:
                rows.append(json.loads(text))
    return rows


def apply_manifest(
    spark: SparkSession,
    manifest_path: str,
    target: str,
    tables: Sequence[str] | None = None,
    rows_per_range: int = DEFAULT_ROWS_PER_RANGE,
) -> list[TableResult]:
    """Apply a snapshot or batch manifest to ``target``; the Python entry point of the job.

    ``tables`` (``schema.table`` names) restricts the run to some tables of the manifest. Tables
    already in the ledger for this batch are not touched; the ledger rows are written last.
    """
    storage = Storage(spark)
    manifest = load_manifest(storage, manifest_path)
    specs = manifest.tables
    if tables:
        wanted = set(tables)
        unknown = wanted - {f"{s.schema}.{s.table}" for s in specs}
        if unknown:
            raise ApplyError(f"--tables names {sorted(unknown)} not in manifest {manifest_path}")
        specs = [s for s in specs if f"{s.schema}.{s.table}" in wanted]
    done = {row["table"] for row in read_ledger(storage, target, manifest.slot, manifest.batch_id)}
    results = []
    step = load_snapshot_table if manifest.kind == "snapshot" else apply_batch_table
    for spec in specs:
        if f"{spec.schema}.{spec.table}" in done:
            results.append(TableResult(spec.name, "skipped"))
            continue
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                result = step(spark, storage, manifest, spec, target, rows_per_range)
                break
            except ConcurrentWriteError as exc:
                # Another job (a re-snapshot load, a racing retry) switched the table first: its
                # state is the new truth, so redo this table from it (skipping what it holds).
                if attempt == CONFLICT_ATTEMPTS:
                    raise ConcurrentWriteError(
                        f"{spec.name}: lost the race for its state {attempt} times ({exc}); run the "
                        "CDC apply and re-snapshot loads of one target in one Airflow pool"
                    ) from exc
                log.warning("%s: %s; redoing it from the new state (attempt %d)", spec.name, exc, attempt + 1)
        log.info("%s %s: %s", manifest.batch_id, spec.name, result)
        results.append(result)
    write_ledger(storage, target, manifest, [s for s in specs if f"{s.schema}.{s.table}" not in done])
    return results


# ---------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apply_batch.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--manifest", required=True, help="path or URI of the batch's or snapshot's _manifest.json"
    )
    parser.add_argument("--target", required=True, help="root of the target lake tables")
    parser.add_argument("--tables", default="", help="comma-separated schema.table names (default: all)")
    parser.add_argument(
        "--rows-per-range",
        type=int,
        default=DEFAULT_ROWS_PER_RANGE,
        help="target rows per key range (docs/TARGET_LAYOUT.md)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; returns the process exit status (0 ok, 2 user-actionable error, 1 unexpected)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started_here = SparkSession.getActiveSession() is None  # a caller's session is the caller's to stop
    spark = SparkSession.builder.appName(f"pglogical-apply {args.manifest}").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        tables = [t.strip() for t in args.tables.split(",") if t.strip()]
        results = apply_manifest(spark, args.manifest, args.target, tables, args.rows_per_range)
        print(json.dumps({"manifest": args.manifest, "tables": [asdict(r) for r in results]}))
        return 0
    except ApplyError as exc:
        print(f"apply_batch: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        print(
            f"apply_batch: unexpected failure applying {args.manifest}:\n{traceback.format_exc()}",
            file=sys.stderr,
        )
        return 1
    finally:
        if started_here:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
