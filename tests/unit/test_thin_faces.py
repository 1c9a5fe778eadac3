"""The Airflow faces stay thin: importing them (every DAG file does) loads no columnar or lake library.

pyarrow, numpy and pyiceberg take about a second to import and are needed only when a task drains,
loads or reads the lake, so the engine parts that use them are imported inside the methods that run.
"""

from __future__ import annotations

import subprocess
import sys

FACES = (
    "airflow_provider_postgres_cdc.hooks.postgres",
    "airflow_provider_postgres_cdc.hooks.lake",
    "airflow_provider_postgres_cdc.sensors.slot_lag",
    "airflow_provider_postgres_cdc.triggers.slot_lag",
    "airflow_provider_postgres_cdc.triggers.slot_lag_event",
    "airflow_provider_postgres_cdc.plugins.pipelines",
    "airflow_provider_postgres_cdc.plugins.report_view",
    "airflow_provider_postgres_cdc.assets",
    "airflow_provider_postgres_cdc.metrics",
    "airflow_provider_postgres_cdc.cli",
)
HEAVY = ("pyarrow", "numpy", "pyiceberg")

CHECK = """
import importlib, sys
heavy, faces = sys.argv[1].split(","), sys.argv[2:]
for face in faces:
    importlib.import_module(face)
print(sorted(name for name in heavy if name in sys.modules))
"""


def loaded_heavy(*modules: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", CHECK, ",".join(HEAVY), *modules], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_importing_the_faces_loads_no_pyarrow_numpy_or_pyiceberg() -> None:
    assert loaded_heavy(*FACES) == "[]"


def test_the_check_sees_a_heavy_import() -> None:
    """The check above can fail: the engine's lake reader does load them."""
    assert "pyarrow" in loaded_heavy("airflow_provider_postgres_cdc.engine.report")
