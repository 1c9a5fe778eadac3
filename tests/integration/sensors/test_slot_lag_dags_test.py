"""The deferrable sensor in a real DAG run: `airflow dags test` defers it and runs the trigger in line."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.testing import AirflowSandbox
from tests.integration.sensors.slot_lag_support import PASSWORD, PublishedSlot

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

DEFERRED_MARKER = "[DAG TEST] running trigger in line"

DAG_SOURCE = """
import datetime

from airflow.sdk import DAG

from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor

with DAG("pgl_slot_lag_deferrable", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
    PostgresCdcSlotLagSensor(
        task_id="wait_for_lag",
        slot_name="{{ params.slot_name }}",
        postgres_conn_id="pgl_lag",
        min_lag_bytes="{{ params.min_lag }}",
        publications=["lag_pub"],
        params={"slot_name": "lag_slot", "min_lag": "256kB"},
        deferrable=True,
        poke_interval=0.5,
        timeout=120,
    )
"""


def test_deferrable_sensor_fires_through_the_trigger_in_dags_test(
    published: PublishedSlot, airflow_sandbox: AirflowSandbox
) -> None:
    writes: list[int] = []

    def on_line(line: str) -> None:
        # The first poke has found the lag under the threshold and the task deferred: only
        # now does the lag grow, so only the trigger can see it cross.
        if DEFERRED_MARKER in line and not writes:
            writes.append(1)
            published.write(2000)

    (airflow_sandbox.dags_folder / "pgl_slot_lag_deferrable.py").write_text(DAG_SOURCE)
    result = airflow_sandbox.dags_test("pgl_slot_lag_deferrable", on_line=on_line, timeout=300)
    tail = result.output[-6000:]
    assert result.returncode == 0, tail
    assert writes, f"the sensor never deferred:\n{tail}"
    before, after = result.output.split(DEFERRED_MARKER, 1)
    assert "'lag_slot' waiting (lag" in before, tail
    assert "'lag_slot' threshold crossed (lag" in after, tail
    assert "state=success" in after or "successful" in after, tail
    assert PASSWORD not in result.output
