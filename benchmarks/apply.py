"""What a batch costs the apply job as the target grows: key ranges against a naive full rewrite.

    .venv/bin/python benchmarks/apply.py [--sizes 1000000,5000000] [--changes 10000] [--workdir DIR]

For each target size it snapshot-loads one table twice: once with the job's key-range layout
(``--rows-per-range``) and once as a single range, which makes every batch rewrite the whole
table (the naive layout, and what hash buckets degrade to when a batch touches every bucket).
Then it applies, to each freshly loaded table, two staged batches of single-change transactions:

* ``oltp``: inserts with increasing keys, updates and deletes of recent rows (half/40%/10%);
* ``random``: updates of keys drawn uniformly from the whole table.

Each apply is timed ``--repeat`` times, interleaved across sizes and layouts (the machine is
shared: noise then hits all of them alike), rolling the table back in between; the fastest counts.
The job runs in-process (``apply_manifest``) on ``local[2]``; spark-submit's ~25 s start-up is
the same for every layout and is left out.
"""

from __future__ import annotations

import argparse
import json
import os
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

from airflow_provider_pglogical.spark import apply_batch as job

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
        "columns": [{"name": n, "arrow_type": str(t), "key": n == "id"} for n, t in COLUMNS],
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


def timed_apply(spark: SparkSession, manifest: str, target: str, rpr: int) -> tuple[float, job.TableResult]:
    started = time.perf_counter()
    (result,) = job.apply_manifest(spark, manifest, target, rows_per_range=rpr)
    return time.perf_counter() - started, result


def roll_back(target: str, manifest: str) -> None:
    """Undo an applied batch: delete the table's newest state version and the batch's ledger rows.

    The versioned state makes the previous table current again, so every timed apply of a batch
    starts from the same freshly loaded table.
    """
    states = sorted((Path(target) / "public.bench" / "_state").glob("*.json"))
    states[-1].unlink()
    shutil.rmtree(Path(target) / "_ledger" / "bench" / Path(manifest).parent.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--rows-per-range", type=int, default=job.DEFAULT_ROWS_PER_RANGE)
    parser.add_argument(
        "--repeat", type=int, default=3, help="applies per batch and target; the fastest counts"
    )
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "3g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pgl-apply-bench-"))
    sizes = [int(s) for s in args.sizes.split(",")]
    layouts = {"ranges": args.rows_per_range, "full-rewrite": 10**15}
    print(
        f"apply benchmark: local[2], {args.changes} changes per batch, rows per range {args.rows_per_range}, "
        f"fastest of {args.repeat} interleaved applies per batch and target"
    )
    print(f"{'target rows':>11} {'batch':>7} {'layout':>13} {'seconds':>8} {'ranges written/total':>21}")
    try:
        warm = str(work / "lake-warmup")  # JIT and first-job costs, paid before anything is timed
        timed_apply(spark, stage_snapshot(spark, work / "staging", 20_000), warm, args.rows_per_range)
        timed_apply(spark, stage_batch(work / "staging", 20_000, "oltp", 1000, SNAP_LSN + 1000), warm, 5000)
        batches: dict[str, dict[int, str]] = {"oltp": {}, "random": {}}
        for rows in sizes:
            snapshot = stage_snapshot(spark, work / "staging", rows)
            batches["oltp"][rows] = stage_batch(work / "staging", rows, "oltp", args.changes, SNAP_LSN + 1000)
            batches["random"][rows] = stage_batch(
                work / "staging", rows, "random", args.changes, SNAP_LSN + 2000
            )
            for layout, rpr in layouts.items():
                seconds, result = timed_apply(spark, snapshot, str(work / f"lake-{rows}-{layout}"), rpr)
                print(
                    f"{rows:>11} {'load':>7} {layout:>13} {seconds:>8.1f} {result.ranges_total:>21}",
                    flush=True,
                )
        oltp: dict[int, float] = {}
        for shape, manifests in batches.items():
            best: dict[tuple[int, str], tuple[float, job.TableResult]] = {}
            for _ in range(args.repeat):  # interleaved, so load from other processes hits all alike
                for rows in sizes:
                    for layout, rpr in layouts.items():
                        target = str(work / f"lake-{rows}-{layout}")
                        run = timed_apply(spark, manifests[rows], target, rpr)
                        roll_back(target, manifests[rows])
                        if (rows, layout) not in best or run[0] < best[rows, layout][0]:
                            best[rows, layout] = run
            for (rows, layout), (seconds, result) in best.items():
                written = f"{result.ranges_written}/{result.ranges_total}"
                print(f"{rows:>11} {shape:>7} {layout:>13} {seconds:>8.1f} {written:>21}", flush=True)
                if shape == "oltp" and layout == "ranges":
                    oltp[rows] = seconds
        if len(oltp) >= 2:
            small, large = min(oltp), max(oltp)
            ratio = oltp[large] / oltp[small]
            verdict = "ok" if ratio < 1.5 else "TOO SLOW"
            print(
                f"oltp batch, ranges: {large} rows / {small} rows = {ratio:.2f}x (must be < 1.5x): {verdict}"
            )
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
