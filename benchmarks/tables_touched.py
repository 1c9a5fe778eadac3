"""What a CDC run costs as the number of tables its batch touches grows, by spark-submit and on a
warm Spark Connect server: 5, 50 and 200 tables.

    make lake-jars spark4 && POSTGRES_CDC_SPARK_JARS=... .venv/bin/python benchmarks/tables_touched.py \
        [--touched 5,50,200] [--repeat 2] [--routes submit,connect]

A throwaway PostgreSQL gets as many small keyed tables as the largest count, all in one
publication; the example DAGs (``dags_examples``) take their initial snapshot. Then, for each
count N and each route, one transaction changes one row in each of N tables and ``airflow dags
test postgres_cdc_microbatch`` drains, applies and acknowledges it; the run's wall time and its
apply task's time are recorded. ``submit`` spark-submits the apply (Spark 3.5, local[2]);
``connect`` runs it as a client of one Spark Connect server started before the rounds (Spark 4.1
with Iceberg 1.12 from ``.venv-spark4``, local[2]; its client Python is that virtualenv's). The
counts and routes are interleaved over ``--repeat`` rounds (noise then hits all of them alike) and
the fastest run of each counts. The baseline of the ratios is spark-submit's run touching the
fewest tables, measured in the same session. Targets on Connect: the fewest tables' apply task
at most 3 s and its whole run at most 10 s; the most tables at most 2x the fewest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from example_dags import example_dags_sandbox, pipeline_conf

from airflow_provider_postgres_cdc.engine.verify import compare_tables
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster, SparkConnectServer

PUBLICATION = "bench_pub"
SLOT = "bench_cdc"
ROWS = 20  # per table
ROOT = Path(__file__).resolve().parents[1]
SPARK4_PYTHON = ROOT / ".venv-spark4" / "bin" / "python"


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


def _connect_server(stack: ExitStack) -> SparkConnectServer:
    """The Spark 4.1 Connect server of ``.venv-spark4``, with its lake jars, for the whole run."""
    probe = [str(SPARK4_PYTHON), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"]
    spark_home = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    listed = [str(ROOT / "tools/lake-jars/jars.sh"), "list", "4.1", str(ROOT / ".venv/lake-jars/spark-4.1")]
    jars = subprocess.run(listed, capture_output=True, text=True, check=True).stdout.strip()
    server = stack.enter_context(SparkConnectServer(spark_home, jars=jars))
    print(f"Spark Connect server started in {server.started_seconds:.1f} s", flush=True)
    os.environ["POSTGRES_CDC_CONNECT_PYTHON"] = str(SPARK4_PYTHON)  # the workers' client Python
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--touched", default="5,50,200", help="comma-separated table counts")
    parser.add_argument("--repeat", type=int, default=2, help="rounds over every count")
    parser.add_argument("--routes", default="submit,connect", help="submit, connect, or both")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.touched.split(",")})
    routes = [r for r in ("submit", "connect") if r in args.routes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="tables-touched-"))
    (root / "lake").mkdir()
    lake = local_lake(str(root / "lake"))
    confs = {"submit": pipeline_conf(SLOT, PUBLICATION, root / "staging")}
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {(r, n): [] for r in routes for n in counts}
    with ExitStack() as stack:
        pg = stack.enter_context(PostgresCluster())
        pg.execute("CREATE DATABASE bench")
        _create(pg, "bench", counts[-1])
        extra = {}
        if "connect" in routes:
            extra["spark_connect"] = _connect_server(stack).connection_uri()
            confs["connect"] = {**confs["submit"], "spark_conn_id": "spark_connect"}
        sandbox = example_dags_sandbox(root / "airflow", pg.uri("bench"), lake, extra)
        started = time.monotonic()
        sandbox.dags_test("postgres_cdc_initial_snapshot", confs["submit"]).check()
        print(f"initial snapshot of {counts[-1]} tables: {time.monotonic() - started:.1f} s", flush=True)
        for round_ in range(args.repeat):
            for n in counts:
                for route in routes:
                    _touch(pg, "bench", n, round_ * len(routes) + routes.index(route))
                    result = sandbox.dags_test("postgres_cdc_microbatch", confs[route]).check()
                    runs[route, n].append((result.seconds, sandbox.task_seconds("apply")))
                    print(
                        f"round {round_ + 1}: {route:7s} {n:4d} tables: run {result.seconds:6.1f} s, "
                        f"apply {runs[route, n][-1][1]:5.1f} s",
                        flush=True,
                    )
        unequal = [r.table for r in compare_tables(pg.dsn("bench"), [PUBLICATION], lake) if not r.equal]
    if unequal:
        print(f"FAILED: lake tables differ from their source: {unequal}")
        return 1
    base = min(s for s, _ in runs[routes[0], counts[0]])
    print(f"\n{'route':>7} {'tables':>6} {'best run s':>10} {'best apply s':>12} {'runs':>24} {'ratio':>6}")
    for route in routes:
        for n in counts:
            best, apply = min(s for s, _ in runs[route, n]), min(a for _, a in runs[route, n])
            shown = ", ".join(f"{s:.1f}" for s, _ in runs[route, n])
            print(f"{route:>7} {n:6d} {best:10.1f} {apply:12.1f} {shown:>24} {best / base:6.2f}x")
    for route in routes:
        fewest, most = (min(s for s, _ in runs[route, n]) for n in (counts[0], counts[-1]))
        print(f"{route}: {counts[-1]} tables to {counts[0]}: {most / fewest:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
