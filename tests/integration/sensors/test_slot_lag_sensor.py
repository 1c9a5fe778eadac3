"""PostgresCdcSlotLagSensor against the throwaway cluster: bytes, time, modes, and a missing or busy slot."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSensorTimeout, TaskDeferred

from airflow_provider_postgres_cdc.engine.health import LagThresholds, assess_slot, decide
from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor
from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger
from tests.integration.sensors.slot_lag_support import PASSWORD, PublishedSlot

pytestmark = pytest.mark.integration

THRESHOLD = 512 * 1024


def sensor(published: PublishedSlot, **kwargs: Any) -> PostgresCdcSlotLagSensor:
    kwargs.setdefault("task_id", "lag")
    kwargs.setdefault("poke_interval", 0.2)
    kwargs.setdefault("timeout", 60)
    kwargs.setdefault("deferrable", False)
    return PostgresCdcSlotLagSensor(slot_name=published.slot, postgres_conn_id=published.conn_id, **kwargs)


def test_lag_grows_with_writes_to_published_tables(published: PublishedSlot) -> None:
    hook = PostgresCdcHook(published.conn_id)
    before = hook.slot_health(published.slot).lag_bytes
    assert before is not None
    lags = []
    for _ in range(3):
        published.write(500)
        lag = hook.slot_health(published.slot).lag_bytes
        assert lag is not None
        lags.append(lag)
    assert before < lags[0] < lags[1] < lags[2]
    # 500 rows of 200 bytes are at least 100 kB of WAL each.
    assert lags[2] - before >= 3 * 100_000
    assert lags[2] == pytest.approx(published.lag_bytes(), abs=64 * 1024)


def test_sensor_fires_when_the_lag_reaches_the_threshold(published: PublishedSlot) -> None:
    lag_sensor = sensor(published, min_lag_bytes="512kB")
    assert not lag_sensor.poke({})  # type: ignore[arg-type]
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            published.write(100)
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        health = lag_sensor.execute({})  # type: ignore[arg-type]
    finally:
        stop.set()
        thread.join()
    # Fired at the threshold, not long after it: the writer adds ~25 kB per 0.05 s.
    assert THRESHOLD <= health["lag_bytes"] < THRESHOLD + 1024 * 1024
    assert health["slot_name"] == published.slot
    assert PASSWORD not in repr(health)


def test_max_lag_bytes_fires_once_the_slot_caught_up(published: PublishedSlot) -> None:
    published.write(3000)
    caught_up = sensor(published, max_lag_bytes=64 * 1024)
    assert not caught_up.poke({})  # type: ignore[arg-type]
    published.advance_to_now()
    assert caught_up.poke({})  # type: ignore[arg-type]


def test_poke_mode_times_out_like_any_sensor(published: PublishedSlot) -> None:
    never = sensor(published, min_lag_bytes="10GB", timeout=0.5, poke_interval=0.1)
    with pytest.raises(AirflowSensorTimeout):
        never.execute({})  # type: ignore[arg-type]


def test_soft_fail_skips_on_timeout(published: PublishedSlot) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    never = sensor(published, min_lag_bytes="10GB", timeout=0.3, poke_interval=0.1, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        never.execute({})  # type: ignore[arg-type]


class _FirstPokeTI:
    """The one thing reschedule mode asks of the task instance: when it was first rescheduled."""

    def get_first_reschedule_date(self, context: Any) -> None:
        return None


def test_reschedule_mode_frees_the_worker_until_the_threshold(published: PublishedSlot) -> None:
    rescheduled = sensor(published, min_lag_bytes="256kB", mode="reschedule", poke_interval=30)
    with pytest.raises(AirflowRescheduleException):
        rescheduled.execute({"ti": _FirstPokeTI()})  # type: ignore[arg-type]
    published.write(3000)
    health = rescheduled.execute({"ti": _FirstPokeTI()})  # type: ignore[arg-type]
    assert health["lag_bytes"] >= 256 * 1024


def test_time_based_lag_is_the_age_of_the_oldest_unconfirmed_commit(published: PublishedSlot) -> None:
    with published.connect() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t (v) VALUES ('first')")
        cur.execute("SELECT clock_timestamp()")
        before_commit = cur.fetchone()[0]
        cur.execute("COMMIT")
        cur.execute("SELECT clock_timestamp(), pg_current_wal_lsn()::text")
        after_commit, after_first = cur.fetchone()
    conn.close()
    time.sleep(1.5)
    published.write(10)
    hook = PostgresCdcHook(published.conn_id)

    health = hook.slot_health(published.slot, [published.publication])
    assert health.oldest_unconfirmed_commit is not None
    assert before_commit <= health.oldest_unconfirmed_commit <= after_commit
    assert health.lag_age is not None and health.lag_age >= timedelta(seconds=1.5)

    aged = sensor(published, min_lag_age=1.0, publications=published.publication)
    assert aged.poke({})  # type: ignore[arg-type]
    assert not sensor(published, min_lag_age=3600, publications=[published.publication]).poke({})  # type: ignore[arg-type]

    # Confirming the first transaction makes the second one the oldest pending change.
    hook.advance_slot(published.slot, after_first)
    newer = hook.slot_health(published.slot, [published.publication])
    assert newer.oldest_unconfirmed_commit is not None
    assert newer.oldest_unconfirmed_commit > after_commit

    # Writes to an unpublished table add bytes, not age: nothing published is pending.
    published.advance_to_now()
    published.write(10, table="other")
    idle = hook.slot_health(published.slot, [published.publication])
    assert idle.lag_age == timedelta(0) and idle.oldest_unconfirmed_commit is None
    assert idle.lag_bytes is not None and idle.lag_bytes > 0
    assert sensor(published, max_lag_age=1, publications=[published.publication]).poke({})  # type: ignore[arg-type]


def test_age_of_an_active_slot_is_reported_unknown_not_guessed(published: PublishedSlot) -> None:
    published.write(10)
    hook = PostgresCdcHook(published.conn_id)
    before = hook.slot_health(published.slot, [published.publication])
    assert before.oldest_unconfirmed_commit is not None
    consumer = hook.get_replication_conn()
    try:
        with consumer.cursor() as cur:
            cur.start_replication(
                slot_name=published.slot,
                decode=False,
                options={"proto_version": "1", "publication_names": published.publication},
            )
            published.cluster.wait_for(
                f"SELECT active FROM pg_replication_slots WHERE slot_name = '{published.slot}'",
                published.dbname,
            )
            with hook.connection() as conn:
                health = assess_slot(conn, published.slot, [published.publication])
                # The slot's confirmed position has not moved: the earlier age is still the truth.
                carried = assess_slot(conn, published.slot, [published.publication], previous=before)
            assert health.lag_age is None
            assert health.age_unknown_reason is not None and "is active (pid" in health.age_unknown_reason
            decision = decide(health, LagThresholds(min_lag_age=timedelta(seconds=1)))
            assert not decision.done
            assert any("age of its lag is unknown" in warning for warning in decision.warnings)
            assert carried.slot.active and carried.age_unknown_reason is None
            assert carried.oldest_unconfirmed_commit == before.oldest_unconfirmed_commit
            assert carried.lag_age is not None and carried.lag_age >= before.lag_age  # type: ignore[operator]
    finally:
        consumer.close()


def test_missing_slot_fails_and_names_the_existing_ones(published: PublishedSlot) -> None:
    missing = PostgresCdcSlotLagSensor(
        task_id="lag", slot_name="no_such_slot", postgres_conn_id=published.conn_id, min_lag_bytes=1
    )
    with pytest.raises(
        SlotNotFoundError,
        match=rf"'no_such_slot' does not exist in this database \(existing: .*{published.slot}",
    ):
        missing.poke({})  # type: ignore[arg-type]


def test_deferrable_sensor_defers_with_credential_free_trigger(published: PublishedSlot) -> None:
    deferring = sensor(published, min_lag_bytes="10GB", deferrable=True, timeout=120, poke_interval=5)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, PostgresCdcSlotLagTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(seconds=120)
    _, kwargs = trigger.serialize()
    assert kwargs["min_lag_bytes"] == 10 * 1024**3
    assert kwargs["postgres_conn_id"] == published.conn_id
    assert PASSWORD not in repr(kwargs)


def test_deferrable_sensor_returns_at_once_when_already_met(published: PublishedSlot) -> None:
    published.write(100)
    met = sensor(published, min_lag_bytes=1, deferrable=True)
    assert met.execute({})["lag_bytes"] >= 1  # type: ignore[arg-type]
