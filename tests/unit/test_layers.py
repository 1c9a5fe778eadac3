"""The Airflow side installs and imports without pyspark: the lake is read with pyiceberg.

A fresh interpreter blocks ``pyspark`` and ``py4j`` imports, then imports every module of the
Airflow side; only the Spark job (``spark/`` but its submit-side ``__init__``) and the apply
operator built on the Spark provider may need them.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import airflow_provider_postgres_cdc

# Modules that run under spark-submit, or subclass the Spark provider's operator (the `spark` extra).
SPARK_SIDE = ("airflow_provider_postgres_cdc.spark.", "airflow_provider_postgres_cdc.operators.spark_apply",
              "airflow_provider_postgres_cdc.operators.lake_job",
              "airflow_provider_postgres_cdc.operators.maintenance")  # fmt: skip

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("pyspark", "py4j"):
            raise ImportError(f"blocked for this test: {name}")
        return None
sys.meta_path.insert(0, Block())
import importlib
for module in sys.argv[1:]:
    importlib.import_module(module)
print("imported", len(sys.argv) - 1)
"""


def airflow_side_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(
            airflow_provider_postgres_cdc.__path__, "airflow_provider_postgres_cdc."
        )
    ]
    runnable = [n for n in names if not n.endswith(".__main__")]  # `python -m` entry points run on import
    return [n for n in runnable if not n.startswith(SPARK_SIDE) or n == "airflow_provider_postgres_cdc.spark"]


def test_airflow_side_imports_without_pyspark() -> None:
    modules = airflow_side_modules()
    assert "airflow_provider_postgres_cdc.operators.ack" in modules
    assert "airflow_provider_postgres_cdc.engine.lake_catalog" in modules
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, *modules], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"imported {len(modules)}" in result.stdout


def test_the_blocker_can_fail() -> None:
    """The check above is real: importing the Spark job under the blocker fails."""
    job = "airflow_provider_postgres_cdc.spark.apply_batch"
    result = subprocess.run([sys.executable, "-c", BLOCKER, job], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "blocked for this test: py" in result.stderr
