"""When a CDC run starts the next one at once: a full batch, lag over the threshold, budget left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_postgres_cdc.engine.catch_up import catch_up

START = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)


def decide(**changes: object) -> tuple[bool, str]:
    settings: dict[str, object] = {
        "full": True,
        "lag_bytes": 50 << 20,
        "min_lag_bytes": 0,
        "since": START,
        "now": START + timedelta(minutes=10),
        "budget_seconds": 3600,
    }
    settings.update(changes)
    decision = catch_up(**settings)  # type: ignore[arg-type]
    return decision.go, decision.reason


def test_a_full_batch_with_lag_and_budget_left_goes_on() -> None:
    go, reason = decide()
    assert go and "52428800 bytes" in reason and "3000 s" in reason


def test_an_unreadable_lag_leaves_the_decision_to_the_full_batch() -> None:
    assert decide(lag_bytes=None)[0]
    assert not decide(lag_bytes=None, full=False)[0]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"full": False}, "took everything the slot held"),
        ({"lag_bytes": 1000, "min_lag_bytes": 4096}, "under the threshold (4096)"),
        ({"lag_bytes": 0}, "under the threshold (0)"),
        ({"now": START + timedelta(hours=1)}, "past its budget of 3600 s"),
    ],
)
def test_each_reason_to_wait_for_the_schedule_is_named(changes: dict[str, object], why: str) -> None:
    go, reason = decide(**changes)
    assert not go and why in reason
