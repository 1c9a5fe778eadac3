"""The CDC pipeline under a real scheduler: a backlog caught up by a chain of runs through a killed
apply, each run's Asset events, and the downstream DAG they schedule reading exactly its cut.

One pipeline on the demo shop schema, real PostgreSQL, Airflow's scheduler and API server (the job
schedule on, for Asset-triggered runs), real ``spark-submit`` in local mode for every CDC run. The
initial snapshot is loaded in the shared Spark session (the snapshot DAG's Asset events, none of
them a cut, are test_openlineage's). Then a backlog piles up while no CDC runs: rounds of the
shop's changes, then orders committed one per transaction (each with its lines and a total equal
to their sum), whose commit LSNs are bracketed. One CDC run is triggered with a ``max_messages``
that ends its batch a third of the way through those orders:

1. the first two batches are full, so each run's ``catch_up`` task triggers the next run with the
   same conf and the chain's start; the third batch takes the rest, is not full, and its
   ``catch_up`` is skipped;
2. the second run's Spark driver is killed mid-apply; the task's retry finishes the batch and the
   chain goes on;
3. each batch starts exactly where the previous ack left the slot, every staged change is in its
   table's changelog once, and the lake equals the source;
4. each run's Asset events carry its batch's LSN window, cut tag and Iceberg snapshot ids;
5. the scheduler runs ``postgres_cdc_downstream_example`` once per cut, and each run computes
   revenue per customer at its cut: exactly what the source held at the cut's LSN (the first two
   cuts part of the way through the orders, though the lake and source had moved on);
6. the StatsD metrics reach a real UDP listener configured as Airflow's StatsD host.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.assets import cut_asset, table_asset
from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.catch_up import CATCH_UP_SINCE
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.testing import AirflowServices, PostgresCluster
from tests.integration.e2e.e2e_support import (
    DAGS,
    assert_changelog_holds,
    load_initial_snapshot,
    pipeline_conf,
    pipeline_sandbox,
    session_lake,
    staged_changes,
)

SLOT = "shop_scheduled"
CDC = "postgres_cdc_microbatch"
DOWNSTREAM = "postgres_cdc_downstream_example"
FIRST_ORDER = 1_000_000
PUBLISHED = set(TABLES)
# The writer's orders in the backlog, at least as many as the shop's changes before them: a batch of
# the shop's changes and a third of the orders' then ends within the orders, and so does the next.
ORDERS = 120
# The example CDC DAG without its schedule (every run here is the test's or the chain's) and with a
# retry after 5 s instead of a minute: the killed apply's retry comes sooner.
CDC_DAG = """
from datetime import timedelta

from airflow_provider_postgres_cdc.dag_factories import cdc_microbatch_dag

retry_soon = {{"retries": 2, "retry_delay": timedelta(seconds=5)}}
dag = cdc_microbatch_dag(schedule=None, staging="{staging}", default_args=retry_soon)
"""
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


@dataclass
class Writer:
    """Commits one order with its lines per transaction and brackets each commit's LSN."""

    dsn: str
    committed: list[tuple[int, Lsn, Lsn]] = field(default_factory=list)  # (order id, before, after)

    def write(self, orders: int) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with closing(conn), conn.cursor() as cur:
            for n in range(orders):
                order = FIRST_ORDER + n
                cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                before = Lsn.parse(cur.fetchone()[0])
                cur.execute(
                    "BEGIN;"
                    "INSERT INTO order_items VALUES "
                    "(%(o)s, 1, 'sku-1', %(q)s, 2.50), (%(o)s, 2, 'sku-2', 1, 10.00);"
                    "INSERT INTO orders (id, customer_id, status, total, placed_at) "
                    "VALUES (%(o)s, %(c)s, 'new', %(q)s * 2.50 + 10.00, now());"
                    "COMMIT;",
                    {"o": order, "q": n % 4 + 1, "c": n % 7 + 1},
                )
                cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                self.committed.append((order, before, Lsn.parse(cur.fetchone()[0])))

    def orders_at(self, lsn: Lsn) -> tuple[int, int]:
        """The fewest and most writer orders the source can have held at ``lsn``: an order whose
        commit was bracketed across ``lsn`` may or may not be in."""
        surely = sum(1 for _, _, after in self.committed if after <= lsn)
        maybe = sum(1 for _, before, _ in self.committed if before < lsn)
        return surely, maybe


@contextmanager
def statsd_listener() -> Iterator[tuple[int, list[str]]]:
    """A UDP socket on a free loopback port, collecting every StatsD line sent to it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    lines: list[str] = []
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            lines.extend(data.decode(errors="replace").splitlines())

    thread = threading.Thread(target=receive, name="statsd")
    thread.start()
    try:
        yield sock.getsockname()[1], lines
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def source_revenue(dsn: str, last_order: int) -> dict[str, dict[str, str]]:
    """Per customer: orders, totals and line revenue of the source, writer orders up to ``last_order``."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(
            "WITH o AS (SELECT * FROM orders WHERE id < %(first)s OR id <= %(last)s), "
            "l AS (SELECT o.customer_id, sum(i.qty * i.unit_price) AS revenue FROM order_items i "
            "      JOIN o ON o.id = i.order_id GROUP BY 1) "
            "SELECT o.customer_id, count(*), sum(o.total), coalesce(l.revenue, 0) FROM o "
            "LEFT JOIN l USING (customer_id) GROUP BY o.customer_id, l.revenue",
            {"first": FIRST_ORDER, "last": last_order},
        )
        rows = cur.fetchall()
    return {
        str(customer): {"orders": count, "total": str(total), "line_revenue": str(Decimal(revenue))}
        for customer, count, total, revenue in rows
    }


