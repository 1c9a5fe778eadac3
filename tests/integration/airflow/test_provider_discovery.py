"""Airflow itself discovers the provider, its hook and its connection type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_provider_postgres_cdc


def airflow_cli(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    airflow = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow), *args], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.airflow
def test_airflow_lists_provider_and_connection_type(tmp_path: Path) -> None:
    providers = json.loads(airflow_cli(tmp_path, "providers", "list", "-o", "json"))
    ours = [p for p in providers if p["package_name"] == "airflow-provider-postgres-cdc"]
    assert ours and ours[0]["version"] == airflow_provider_postgres_cdc.__version__  # pyproject agrees
    hooks = json.loads(airflow_cli(tmp_path, "providers", "hooks", "-o", "json"))
    assert any(
        h["connection_type"] == "postgres_cdc_lake"
        and h["class"] == "airflow_provider_postgres_cdc.hooks.lake.PostgresCdcLakeHook"
        for h in hooks
    )
