"""The slot lag trigger without a server: its serialization pins the classpath and holds no credentials."""

from __future__ import annotations

import json

from airflow.sdk.module_loading import import_string

from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger

CLASSPATH = "airflow_provider_postgres_cdc.triggers.slot_lag.PostgresCdcSlotLagTrigger"
MB = 1 << 20


def test_trigger_serialization_round_trip_pins_the_classpath() -> None:
    trigger = PostgresCdcSlotLagTrigger(
        slot_name="s1",
        postgres_conn_id="pg_prod",
        publications=("pub_a", "Pub B"),
        min_lag_bytes=64 * MB,
        min_lag_age=600.0,
        min_safe_wal_bytes=1 << 30,
        on_wal_risk="warn",
        stale_after=86400.0,
        poke_interval=30.0,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert import_string(classpath) is PostgresCdcSlotLagTrigger
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {
        "slot_name": "s1",
        "postgres_conn_id": "pg_prod",
        "publications": ["pub_a", "Pub B"],
        "min_lag_bytes": 64 * MB,
        "max_lag_bytes": None,
        "min_lag_age": 600.0,
        "max_lag_age": None,
        "min_safe_wal_bytes": 1 << 30,
        "on_wal_risk": "warn",
        "stale_after": 86400.0,
        "poke_interval": 30.0,
    }


def test_trigger_kwargs_name_the_connection_and_never_hold_credentials() -> None:
    _, kwargs = PostgresCdcSlotLagTrigger(slot_name="s1", min_lag_bytes=1).serialize()
    assert not {"password", "host", "login", "dsn", "uri"} & set(kwargs)
