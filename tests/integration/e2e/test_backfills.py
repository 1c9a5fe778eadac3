"""Backfills while the CDC runs: an added table, a lost slot, re-snapshots, re-runs, a date-range backfill.

Each pipeline runs on real PostgreSQL, real Airflow (``airflow dags test`` of the example DAGs, and
a real scheduler for ``airflow backfill create``) and real ``spark-submit`` in local mode, from an
initial snapshot loaded in the shared Spark session; at the end every lake table must equal its
source.

In ``make test``: a table added to the publication by the backfill DAG while a writer keeps
changing it, then streamed by the CDC run after it.

In ``make test-long`` (marker ``long``, about 6 minutes more): a re-snapshot of two tables whose
load comes only after the CDC applied a batch reaching past its consistent point (the load must
replay those changes from the changelog); ``airflow backfill create`` of the CDC DAG over three
intervals (the runs go in order); a past CDC run cleared and run again (nothing may change); and,
on a pipeline of its own, the slot invalidated for real (``max_slot_wal_keep_size``): the CDC run
fails pointing to the recovery DAG, which recreates the slot and reloads every table. (The pieces
of that recovery, a slot really invalidated and a lost slot recreated, are
tests/integration/sensors/test_slot_invalidation.py's and
tests/integration/snapshot/test_resnapshot.py's in ``make test``.)
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.testing import AirflowSandbox, PostgresCluster
from tests.integration.e2e.e2e_support import (
    lake_snapshots,
    lake_state,
    load_initial_snapshot,
    pipeline_conf,
    pipeline_sandbox,
    session_lake,
    spark_apply,
)

SLOT = "shop_backfill"
REFUNDS = {"table": "public.refunds", "columns": ["id", "order_id", "amount"], "row_filter": "amount > 0"}
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


def slot_state(pg: PostgresCluster, dbname: str) -> list[tuple[Any, ...]]:
    """Every slot of the database with its positions (a temporary re-snapshot slot would show too)."""
    return pg.execute(
        "SELECT slot_name::text, temporary, restart_lsn::text, confirmed_flush_lsn::text, wal_status "
        "FROM pg_replication_slots WHERE database = current_database() ORDER BY 1",
        dbname,
    )


def invalidate_slot(pg: PostgresCluster, dbname: str, shop: ShopWorkload) -> None:
    """Make PostgreSQL invalidate the pipeline slot: a 1 MB WAL cap, segment switches, checkpoints."""
    pg.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    pg.execute("SELECT pg_reload_conf()")
    try:
        for _ in range(6):
            shop.step()
            pg.execute("SELECT pg_switch_wal()", dbname)
            pg.execute("CHECKPOINT", dbname)
            if [r[4] for r in slot_state(pg, dbname)] == ["lost"]:
                return
        raise AssertionError(f"the slot was not invalidated: {slot_state(pg, dbname)}")
    finally:
        pg.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        pg.execute("SELECT pg_reload_conf()")


@contextmanager
def writer(dsn: str) -> Iterator[None]:
    """Keep changing refunds (in and out of its row filter) and orders until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            n = 0
            with conn.cursor() as cur:
                while not stop.is_set():
                    n += 1
                    cur.execute(
                        "INSERT INTO refunds VALUES (%s, %s, %s, 'late'); "
                        "UPDATE refunds SET amount = -amount WHERE id = %s; "
                        "UPDATE orders SET notes = %s WHERE id = (SELECT min(id) FROM orders)",
                        (10_000 + n, n, n % 50 - 10, n // 2 + 1, f"writer {n}"),
                    )
                    stop.wait(0.05)
            conn.close()
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="writer")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not errors, errors


def start_pipeline(
    pg: PostgresCluster, dbname: str, root: Path, spark: SparkSession
) -> tuple[ShopWorkload, dict[str, Any], LakeConfig, AirflowSandbox]:
    """The shop and a refunds table with a row filter's identity, its initial snapshot loaded in the
    shared Spark session (the snapshot DAG is the other end-to-end tests'): (workload, the example
    DAGs' run conf, lake, sandbox running the example DAGs)."""
    shop = ShopWorkload(pg.dsn(dbname), seed=23)
    shop.create_schema()
    shop.initial_load()
    pg.execute(
        # Its row filter's column must be in the replica identity, or PostgreSQL rejects its updates.
        "CREATE TABLE refunds (id bigint PRIMARY KEY, order_id bigint, amount int NOT NULL, reason text);"
        "CREATE UNIQUE INDEX refunds_identity ON refunds (id, amount);"
        "ALTER TABLE refunds REPLICA IDENTITY USING INDEX refunds_identity;"
        "INSERT INTO refunds SELECT g, g, g % 40 - 10, 'early' FROM generate_series(1, 300) g;",
        dbname,
    )
    staging = root / "staging"
    lake = session_lake(spark, root / "lake", "lake_backfills")
    sandbox = pipeline_sandbox(root / "airflow", pg.uri(dbname), connection_json(lake))
    conf = pipeline_conf(SLOT, staging)
    load_initial_snapshot(spark, lake, pg.dsn(dbname), SLOT, conf["staging"])
    return shop, conf, lake, sandbox


