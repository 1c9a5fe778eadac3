"""Failover on PostgreSQL 18: the pipeline's failover slot survives a SIGKILLed primary, no re-snapshot.

A primary and a physical standby (``pg_basebackup``) run on this machine, the standby with
``sync_replication_slots`` and the primary with ``synchronized_standby_slots``. The initial
snapshot creates the pipeline's slot as a failover slot (the default from PostgreSQL 17); CDC
rounds (drain, Spark apply, ack) run while a writer commits on the primary, until
``pgcdc check`` on the standby finds the slot sync-ready. The standby's copy of the slot is then
held back while a batch is acknowledged on the primary, and the staging retention removes that
batch's files: the lake is ahead of the copy. The primary is SIGKILLed in the middle of the
workload, the standby promoted, and the pipeline pointed at it: that is all a user changes. It
continues from the synchronized slot, reading again a window the lake holds in part: every table
equals the new primary's (the keyless REPLICA IDENTITY FULL one too), every change is in its
changelog exactly once, and the only snapshot is the first one.

A second test covers the bad input: a slot that was not yet sync-ready at promotion is gone
from the new primary, and the drain says so and what to do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg2
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.engine.retention import prune_staging
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.layout import SNAPSHOT_PREFIX
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.testing.standby import PostgresStandby
from tests.integration.fidelity.steps import acknowledge

SLOT = "shop_cdc"
CHANGE_KEY = ("_pgl_commit_lsn", "_pgl_seq")
pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def pair() -> Iterator[tuple[PostgresCluster, PostgresStandby]]:
    """A PostgreSQL 18 primary and its hot standby, the primary guarding the standby's copies."""
    with PostgresCluster(major=18) as primary, PostgresStandby(primary) as standby:
        standby.guard_failover_slots()
        yield primary, standby


@pytest.fixture
def shop(pair: tuple[PostgresCluster, PostgresStandby]) -> ShopWorkload:
    """The demo's shop schema, loaded, in database ``shop`` of the primary."""
    primary, _ = pair
    primary.execute("CREATE DATABASE shop")
    workload = ShopWorkload(primary.dsn("shop"), seed=23)
    workload.create_schema()
    workload.initial_load()
    return workload


