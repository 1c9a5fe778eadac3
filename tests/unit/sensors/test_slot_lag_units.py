"""Slot lag sensor without a server: trigger serialization, threshold and WAL-safety judgement, parsing."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.sdk.module_loading import import_string
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.engine.slot_health import (
    LagThresholds,
    Outcome,
    SlotHealth,
    SlotLagDecision,
    WalRetentionError,
    WalRisk,
    _begin_commit_time,
    decide,
    format_size,
    judge_lag,
    parse_duration,
    parse_size,
    publication_names_option,
    wal_safety,
)
from airflow_provider_pglogical.errors import SlotLostError, SlotNotFoundError
from airflow_provider_pglogical.formats.lsn import Lsn
from airflow_provider_pglogical.replication.slots import SlotInfo
from airflow_provider_pglogical.sensors.slot_lag import PgLogicalSlotLagSensor
from airflow_provider_pglogical.triggers.slot_lag import PgLogicalSlotLagTrigger

CLASSPATH = "airflow_provider_pglogical.triggers.slot_lag.PgLogicalSlotLagTrigger"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MB = 1 << 20


def health(
    *,
    lag: int = 10 * MB,
    wal_status: str = "reserved",
    safe_wal_size: int | None = None,
    keep: int | None = None,
    age: timedelta | None = None,
    active: bool = False,
) -> SlotHealth:
    current = Lsn(100 * MB)
    slot = SlotInfo(
        "s1", "pgoutput", "logical", "db", False, active, 42 if active else None,
        Lsn(current - lag - 4096), Lsn(current - lag), wal_status, safe_wal_size, False, current,
    )  # fmt: skip
    return SlotHealth(slot, NOW, keep, "db", lag_age=age, age_unknown_reason=None if age is not None else "x")


# --------------------------------------------------------------------------- the trigger


def test_trigger_serialization_round_trip_pins_the_classpath() -> None:
    trigger = PgLogicalSlotLagTrigger(
        slot_name="s1",
        pglogical_conn_id="pg_prod",
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
    assert import_string(classpath) is PgLogicalSlotLagTrigger
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {
        "slot_name": "s1",
        "pglogical_conn_id": "pg_prod",
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
    _, kwargs = PgLogicalSlotLagTrigger(slot_name="s1", min_lag_bytes=1).serialize()
    assert not {"password", "host", "login", "dsn", "uri"} & set(kwargs)


# --------------------------------------------------------------------------- the sensor's arguments


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, "at least one"),
        ({"min_lag_bytes": 1, "max_lag_bytes": 2}, "cannot be combined"),
        ({"min_lag_age": 60}, "need publications"),
        ({"max_lag_bytes": 1, "on_wal_risk": "ignore"}, "on_wal_risk"),
    ],
)
def test_sensor_rejects_ambiguous_arguments_at_parse_time(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PgLogicalSlotLagSensor(task_id="lag", slot_name="s1", **kwargs)


def test_sensor_templates_its_slot_thresholds_and_publications() -> None:
    fields = set(PgLogicalSlotLagSensor.template_fields)
    assert {
        "slot_name",
        "min_lag_bytes",
        "max_lag_bytes",
        "min_lag_age",
        "max_lag_age",
        "publications",
    } <= fields
    # A template is accepted unrendered; only its None-ness is checked before execute.
    PgLogicalSlotLagSensor(task_id="lag", slot_name="{{ params.slot }}", min_lag_bytes="{{ params.lag }}")


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8192", 8192), ("64MB", 64 * MB), ("1.5 GB", 3 << 29), ("16kB", 16384), ("2tb", 2 << 40), (7, 7)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1", "12 parsecs", "", "MB", True])
def test_parse_size_rejects(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_format_size_round_trips_within_rounding(num: int) -> None:
    # Like pg_size_pretty: a unit is used from 10 of it on, so rounding costs at most 5 %.
    back = parse_size(format_size(num))
    assert back == num if num < 10240 else abs(back - num) <= num * 0.05


def test_parse_duration() -> None:
    assert parse_duration(timedelta(minutes=5)) == timedelta(minutes=5)
    assert parse_duration("90") == parse_duration(90) == timedelta(seconds=90)
    for bad in ("soon", -1, float("inf")):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_publication_names_are_quoted_as_identifiers() -> None:
    assert publication_names_option(["pub", "Mixed,Case", 'q"uote']) == '"pub","Mixed,Case","q""uote"'
    with pytest.raises(ValueError):
        publication_names_option([])


def test_begin_message_commit_time() -> None:
    # A Begin captured from PostgreSQL 15: final LSN 0/150A6E0, xid 728, committed at
    # 2026-11-21 05:49:32.851695 UTC (848555372851695 microseconds after 2000-01-01).
    data = b"B" + struct.pack("!QqI", 0x150A6E0, 848_555_372_851_695, 728)
    assert _begin_commit_time(data) == datetime(2026, 11, 21, 5, 49, 32, 851695, tzinfo=UTC)
    with pytest.raises(Exception, match="Begin"):
        _begin_commit_time(b"C" + bytes(25))


# --------------------------------------------------------------------------- judgement


def test_min_thresholds_fire_when_any_is_reached() -> None:
    thresholds = LagThresholds(min_lag_bytes=64 * MB, min_lag_age=timedelta(minutes=10))
    assert not judge_lag(health(lag=MB, age=timedelta(minutes=1)), thresholds)[0]
    assert judge_lag(health(lag=MB, age=timedelta(minutes=11)), thresholds)[0]
    assert judge_lag(health(lag=65 * MB, age=None), thresholds)[0]


def test_max_thresholds_fire_when_all_hold() -> None:
    thresholds = LagThresholds(max_lag_bytes=MB, max_lag_age=timedelta(seconds=5))
    assert judge_lag(health(lag=1000, age=timedelta(0)), thresholds)[0]
    assert not judge_lag(health(lag=1000, age=timedelta(seconds=6)), thresholds)[0]
    assert not judge_lag(health(lag=2 * MB, age=timedelta(0)), thresholds)[0]
    # An unknown age is not "caught up".
    assert not judge_lag(health(lag=1000, age=None), thresholds)[0]


def test_wal_safety_levels() -> None:
    assert wal_safety(health()).risk is WalRisk.OK
    assert wal_safety(health(safe_wal_size=5 * MB, keep=64 * MB), 16 * MB).risk is WalRisk.AT_RISK
    assert wal_safety(health(safe_wal_size=50 * MB, keep=64 * MB), 16 * MB).risk is WalRisk.OK
    unreserved = wal_safety(health(wal_status="unreserved", keep=MB))
    assert unreserved.risk is WalRisk.AT_RISK
    assert "10 MB of changes not yet drained" in unreserved.message
    assert "ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'" in unreserved.message
    lost = wal_safety(health(wal_status="lost", keep=MB))
    assert lost.risk is WalRisk.LOST
    assert "airflow dags trigger pglogical_recover_slot" in lost.message and '"slot": "s1"' in lost.message


def test_a_lost_slot_fails_even_when_the_threshold_is_met() -> None:
    decision = decide(health(wal_status="lost"), LagThresholds(min_lag_bytes=1), on_wal_risk="warn")
    assert decision.outcome is Outcome.LOST
    with pytest.raises(SlotLostError):
        decision.raise_for_failure()


def test_wal_risk_fails_or_warns_by_option() -> None:
    risky = health(safe_wal_size=MB, keep=64 * MB)
    failed = decide(risky, LagThresholds(min_lag_bytes=1), min_safe_wal_bytes=16 * MB)
    assert failed.outcome is Outcome.WAL_AT_RISK
    with pytest.raises(WalRetentionError, match="close to being invalidated"):
        failed.raise_for_failure()
    warned = decide(risky, LagThresholds(min_lag_bytes=1), min_safe_wal_bytes=16 * MB, on_wal_risk="warn")
    assert warned.outcome is Outcome.MET
    assert any("close to being invalidated" in warning for warning in warned.warnings)


def test_inactive_stale_slot_is_warned_about() -> None:
    old = health(age=timedelta(days=2))
    stale = decide(old, LagThresholds(min_lag_bytes=1), stale_after=timedelta(days=1))
    assert any("inactive and stale" in warning for warning in stale.warnings)
    active = replace(old, slot=replace(old.slot, active=True, active_pid=7))
    assert not decide(active, LagThresholds(min_lag_bytes=1), stale_after=timedelta(days=1)).warnings


def test_decision_survives_the_event_round_trip() -> None:
    decision = decide(health(wal_status="lost"), LagThresholds(min_lag_bytes=1))
    event = json.loads(json.dumps(decision.to_event()))
    back = SlotLagDecision.from_event(event)
    assert back.outcome is Outcome.LOST and back.message == decision.message
    assert back.health == decision.health
    with pytest.raises(SlotNotFoundError):
        SlotLagDecision(Outcome.SLOT_MISSING, "gone").raise_for_failure()
    assert SlotLagDecision.from_event(None).outcome is Outcome.ERROR


def test_importing_the_sensor_stays_light_for_dag_parsing() -> None:
    """The sensor is imported by every DAG file that uses it: no pyarrow/numpy (about a second)."""
    code = (
        "import sys, airflow_provider_pglogical.sensors.slot_lag, airflow_provider_pglogical.cli.lag; "
        "heavy = {'pyarrow', 'numpy'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("configured", ["True", "False"])
def test_deferrable_defaults_to_airflows_default_deferrable(configured: str) -> None:
    code = (
        "from airflow_provider_pglogical.sensors.slot_lag import PgLogicalSlotLagSensor as S; "
        "print(S(task_id='t', slot_name='s', min_lag_bytes=1).deferrable)"
    )
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": configured}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == configured
