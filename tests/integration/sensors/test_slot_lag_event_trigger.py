"""PostgresCdcSlotLagEventTrigger.run() under asyncio against the real server: one event per position.

The triggerer drives a watcher's ``run()`` the same way: it iterates the generator for as long as
the watcher lives. Here the test is the triggerer, so it can see every event, every pause, and
the loop's longest stall. The real triggerer and scheduler run it in
``tests/integration/airflow/test_asset_watcher.py``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.triggers.base import TriggerEvent

from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from airflow_provider_postgres_cdc.triggers.slot_lag_event import PostgresCdcSlotLagEventTrigger
from tests.integration.sensors.slot_lag_support import PASSWORD, Heartbeat, PublishedSlot

pytestmark = pytest.mark.integration

THRESHOLD = 256 * 1024


def test_fires_once_per_confirmed_position_without_blocking_the_loop(published: PublishedSlot) -> None:
    trigger = PostgresCdcSlotLagEventTrigger(
        slot_name=published.slot,
        postgres_conn_id=published.conn_id,
        publications=[published.publication],
        min_lag_bytes=THRESHOLD,
        min_lag_age=3600,
        poke_interval=0.2,
    )

    async def scenario() -> tuple[list[TriggerEvent], float]:
        events = trigger.run()
        fired: list[TriggerEvent] = []
        with Heartbeat() as heartbeat:
            pending = asyncio.ensure_future(anext(events))
            await asyncio.sleep(1.0)
            assert not pending.done(), "fired under the threshold"
            await asyncio.to_thread(published.write, 2000)  # past the threshold
            fired.append(await asyncio.wait_for(pending, 30))
            # Still past it at the same position, and growing: nothing more.
            pending = asyncio.ensure_future(anext(events))
            await asyncio.to_thread(published.write, 2000)
            await asyncio.sleep(1.5)
            assert not pending.done(), "fired twice for one position"
            # An ack moves the slot: quiet under the threshold, then the next event.
            await asyncio.to_thread(published.advance_to_now)
            await asyncio.sleep(1.0)
            assert not pending.done(), "fired under the threshold after the ack"
            await asyncio.to_thread(published.write, 2000)
            fired.append(await asyncio.wait_for(pending, 30))
            await events.aclose()
        return fired, heartbeat.worst

    (first, second), worst_stall = asyncio.run(scenario())
    for event in (first, second):
        payload = event.payload
        assert payload["outcome"] == "met" and payload["slot_name"] == published.slot
        assert payload["lag_bytes"] >= THRESHOLD
        assert payload["confirmed_flush_lsn"] == payload["health"]["confirmed_flush_lsn"]
        assert payload["lag_age_seconds"] is not None and payload["lag_age_seconds"] < 3600
        assert PASSWORD not in json.dumps(payload)
    assert first.payload["confirmed_flush_lsn"] != second.payload["confirmed_flush_lsn"]
    assert worst_stall < 0.25, f"event loop stalled for {worst_stall:.3f}s"


def test_a_missing_slot_fails_the_watcher_with_the_recover_message(published: PublishedSlot) -> None:
    trigger = PostgresCdcSlotLagEventTrigger(
        slot_name="gone_slot", postgres_conn_id=published.conn_id, min_lag_bytes=1, poke_interval=0.5
    )

    async def first() -> TriggerEvent:
        return await anext(trigger.run())

    with pytest.raises(SlotNotFoundError, match=r"'gone_slot' does not exist.*postgres_cdc_recover_slot"):
        asyncio.run(first())
