"""DAG files parse fast and light: no pyarrow, numpy or pyiceberg (the engine loads in ``execute``).

The DAG processor imports every DAG file again and again; an operator module that pulled in the
engine would cost each parse hundreds of milliseconds and the memory of Arrow. A fresh interpreter
imports Airflow and the Spark provider (the package's Spark operators subclass it), parses every
example DAG file with Airflow's own DagBag, timing each (the first pays for importing this
package), then imports every Airflow face (operators, hooks, sensors, triggers, plugins, task groups,
factories, Asset handlers, metrics, the command's entry point), and reports which heavy modules
were loaded.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

PACKAGE = "airflow_provider_postgres_cdc"
FACE_PACKAGES = ("operators", "hooks", "sensors", "triggers", "plugins")
FACE_MODULES = ("task_groups", "dag_factories", "assets", "metrics", "get_provider_info", "cli")
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "dags_examples").glob("*.py"))
HEAVY = ("pyarrow", "numpy", "pyiceberg")
BUDGET_SECONDS = 0.3

PROBE = """
import importlib, json, sys, time
import airflow.sdk
import airflow.providers.apache.spark.operators.spark_submit
from airflow.dag_processing.dagbag import DagBag

modules, files = json.loads(sys.argv[1])
seconds, dags, errors = {}, {}, {}
for path in files:
    # The parse's own CPU time: on a shared 2-core machine, wall time also counts other processes.
    start = time.process_time()
    bag = DagBag(dag_folder=path)
    seconds[path] = time.process_time() - start
    dags[path], errors[path] = sorted(bag.dags), bag.import_errors
for module in modules:
    importlib.import_module(module)
heavy = [name for name in sys.argv[2:] if name in sys.modules]
print(json.dumps({"seconds": seconds, "dags": dags, "errors": errors, "heavy": heavy}))
"""


def faces() -> list[str]:
    """Every module a DAG file or Airflow's plugin and provider discovery imports."""
    packages = [importlib.import_module(f"{PACKAGE}.{name}") for name in FACE_PACKAGES]
    in_packages = [
        info.name
        for package in packages
        for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")
    ]
    return [*in_packages, *(f"{PACKAGE}.{name}" for name in FACE_MODULES)]


def probe(modules: list[str], files: list[Path]) -> dict[str, dict[str, object] | list[str]]:
    argument = json.dumps([modules, [str(path) for path in files]])
    result = subprocess.run(
        [sys.executable, "-c", PROBE, argument, *HEAVY], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, dict[str, object] | list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_faces_and_example_dags_load_no_heavy_module_and_parse_within_budget() -> None:
    modules = faces()
    assert f"{PACKAGE}.operators.snapshot" in modules and f"{PACKAGE}.hooks.postgres" in modules
    assert len(EXAMPLES) >= 6
    report = probe(modules, EXAMPLES)
    assert report["heavy"] == []
    assert all(errors == {} for errors in report["errors"].values()), report["errors"]  # type: ignore[union-attr]
    assert all(dags for dags in report["dags"].values()), report["dags"]  # type: ignore[union-attr]
    slow = {path: s for path, s in report["seconds"].items() if s > BUDGET_SECONDS}  # type: ignore[union-attr]
    assert slow == {}, f"parsed in more than {BUDGET_SECONDS} s: {slow}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: the engine's drain module loads pyarrow."""
    report = probe(["airflow_provider_postgres_cdc.engine.drain"], [])
    assert "pyarrow" in report["heavy"]
