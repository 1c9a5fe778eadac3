"""Jobs on the standalone cluster run on executor JVMs of their own and import what spark-submit ships.

Part of ``make test``: one small job (about 25 s) guards the premise of every cluster test, that
nothing a job needs reaches its executors through the driver's process or files by accident.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.spark import job_py_files
from airflow_provider_postgres_cdc.testing import SparkStandaloneCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]
PROBE = str(Path(__file__).with_name("pid_probe.py"))


def test_tasks_run_in_executor_processes_with_shipped_modules(spark_cluster: SparkStandaloneCluster) -> None:
    seen: dict[int, int] = {}  # executor pid -> worker index, polled while the job runs
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for worker, pids in spark_cluster.executor_pids().items():
                seen.update(dict.fromkeys(pids, worker))
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with tempfile.TemporaryDirectory() as scratch:
        shipped = job_py_files(scratch)
        result = subprocess.run(
            [str(Path(sys.executable).with_name("spark-submit")), "--master", spark_cluster.master_url,
             "--deploy-mode", "client", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.executor.memory=512m",
             "--py-files", shipped, PROBE],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    done.set()
    watcher.join()
    assert result.returncode == 0, result.stderr[-3000:] + spark_cluster.logs()
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for task in report["tasks"]:
        assert task["pid"] != report["driver"] and report["driver"] not in task["ancestors"]
        executors = [pid for pid in task["ancestors"] if pid in seen]
        assert len(executors) == 1, (task, seen)  # a Python worker forked by one executor JVM
        # The package came from the zip given to --py-files, not from the worktree the driver sees.
        assert "postgres_cdc_job.zip" in task["module"], task["module"]
    assert set(seen.values()) <= set(range(spark_cluster.workers)) and seen
