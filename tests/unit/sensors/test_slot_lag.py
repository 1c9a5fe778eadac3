"""The slot lag sensor without a server: argument checks at parse time and after rendering, templating."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, "at least one"),
        ({"min_lag_bytes": 1, "max_lag_bytes": 2}, "cannot be combined"),
        ({"min_lag_age": 60}, "need publications"),
        ({"max_lag_bytes": 1, "on_wal_risk": "ignore"}, "on_wal_risk"),
        (
            {"min_lag_bytes": "64 MiB"},
            r"min_lag_bytes='64 MiB' is not an int of bytes or a size such as '64MB'",
        ),
        (
            {"max_lag_age": "ten minutes", "publications": "p"},
            r"max_lag_age='ten minutes' is not a timedelta",
        ),
        (
            {"max_lag_bytes": 1, "min_safe_wal_bytes": -1},
            r"min_safe_wal_bytes=-1 is not .*cannot be negative",
        ),
        ({"max_lag_bytes": 1, "stale_after": "a day"}, r"stale_after='a day' is not a timedelta"),
    ],
)
def test_sensor_rejects_ambiguous_arguments_at_parse_time(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PostgresCdcSlotLagSensor(task_id="lag", slot_name="s1", **kwargs)


def test_sensor_templates_its_slot_thresholds_and_publications() -> None:
    fields = set(PostgresCdcSlotLagSensor.template_fields)
    assert {
        "slot_name",
        "min_lag_bytes",
        "max_lag_bytes",
        "min_lag_age",
        "max_lag_age",
        "publications",
    } <= fields
    # A template is accepted unrendered; only its None-ness is checked before execute.
    PostgresCdcSlotLagSensor(task_id="lag", slot_name="{{ params.slot }}", min_lag_bytes="{{ params.lag }}")


def test_a_templated_threshold_is_checked_once_rendered() -> None:
    sensor = PostgresCdcSlotLagSensor(
        task_id="lag",
        slot_name="s1",
        min_lag_bytes="{{ params.lag }}",
        min_safe_wal_bytes="{{ params.floor }}",
    )
    sensor.min_lag_bytes = "a lot"  # what the template rendered to
    with pytest.raises(ValueError, match=r"min_lag_bytes='a lot' is not an int of bytes"):
        sensor.execute({})  # type: ignore[arg-type]
    sensor.min_lag_bytes, sensor.min_safe_wal_bytes = "64MB", "1 TiB"
    with pytest.raises(ValueError, match=r"min_safe_wal_bytes='1 TiB' is not"):
        sensor.execute({})  # type: ignore[arg-type]


@pytest.mark.parametrize("configured", ["True", "False"])
def test_deferrable_defaults_to_airflows_default_deferrable(configured: str) -> None:
    code = (
        "from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor as S; "
        "print(S(task_id='t', slot_name='s', min_lag_bytes=1).deferrable)"
    )
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": configured}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == configured