class Writer(threading.Thread):
    """Commits shop transactions on the primary until stopped, or until the primary dies under it."""

    def __init__(self, shop: ShopWorkload) -> None:
        super().__init__(daemon=True)
        self.shop = shop
        self.stopping = threading.Event()
        self.steps = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.shop.step()
            except psycopg2.Error:
                return  # the primary was killed mid-transaction: that one never committed
            self.steps += 1
            time.sleep(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


class Pipeline:
    """The pipeline's steps in this process: snapshot, then drain -> apply -> ack, on one DSN."""

    def __init__(self, spark: SparkSession, dsn: str, root: Path) -> None:
        self.spark, self.dsn, self.staging = spark, dsn, root / "staging"
        (root / "lake").mkdir(parents=True)
        self.lake: LakeConfig = local_lake(str(root / "lake"), catalog=f"failover_{root.name[-8:]}")
        register_lake(spark, self.lake)
        self.staged: dict[str, set[tuple[int, int]]] = {t: set() for t in TABLES}  # every change drained

    def snapshot(self) -> None:
        path, _ = take_snapshot(self.dsn, SLOT, [PUBLICATION], str(self.staging))
        apply_manifest(self.spark, path, self.lake)

    def round(self) -> None:
        result = drain_batch(self.dsn, DrainSettings(SLOT, (PUBLICATION,), str(self.staging)))
        batch_dir = self.staging / SLOT / result.manifest.batch_id
        for entry in result.manifest.tables:  # before the retention removes them
            for part in entry.files:
                keys = pq.read_table(batch_dir / part, columns=list(CHANGE_KEY)).to_pydict()
                self.staged[entry.qualified].update(zip(*keys.values(), strict=True))
        if result.manifest.tables:
            apply_manifest(self.spark, result.manifest_uri, self.lake)
        acknowledge(self.dsn, SLOT, self.lake, result.manifest)

    def confirmed(self, dsn: str) -> Lsn:
        conn = connect(dsn)
        try:
            position = describe_slot(conn, SLOT).confirmed_flush_lsn
        finally:
            conn.close()
        assert position is not None
        return position

    def changelog_problems(self) -> list[str]:
        """Each drained change logged exactly once (a window read again after the failover included)."""
        staged = self.staged
        catalog = open_catalog(self.lake)
        problems = []
        for qualified in TABLES:
            schema, table = qualified.split(".")
            log = catalog.load_table(self.lake.changelog_identifier(schema, table))
            columns = log.scan(selected_fields=CHANGE_KEY).to_arrow().to_pydict().values()
            logged = Counter(zip(*columns, strict=True))
            twice = sum(1 for n in logged.values() if n > 1)
            if twice or set(logged) != staged[qualified]:
                problems.append(
                    f"{qualified}: {twice} changes logged twice, {len(staged[qualified] - set(logged))} "
                    f"staged but not logged, {len(set(logged) - staged[qualified])} logged but not staged"
                )
        return problems


def check(dsn: str, *args: str) -> dict[str, object]:
    """``pgcdc check --json`` against ``dsn`` (its exit status is in the result)."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", "check", "--dsn", dsn, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report: dict[str, object] = json.loads(done.stdout)
    report["returncode"] = done.returncode
    return report


@pytest.mark.timeout(600)
def test_cdc_continues_on_the_promoted_standby_without_a_resnapshot(
    pair: tuple[PostgresCluster, PostgresStandby], shop: ShopWorkload, spark: SparkSession, tmp_path: Path
) -> None:
    primary, standby = pair
    pipeline = Pipeline(spark, primary.dsn("shop"), tmp_path)
    pipeline.snapshot()
    conn = connect(primary.dsn("shop"))
    assert describe_slot(conn, SLOT).failover  # on by default where the server has failover slots
    conn.close()

    # Not yet sync-ready: check on the standby says so (exit 1) and why.
    standby.wait_replayed()
    early = check(standby.dsn("shop"), "--slot-name", SLOT)
    assert early["returncode"] == 1 and early["in_recovery"] is True
    writer = Writer(shop)
    writer.start()
    rounds = 0
    while not standby.wait_slot_sync_ready(SLOT, "shop", timeout=8):
        # Sync-ready after an ack that passed a running_xacts record.
        assert rounds < 6, f"slot not sync-ready after {rounds} CDC rounds:\n{standby.server_log()[-3000:]}"
        pipeline.round()
        primary.execute("SELECT pg_log_standby_snapshot()", "shop")
        rounds += 1
    ready = check(standby.dsn("shop"), "--slot-name", SLOT)
    assert ready["returncode"] == 0, ready["problems"]
    assert ready["slot_synced"] is True and ready["slot_temporary"] is False

    # The last acknowledgements never reach the standby's copy, and the retention removes the
    # acknowledged batches' staging: after the failover the lake is ahead of the slot.
    standby.hold_slot_sync()
    behind = pipeline.confirmed(standby.dsn("shop"))
    pipeline.round()
    acked = pipeline.confirmed(pipeline.dsn)
    assert behind < acked
    prune_staging(str(pipeline.staging), SLOT, acked, timedelta(0))
    assert not list((pipeline.staging / SLOT).glob("batch-*"))

    # The primary dies mid-workload: what it did not ship to the standby is gone with it, and the
    # drain never read past what the standby had (synchronized_standby_slots).
    primary.kill()
    writer.stop()
    standby.promote()
    standby.wait_for("SELECT NOT pg_is_in_recovery()")

    # What the user changes: the connection. The pipeline goes on from the synchronized slot.
    pipeline.dsn = standby.dsn("shop")
    assert pipeline.confirmed(pipeline.dsn) == behind
    pipeline.round()  # from the copy's position: only the changes past what the lake holds are applied
    shop.dsn = standby.dsn("shop")  # the application fails over too
    shop.step()
    shop.step()
    pipeline.round()

    results = compare_tables(pipeline.dsn, [PUBLICATION], pipeline.lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == set(TABLES)
    assert pipeline.changelog_problems() == []
    snapshots = [
        p.name for p in (tmp_path / "staging" / SLOT).iterdir() if p.name.startswith(SNAPSHOT_PREFIX)
    ]
    assert len(snapshots) == 1, snapshots  # no re-snapshot
    assert writer.steps > 0 and rounds >= 1


@pytest.mark.timeout(300)
def test_a_slot_not_yet_sync_ready_at_promotion_is_reported_with_the_fix(
    pair: tuple[PostgresCluster, PostgresStandby], shop: ShopWorkload, tmp_path: Path
) -> None:
    primary, standby = pair
    take_snapshot(primary.dsn("shop"), SLOT, [PUBLICATION], str(tmp_path / "staging"))
    standby.wait_replayed()
    report = check(standby.dsn("shop"), "--slot-name", SLOT)
    assert report["returncode"] == 1
    assert any(
        "not yet sync-ready" in str(p) or "does not exist on this standby" in str(p)
        for p in report["problems"]
    )  # type: ignore[attr-defined]
    primary.kill()
    standby.promote()
    standby.wait_for("SELECT NOT pg_is_in_recovery()")
    with pytest.raises(SlotNotFoundError, match="promot") as error:
        drain_batch(standby.dsn("shop"), DrainSettings(SLOT, (PUBLICATION,), str(tmp_path / "staging")))
    assert "postgres_cdc_recover_slot" in str(error.value)