def assert_lake_equals_source(dsn: str, lake: LakeConfig, tables: set[str]) -> None:
    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == tables


@pytest.mark.timeout(1800)
def test_an_added_table_is_loaded_by_the_backfill_dag_under_a_writer_then_streamed_end_equal(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop, conf, lake, sandbox = start_pipeline(pg_cluster, pg_dbname, tmp_path, spark)

    # Add refunds (columns and row filter) while a writer keeps changing it.
    with writer(dsn):
        run = sandbox.dags_test(
            "postgres_cdc_backfill_tables", {**conf, "tables": ["public.customers"], "add_tables": [REFUNDS]}
        ).check()
    assert "public.refunds" in run.output
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()
    assert_lake_equals_source(dsn, lake, {*TABLES, "public.refunds"})


@pytest.mark.long
@pytest.mark.timeout(2400)
def test_resnapshots_behind_the_cdc_a_scheduler_backfill_and_a_rerun_end_equal(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop, conf, lake, sandbox = start_pipeline(pg_cluster, pg_dbname, tmp_path, spark)
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()

    # 1. Re-snapshot two tables; the CDC applies a batch reaching past the consistent point first.
    before = slot_state(pg_cluster, pg_dbname)
    path, resnap = take_snapshot(
        dsn,
        SLOT,
        [PUBLICATION],
        conf["staging"],
        tables=["public.orders", "public.products"],
        slot_mode="temporary",
    )
    assert slot_state(pg_cluster, pg_dbname) == before  # the pipeline slot is untouched
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()
    applied = lake_state(lake, "public.orders")
    assert applied.applied_end_lsn > resnap.end_lsn
    spark_apply(path, lake)
    reloaded = lake_state(lake, "public.orders")
    assert reloaded.base_lsn == resnap.end_lsn and reloaded.applied_end_lsn == applied.applied_end_lsn

    # 2. airflow backfill create over past 15-minute intervals: a scheduler runs them in order.
    shop.step()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    with sandbox.services() as services:
        result = services.backfill(
            "postgres_cdc_microbatch",
            (now - timedelta(minutes=50)).isoformat(),
            (now - timedelta(minutes=20)).isoformat(),
            conf=conf,
        ).check()
        runs = sorted(result.runs, key=lambda r: r.logical_date or now)
        assert len(runs) >= 2 and all(r.run_type == "backfill" for r in runs)
        for earlier, later in itertools.pairwise(runs):
            assert earlier.end_date and later.start_date and earlier.end_date <= later.start_date

        # 3. Clearing a past run and running it again applies nothing twice and moves nothing back.
        versions, (slot_before,) = lake_snapshots(lake, SLOT), slot_state(pg_cluster, pg_dbname)
        services.rerun("postgres_cdc_microbatch", runs[0].run_id).check()
        (slot_after,) = slot_state(pg_cluster, pg_dbname)
        assert lake_snapshots(lake, SLOT) == versions
        assert Lsn.parse(slot_after[3]) >= Lsn.parse(slot_before[3])
    assert_lake_equals_source(dsn, lake, {*TABLES})


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_a_lost_slot_is_repaired_by_the_recovery_dag_end_equal(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop, conf, lake, sandbox = start_pipeline(pg_cluster, pg_dbname, tmp_path, spark)

    # Lose the slot for real; the CDC run fails pointing to the recovery DAG, which repairs all.
    invalidate_slot(pg_cluster, pg_dbname, shop)
    failed = sandbox.dags_test("postgres_cdc_microbatch", conf)
    assert failed.returncode != 0 and "postgres_cdc_recover_slot" in failed.output, failed.output[-3000:]
    sandbox.dags_test("postgres_cdc_recover_slot", conf).check()
    assert [(r[0], r[4]) for r in slot_state(pg_cluster, pg_dbname)] == [(SLOT, "reserved")]
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()
    assert_lake_equals_source(dsn, lake, {*TABLES})
