"""WAL-retention safety for real: a cluster with a 1 MB max_slot_wal_keep_size loses a slot on purpose.

WAL is pushed past the cap with ``pg_switch_wal()`` (one 16 MB segment each); the slot first turns
``unreserved`` (WAL it needs is still there but no longer reserved), and the next ``CHECKPOINT``
removes that WAL and invalidates it (``lost``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.cli.lag import register
from airflow_provider_postgres_cdc.engine.health import WalRetentionError
from airflow_provider_postgres_cdc.errors import SlotLostError
from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger
from tests.integration.sensors.slot_lag_support import PASSWORD, PublishedSlot, make_published_slot

pytestmark = pytest.mark.integration

TINY_WAL_SETTINGS = {
    "max_slot_wal_keep_size": "1MB",
    "wal_keep_size": "0",
    # The smallest sizes PostgreSQL accepts with 16 MB segments; no automatic checkpoint
    # interferes while a test switches one or two segments.
    "min_wal_size": "32MB",
    "max_wal_size": "64MB",
    "checkpoint_timeout": "1h",
}


@pytest.fixture(scope="module")
def tiny_cluster() -> Iterator[PostgresCluster]:
    with PostgresCluster(settings=TINY_WAL_SETTINGS) as cluster:
        yield cluster


@pytest.fixture
def tiny(tiny_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[PublishedSlot]:
    dbname = f"t_{uuid.uuid4().hex[:10]}"
    tiny_cluster.create_database(dbname)
    yield make_published_slot(tiny_cluster, dbname, "pgl_tiny", monkeypatch)
    tiny_cluster.drop_database(dbname)


def wal_status(slot: PublishedSlot) -> str:
    rows = slot.cluster.execute(
        sql.SQL("SELECT wal_status FROM pg_replication_slots WHERE slot_name = {}").format(
            sql.Literal(slot.slot)
        ),
        slot.dbname,
    )
    return str(rows[0][0])


def lag_sensor(slot: PublishedSlot, **kwargs: object) -> PostgresCdcSlotLagSensor:
    return PostgresCdcSlotLagSensor(
        task_id="lag", slot_name=slot.slot, postgres_conn_id=slot.conn_id, deferrable=False, **kwargs
    )


def run_lag_command(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["lag", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_safe_wal_size_under_the_floor_fails_or_warns(tiny: PublishedSlot) -> None:
    tiny.write(100)
    assert wal_status(tiny) == "reserved"
    # safe_wal_size is about one segment here, far under a 64 MB floor.
    with pytest.raises(WalRetentionError, match=r"only .* more WAL can be written") as failure:
        lag_sensor(tiny, min_lag_bytes=1, min_safe_wal_bytes="64MB").poke({})  # type: ignore[arg-type]
    assert "ALTER SYSTEM SET max_slot_wal_keep_size" in str(failure.value)
    warned = lag_sensor(tiny, min_lag_bytes=1, min_safe_wal_bytes="64MB", on_wal_risk="warn")
    assert warned.poke({})  # type: ignore[arg-type]
    # Without a floor a reserved slot is fine.
    assert lag_sensor(tiny, min_lag_bytes=1).poke({})  # type: ignore[arg-type]


def test_invalidated_slot_fails_with_the_recovery_path(
    tiny: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny.write(100)
    tiny.cluster.execute("SELECT pg_switch_wal()", tiny.dbname)
    tiny.write(10)
    assert wal_status(tiny) == "unreserved"
    with pytest.raises(WalRetentionError, match=r"is unreserved: it holds .* of WAL"):
        lag_sensor(tiny, min_lag_bytes=1).poke({})  # type: ignore[arg-type]
    code, out = run_lag_command(capsys, "--dsn", tiny.cluster.dsn(tiny.dbname))
    assert code == 1 and "AT_RISK" in out and "unreserved" in out

    for _ in range(5):
        tiny.cluster.execute("CHECKPOINT", tiny.dbname)
        if wal_status(tiny) == "lost":
            break
        tiny.cluster.execute("SELECT pg_switch_wal()", tiny.dbname)
    assert wal_status(tiny) == "lost"

    # soft_fail skips a sensor that timed out, never one whose slot lost data.
    for sensor in (lag_sensor(tiny, min_lag_bytes=1), lag_sensor(tiny, min_lag_bytes=1, soft_fail=True)):
        with pytest.raises(SlotLostError, match="invalidated") as lost:
            sensor.execute({})  # type: ignore[arg-type]
        assert "airflow dags trigger postgres_cdc_recover_slot" in str(lost.value)

    trigger = PostgresCdcSlotLagTrigger(slot_name=tiny.slot, postgres_conn_id=tiny.conn_id, min_lag_bytes=1)
    events = trigger.run()
    payload = asyncio.run(anext(events)).payload  # type: ignore[arg-type]
    assert payload["outcome"] == "lost"
    assert PASSWORD not in json.dumps(payload)
    with pytest.raises(SlotLostError, match="postgres_cdc_recover_slot"):
        lag_sensor(tiny, min_lag_bytes=1).execute_complete({}, payload)  # type: ignore[arg-type]

    code, out = run_lag_command(capsys, "--postgres-conn-id", tiny.conn_id, "--slot-name", tiny.slot)
    assert code == 1
    assert "LOST" in out and "postgres_cdc_recover_slot" in out
