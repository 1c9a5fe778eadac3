"""The sandbox runs real scheduler work: a backfill in logical-date order, and a cleared past run again.

A tiny daily DAG appends ``<logical_date> <run_id>`` to a file from its one task, so the file
is the order in which Airflow really ran the task, independent of what the REST API reports.
In ``make test-long``, beside the one test that uses these runs (tests/integration/e2e/test_backfills.py).
"""

from __future__ import annotations

import os
import textwrap
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.testing import AirflowSandbox

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.long]

DAG_ID = "sandbox_runs"
DAG_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import datetime as dt
    import os

    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG


    def record(logical_date, run_id, **_):
        with open(os.environ["SANDBOX_RUNS_FILE"], "a", encoding="utf-8") as out:
            out.write(f"{logical_date.isoformat()} {run_id}\\n")


    with DAG(
        "sandbox_runs",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        catchup=False,
        max_active_runs=1,
    ):
        PythonOperator(task_id="record", python_callable=record)
    """
)
DAYS = [datetime(2024, 1, day, tzinfo=UTC) for day in (1, 2, 3)]


def recorded(path: Path) -> list[tuple[datetime, str]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [(datetime.fromisoformat(stamp), run_id) for stamp, run_id in (line.split(" ") for line in lines)]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(600)
def test_backfill_runs_in_order_then_a_cleared_run_runs_again(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{DAG_ID}.py").write_text(DAG_FILE, encoding="utf-8")
    out = tmp_path / "runs.txt"
    sandbox = AirflowSandbox(tmp_path / "home", dags, env={"SANDBOX_RUNS_FILE": str(out)})

    with sandbox.services() as services:
        backfill = services.backfill(DAG_ID, "2024-01-01", "2024-01-03").check()
        runs = backfill.runs
        assert [run.logical_date for run in runs] == DAYS
        assert all(run.run_type == "backfill" and run.state == "success" for run in runs)
        # max_active_runs=1: each run started only after the previous one ended.
        for earlier, later in pairwise(runs):
            assert earlier.end_date is not None and later.start_date is not None
            assert earlier.end_date <= later.start_date
        assert recorded(out) == [(run.logical_date, run.run_id) for run in runs]

        second = runs[1]
        rerun = services.rerun(DAG_ID, second.run_id).check()
        (again,) = rerun.runs
        assert again.run_id == second.run_id and again.logical_date == DAYS[1]
        assert again.state == "success" and again.start_date is not None
        assert second.end_date is not None and again.start_date > second.end_date
        assert recorded(out)[3:] == [(DAYS[1], second.run_id)]
        pids = services.pids

    assert not services.running
    assert not any(group_alive(pgid) for pgid in pids.values()), pids

    # Without a scheduler, `airflow dags test` at a past date runs the task again, but as a new
    # manual run that replaces the backfill run of that date.
    sandbox.dags_test_at(DAG_ID, DAYS[2], conf={"again": True}).check()
    (stamp, run_id), *_ = recorded(out)[4:]
    assert stamp == DAYS[2] and run_id.startswith("manual__")
    assert len(recorded(out)) == 5
