"""The watcher trigger without a server: exact serialization, normalised kwargs, one event per position."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from airflow.sdk import AssetWatcher
from airflow.sdk.module_loading import import_string
from airflow.triggers.base import BaseEventTrigger

from airflow_provider_postgres_cdc.engine.health import Outcome
from airflow_provider_postgres_cdc.triggers.slot_lag_event import PostgresCdcSlotLagEventTrigger, fires

CLASSPATH = "airflow_provider_postgres_cdc.triggers.slot_lag_event.PostgresCdcSlotLagEventTrigger"
EXAMPLE = Path(__file__).resolve().parents[3] / "dags_examples" / "postgres_cdc_on_lag.py"
MB = 1 << 20


def test_serialization_round_trip_pins_the_classpath_and_normalises_sizes_and_ages() -> None:
    trigger = PostgresCdcSlotLagEventTrigger(
        slot_name="s1",
        postgres_conn_id="pg_prod",
        publications=("pub_a", "Pub B"),
        min_lag_bytes="64MB",
        max_lag_age="600",
        min_safe_wal_bytes=1 << 30,
        stale_after=86400.0,
        poke_interval=30,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert import_string(classpath) is PostgresCdcSlotLagEventTrigger
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert kwargs == {
        "slot_name": "s1",
        "postgres_conn_id": "pg_prod",
        "publications": ["pub_a", "Pub B"],
        "min_lag_bytes": 64 * MB,
        "max_lag_age": 600.0,
        "min_safe_wal_bytes": 1 << 30,
        "stale_after": 86400.0,
        "poke_interval": 30.0,
    }
    # The triggerer builds the trigger from these kwargs; the DAG processor matches an asset's
    # trigger row by the hash of the same kwargs, so "64MB" and 67108864 must be one watcher.
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(*rebuilt.serialize())
    assert not {"password", "host", "login", "dsn", "uri"} & set(kwargs)


def test_it_is_an_event_trigger_an_asset_watcher_accepts_with_the_lag_checks_thresholds() -> None:
    trigger = PostgresCdcSlotLagEventTrigger(
        slot_name="s", publications=["p"], min_lag_bytes=1, max_lag_age=60
    )
    assert isinstance(trigger, BaseEventTrigger)
    AssetWatcher(name="w", trigger=trigger)
    # The watcher's max_lag_age is the lag check's "piled up" age: fire once a change is that old.
    thresholds = trigger._thresholds()
    assert thresholds.min_lag_bytes == 1
    assert thresholds.min_lag_age is not None and thresholds.min_lag_age.total_seconds() == 60
    assert not thresholds.fires_when_caught_up


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "set min_lag_bytes or max_lag_age"),
        ({"max_lag_age": 60}, "max_lag_age needs publications"),
        ({"min_lag_bytes": "lots"}, "size"),
        ({"max_lag_age": -1, "publications": ["p"]}, "duration"),
    ],
)
def test_bad_thresholds_fail_when_the_dag_is_parsed(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PostgresCdcSlotLagEventTrigger(slot_name="s", **kwargs)  # type: ignore[arg-type]


def test_one_event_per_acknowledged_position() -> None:
    # The first crossing fires; the same position never fires again, however long it stays over.
    assert fires(Outcome.MET, "0/1000", None)
    assert not fires(Outcome.MET, "0/1000", "0/1000")
    # Under the threshold nothing fires, moved or not.
    assert not fires(Outcome.WAITING, "0/2000", "0/1000")
    assert not fires(Outcome.WAITING, "0/1000", None)
    # An ack moved the slot and the lag crossed again: the next event.
    assert fires(Outcome.MET, "0/2000", "0/1000")
    # Failures are raised by the watcher, never fired as events (they would start a CDC run).
    for failure in (Outcome.LOST, Outcome.SLOT_MISSING, Outcome.WAL_AT_RISK, Outcome.ERROR):
        assert not fires(failure, "0/3000", "0/1000")


def load_example(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    for name, value in env.items():
        monkeypatch.setenv(f"POSTGRES_CDC_ON_LAG_{name}", value)
    spec = importlib.util.spec_from_file_location("postgres_cdc_on_lag_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_dag_reads_slot_and_thresholds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SLOT": "shop_cdc", "MIN_LAG_BYTES": "1MB", "MAX_LAG_AGE": "", "POKE_INTERVAL": "5"}
    module = load_example(monkeypatch, **env)
    (watcher,) = module.slot_lag.watchers
    _, kwargs = watcher.trigger.serialize()
    assert kwargs["slot_name"] == "shop_cdc" and kwargs["min_lag_bytes"] == MB
    assert kwargs["max_lag_age"] is None and kwargs["poke_interval"] == 5.0
    dag = module.dag
    assert dag.max_active_runs == 1
    assert dag.params["slot_name"] == "shop_cdc"
    assert "postgres_cdc.wait_for_lag" not in dag.task_dict  # the watcher decided already
    assert {"postgres_cdc.drain", "postgres_cdc.apply", "postgres_cdc.ack"} <= set(dag.task_dict)


def test_example_dag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLOT", "MIN_LAG_BYTES", "MAX_LAG_AGE", "POKE_INTERVAL", "PUBLICATION", "CONN_ID"):
        monkeypatch.delenv(f"POSTGRES_CDC_ON_LAG_{name}", raising=False)
    _, kwargs = load_example(monkeypatch).slot_lag.watchers[0].trigger.serialize()
    assert kwargs["slot_name"] == "postgres_cdc_slot" and kwargs["publications"] == ["postgres_cdc_pub"]
    assert (kwargs["min_lag_bytes"], kwargs["max_lag_age"], kwargs["poke_interval"]) == (64 * MB, 900.0, 60.0)
