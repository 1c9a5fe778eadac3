"""What a CDC run costs as the number of tables its batch touches grows: 5, 50 and 200 tables.

    make lake-jars && POSTGRES_CDC_SPARK_JARS=... .venv/bin/python benchmarks/tables_touched.py \
        [--touched 5,50,200] [--repeat 2]

A throwaway PostgreSQL gets as many small keyed tables as the largest count, all in one
publication; the example DAGs (``dags_examples``) take their initial snapshot. Then, for each
count N, one transaction changes one row in each of N tables and ``airflow dags test
postgres_cdc_microbatch`` drains, applies (spark-submit, local[2]) and acknowledges it; the run's
wall time is recorded. The counts are interleaved over ``--repeat`` rounds (noise then hits all of
them alike) and the fastest run of each counts. The baseline of the ratio is the run touching the
fewest tables, measured in the same session. Targets: the largest count at most 3x the baseline,
and the 5-table run at most 20 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from example_dags import example_dags_sandbox, pipeline_conf

from airflow_provider_postgres_cdc.engine.verify import compare_tables
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster

PUBLICATION = "bench_pub"
SLOT = "bench_cdc"
ROWS = 20  # per table


def _create(pg: PostgresCluster, dbname: str, tables: int) -> None:
    statements = [
        f"CREATE TABLE t{i:03d} (id int PRIMARY KEY, name text, amount numeric(12, 2), seen timestamptz); "
        f"INSERT INTO t{i:03d} SELECT g, 'row ' || g, g / 4.0, now() FROM generate_series(1, {ROWS}) g"
        for i in range(tables)
    ]
    pg.execute("; ".join(statements), dbname)
    pg.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES", dbname)


def _touch(pg: PostgresCluster, dbname: str, tables: int, round_: int) -> None:
    """One transaction changing one row of each of the first ``tables`` tables."""
    updates = [
        f"UPDATE t{i:03d} SET name = 'round {round_}', amount = amount + 1 WHERE id = {1 + round_ % ROWS}"
        for i in range(tables)
    ]
    pg.execute("BEGIN; " + "; ".join(updates) + "; COMMIT", dbname)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--touched", default="5,50,200", help="comma-separated table counts")
    parser.add_argument("--repeat", type=int, default=2, help="rounds over every count")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.touched.split(",")})
    root = Path(tempfile.mkdtemp(prefix="tables-touched-"))
    (root / "lake").mkdir()
    lake = local_lake(str(root / "lake"))
    conf = pipeline_conf(SLOT, PUBLICATION, root / "staging")
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    with PostgresCluster() as pg:
        pg.execute("CREATE DATABASE bench")
        _create(pg, "bench", counts[-1])
        sandbox = example_dags_sandbox(root / "airflow", pg.uri("bench"), lake)
        started = time.monotonic()
        sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()
        print(f"initial snapshot of {counts[-1]} tables: {time.monotonic() - started:.1f} s", flush=True)
        for round_ in range(args.repeat):
            for n in counts:
                _touch(pg, "bench", n, round_)
                result = sandbox.dags_test("postgres_cdc_microbatch", conf).check()
                seconds[n].append(result.seconds)
                print(f"round {round_ + 1}: {n:4d} tables touched: {result.seconds:6.1f} s", flush=True)
        unequal = [r.table for r in compare_tables(pg.dsn("bench"), [PUBLICATION], lake) if not r.equal]
    if unequal:
        print(f"FAILED: lake tables differ from their source: {unequal}")
        return 1
    base = min(seconds[counts[0]])
    print(f"\n{'tables':>6} {'best s':>8} {'runs':>20} {'ratio':>6}")
    for n in counts:
        runs = ", ".join(f"{s:.1f}" for s in seconds[n])
        print(f"{n:6d} {min(seconds[n]):8.1f} {runs:>20} {min(seconds[n]) / base:6.2f}x")
    print(
        f"\nratio {counts[-1]} to {counts[0]} tables: {min(seconds[counts[-1]]) / base:.2f}x (target <= 3x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
