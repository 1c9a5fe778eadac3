"""Local snapshot engine throughput against ``psql -c "COPY t TO STDOUT" > /dev/null`` in the same run.

A throwaway cluster gets a table of int, text, timestamptz, numeric and jsonb columns; the
baseline is psql streaming the table's text COPY to /dev/null (the server-bound ceiling), then
the local engine copies it to Parquet through a fresh slot. Target: ratio >= 0.6.

With ``--iceberg`` it also runs the example initial snapshot DAG (``airflow dags test``: the copy
from the exported snapshot, then the Spark load's spark-submit on ``local[2]`` up to the Iceberg
commit, in a local lake) and compares its rows/s with the same baseline; it needs the lake jars
(``make lake-jars``, ``POSTGRES_CDC_SPARK_JARS``).

    .venv/bin/python benchmarks/snapshot.py [--rows 2000000] [--parallelism 2] [--batch-bytes N] [--repeat 3]
        [--iceberg]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from example_dags import example_dags_sandbox, pipeline_conf
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.snapshot import DEFAULT_BATCH_BYTES, take_snapshot
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster

TARGET_RATIO = 0.6
ICEBERG_TARGET_RATIO = 0.8


def _load(pg: PostgresCluster, dbname: str, rows: int) -> None:
    pg.execute(
        "CREATE TABLE t (id int PRIMARY KEY, name text, created timestamptz, amount numeric(12, 2), "
        "doc jsonb)",
        dbname,
    )
    pg.execute(
        "INSERT INTO t SELECT g, 'customer ' || g, timestamptz '2024-01-01' + g * interval '1 second', "
        f"(g % 100000) / 100.0, jsonb_build_object('id', g, 'tag', 'x' || (g % 97)) "
        f"FROM generate_series(1, {rows}) g",
        dbname,
    )
    pg.execute("VACUUM ANALYZE t", dbname)
    pg.execute("CREATE PUBLICATION bench FOR TABLE t", dbname)


def _psql_copy(pg: PostgresCluster, dbname: str) -> float:
    psql = shutil.which("psql") or str(pg.bindir / "psql")
    env = {**os.environ, "PGHOST": pg.host, "PGPORT": str(pg.port), "PGUSER": pg.superuser}
    started = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run([psql, "-d", dbname, "-c", "COPY t TO STDOUT"], stdout=sink, check=True, env=env)
    return time.perf_counter() - started


def _engine_copy(
    pg: PostgresCluster, dbname: str, staging: str, parallelism: int, batch_bytes: int, run: int
) -> float:
    slot = f"bench_{run}"
    started = time.perf_counter()
    _, manifest = take_snapshot(
        pg.dsn(dbname), slot, ["bench"], staging,
        parallelism=parallelism, batch_bytes=batch_bytes, progress_interval=30,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    pg.execute(sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(slot)), dbname)
    shutil.rmtree(os.path.join(staging, slot))
    if manifest.total_rows != _rows(pg, dbname):
        raise SystemExit(f"engine staged {manifest.total_rows} rows, table has {_rows(pg, dbname)}")
    return seconds


def _iceberg_load(pg: PostgresCluster, dbname: str, root: Path, run: int) -> float:
    """The example initial snapshot DAG into a fresh local lake: exported snapshot to Iceberg commit."""
    lake_dir = root / f"lake-{run}"
    lake_dir.mkdir()
    lake = local_lake(str(lake_dir))
    sandbox = example_dags_sandbox(root / f"airflow-{run}", pg.uri(dbname), lake)
    sandbox.migrate()  # the metadata database, before the clock starts
    conf = pipeline_conf(f"bench_iceberg_{run}", "bench", root / "staging")
    result = sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()
    pg.execute(sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(conf["slot_name"])), dbname)
    return result.seconds


def _rows(pg: PostgresCluster, dbname: str) -> int:
    return int(pg.execute("SELECT count(*) FROM t", dbname)[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--batch-bytes", type=int, default=DEFAULT_BATCH_BYTES, help="COPY text per batch")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side; the best is kept")
    parser.add_argument("--iceberg", action="store_true", help="also the snapshot DAG into Iceberg")
    args = parser.parse_args()
    with PostgresCluster() as pg, tempfile.TemporaryDirectory(prefix="postgres-cdc-bench-") as staging:
        pg.create_database("bench")
        _load(pg, "bench", args.rows)
        # Interleaved, so load from other processes on the machine weighs on both sides alike.
        psql_times, engine_times, iceberg_times = [], [], []
        for run in range(args.repeat):
            psql_times.append(_psql_copy(pg, "bench"))
            engine_times.append(_engine_copy(pg, "bench", staging, args.parallelism, args.batch_bytes, run))
            if args.iceberg:
                iceberg_times.append(_iceberg_load(pg, "bench", Path(staging), run))
        psql_best, engine_best = min(psql_times), min(engine_times)
    psql_rate = args.rows / psql_best
    engine_rate = args.rows / engine_best
    ratio = engine_rate / psql_rate
    print(
        f"rows: {args.rows}, parallelism: {args.parallelism}, batch bytes: {args.batch_bytes}, "
        f"best of {args.repeat}"
    )
    print(f"psql COPY t TO STDOUT > /dev/null : {psql_best:7.2f} s  {psql_rate:10,.0f} rows/s")
    print(f"local engine -> Parquet (snapshot): {engine_best:7.2f} s  {engine_rate:10,.0f} rows/s")
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print(f"ratio engine/psql: {ratio:.2f}x (target >= {TARGET_RATIO}x): {verdict}")
    if iceberg_times:
        iceberg_rate = args.rows / min(iceberg_times)
        runs = ", ".join(f"{t:.1f}" for t in iceberg_times)
        best = min(iceberg_times)
        print(f"snapshot DAG -> Iceberg commit    : {best:7.2f} s  {iceberg_rate:10,.0f} rows/s ({runs})")
        ratio = iceberg_rate / psql_rate
        verdict = "PASS" if ratio >= ICEBERG_TARGET_RATIO else "FAIL"
        print(f"ratio Iceberg/psql: {ratio:.2f}x (target >= {ICEBERG_TARGET_RATIO}x): {verdict}")


if __name__ == "__main__":
    main()
