"""What a batch costs the Iceberg apply job as the table grows: merge-on-read against copy-on-write,
a partitioned table against an unpartitioned one, and a table keeping its history against one not.

    make lake-jars && POSTGRES_CDC_SPARK_JARS=... .venv/bin/python benchmarks/apply.py \
        [--sizes 1000000,5000000] [--changes 10000] [--repeat 2] [--workdir DIR] \
        [--partition-by '["bucket(16, id)"]'] [--history]

For each table size it snapshot-loads one Iceberg table per write mode (format v2, unpartitioned,
unsorted: docs/LAKE.md says why), in a local SQLite-catalog lake. Then it applies, to each freshly
loaded table, two staged batches of single-change transactions:

* ``oltp``: inserts with increasing keys, updates and deletes of recent rows (half/40%/10%);
* ``random``: updates of keys drawn uniformly from the whole table.

Each apply is timed ``--repeat`` times, interleaved across sizes and modes (noise then hits all
of them alike), rolling the table back to its load snapshot in between (Iceberg's
``rollback_to_snapshot``); the fastest counts. ``--partition-by`` adds a third, merge-on-read
table under that partition spec (the apply operator's ``partition_by`` for it), and prints its
cost against the unpartitioned merge-on-read table of the same size. ``--history`` adds a
merge-on-read table keeping its history (``history="scd2"``: the history table's MERGE is part of
each apply) and prints its cost against the same table without. The job runs in-process
(``apply_manifest``) on ``local[2]``; spark-submit's ~25 s start-up is the same for every mode and
is left out. The baseline of the ratio is the same batch on the 1M table, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from airflow_provider_postgres_cdc.formats.lake import HISTORY_SUFFIX, LakeConfig, local_lake
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.session import local_session, register_lake

SNAP_LSN = 0x1_0000_0000
COLUMNS = [
    ("id", pa.int64()),
    ("name", pa.string()),
    ("amount", pa.decimal128(12, 2)),
    ("updated_at", pa.timestamp("us", tz="UTC")),
    ("payload", pa.string()),
]


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def write_manifest(
    directory: Path, kind: str, batch_id: str, start: int, end: int, files: list[str], rows: int
) -> str:
    table = {
        "schema": "public",
        "table": "bench",
        "path": "public.bench",
        "columns": [
            {"name": n, "pg_type": "", "type_oid": 0, "typmod": -1, "arrow_type": str(t), "key": n == "id"}
            for n, t in COLUMNS
        ],
        "key_columns": ["id"],
        "replica_identity": "d",
        "rows": rows,
        "files": files,
        "row_filter": None,
        "column_list": None,
        "warnings": [],
    }
    manifest = {
        "format_version": 1,
        "kind": kind,
        "slot": "bench",
        "database": "bench",
        "batch_id": batch_id,
        "start_lsn": lsn_text(start),
        "end_lsn": lsn_text(end),
        "created_at": datetime.now(UTC).isoformat(),
        "tables": [table],
        "stats": {},
    }
    path = directory / "_manifest.json"
    path.write_text(json.dumps(manifest))
    return str(path)


def stage_snapshot(spark: SparkSession, staging: Path, rows: int) -> str:
    """A staged snapshot of ``rows`` rows written by Spark (pyarrow in one process would be slow)."""
    batch_id = f"snapshot-{SNAP_LSN:016X}"
    directory = staging / f"n{rows}" / batch_id
    (
        spark.range(rows)
        .select(
            sf.col("id"),
            sf.concat(sf.lit("customer-"), sf.col("id")).alias("name"),
            ((sf.col("id") % 100_000) / 100).cast("decimal(12,2)").alias("amount"),
            sf.timestamp_micros(sf.lit(1_700_000_000_000_000) + sf.col("id")).alias("updated_at"),
            sf.concat(sf.lit("order line text "), sf.col("id") % 977, sf.lit(" " + "x" * 60)).alias(
                "payload"
            ),
        )
        .write.mode("overwrite")
        .parquet(str(directory / "public.bench"))
    )
    files = sorted(f"public.bench/{p.name}" for p in (directory / "public.bench").glob("part-*.parquet"))
    return write_manifest(directory, "snapshot", batch_id, SNAP_LSN, SNAP_LSN, files, rows)


def _row(key: int, tag: str) -> dict[str, Any]:
    return {
        "id": key,
        "name": f"{tag}-{key}",
        "amount": Decimal(key % 100_000) / 100,
        "updated_at": datetime(2026, 11, 21, tzinfo=UTC),
        "payload": f"{tag} payload " + "y" * 60,
    }


def stage_batch(staging: Path, rows: int, shape: str, changes: int, start: int, seed: int = 1) -> str:
    """A staged batch of ``changes`` single-change transactions, FORMATS.md columns exactly."""
    rnd = random.Random(seed)
    ops: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    next_key = rows
    recent = list(range(rows - 20_000, rows))
    for _ in range(changes):
        roll = rnd.random()
        if shape == "random":
            ops.append(("U", _row(rnd.randrange(rows), "rnd"), None))
        elif roll < 0.5:
            ops.append(("I", _row(next_key, "new"), None))
            recent.append(next_key)
            next_key += 1
        elif roll < 0.9:
            ops.append(("U", _row(recent[-1 - rnd.randrange(min(len(recent), 20_000))], "upd"), None))
        else:
            victim = recent.pop(len(recent) - 1 - rnd.randrange(min(len(recent), 20_000)))
            ops.append(("D", None, {"id": victim}))
    end = start + 100 * (changes + 1)
    batch_id = f"batch-{start:016X}-{end:016X}"
    directory = staging / f"n{rows}" / batch_id
    (directory / "public.bench").mkdir(parents=True, exist_ok=True)
    lsns = [start + 100 * (i + 1) for i in range(changes)]
    cols: dict[str, pa.Array] = {
        name: pa.array([(r or {}).get(name) for _, r, _ in ops], typ) for name, typ in COLUMNS
    }
    cols |= {
        "_pgl_op": pa.array([op for op, _, _ in ops], pa.string()),
        "_pgl_commit_lsn": pa.array(lsns, pa.int64()),
        "_pgl_end_lsn": pa.array([x + 40 for x in lsns], pa.int64()),
        "_pgl_seq": pa.array([0] * changes, pa.int64()),
        "_pgl_xid": pa.array(range(1000, 1000 + changes), pa.int64()),
        "_pgl_commit_time": pa.array(
            [datetime(2026, 11, 21, tzinfo=UTC)] * changes, pa.timestamp("us", tz="UTC")
        ),
        "_pgl_unchanged": pa.array([[] for _ in ops], pa.list_(pa.string())),
        "_pgl_old": pa.array(
            [None if old is None else {n: old.get(n) for n, _ in COLUMNS} for _, _, old in ops],
            pa.struct(COLUMNS),
        ),
        "_pgl_truncate_flags": pa.array([None] * changes, pa.int8()),
    }
    pq.write_table(pa.table(cols), directory / "public.bench" / "part-00000.parquet")
    return write_manifest(
        directory, "batch", batch_id, start, end, ["public.bench/part-00000.parquet"], changes
    )


def timed_apply(
    spark: SparkSession,
    manifest: str,
    lake: LakeConfig,
    mode: str,
    partition: str | None = None,
    history: bool = False,
) -> float:
    started = time.perf_counter()
    option = json.dumps({"public.bench": json.loads(partition)}) if partition else None
    versions = '{"public.bench": "scd2"}' if history else None
    job.apply_manifest(spark, manifest, lake, write_mode=mode, partition_by=option, history=versions)
    return time.perf_counter() - started


def roll_back(spark: SparkSession, lake: LakeConfig, loaded: dict[str, int]) -> None:
    """Make the freshly loaded tables current again (and drop the changelog the batch appended)."""
    for name, snapshot_id in loaded.items():
        spark.sql(f"CALL {lake.catalog}.system.rollback_to_snapshot('public.{name}', {snapshot_id})")
    spark.sql(f"DROP TABLE IF EXISTS {lake.catalog}.public.bench__pgl_changelog")


def new_lake(spark: SparkSession, root: Path, name: str) -> LakeConfig:
    root.mkdir(parents=True, exist_ok=True)
    lake = local_lake(str(root), catalog=name)
    register_lake(spark, lake)
    return lake


def current_snapshots(spark: SparkSession, lake: LakeConfig) -> dict[str, int]:
    """The current snapshot of the bench table and of its history table, when it has one."""
    tables, found = IcebergTables(spark, lake), {}
    for name in ("bench", "bench" + HISTORY_SUFFIX):
        table = tables.table(("public", name))
        if table is not None and table.snapshot_id is not None:
            found[name] = table.snapshot_id
    return found


def _layout(label: str, partition_by: str | None) -> tuple[str, str | None, bool]:
    """(write mode, partition fields JSON, history) of a table layout the benchmark compares."""
    if label in ("partitioned", "history"):
        return "merge-on-read", partition_by if label == "partitioned" else None, label == "history"
    return label, None, False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument(
        "--repeat", type=int, default=2, help="applies per batch and table; the fastest counts"
    )
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument(
        "--partition-by", default=None, help="JSON list of partition fields, e.g. '[\"bucket(16, id)\"]'"
    )
    parser.add_argument("--history", action="store_true", help="compare a table keeping its history")
    args = parser.parse_args()
    spark = local_session("postgres-cdc-apply-bench")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pgl-apply-bench-"))
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = ("merge-on-read", "copy-on-write") + (("partitioned",) if args.partition_by else ())
    modes += ("history",) if args.history else ()
    print(f"apply benchmark (Iceberg): local[2], {args.changes} changes per batch, fastest of {args.repeat}")
    if args.partition_by:
        print(f"partitioned: merge-on-read, partition_by {args.partition_by}")
    print(f"{'table rows':>11} {'batch':>7} {'write mode':>14} {'seconds':>8}")
    try:
        warm = new_lake(spark, work / "lake-warmup", "warm")  # JIT and first-job costs, not timed
        timed_apply(spark, stage_snapshot(spark, work / "staging", 20_000), warm, modes[0])
        timed_apply(
            spark, stage_batch(work / "staging", 20_000, "oltp", 1000, SNAP_LSN + 1000), warm, modes[0]
        )
        batches: dict[str, dict[int, str]] = {"oltp": {}, "random": {}}
        lakes: dict[tuple[int, str], tuple[LakeConfig, dict[str, int]]] = {}
        for rows in sizes:
            snapshot = stage_snapshot(spark, work / "staging", rows)
            batches["oltp"][rows] = stage_batch(work / "staging", rows, "oltp", args.changes, SNAP_LSN + 1000)
            batches["random"][rows] = stage_batch(
                work / "staging", rows, "random", args.changes, SNAP_LSN + 2000
            )
            for mode in modes:
                lake = new_lake(spark, work / f"lake-{rows}-{mode}", f"b{rows}_{mode.replace('-', '_')}")
                seconds = timed_apply(spark, snapshot, lake, *_layout(mode, args.partition_by))
                lakes[rows, mode] = (lake, current_snapshots(spark, lake))
                print(f"{rows:>11} {'load':>7} {mode:>14} {seconds:>8.1f}", flush=True)
        for shape, manifests in batches.items():
            best: dict[tuple[int, str], float] = {}
            for _ in range(args.repeat):  # interleaved, so load from other processes hits all alike
                for rows in sizes:
                    for mode in modes:
                        lake, loaded = lakes[rows, mode]
                        seconds = timed_apply(spark, manifests[rows], lake, *_layout(mode, args.partition_by))
                        roll_back(spark, lake, loaded)
                        best[rows, mode] = min(seconds, best.get((rows, mode), seconds))
            for (rows, mode), seconds in best.items():
                print(f"{rows:>11} {shape:>7} {mode:>14} {seconds:>8.1f}", flush=True)
            for label, against in (("partitioned", "unpartitioned"), ("history", "without history")):
                for rows in sizes if label in modes else []:
                    ratio = best[rows, label] / best[rows, "merge-on-read"]
                    print(f"{shape} batch, {rows} rows: {label} / {against} = {ratio:.2f}x")
            if shape == "oltp" and len(sizes) >= 2:
                small, large = min(sizes), max(sizes)
                for mode in modes[:2]:
                    ratio = best[large, mode] / best[small, mode]
                    verdict = "ok" if ratio < 1.5 else "TOO SLOW"
                    print(
                        f"oltp batch, {mode}: {large} rows / {small} rows = {ratio:.2f}x (< 1.5x): {verdict}"
                    )
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
