"""Event-driven runs with a real scheduler and triggerer: the slot lag watcher starts a DAG by itself.

A small DAG scheduled on a watched Asset records the asset events that triggered each run. It
must not run while the slot's lag is under the threshold, must run once writes push the lag past
it, must not run again while the slot stays at the same confirmed position (however far the lag
grows), and runs again once the slot was advanced (an ack) and the lag crossed again. A second
watcher, on a slot that does not exist, fails in the triggerer with the lag sensor's message.
The real CDC DAG on a watcher (``dags_examples/postgres_cdc_on_lag.py``) is run in
``tests/integration/e2e/test_cdc_on_lag.py``.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_postgres_cdc.testing import (
    AirflowSandbox,
    AirflowServices,
    DagRunRecord,
    PostgresCluster,
)
from tests.integration.sensors.slot_lag_support import PublishedSlot, connection_uri, make_published_slot

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

THRESHOLD = 256 * 1024
DAG_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import datetime as dt
    import json
    import os

    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG, Asset, AssetWatcher

    from airflow_provider_postgres_cdc.triggers.slot_lag_event import PostgresCdcSlotLagEventTrigger


    def record(triggering_asset_events, run_id, **_):
        events = [event.extra for events in triggering_asset_events.values() for event in events]
        with open(os.environ["WATCHED_RUNS_FILE"], "a", encoding="utf-8") as out:
            out.write(json.dumps({"run_id": run_id, "events": events}) + "\\n")


    def watched(dag_id, slot):
        trigger = PostgresCdcSlotLagEventTrigger(
            slot_name=slot, postgres_conn_id="pgl_lag", min_lag_bytes=THRESHOLD, poke_interval=1
        )
        asset = Asset(name=f"lag_{slot}", watchers=[AssetWatcher(name=f"lag_{slot}", trigger=trigger)])
        with DAG(dag_id, schedule=[asset], start_date=dt.datetime(2026, 1, 1), max_active_runs=1):
            PythonOperator(task_id="record", python_callable=record)


    watched("on_lag", "lag_slot")
    watched("on_missing_slot", "no_such_slot")
    """
).replace("THRESHOLD", str(THRESHOLD))


def wait_for(what: str, check: Callable[[], Any], services: AirflowServices, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout}s\n{services.logs(12000)}")


def finished_runs(services: AirflowServices, dag_id: str) -> list[DagRunRecord]:
    return [run for run in services.dag_runs(dag_id) if run.state in ("success", "failed")]


def recorded(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def triggerer_log(services: AirflowServices) -> str:
    assert services.log_dir is not None
    return (services.log_dir / "triggerer.log").read_text(errors="replace")


def write_until(published: PublishedSlot, lag_bytes: int) -> None:
    while published.lag_bytes() < lag_bytes:
        published.write(100, payload=500)


@pytest.mark.timeout(600)
def test_watcher_starts_a_run_once_per_position_past_the_threshold(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = make_published_slot(pg_cluster, pg_dbname, "pgl_lag", monkeypatch)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "watched.py").write_text(DAG_FILE, encoding="utf-8")
    out = tmp_path / "runs.jsonl"
    sandbox = AirflowSandbox(
        tmp_path / "home",
        dags,
        connections={"pgl_lag": connection_uri(pg_cluster, pg_dbname)},
        env={"WATCHED_RUNS_FILE": str(out)},
    )
    with sandbox.services(triggerer=True, job_schedule=True) as services:
        services.watch("on_lag", "on_missing_slot")

        # Not before: the watcher checks every second and stays quiet under the threshold.
        write_until(published, THRESHOLD // 4)
        checks = lambda: triggerer_log(services).count("slot 'lag_slot' waiting")  # noqa: E731
        wait_for("three checks of lag_slot under the threshold", lambda: checks() >= 3, services)
        time.sleep(3)
        assert services.dag_runs("on_lag") == []

        # Past the threshold: one run, started by the scheduler because of the watcher's event.
        write_until(published, THRESHOLD)
        (first,) = wait_for("the first run", lambda: finished_runs(services, "on_lag"), services)
        assert first.state == "success" and first.run_type == "asset_triggered", services.logs()
        ((event,),) = [run["events"] for run in recorded(out)]
        assert event["from_trigger"] is True
        payload = event["payload"]
        position = pg_cluster.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'lag_slot'",
            pg_dbname,
        )[0][0]
        assert payload["slot_name"] == "lag_slot" and payload["outcome"] == "met"
        assert payload["confirmed_flush_lsn"] == payload["health"]["confirmed_flush_lsn"] == position
        assert payload["lag_bytes"] >= THRESHOLD and "threshold crossed" in payload["message"]

        # Same position, lag still growing: no second run (nothing acked, nothing new to announce).
        write_until(published, 2 * THRESHOLD)
        wait_for("a repeated check", lambda: "was fired already" in triggerer_log(services), services)
        time.sleep(3)
        assert len(services.dag_runs("on_lag")) == 1

        # An ack moves the slot; once the lag crosses again, the next run.
        published.advance_to_now()
        write_until(published, THRESHOLD)
        wait_for("the second run", lambda: len(finished_runs(services, "on_lag")) == 2, services)
        assert [run.state for run in services.dag_runs("on_lag")] == ["success", "success"]
        second = recorded(out)[1]["events"][0]["payload"]
        assert second["confirmed_flush_lsn"] != position

        # The watcher on a missing slot fails loudly in the triggerer, with the lag sensor's message.
        log = triggerer_log(services)
        assert "replication slot 'no_such_slot' does not exist" in log
        assert "postgres_cdc_recover_slot" in log and "SlotNotFoundError" in log
        assert services.dag_runs("on_missing_slot") == []
