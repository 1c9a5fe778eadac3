"""Decoding on a hot standby (PostgreSQL 16+), here on 18: snapshot, drain, lag and ack all on the standby.

The combination that works: the initial snapshot taken on the standby (its replication connection
exports a snapshot there, and the slot is created there, not as a failover slot), then drains by
both transports, ``pgcdc lag`` and the ack against the standby, while the primary takes the
writes. On a standby without ``hot_standby_feedback`` the drain refuses to read, naming the fix,
before the primary's vacuum can invalidate the slot. A standby promoted in the middle of a drain
makes that drain fail with ``StandbyPromotedError``, staging nothing and leaving the slot where it
was; the next drain reads the same window from the promoted server.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.errors import FailoverNotReadyError, StandbyPromotedError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import advance_slot, connect, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.testing.standby import PostgresStandby
from tests.integration.drain.staged import staged_tables

SLOT = "on_standby"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PostgresCluster, PostgresStandby]]:
    with PostgresCluster(major=18) as primary, PostgresStandby(primary) as standby:
        yield primary, standby


def _snapshot_on_standby(
    primary: PostgresCluster, standby: PostgresStandby, db: str, slot: str, staging: Path
) -> None:
    """The snapshot on the standby: creating a slot there waits for the primary's next running_xacts."""
    done = threading.Event()

    def nudge() -> None:
        while not done.wait(0.2):
            primary.execute("SELECT pg_log_standby_snapshot()", db)

    nudger = threading.Thread(target=nudge, daemon=True)
    nudger.start()
    try:
        take_snapshot(standby.dsn(db), slot, ["pub"], str(staging))
    finally:
        done.set()
        nudger.join()


def _database(primary: PostgresCluster, standby: PostgresStandby) -> str:
    db = f"sb_{uuid.uuid4().hex[:10]}"
    primary.create_database(db)
    primary.execute("CREATE TABLE t (id int PRIMARY KEY, note text); CREATE PUBLICATION pub FOR TABLE t", db)
    primary.execute("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 50) g", db)
    standby.wait_replayed()
    return db


def test_snapshot_drain_lag_and_ack_on_a_standby(
    pair: tuple[PostgresCluster, PostgresStandby], tmp_path: Path
) -> None:
    primary, standby = pair
    db = _database(primary, standby)
    _snapshot_on_standby(primary, standby, db, SLOT, tmp_path / "snapshot")
    conn = connect(standby.dsn(db))
    slot = describe_slot(conn, SLOT)
    assert slot.in_recovery and not slot.failover  # a standby's own slot cannot be a failover slot
    primary.execute("INSERT INTO t SELECT g, 'after' FROM generate_series(51, 250) g", db)
    primary.execute("UPDATE t SET note = 'changed' WHERE id <= 10", db)
    standby.wait_replayed()

    lag = subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", "lag", "--dsn", standby.dsn(db),
         "--slot-name", SLOT, "--publications", "pub", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert lag.returncode == 0, lag.stderr
    (health,) = json.loads(lag.stdout)
    assert health["lag_bytes"] > 0 and health["status"] == "ok"

    staged = {}
    for transport in ("peek", "stream"):
        settings = DrainSettings(SLOT, ("pub",), str(tmp_path / transport), transport=transport)
        result = drain_batch(standby.dsn(db), settings)
        assert result.manifest.stats.changes == 210
        staged[transport] = staged_tables(result)
        assert describe_slot(conn, SLOT).confirmed_flush_lsn == slot.confirmed_flush_lsn  # never moved
    assert staged["peek"] == staged["stream"]
    assert advance_slot(conn, SLOT, result.manifest.end_lsn) == result.manifest.end_lsn
    assert describe_slot(conn, SLOT).lag_bytes == 0
    conn.close()


def _changes_pending_on_standby(
    primary: PostgresCluster, standby: PostgresStandby, slot: str, rows: int, tmp_path: Path
) -> tuple[str, Lsn]:
    """A fresh database whose slot, snapshotted on the standby, has ``rows`` inserts replayed after it;
    returns the database and the slot's confirmed position."""
    db = _database(primary, standby)
    _snapshot_on_standby(primary, standby, db, slot, tmp_path / "snapshot")
    primary.execute(f"INSERT INTO t SELECT g, 'after' FROM generate_series(51, {50 + rows}) g", db)
    standby.wait_replayed()
    conn = connect(standby.dsn(db))
    try:
        start = describe_slot(conn, slot).confirmed_flush_lsn
    finally:
        conn.close()
    assert start is not None
    return db, start


def _set_feedback(standby: PostgresStandby, db: str, value: str) -> None:
    """Set ``hot_standby_feedback`` on the standby and wait until new sessions see it."""
    standby.execute(f"ALTER SYSTEM SET hot_standby_feedback = {value}")
    standby.execute("SELECT pg_reload_conf()")
    for _ in range(100):  # the postmaster applies the reload asynchronously
        if standby.execute("SHOW hot_standby_feedback", db) == [(value,)]:
            return
        time.sleep(0.05)
    raise AssertionError(f"hot_standby_feedback did not become {value}")


def test_a_standby_without_hot_standby_feedback_is_refused_before_the_drain_reads(
    pair: tuple[PostgresCluster, PostgresStandby], tmp_path: Path
) -> None:
    primary, standby = pair
    slot = "no_feedback"
    db, start = _changes_pending_on_standby(primary, standby, slot, 30, tmp_path)
    conn = connect(standby.dsn(db))
    settings = DrainSettings(slot, ("pub",), str(tmp_path / "staging"))
    _set_feedback(standby, db, "off")
    try:
        with pytest.raises(FailoverNotReadyError, match=r"ALTER SYSTEM SET hot_standby_feedback = on"):
            drain_batch(standby.dsn(db), settings)
        assert describe_slot(conn, slot).confirmed_flush_lsn == start  # the slot did not move
        assert not list((tmp_path / "staging" / slot).glob("batch-*"))  # nothing staged
    finally:
        _set_feedback(standby, db, "on")  # as PostgresStandby configures it
    assert drain_batch(standby.dsn(db), settings).manifest.stats.changes == 30  # with the fix, it reads
    conn.close()


def test_a_standby_promoted_mid_drain_fails_the_drain_and_loses_nothing(
    pair: tuple[PostgresCluster, PostgresStandby], tmp_path: Path
) -> None:
    primary, standby = pair
    slot = "promoted_mid_drain"
    db, start = _changes_pending_on_standby(primary, standby, slot, 100, tmp_path)

    class PromoteOnceBounded(logging.Handler):
        """Promotes the standby when the drain has fixed its window and not yet read it."""

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("draining slot"):
                standby.promote()

    handler = PromoteOnceBounded()
    drain_log = logging.getLogger("airflow_provider_postgres_cdc.engine.drain")
    drain_log.addHandler(handler)
    previous_level = drain_log.level
    drain_log.setLevel(logging.INFO)
    settings = DrainSettings(slot, ("pub",), str(tmp_path / "staging"))
    try:
        with pytest.raises(StandbyPromotedError, match="promoted to primary while this drain read"):
            drain_batch(standby.dsn(db), settings)
    finally:
        drain_log.removeHandler(handler)
        drain_log.setLevel(previous_level)
    conn = connect(standby.dsn(db))
    assert describe_slot(conn, slot).confirmed_flush_lsn == start  # the slot did not move
    assert not list((tmp_path / "staging" / slot).glob("batch-*"))  # nothing staged
    result = drain_batch(standby.dsn(db), settings)  # the promoted server: the same window, whole
    assert result.manifest.start_lsn == start and result.manifest.stats.changes == 100
    conn.close()
