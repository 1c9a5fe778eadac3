"""Data-aware scheduling end to end, with a real scheduler: a CDC run's Asset events start the downstream DAG.

One pipeline on the demo shop schema, real PostgreSQL, real ``spark-submit`` in local mode, and
Airflow's scheduler and API server (``AirflowServices`` with the job schedule on):

1. the initial snapshot is loaded (in the shared Spark session: the snapshot DAG's Asset events are
   test_openlineage's), then a CDC run is triggered; a writer keeps committing orders, each with
   its order lines and a total equal to their sum, in one transaction, all the while;
2. the CDC run's Asset events carry the batch's LSN window, cut tag and Iceberg snapshot ids;
3. the scheduler queues ``postgres_cdc_downstream_example`` because of the cut event, and that run
   computes revenue per customer at the cut: exactly what the source held at the cut's LSN
   (the writer's orders up to the last one committed by then, each with all its lines);
4. the StatsD metrics reach a real UDP listener configured as Airflow's StatsD host.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.assets import cut_asset, table_asset
from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, ShopWorkload
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.formats.lake import local_lake, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.e2e.e2e_support import lake_state, pipeline_conf, pipeline_sandbox

SLOT = "shop_assets"
DOWNSTREAM = "postgres_cdc_downstream_example"
FIRST_ORDER = 1_000_000
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


@dataclass
class Writer:
    """Commits one order with its lines per transaction and brackets each commit's LSN."""

    dsn: str
    committed: list[tuple[int, Lsn, Lsn]] = field(default_factory=list)  # (order id, before, after)
    errors: list[BaseException] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                n = 0
                while not stop.is_set():
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
                    n += 1
                    stop.wait(0.05)
            conn.close()
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def orders_at(self, lsn: Lsn) -> tuple[int, int]:
        """The fewest and most writer orders the source can have held at ``lsn``: an order whose
        commit was bracketed across ``lsn`` may or may not be in."""
        surely = sum(1 for _, _, after in self.committed if after <= lsn)
        maybe = sum(1 for _, before, _ in self.committed if before < lsn)
        return surely, maybe


@contextmanager
def writing(writer: Writer) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=writer.run, args=(stop,), name="writer")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
    assert not writer.errors, writer.errors


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


@pytest.mark.timeout(1200)
def test_cdc_asset_events_schedule_the_downstream_dag_on_the_exact_cut(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=22)
    shop.create_schema()
    shop.initial_load()
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"), catalog="lake_assets")  # its own name in the shared session
    lake_conn = connection_json(lake)
    sandbox = pipeline_sandbox(tmp_path / "airflow", pg_cluster.uri(pg_dbname), lake_conn)
    conf = pipeline_conf(SLOT, tmp_path / "staging")
    writer = Writer(dsn)
    register_lake(spark, lake)
    with statsd_listener() as (port, stats), writing(writer):
        snapshot, _ = take_snapshot(dsn, SLOT, [PUBLICATION], conf["staging"])
        apply_manifest(spark, snapshot, lake)
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
            services.trigger("postgres_cdc_initial_snapshot", conf).check()
            assert services.asset_events(
                source_dag_id="postgres_cdc_initial_snapshot", source_task_id="postgres_cdc_snapshot.load"
            )
            assert not services.dag_runs(DOWNSTREAM), "a snapshot load is no acknowledged cut"
            cdc = services.trigger("postgres_cdc_microbatch", conf).check()
            downstream = services.wait_for_runs(DOWNSTREAM, 1).check()
            table_events = services.asset_events(
                source_dag_id="postgres_cdc_microbatch", source_task_id="postgres_cdc.apply"
            )
            cut_events = services.asset_events(
                source_dag_id="postgres_cdc_microbatch", source_task_id="postgres_cdc.ack"
            )
            result = services.api(
                "GET",
                f"/dags/{DOWNSTREAM}/dagRuns/{downstream.runs[0].run_id}/taskInstances/revenue_per_customer/xcomEntries/return_value",
                query={"deserialize": "true"},
            )["value"]

    # 2. The CDC run's events: one per table written, one cut, all with the batch's window and tag.
    assert len(cdc.runs) == 1 and len(cut_events) == 1, cut_events
    cut = cut_events[0]
    extra = cut["extra"]
    assert cut["uri"] == cut_asset(lake, SLOT).uri
    end = Lsn.parse(extra["end_lsn"])
    assert extra["slot"] == SLOT and extra["lsn"] == extra["end_lsn"] and extra["tag"] == tag_name(end)
    assert Lsn.parse(extra["start_lsn"]) < end and extra["changes"] > 0
    assert extra["latency_seconds"] is not None and extra["latency_seconds"] >= 0
    assert [run["dag_id"] for run in cut["created_dagruns"]] == [DOWNSTREAM]
    written = {event["uri"]: event["extra"] for event in table_events}
    assert set(written) == {table_asset(lake, "public", t).uri for t in ("orders", "order_items")}
    for qualified, event in ((e["table"], e) for e in written.values()):
        state = lake_state(lake, qualified)
        assert (event["start_lsn"], event["end_lsn"], event["tag"]) == (
            extra["start_lsn"],
            extra["end_lsn"],
            extra["tag"],
        )
        assert event["snapshot_id"] == state.snapshot_id and event["batch_id"] == extra["batch_id"]
        assert event["rows_inserted"] > 0 and event["rows_updated"] == event["rows_deleted"] == 0
        namespace, table = lake.identifier(*qualified.split("."))
        assert extra["tables"][f"{namespace}.{table}"] == event["snapshot_id"]

    # 3. The downstream run read exactly the cut: the source at its LSN, while the writer went on.
    assert (result["tag"], result["lsn"]) == (extra["tag"], extra["lsn"])
    surely, maybe = writer.orders_at(end)
    assert len(writer.committed) > maybe, "the writer must have gone on past the cut"
    last = result["newest_order_id"] - FIRST_ORDER + 1
    assert surely <= last <= maybe, (surely, last, maybe)
    assert normalized(result["customers"]) == normalized(source_revenue(dsn, result["newest_order_id"]))

    # 4. Metrics, tagged by name with the slot, on a real StatsD listener.
    names = {line.split(":", 1)[0] for line in stats}
    for metric in ("batch.changes", "drain.seconds", "apply.seconds", "slot.lag_bytes", "batch.latency"):
        assert (
            f"airflow.postgres_cdc.{metric}" in names and f"airflow.postgres_cdc.{metric}.{SLOT}" in names
        ), (
            metric,
            sorted(names),
        )
    changes = [line for line in stats if line.startswith(f"airflow.postgres_cdc.batch.changes.{SLOT}:")]
    assert changes and int(float(changes[-1].split(":")[1].split("|")[0])) == extra["changes"]
