"""Slots on a real server: exported snapshots, describe, lag, advance, drop, and their errors."""

from __future__ import annotations

import time

import psycopg2
import pytest

from airflow_provider_postgres_cdc.errors import SlotActiveError, SlotExistsError, SlotNotFoundError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import (
    advance_slot,
    connect,
    connect_replication,
    create_slot,
    create_slot_with_snapshot,
    describe_slot,
    drop_slot,
    list_slots,
    slot_lag_bytes,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster


def test_exported_snapshot_sees_exactly_the_rows_before_the_slot(
    pg_cluster: PostgresCluster, pg_dsn: str, pg_dbname: str
) -> None:
    pg_cluster.execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)", pg_dbname)
    holder = connect_replication(pg_dsn)
    conn = connect(pg_dsn)
    try:
        created = create_slot_with_snapshot(holder, "snap_slot")
        assert created.snapshot_name
        assert created.output_plugin == "pgoutput"
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (3)")
        reader = connect(pg_dsn, autocommit=False)
        with reader.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (created.snapshot_name,))
            cur.execute("SELECT array_agg(id ORDER BY id) FROM t")
            assert cur.fetchone()[0] == [1, 2]
        reader.close()
        slot = describe_slot(conn, "snap_slot")
        assert slot.confirmed_flush_lsn == created.consistent_point
        assert slot.plugin == "pgoutput" and slot.wal_status == "reserved"
    finally:
        holder.close()
        conn.close()


def test_snapshot_dies_with_its_connection(pg_dsn: str) -> None:
    holder = connect_replication(pg_dsn)
    created = create_slot_with_snapshot(holder, "short_lived", temporary=True)
    pid = holder.get_backend_pid()
    holder.close()
    reader = connect(pg_dsn, autocommit=False)
    try:
        # The backend exits after close() returns; its snapshot is importable until it has.
        with reader.cursor() as cur:
            for _ in range(100):
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
                if cur.fetchone()[0] == 0:
                    break
                time.sleep(0.05)
        reader.rollback()
        with reader.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(psycopg2.errors.InvalidParameterValue, match="invalid snapshot identifier"):
                cur.execute("SET TRANSACTION SNAPSHOT %s", (created.snapshot_name,))
        conn = connect(pg_dsn)
        # Temporary slots vanish with the connection (asynchronously: wait for the backend to exit).
        with conn.cursor() as cur:
            for _ in range(50):
                cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'short_lived'")
                if cur.fetchone()[0] == 0:
                    break
                cur.execute("SELECT pg_sleep(0.1)")
            else:
                pytest.fail("temporary slot survived its connection")
        conn.close()
    finally:
        reader.close()


def test_lag_advance_and_drop(pg_cluster: PostgresCluster, pg_dsn: str, pg_dbname: str) -> None:
    conn = connect(pg_dsn)
    try:
        created = create_slot(conn, "cdc_slot")
        with pytest.raises(SlotExistsError):
            create_slot(conn, "cdc_slot")
        assert slot_lag_bytes(conn, "cdc_slot") >= 0
        pg_cluster.execute("CREATE TABLE big AS SELECT g FROM generate_series(1, 10000) g", pg_dbname)
        slot = describe_slot(conn, "cdc_slot")
        assert slot.lag_bytes is not None and slot.lag_bytes > 100_000
        # The server never advances a slot past the WAL flushed so far (synchronous_commit is off here).
        assert advance_slot(conn, "cdc_slot", slot.current_wal_lsn) <= slot.current_wal_lsn
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn()::text")
            target = Lsn.parse(cur.fetchone()[0])
        assert advance_slot(conn, "cdc_slot", target) == target
        assert describe_slot(conn, "cdc_slot").confirmed_flush_lsn == target
        # Backwards is a no-op: the slot never moves back.
        assert advance_slot(conn, "cdc_slot", created.consistent_point) == target
        assert describe_slot(conn, "cdc_slot").confirmed_flush_lsn == target
        assert [s.slot_name for s in list_slots(conn, database=pg_dbname)] == ["cdc_slot"]
        assert drop_slot(conn, "cdc_slot") is True
        assert drop_slot(conn, "cdc_slot") is False
        with pytest.raises(SlotNotFoundError, match=r"cdc_slot.*does not exist"):
            drop_slot(conn, "cdc_slot", if_exists=False)
        with pytest.raises(SlotNotFoundError, match="its slots: none"):
            describe_slot(conn, "cdc_slot")
    finally:
        conn.close()


def test_active_slot_cannot_be_dropped_or_advanced(pg_dsn: str) -> None:
    conn = connect(pg_dsn)
    stream = connect_replication(pg_dsn)
    try:
        create_slot(conn, "busy_slot")
        with conn.cursor() as cur:
            cur.execute("CREATE PUBLICATION p FOR ALL TABLES")
        with stream.cursor() as cur:
            cur.start_replication(
                slot_name="busy_slot", options={"proto_version": "1", "publication_names": "p"}
            )
            cur.send_feedback()  # make sure the walsender has taken the slot
            for _ in range(50):
                if describe_slot(conn, "busy_slot").active:
                    break
                cur.read_message()
            assert describe_slot(conn, "busy_slot").active
            with pytest.raises(SlotActiveError):
                drop_slot(conn, "busy_slot")
            with pytest.raises(SlotActiveError):
                advance_slot(conn, "busy_slot", Lsn(describe_slot(conn, "busy_slot").current_wal_lsn + 1))
    finally:
        stream.close()
        conn.close()
