"""``make demo``: the main job end to end on this machine, from an empty PostgreSQL to equal lake tables.

1. starts a throwaway PostgreSQL (``wal_level=logical``) and loads a small shop schema;
2. writes a DAG file that builds the pipeline's DAGs with the package's factories
   (``dag_factories.initial_snapshot_dag`` and ``cdc_microbatch_dag``), as a user's would;
3. runs the ``postgres_cdc_initial_snapshot`` DAG with ``airflow dags test`` (slot with
   exported snapshot, copy, Spark load);
4. three times: commits a round of mixed changes, then runs the ``postgres_cdc_microbatch``
   DAG (lag sensor, drain, Spark apply, ack), and prints the run's and its apply's seconds. With
   ``--connect-python`` (a Python whose pyspark 4 has its ``connect`` extra) and
   ``--connect-jars`` (that Spark line's Iceberg runtime), these runs apply as clients of a Spark
   Connect server started from that pyspark before the first round, which stays warm between
   them (docs/LAKE.md, "Spark Connect"); without, they spark-submit like the snapshot;
5. prints the Asset events the runs left in Airflow's metadata database (one per lake table
   written, one per acknowledged cut), then, per table, the source's and the lake's row counts
   and whether their contents are equal (read through pyiceberg, no Spark), and the lake's latest
   consistent cut (LSN and tag).

Everything lands in ``demo-output/`` (staging, the lake's warehouse and SQLite catalog, the DAG
file, Airflow home), which is kept for a look with Spark, pyiceberg or DuckDB (README, "Reading the lake").
Exit status 1 when any table differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, ShopWorkload
from airflow_provider_postgres_cdc.engine.lake_catalog import latest_cut
from airflow_provider_postgres_cdc.engine.report import AckPoint, collect_report, render_html
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.testing import AirflowSandbox, PostgresCluster, SparkConnectServer

SLOT = "shop_cdc"
DAG_FILE = """\
\"\"\"The demo's pipeline, built by the package's DAG factories (what a user's DAG file holds).\"\"\"

from airflow_provider_postgres_cdc.dag_factories import cdc_microbatch_dag, initial_snapshot_dag

PIPELINE = {pipeline}

initial = initial_snapshot_dag(**PIPELINE)
cdc = cdc_microbatch_dag(**PIPELINE)
"""


def write_dags(folder: Path, pipeline: dict[str, str]) -> Path:
    """The demo's DAG file in ``folder``: only what the installed package ships, no repository file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "shop_pipeline.py"
    path.write_text(DAG_FILE.format(pipeline=json.dumps(pipeline, indent=4)))
    return path


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_report(dsn: str, lake: LakeConfig, root: Path, acks: list[AckPoint]) -> Path:
    """The pipeline's HTML report (``pgcdc report``), written while the source still runs."""
    path = root / "report.html"
    path.write_text(render_html([collect_report(dsn, SLOT, lake, publications=[PUBLICATION], acks=acks)]))
    return path


def connect_server(stack: ExitStack, python: str, jars: str) -> SparkConnectServer:
    """A Spark Connect server from the pyspark of ``python``; its runs' client is that Python too."""
    probe = [python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"]
    spark_home = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    say(f"starting a Spark Connect server from {spark_home}")
    server = stack.enter_context(SparkConnectServer(spark_home, jars=jars))
    say(f"  Spark Connect server at {server.url}, started in {server.started_seconds:.0f} s")
    os.environ["POSTGRES_CDC_CONNECT_PYTHON"] = python  # the apply's client Python (the workers')
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", default="demo-output", help="directory for staging, lake and Airflow home"
    )
    parser.add_argument("--rounds", type=int, default=3, help="CDC runs after the snapshot")
    parser.add_argument(
        "--connect-python", help="apply the CDC runs on a Spark Connect server of this pyspark"
    )
    parser.add_argument("--connect-jars", default="", help="the Connect server's jars (comma-separated)")
    args = parser.parse_args(argv)
    root = Path(args.output).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "lake").mkdir()
    lake = local_lake(str(root / "lake"))
    with ExitStack() as stack:
        pg = stack.enter_context(PostgresCluster())
        say(f"PostgreSQL running on port {pg.port}; creating the shop schema")
        pg.execute("CREATE DATABASE shop")
        shop = ShopWorkload(pg.dsn("shop"))
        shop.create_schema()
        shop.initial_load()
        pipeline = {
            "postgres_conn_id": "shop_db",
            "publications": PUBLICATION,
            "slot_name": SLOT,
            "staging": str(root / "staging"),
            "lake_conn_id": "shop_lake",
            "spark_conn_id": "spark_local",
        }
        server = (
            connect_server(stack, args.connect_python, args.connect_jars) if args.connect_python else None
        )
        rounds = {"spark_conn_id": "spark_connect"} if server else None
        dag_file = write_dags(root / "dags", pipeline)
        say(f"DAG file {dag_file}: the pipeline's DAGs from the package's factories")
        sandbox = AirflowSandbox(
            root / "airflow",
            dag_file.parent,
            connections={
                "shop_db": pg.uri("shop"),
                "spark_local": "spark://local%5B2%5D",
                "shop_lake": connection_json(lake),
                **({"spark_connect": server.connection_uri()} if server else {}),
            },
        )
        say("airflow dags test postgres_cdc_initial_snapshot")
        result = sandbox.dags_test("postgres_cdc_initial_snapshot").check()
        say(f"  snapshot loaded in {result.seconds:.0f} s")
        for number in range(1, args.rounds + 1):
            shop.step()
            say(f"round {number}: changes committed; airflow dags test postgres_cdc_microbatch")
            result = sandbox.dags_test("postgres_cdc_microbatch", rounds).check()
            (lag,) = pg.execute(
                "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
                "WHERE slot_name = 'shop_cdc'",
                "shop",
            )[0]
            where = " on Spark Connect" if server else ""
            apply = sandbox.task_seconds("apply")
            say(f"  applied and acknowledged in {result.seconds:.1f} s (apply {apply:.1f} s{where})")
            say(f"  slot lag now {lag} bytes")
        events = sandbox.asset_events()
        say(f"Asset events in Airflow's metadata database: {len(events)}")
        for uri, count in sorted(Counter(event.uri for event in events).items()):
            say(f"  {count:3d}  {uri}")
        cut_events = [event for event in events if event.uri.startswith("postgres-cdc://")]
        acks = [ack for e in cut_events if (ack := AckPoint.from_event(e.extra, e.timestamp)) is not None]
        say("comparing every table with its source (pyiceberg)")
        results = compare_tables(pg.dsn("shop"), [PUBLICATION], lake)
        report = write_report(pg.dsn("shop"), lake, root, acks)
    print()
    print(format_report(results))
    print()
    cut = latest_cut(lake, SLOT)
    if cut is not None:
        say(f"latest consistent cut: source LSN {cut.lsn}, tag {cut.tag} on {len(cut.snapshots)} tables")
    say(
        f"lake: catalog {root / 'lake' / 'catalog.db'} (Iceberg JDBC on SQLite), "
        f"warehouse {root / 'lake' / 'warehouse'}"
    )
    say(f"pipeline report (open in a browser): {report}")
    equal = all(r.equal for r in results)
    say("all tables equal their source" if equal else "SOME TABLES DIFFER")
    return 0 if equal and cut is not None and cut_events else 1
