"""Drain throughput: 1,000,000 changes from a slot to staged Parquet, against two baselines measured here.

* ``pg_recvlogical`` to /dev/null: the server's streaming path with no client work at all
  (run on a copy of the slot, because pg_recvlogical confirms what it reads);
* ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``: the server's own decoding
  speed through the SQL interface, the floor under any peek-based drain.

It prints both ratios (docs/PERFORMANCE.md has the ranges measured so far). The peek
materialises the whole window on the server before its first row leaves, so the client's work
after that adds to the server's time one for one.

``--hash name [at ...]`` drains the same window a second time with those columns hashed
(``column_transforms``) and prints that drain's time against the plain one: what hashing costs.
``name`` is distinct per row, ``at`` mostly too, ``doc`` repeats.

    .venv/bin/python benchmarks/drain.py [--changes 1000000] [--transport peek|stream] [--hash name]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.replication import connect, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

WORKLOAD = """
CREATE TABLE bench (id int PRIMARY KEY, name text, at timestamptz, amount numeric(12, 2), doc jsonb);
CREATE PUBLICATION bench_pub FOR TABLE bench;
"""


def make_changes(cluster: PostgresCluster, changes: int) -> None:
    """60% inserts, 30% updates, 10% deletes, in transactions of 10,000 changes."""
    inserts, updates = int(changes * 0.6), int(changes * 0.3)
    deletes = changes - inserts - updates
    step = 10_000
    for start in range(0, inserts, step):
        cluster.execute(
            "INSERT INTO bench SELECT g, 'name ' || g, '2026-01-01'::timestamptz + g * interval '1 s', "
            f"g * 0.01, jsonb_build_object('g', g, 'tag', 'x') FROM generate_series({start}, "
            f"{min(start + step, inserts) - 1}) g"
        )
    for start in range(0, updates, step):
        cluster.execute(f"UPDATE bench SET amount = amount + 1 WHERE id >= {start} AND id < {start + step}")
    cluster.execute(f"DELETE FROM bench WHERE id >= {inserts - deletes}")


def timed(label: str, func: object) -> float:
    started = time.perf_counter()
    func()  # type: ignore[operator]
    seconds = time.perf_counter() - started
    print(f"{label:40s} {seconds:8.2f} s")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--transport", choices=("peek", "stream"), default="peek")
    parser.add_argument("--hash", nargs="+", default=[], choices=("name", "at", "amount", "doc"))
    args = parser.parse_args()
    settings = {"shared_buffers": "512MB", "max_wal_size": "4GB", "logical_decoding_work_mem": "256MB"}
    with PostgresCluster(settings) as cluster:
        cluster.execute(WORKLOAD)
        conn = connect(cluster.dsn())
        create_slot(conn, "bench_slot")
        print(f"generating {args.changes:,} changes ...")
        make_changes(cluster, args.changes)
        (end,) = cluster.execute("SELECT pg_current_wal_flush_lsn()::text")[0]
        cluster.execute("SELECT pg_copy_logical_replication_slot('bench_slot', 'recv_slot')")
        n = args.changes

        def peek_count() -> None:
            rows = cluster.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench_slot', NULL, NULL, "
                "'proto_version', '1', 'publication_names', 'bench_pub')"
            )
            print(f"  peek rows (messages incl. begin/commit): {rows[0][0]:,}")

        def recvlogical() -> None:
            subprocess.run(
                [
                    str(cluster.bindir / "pg_recvlogical"), "-d", cluster.dsn(), "--slot", "recv_slot",
                    "--start", "-o", "proto_version=1", "-o", "publication_names=bench_pub",
                    "-f", "/dev/null", "--endpos", end, "--no-loop",
                ],
                check=True,
            )  # fmt: skip

        def drain(transforms: ColumnTransformer | None = None) -> None:
            staging = tempfile.mkdtemp(prefix="postgres-cdc-bench-")  # each drain stages the window anew
            settings = DrainSettings(
                "bench_slot", ("bench_pub",), staging, transport=args.transport, max_messages=None,
                transforms=transforms,
            )  # fmt: skip
            result = drain_batch(cluster.dsn(), settings)
            print(f"  staged {result.manifest.stats.changes:,} changes, end {result.manifest.end_lsn}")

        peek_s = timed("SQL peek count (server decoding only)", peek_count)
        recv_s = timed("pg_recvlogical to /dev/null", recvlogical)
        drain_s = timed(f"drain to Parquet ({args.transport})", drain)
        hashing = ColumnTransformer(
            {"public.bench": dict.fromkeys(args.hash, "hash")}, b"benchmark-key-0123456789"
        )
        hashed_s = (
            timed(f"drain hashing {', '.join(args.hash)}", lambda: drain(hashing)) if args.hash else 0.0
        )
        conn.close()
    print()
    print(f"peek count      {n / peek_s:12,.0f} changes/s")
    print(f"pg_recvlogical  {n / recv_s:12,.0f} changes/s")
    print(f"drain           {n / drain_s:12,.0f} changes/s")
    print(f"drain / pg_recvlogical = {recv_s / drain_s:.2f}x   (target >= 2.5x)")
    print(f"drain / SQL peek count = {peek_s / drain_s:.2f}x   (target >= 0.6x, aim 0.8x)")
    if args.hash:
        print(f"drain hashing {', '.join(args.hash)} / drain = {hashed_s / drain_s:.2f}x   (time)")


if __name__ == "__main__":
    main()
