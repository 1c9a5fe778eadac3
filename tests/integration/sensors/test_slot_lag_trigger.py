"""PostgresCdcSlotLagTrigger.run() under asyncio against the real server: fires, never blocks, reruns."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.triggers.base import TriggerEvent

from airflow_provider_postgres_cdc.engine.health import assess_slot_async
from airflow_provider_postgres_cdc.engine.health.drivers import connect_async, wait_async
from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor
from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger
from tests.integration.sensors.slot_lag_support import PASSWORD, Heartbeat, PublishedSlot

pytestmark = pytest.mark.integration


async def first_event(trigger: PostgresCdcSlotLagTrigger, timeout: float = 60) -> TriggerEvent:
    events: AsyncIterator[TriggerEvent] = trigger.run()
    event = await asyncio.wait_for(anext(events), timeout)
    # One event, then the generator ends.
    with pytest.raises(StopAsyncIteration):
        await anext(events)
    return event


def lag_trigger(published: PublishedSlot, **kwargs: Any) -> PostgresCdcSlotLagTrigger:
    kwargs.setdefault("poke_interval", 0.2)
    return PostgresCdcSlotLagTrigger(slot_name=published.slot, postgres_conn_id=published.conn_id, **kwargs)


def test_trigger_fires_at_the_threshold_without_blocking_the_loop(published: PublishedSlot) -> None:
    trigger = lag_trigger(published, min_lag_bytes=256 * 1024, publications=[published.publication])

    async def scenario() -> tuple[TriggerEvent, float]:
        with Heartbeat() as heartbeat:
            waiting = asyncio.create_task(first_event(trigger))
            await asyncio.sleep(1.0)
            assert not waiting.done(), "fired before any write"
            await asyncio.to_thread(published.write, 2000)
            event = await waiting
        return event, heartbeat.worst

    event, worst_stall = asyncio.run(scenario())
    payload = event.payload
    assert payload["outcome"] == "met"
    assert payload["health"]["lag_bytes"] >= 256 * 1024
    assert payload["health"]["lag_age_seconds"] is not None
    json.dumps(payload)
    assert PASSWORD not in json.dumps(payload)
    # Connecting and querying wait on the loop (the big-transaction test below makes a blocking
    # call impossible to miss; here the margin is for a loaded machine).
    assert worst_stall < 0.25, f"event loop stalled for {worst_stall:.3f}s"

    # Run again, the same instance and one rebuilt from its serialized form (a triggerer restart).
    assert asyncio.run(first_event(trigger)).payload["outcome"] == "met"
    _, kwargs = trigger.serialize()
    rebuilt = PostgresCdcSlotLagTrigger(**kwargs)
    assert asyncio.run(first_event(rebuilt)).payload["outcome"] == "met"


def test_time_based_trigger_peeks_a_large_transaction_without_blocking(published: PublishedSlot) -> None:
    """Peeking a 500k-row first transaction keeps the server busy for a second or two (it spills);
    the loop must stay free all along, and the trigger fires once that transaction is old enough."""
    published.write(500_000, payload=1)
    trigger = lag_trigger(published, min_lag_age=2.0, publications=[published.publication])

    async def scenario() -> tuple[TriggerEvent, float, float]:
        started = time.monotonic()
        with Heartbeat() as heartbeat:
            event = await first_event(trigger)
        return event, heartbeat.worst, time.monotonic() - started

    event, worst_stall, elapsed = asyncio.run(scenario())
    payload = event.payload
    assert payload["outcome"] == "met", payload
    assert payload["health"]["lag_age_seconds"] >= 2.0
    assert payload["health"]["lag_bytes"] > 10 * 1024 * 1024
    assert elapsed < 30
    assert worst_stall < 0.3, f"event loop stalled for {worst_stall:.3f}s"


def test_async_queries_wait_on_the_loop_not_in_it(published: PublishedSlot) -> None:
    """A 0.5 s server-side sleep must leave the loop free for the whole half second."""

    async def scenario() -> float:
        params = PostgresCdcHook(published.conn_id).connection_params()
        conn = await connect_async(params, 10)
        try:
            with Heartbeat() as heartbeat:
                cur = conn.cursor()
                started = time.monotonic()
                cur.execute("SELECT pg_sleep(0.5)")
                await wait_async(conn)
                assert time.monotonic() - started >= 0.5
        finally:
            conn.close()
        return heartbeat.worst

    # Blocking would stall for the whole 0.5 s; the margin is for a loaded machine.
    assert asyncio.run(scenario()) < 0.2


def test_async_assessment_matches_the_sync_one(published: PublishedSlot) -> None:
    published.write(50)
    hook = PostgresCdcHook(published.conn_id)
    sync = hook.slot_health(published.slot, [published.publication])
    params = asyncio.run(hook.aconnection_params())
    assert params == hook.connection_params()
    async_ = asyncio.run(assess_slot_async(params, published.slot, [published.publication]))
    assert async_.slot.confirmed_flush_lsn == sync.slot.confirmed_flush_lsn
    assert async_.oldest_unconfirmed_commit == sync.oldest_unconfirmed_commit
    assert async_.stats is not None and sync.stats is not None


def test_trigger_reports_a_missing_slot_and_the_sensor_raises_it(published: PublishedSlot) -> None:
    trigger = PostgresCdcSlotLagTrigger(
        slot_name="gone_slot", postgres_conn_id=published.conn_id, min_lag_bytes=1
    )
    event = asyncio.run(first_event(trigger))
    assert event.payload["outcome"] == "slot_missing"
    sensor = PostgresCdcSlotLagSensor(
        task_id="lag", slot_name="gone_slot", postgres_conn_id=published.conn_id, min_lag_bytes=1
    )
    with pytest.raises(SlotNotFoundError, match="gone_slot"):
        sensor.execute_complete({}, event.payload)  # type: ignore[arg-type]


def test_trigger_reports_an_unreachable_server_without_the_password(
    published: PublishedSlot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PGL_DOWN", f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/nowhere")
    trigger = PostgresCdcSlotLagTrigger(
        slot_name=published.slot, postgres_conn_id="pgl_down", min_lag_bytes=1
    )
    payload = asyncio.run(first_event(trigger)).payload
    assert payload["outcome"] == "error"
    assert "OperationalError" in payload["message"]
    assert PASSWORD not in json.dumps(payload)


def test_a_cancelled_trigger_leaves_no_connection_and_runs_again(published: PublishedSlot) -> None:
    """The triggerer cancels run() on shutdown or reassignment, then runs the trigger elsewhere."""
    trigger = lag_trigger(published, min_lag_bytes=256 * 1024, publications=[published.publication])

    async def cancel_midway() -> None:
        waiting = asyncio.create_task(first_event(trigger))
        await asyncio.sleep(0.7)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(cancel_midway())
    published.cluster.wait_for(
        f"SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = '{published.dbname}' "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        "postgres",
    )
    published.write(2000)
    assert asyncio.run(first_event(trigger)).payload["outcome"] == "met"


def test_async_connect_resolves_a_host_name_on_the_loop(
    published: PublishedSlot, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"postgresql://postgres:{PASSWORD}@localhost:{published.cluster.port}/{published.dbname}"
    monkeypatch.setenv("AIRFLOW_CONN_PGL_BY_NAME", uri)
    params = PostgresCdcHook("pgl_by_name").connection_params()
    health = asyncio.run(assess_slot_async(params, published.slot))
    assert health.slot_name == published.slot