def normalized(customers: dict[str, dict[str, Any]]) -> dict[str, tuple[int, Decimal, Decimal]]:
    return {
        c: (int(v["orders"]), Decimal(str(v["total"])), Decimal(str(v["line_revenue"])))
        for c, v in customers.items()
    }


def backlog_messages(pg: PostgresCluster, dbname: str) -> int:
    """pgoutput messages waiting in the slot (peeked: the slot does not move)."""
    ((count,),) = pg.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
        f"'{SLOT}', NULL, NULL, 'proto_version', '1', 'publication_names', '{PUBLICATION}')",
        dbname,
    )
    return int(count)


def task_xcom(services: AirflowServices, dag_id: str, run_id: str, task_id: str) -> Any:
    path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    return services.api("GET", path, query={"deserialize": "true"})["value"]


def task_instance(services: AirflowServices, run_id: str, task_id: str) -> dict[str, Any]:
    return dict(services.api("GET", f"/dags/{CDC}/dagRuns/{run_id}/taskInstances/{task_id}"))


def kill_second_apply(services: AirflowServices, staging: Path) -> int:
    """Wait for the chain's second run to be applying, then SIGKILL its Spark driver; its pid."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        runs = services.dag_runs(CDC)
        if (
            len(runs) >= 2
            and task_instance(services, runs[1].run_id, "postgres_cdc.apply")["state"] == "running"
        ):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes()
                except OSError:  # the process ended meanwhile
                    continue
                if b"org.apache.spark.deploy.SparkSubmit" in text and str(staging).encode() in text:
                    pid = int(cmdline.parent.name)
                    os.kill(pid, signal.SIGKILL)
                    return pid
        time.sleep(0.2)
    raise AssertionError(f"the second run never applied:\n{services.logs()}")


@pytest.mark.timeout(1500)
def test_a_backlog_is_caught_up_through_a_killed_apply_and_each_cut_schedules_the_downstream_dag(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=22)
    shop.create_schema()
    shop.initial_load()
    lake = session_lake(spark, tmp_path / "lake", "lake_scheduled")
    staging = tmp_path / "staging"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "cdc.py").write_text(CDC_DAG.format(staging=staging))
    shutil.copy(DAGS / f"{DOWNSTREAM}.py", dags)
    sandbox = pipeline_sandbox(
        tmp_path / "airflow", pg_cluster.uri(pg_dbname), connection_json(lake), dags=dags
    )
    conf = pipeline_conf(SLOT, staging)
    load_initial_snapshot(spark, lake, dsn, SLOT, conf["staging"])
    for _ in range(2):
        shop.step()
    shop_messages = backlog_messages(pg_cluster, pg_dbname)
    writer = Writer(dsn)
    writer.write(max(ORDERS, shop_messages))
    order_messages = backlog_messages(pg_cluster, pg_dbname) - shop_messages
    conf = {**conf, "max_messages": shop_messages + order_messages // 3}

    with statsd_listener() as (port, stats):
        sandbox.extra_env.update(
            POSTGRES_CDC_DOWNSTREAM_CATALOG=lake.catalog,
            POSTGRES_CDC_DOWNSTREAM_SLOT=SLOT,
            POSTGRES_CDC_DOWNSTREAM_LAKE_CONN_ID="lake",
            AIRFLOW__METRICS__STATSD_ON="True",
            AIRFLOW__METRICS__STATSD_HOST="127.0.0.1",
            AIRFLOW__METRICS__STATSD_PORT=str(port),
            AIRFLOW__METRICS__STATSD_PREFIX="airflow",
        )
        with sandbox.services(job_schedule=True) as services:
            services.set_paused(DOWNSTREAM, False)
            services.set_paused(CDC, False)
            first = services.api("POST", f"/dags/{CDC}/dagRuns", {"logical_date": None, "conf": conf})
            killed = kill_second_apply(services, staging)
            chain = services.wait_for_runs(CDC, 3, timeout=900).check().runs
            downstream = services.wait_for_runs(DOWNSTREAM, 3).check().runs
            drained = [task_xcom(services, CDC, run.run_id, "postgres_cdc.drain") for run in chain]
            catch_up = [
                task_instance(services, run.run_id, "postgres_cdc.catch_up")["state"] for run in chain
            ]
            apply_tries = [
                task_instance(services, run.run_id, "postgres_cdc.apply")["try_number"] for run in chain
            ]
            table_events = services.asset_events(source_dag_id=CDC, source_task_id="postgres_cdc.apply")
            cut_events = services.asset_events(source_dag_id=CDC, source_task_id="postgres_cdc.ack")
            results = [
                task_xcom(services, DOWNSTREAM, run.run_id, "revenue_per_customer") for run in downstream
            ]

    # 1. Each full batch's run started one more run, with its conf and the chain's start; the last stopped.
    assert len(chain) == 3 and chain[0].run_id == first["dag_run_id"], chain
    assert [d["full"] for d in drained] == [True, True, False], drained
    assert catch_up == ["success", "success", "skipped"]
    assert chain[0].start_date is not None
    for follow in chain[1:]:
        assert follow.conf == {**conf, CATCH_UP_SINCE: follow.conf[CATCH_UP_SINCE]}
        since = datetime.fromisoformat(follow.conf[CATCH_UP_SINCE])
        assert abs((since - chain[0].start_date).total_seconds()) < 1, (since, chain[0].start_date)

    # 2. The killed apply was retried (its driver really died: the pid is gone).
    assert apply_tries == [1, 2, 1] and not Path(f"/proc/{killed}").exists()

    # 3. Contiguous windows, each change logged once, and the lake equals the source.
    for earlier, later in itertools.pairwise(drained):
        assert later["start_lsn"] == earlier["end_lsn"]
    ((confirmed,),) = pg_cluster.execute(
        f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'", pg_dbname
    )
    assert confirmed == drained[-1]["end_lsn"]
    staged = staged_changes(pafs.LocalFileSystem(), str(staging / SLOT))
    assert assert_changelog_holds(lake, staged) == sum(d["changes"] for d in drained)
    compared = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in compared), format_report(compared)

    # 4. Each run's events: one per table written, one cut, all with the batch's window and tag.
    assert [Lsn.parse(c["extra"]["end_lsn"]) for c in cut_events] == [
        Lsn.parse(d["end_lsn"]) for d in drained
    ]
    for cut in cut_events:
        extra = cut["extra"]
        assert cut["uri"] == cut_asset(lake, SLOT).uri
        end = Lsn.parse(extra["end_lsn"])
        assert extra["slot"] == SLOT and extra["lsn"] == extra["end_lsn"] and extra["tag"] == tag_name(end)
        assert Lsn.parse(extra["start_lsn"]) < end and extra["changes"] > 0
        assert extra["latency_seconds"] is not None and extra["latency_seconds"] >= 0
        assert [run["dag_id"] for run in cut["created_dagruns"]] == [DOWNSTREAM]
        written = {e["uri"]: e["extra"] for e in table_events if e["extra"]["end_lsn"] == extra["end_lsn"]}
        assert written and all(e["table"] in PUBLISHED for e in written.values())
        for event in written.values():
            assert (event["start_lsn"], event["tag"], event["batch_id"]) == (
                extra["start_lsn"],
                extra["tag"],
                extra["batch_id"],
            )
            namespace, table = lake.identifier(*event["table"].split("."))
            assert extra["tables"][f"{namespace}.{table}"] == event["snapshot_id"]
    # The last batch holds only the writer's orders: inserts into two tables.
    last = {e["uri"]: e["extra"] for e in table_events if e["extra"]["end_lsn"] == drained[-1]["end_lsn"]}
    assert set(last) == {table_asset(lake, "public", t).uri for t in ("orders", "order_items")}
    assert all(e["rows_inserted"] > 0 and e["rows_updated"] == e["rows_deleted"] == 0 for e in last.values())

    # 5. One downstream run per cut, each reading exactly its cut: the source at its LSN. The first
    # two cuts are part of the way through the writer's orders, which the lake and source went past.
    assert [(r["tag"], r["lsn"]) for r in results] == [
        (c["extra"]["tag"], c["extra"]["lsn"]) for c in cut_events
    ]
    for result in results:
        surely, maybe = writer.orders_at(Lsn.parse(result["lsn"]))
        newest = result["newest_order_id"] - FIRST_ORDER + 1
        assert surely <= newest <= maybe, (surely, newest, maybe)
        assert normalized(result["customers"]) == normalized(source_revenue(dsn, result["newest_order_id"]))
    orders_read = [r["newest_order_id"] - FIRST_ORDER + 1 for r in results]
    assert 0 < orders_read[0] < orders_read[1] < orders_read[2] == len(writer.committed), orders_read

    # 6. Metrics, tagged by name with the slot, on a real StatsD listener.
    names = {line.split(":", 1)[0] for line in stats}
    for metric in ("batch.changes", "drain.seconds", "apply.seconds", "slot.lag_bytes", "batch.latency"):
        assert (
            f"airflow.postgres_cdc.{metric}" in names and f"airflow.postgres_cdc.{metric}.{SLOT}" in names
        ), (
            metric,
            sorted(names),
        )
    changes = [line for line in stats if line.startswith(f"airflow.postgres_cdc.batch.changes.{SLOT}:")]
    assert {int(float(line.split(":")[1].split("|")[0])) for line in changes} == {
        c["extra"]["changes"] for c in cut_events
    }
