"""The judgement of a slot measurement: thresholds, WAL safety, staleness, the decision's event form."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_postgres_cdc.engine.health.model import SlotHealth
from airflow_provider_postgres_cdc.engine.health.verdict import (
    LagThresholds,
    Outcome,
    SlotLagDecision,
    WalRisk,
    decide,
    judge_lag,
    wal_safety,
)
from airflow_provider_postgres_cdc.errors import SlotLostError, SlotNotFoundError, WalRetentionError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication.slots import SlotInfo

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
    assert (
        "airflow dags trigger postgres_cdc_recover_slot" in lost.message
        and '"slot_name": "s1"' in lost.message
    )


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
