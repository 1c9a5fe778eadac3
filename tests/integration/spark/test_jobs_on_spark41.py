"""The jobs' own tests again on Spark 4.1 with Iceberg 1.12, in a driver and on a Spark Connect server.

pyspark 4 cannot share a process with the pyspark 3.5 the suite imports, so a chosen subset of
this directory's tests runs in a pytest of its own whose pyspark is the 4.1 line's
(tests/spark_lines.py), with the 4.1 lake jars, once per route: in-process, in that run's one
Spark driver, as on 3.5 and as under spark-submit; and as a client of a Spark Connect server
(pyspark's ``SPARK_REMOTE``), as the operators run the jobs on a ``spark_connect`` connection.
The same test code, the same job code. ``make test``'s subset reaches every kind of write the
jobs make (summary keys from the session's snapshot properties, state from metadata tables,
schema and partition spec changes, branches and fast-forwards, tags, empty commits, conflicts)
and every stored procedure of the maintenance job; ``make test-long`` runs more of the
directory's tests the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_provider_postgres_cdc.testing.spark_connect import SparkConnectServer
from tests.spark_lines import ROOT, SPARK_41, SparkLine, spark_line_named

_SPARK = "tests/integration/spark"
# In ``make test``: a crash between tables and its re-run, merge-on-read delete files, a partition
# spec changed by a reload, every maintenance procedure, schema evolution and the history table.
SUBSET = (
    f"{_SPARK}/test_apply_batch.py::test_schema_evolution_adds_and_keeps_dropped_columns",
    f"{_SPARK}/test_apply_batch.py::test_crash_after_some_tables_committed_converges_on_rerun",
    f"{_SPARK}/test_apply_batch.py::test_a_small_merge_on_read_batch_adds_delete_files_without_rewriting_data",
    f"{_SPARK}/test_partitioned_apply.py::test_a_partitioned_table_takes_batches_reloads_a_new_spec_and_maintenance",
    f"{_SPARK}/test_history.py::test_a_load_switches_history_on_and_a_reload_behind_the_lake_takes_the_replayed_changes",
)
# In ``make test-long``: the random batches against the model, key changes, re-runs, a racing
# re-snapshot, overflowing values and the maintenance test's cuts and state.
LONG_SUBSET = (
    f"{_SPARK}/test_apply_batch.py::test_random_batch_matches_model",
    f"{_SPARK}/test_apply_batch.py::test_key_change_deletes_old_key_and_keeps_toast",
    f"{_SPARK}/test_apply_batch.py::test_rerun_of_an_applied_batch_has_no_effect",
    f"{_SPARK}/test_resnapshot_apply.py::test_racing_batch_and_resnapshot_load_both_land[batch]",
    f"{_SPARK}/test_value_overflow.py::test_overflowing_values_and_time_reach_the_lake_exactly",
    f"{_SPARK}/test_maintenance.py::test_maintenance_keeps_rows_cuts_and_state",
)
pytestmark = pytest.mark.spark


ROUTES = pytest.mark.parametrize("route", ["driver", "connect"])


@ROUTES
def test_the_jobs_tests_pass_on_spark_41(route: str) -> None:
    run_on_spark_41(SUBSET, route)


@pytest.mark.long
@ROUTES
def test_more_of_the_jobs_tests_pass_on_spark_41(route: str) -> None:
    run_on_spark_41(LONG_SUBSET, route)


def run_on_spark_41(subset: tuple[str, ...], route: str) -> None:
    """``subset`` in a pytest of its own on the 4.1 line, in its own driver or (``route`` "connect")
    as a client of a Spark Connect server; every one of its tests must pass."""
    line = spark_line_named(SPARK_41)
    if route == "connect":
        with SparkConnectServer(line.spark_home, jars=line.jars()) as server:
            _run_subset(subset, line, {"SPARK_REMOTE": server.url})
    else:
        _run_subset(subset, line, {})


def _run_subset(subset: tuple[str, ...], line: SparkLine, extra: dict[str, str]) -> None:
    # The test virtualenv's Python with the 4.1 line's pyspark (and py4j) ahead of its own 3.5;
    # Spark's Python workers inherit the path. The run is a session of its own, not an xdist worker.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    site_packages = str(line.spark_home.parent)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, (site_packages, env.get("PYTHONPATH")))),
        SPARK_HOME=str(line.spark_home),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        POSTGRES_CDC_SPARK_JARS=line.jars(),
        **extra,
    )
    probe = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__version__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.startswith("4.1."), probe.stdout
    command = [sys.executable, "-m", "pytest", *subset, "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert summary.startswith(f"{len(subset)} passed"), summary
