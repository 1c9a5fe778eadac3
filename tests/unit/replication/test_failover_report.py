"""What ``pgcdc check`` says about failover, judged from the facts alone (no server).

The same judgements run against real servers in tests/integration/reliability/test_failover.py;
here every gap is produced on purpose, each must name its own fix, and a ready standby none.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_postgres_cdc.errors import FailoverNotReadyError, ServerFeatureError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication.failover import FailoverReport
from airflow_provider_postgres_cdc.replication.slots import SlotInfo, invalidation_message

SYNCED = SlotInfo(
    "cdc", "pgoutput", "logical", "shop", False, False, None, Lsn(100), Lsn(200), "reserved", None, False,
    Lsn(300), failover=True, synced=True, in_recovery=True,
)  # fmt: skip
READY = FailoverReport(
    in_recovery=True, server_version_num=180006, hot_standby_feedback="on", primary_slot_name="sb",
    sync_replication_slots="on", synchronized_standby_slots=None, primary_conninfo_has_dbname=True,
    slot_name="cdc", slot=SYNCED,
)  # fmt: skip


def test_a_ready_standby_has_no_problem() -> None:
    assert READY.problems() == []


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        ({"hot_standby_feedback": "off"}, "SET hot_standby_feedback = on"),
        ({"primary_slot_name": None}, "pg_create_physical_replication_slot"),
        ({"sync_replication_slots": "off"}, "SET sync_replication_slots = on"),
        ({"primary_conninfo_has_dbname": False}, "dbname="),
        ({"slot": None}, "does not exist on this standby"),
        ({"slot": replace(SYNCED, temporary=True)}, "pg_log_standby_snapshot"),
        ({"slot": replace(SYNCED, synced=False)}, "synced = false"),
        ({"slot": replace(SYNCED, invalidation_reason="rows_removed")}, "hot_standby_feedback = on"),
    ],
)
def test_each_gap_on_a_standby_names_its_fix(change: dict[str, object], fix: str) -> None:
    problems = replace(READY, **change).problems()  # type: ignore[arg-type]
    assert len(problems) == 1 and isinstance(problems[0], FailoverNotReadyError)
    assert fix in str(problems[0])


def test_too_old_standbys_get_the_feature_error() -> None:
    sixteen = replace(READY, server_version_num=160004, sync_replication_slots=None)
    assert [type(p) for p in sixteen.problems()] == [ServerFeatureError]
    assert "failover slots need 17" in str(sixteen.problems()[0])
    fifteen = replace(READY, server_version_num=150010)
    assert "from PostgreSQL 16" in str(fifteen.problems()[0])


def test_on_a_primary_gaps_are_warnings() -> None:
    primary_slot = replace(SYNCED, synced=False, in_recovery=False)
    primary = replace(READY, in_recovery=False, slot=primary_slot, primary_conninfo_has_dbname=None)
    assert primary.problems() == []
    assert "synchronized_standby_slots" in primary.warnings()[0]
    assert replace(primary, synchronized_standby_slots="sb").warnings() == []
    no_failover = replace(primary, slot=replace(primary_slot, failover=False))
    assert "FAILOVER true" in no_failover.warnings()[0]


@pytest.mark.parametrize(
    ("reason", "fix"),
    [
        ("wal_removed", "max_slot_wal_keep_size"),
        ("rows_removed", "hot_standby_feedback = on"),
        ("wal_level_insufficient", "wal_level = 'logical'"),
        ("idle_timeout", "idle_replication_slot_timeout"),
    ],
)
def test_every_invalidation_reason_has_its_own_fix(reason: str, fix: str) -> None:
    slot = replace(SYNCED, invalidation_reason=reason, wal_status="lost")
    assert slot.invalidated
    message = invalidation_message(slot)
    assert fix in message and f"invalidation_reason = {reason}" in message
    assert "postgres_cdc_recover_slot" in message
