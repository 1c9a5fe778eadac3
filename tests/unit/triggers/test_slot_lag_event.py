"""The watcher trigger without a server: exact serialization, normalised kwargs, one event per position."""

from __future__ import annotations

import importlib.util
import json
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from airflow.sdk import AssetWatcher
from airflow.sdk.module_loading import import_string
from airflow.triggers.base import BaseEventTrigger

from airflow_provider_postgres_cdc.engine.health import LagThresholds, Outcome
from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor
from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger
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
        min_lag_age="600",
        min_safe_wal_bytes="1GB",
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
        "max_lag_bytes": None,
        "min_lag_age": 600.0,
        "max_lag_age": None,
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
        slot_name="s", publications=["p"], min_lag_bytes=1, min_lag_age=60
    )
    assert isinstance(trigger, BaseEventTrigger)
    AssetWatcher(name="w", trigger=trigger)
    thresholds = trigger._thresholds()
    assert thresholds == LagThresholds(min_lag_bytes=1, min_lag_age=timedelta(seconds=60))
    assert not thresholds.fires_when_caught_up


@pytest.mark.parametrize("name", ["min_lag_bytes", "max_lag_bytes", "min_lag_age", "max_lag_age"])
def test_each_threshold_means_the_same_on_the_sensor_the_trigger_and_the_watcher(name: str) -> None:
    """One name, one direction: the three faces hand the same LagThresholds to the one judgement."""
    value = "2MB" if name.endswith("_bytes") else "120"
    kwargs = {"slot_name": "s", "publications": ["p"], name: value}
    sensor = PostgresCdcSlotLagSensor(task_id="lag", **kwargs)  # type: ignore[arg-type]
    trigger = PostgresCdcSlotLagTrigger(**kwargs)  # type: ignore[arg-type]
    watcher = PostgresCdcSlotLagEventTrigger(**kwargs)  # type: ignore[arg-type]
    expected = LagThresholds(**{name: 2 * MB if name.endswith("_bytes") else timedelta(seconds=120)})
    assert sensor._thresholds() == trigger._thresholds() == watcher._thresholds() == expected
    assert expected.fires_when_caught_up is name.startswith("max_")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one of min_lag_bytes"),
        ({"min_lag_bytes": 1, "max_lag_age": 60, "publications": ["p"]}, "cannot be combined"),
        ({"min_lag_age": 60}, "need publications"),
        ({"min_lag_bytes": "lots"}, r"min_lag_bytes='lots' is not an int of bytes or a size such as '64MB'"),
        (
            {"min_lag_age": -1, "publications": ["p"]},
            r"min_lag_age=-1 is not a timedelta, a number of seconds",
        ),
        ({"max_lag_bytes": 1.5}, "max_lag_bytes=1.5 is not an int of bytes"),
        ({"min_lag_bytes": 1, "min_safe_wal_bytes": "1 GiB"}, "min_safe_wal_bytes='1 GiB' is not"),
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
    env = {"SLOT_NAME": "shop_cdc", "MIN_LAG_BYTES": "1MB", "MIN_LAG_AGE": "", "POKE_INTERVAL": "5"}
    module = load_example(monkeypatch, **env)
    (watcher,) = module.slot_lag.watchers
    _, kwargs = watcher.trigger.serialize()
    assert kwargs["slot_name"] == "shop_cdc" and kwargs["min_lag_bytes"] == MB
    assert kwargs["min_lag_age"] is None and kwargs["poke_interval"] == 5.0
    dag = module.dag
    assert dag.max_active_runs == 1
    assert dag.params["slot_name"] == "shop_cdc"
    assert "postgres_cdc.wait_for_lag" not in dag.task_dict  # the watcher decided already
    assert {"postgres_cdc.drain", "postgres_cdc.apply", "postgres_cdc.ack"} <= set(dag.task_dict)


def test_example_dag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("SLOT_NAME", "MIN_LAG_BYTES", "MIN_LAG_AGE", "POKE_INTERVAL", "PUBLICATIONS", "POSTGRES_CONN_ID")
    for name in names:
        monkeypatch.delenv(f"POSTGRES_CDC_ON_LAG_{name}", raising=False)
    _, kwargs = load_example(monkeypatch).slot_lag.watchers[0].trigger.serialize()
    assert kwargs["slot_name"] == "postgres_cdc_slot" and kwargs["publications"] == ["postgres_cdc_pub"]
    assert (kwargs["min_lag_bytes"], kwargs["min_lag_age"], kwargs["poke_interval"]) == (64 * MB, 900.0, 60.0)
    assert (kwargs["max_lag_bytes"], kwargs["max_lag_age"]) == (None, None)
