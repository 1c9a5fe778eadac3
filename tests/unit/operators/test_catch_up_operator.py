"""The catch-up task: when it triggers the next run, with which conf, and the thresholds it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException, DagRunTriggerException

from airflow_provider_postgres_cdc.engine.catch_up import CATCH_UP_SINCE
from airflow_provider_postgres_cdc.operators.catch_up import PostgresCdcCatchUpOperator

PARAMS = {"slot_name": "shop_cdc", "staging": "/st", "max_messages": 1000, CATCH_UP_SINCE: None}


@dataclass
class TaskInstance:
    """What the operator reads of its task instance: the drain's and the ack's XComs."""

    xcoms: dict[str, Any]

    def xcom_pull(self, task_ids: str) -> Any:
        return self.xcoms[task_ids]


@dataclass
class DagRun:
    conf: dict[str, Any]
    start_date: datetime
    extra: dict[str, Any] = field(default_factory=dict)


def five_minutes_ago() -> datetime:
    """A run's start, taken when the test runs: a time fixed at import would age while the suite runs."""
    return datetime.now(UTC) - timedelta(minutes=5)


def run(
    *,
    full: bool,
    lag: int | None,
    conf: dict[str, Any],
    min_lag: int | str = 0,
    started: datetime | None = None,
) -> Any:
    operator = PostgresCdcCatchUpOperator(
        task_id="catch_up",
        drain_task_id="g.drain",
        ack_task_id="g.ack",
        catch_up_seconds="{{ params.catch_up_seconds }}",
        min_lag_bytes=min_lag,
        trigger_dag_id="shop_cdc",
        openlineage_inject_parent_info=False,
    )
    operator.catch_up_seconds = "600"  # as Airflow renders the template: text
    context = {
        "ti": TaskInstance({"g.drain": {"full": full}, "g.ack": {"lag_bytes": lag}}),
        "dag_run": DagRun(conf, started or five_minutes_ago()),
        "params": PARAMS,
    }
    return operator.execute(context)  # type: ignore[arg-type]


def test_a_full_batch_triggers_the_next_run_with_the_runs_params_and_the_chains_start() -> None:
    conf = {"slot_name": "shop_cdc", "max_messages": 1000, "not_a_param": "x"}
    started = five_minutes_ago()
    with pytest.raises(DagRunTriggerException) as raised:
        run(full=True, lag=50 << 20, conf=conf, started=started)
    assert raised.value.trigger_dag_id == "shop_cdc"
    assert raised.value.conf == {
        "slot_name": "shop_cdc",
        "max_messages": 1000,
        CATCH_UP_SINCE: started.isoformat(),
    }


def test_a_follow_up_run_keeps_the_chains_start_and_stops_past_the_budget() -> None:
    earlier = (datetime.now(UTC) - timedelta(minutes=3)).isoformat()
    with pytest.raises(DagRunTriggerException) as raised:
        run(full=True, lag=None, conf={CATCH_UP_SINCE: earlier})
    assert raised.value.conf == {CATCH_UP_SINCE: earlier}
    spent = (datetime.now(UTC) - timedelta(minutes=11)).isoformat()
    with pytest.raises(AirflowSkipException, match="past its budget of 600 s"):
        run(full=True, lag=None, conf={CATCH_UP_SINCE: spent})


def test_the_threshold_is_a_size_as_the_lag_sensor_takes_it() -> None:
    with pytest.raises(AirflowSkipException, match=r"\(10485760 bytes\) is under the threshold \(16777216\)"):
        run(full=True, lag=10 << 20, conf={}, min_lag="16MB")
    with pytest.raises(DagRunTriggerException):
        run(full=True, lag=20 << 20, conf={}, min_lag="16MB")


def test_a_batch_that_took_everything_waits_for_the_schedule() -> None:
    with pytest.raises(AirflowSkipException, match="took everything the slot held"):
        run(full=False, lag=50 << 20, conf={})
