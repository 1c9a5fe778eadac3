"""Slot health: how far behind a replication slot is, and whether PostgreSQL is about to drop its WAL.

One job per module: :mod:`.units` (sizes and durations), :mod:`.model` (what a measurement
holds), :mod:`.measure` (the I/O-free query generator that measures a slot, and its entry
points), :mod:`.verdict` (the pure judgement), :mod:`.drivers` (running any such generator on a
blocking or an asyncio psycopg2 connection). The names the sensor, trigger, hook and CLI use are
re-exported here.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.engine.health.measure import assess_slot, assess_slot_async, assess_slots
from airflow_provider_postgres_cdc.engine.health.model import SlotHealth, SlotStats
from airflow_provider_postgres_cdc.engine.health.units import format_size, parse_duration, parse_size
from airflow_provider_postgres_cdc.engine.health.verdict import (
    LagThresholds,
    Outcome,
    SlotLagDecision,
    WalRisk,
    WalSafety,
    check_threshold_kinds,
    decide,
    judge_lag,
    stale_warning,
    wal_safety,
)
from airflow_provider_postgres_cdc.errors import WalRetentionError
from airflow_provider_postgres_cdc.replication.publications import publication_names_option

__all__ = [
    "LagThresholds",
    "Outcome",
    "SlotHealth",
    "SlotLagDecision",
    "SlotStats",
    "WalRetentionError",
    "WalRisk",
    "WalSafety",
    "assess_slot",
    "assess_slot_async",
    "assess_slots",
    "check_threshold_kinds",
    "decide",
    "format_size",
    "judge_lag",
    "parse_duration",
    "parse_size",
    "publication_names_option",
    "stale_warning",
    "wal_safety",
]
