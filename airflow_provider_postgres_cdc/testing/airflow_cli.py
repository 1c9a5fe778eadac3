"""A private ``AIRFLOW_HOME`` in which the ``airflow`` CLI runs real DAGs: ``airflow dags test`` and friends.

:class:`AirflowSandbox` needs no running Airflow: ``airflow dags test`` runs a DAG in one process
against a SQLite metadata database. When a test needs the scheduler (backfills, re-runs of a
past run), :meth:`AirflowSandbox.services` starts it (see :mod:`.airflow_services`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing.airflow_home import AirflowHome
from airflow_provider_postgres_cdc.testing.airflow_runs import SchedulerResult
from airflow_provider_postgres_cdc.testing.airflow_services import AirflowServices
from airflow_provider_postgres_cdc.testing.processes import terminate_process_groups

__all__ = ["AirflowSandbox", "AssetEventRecord", "DagRunResult"]


_ERROR_LINE = re.compile(r"error:|Caused by:|Exception:|Error:")


@dataclass(frozen=True, slots=True)
class DagRunResult:
    """What ``airflow dags test`` printed and how it exited."""

    dag_id: str
    returncode: int
    output: str
    seconds: float

    def check(self) -> DagRunResult:
        """Raise with the output's tail when the run failed, after the lines of the output that name an
        error (a Spark job's own message is logged long before the task's traceback)."""
        if self.returncode != 0:
            errors = [line for line in self.output.splitlines() if _ERROR_LINE.search(line)]
            raise RuntimeError(
                f"airflow dags test {self.dag_id} exited {self.returncode}:\n"
                + "\n".join(errors[:40])[:6000]
                + f"\n...\n{self.output[-6000:]}"
            )
        return self


@dataclass(frozen=True)
class AssetEventRecord:
    """One Asset event as the metadata database holds it."""

    uri: str
    extra: dict[str, Any]
    timestamp: datetime
    source_dag_id: str | None
    source_task_id: str | None


class AirflowSandbox(AirflowHome):
    """A private ``AIRFLOW_HOME`` for real ``airflow dags test`` runs (see :class:`.AirflowHome` for
    its parameters), and the scheduler and API server for the runs that need them."""

    def asset_events(self) -> list[AssetEventRecord]:
        """Every Asset event in the sandbox's metadata database (SQLite, ``airflow.db`` of its home),
        oldest first: what ``airflow dags test`` runs emitted, with no API server running."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT a.uri, e.extra, e.timestamp, e.source_dag_id, e.source_task_id "
                "FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
            ).fetchall()
        return [
            AssetEventRecord(
                str(uri),
                json.loads(extra or "{}"),
                datetime.fromisoformat(str(stamp)).replace(tzinfo=UTC),
                dag,
                task,
            )
            for uri, extra, stamp, dag, task in rows
        ]

    def task_seconds(self, task_id: str) -> float:
        """How long the newest run of the task ``task_id`` (a task group's prefix aside) took, from
        the sandbox's metadata database."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            row = db.execute(
                "SELECT (julianday(end_date) - julianday(start_date)) * 86400 FROM task_instance "
                "WHERE task_id = ? OR task_id LIKE ? ORDER BY start_date DESC LIMIT 1",
                (task_id, f"%.{task_id}"),
            ).fetchone()
        if row is None or row[0] is None:
            raise LookupError(f"no finished run of task {task_id!r} in {self.home}")
        return float(row[0])

    def dags_test(
        self,
        dag_id: str,
        conf: Mapping[str, object] | None = None,
        *,
        timeout: float = 900,
        on_line: Callable[[str], None] | None = None,
    ) -> DagRunResult:
        """``airflow dags test <dag_id> --conf <json>``; check ``returncode`` or call ``.check()``.

        ``on_line`` sees each line of the run's output as it is printed, so a test can act while
        the DAG runs (for example write to the source once a sensor has deferred).
        """
        self.migrate()
        args = ["dags", "test", dag_id]
        if conf:
            args += ["--conf", json.dumps(conf)]
        started = time.monotonic()
        result = self.airflow(*args, timeout=timeout, on_line=on_line)
        return DagRunResult(dag_id, result.returncode, result.stdout, time.monotonic() - started)

    def dags_test_killed(
        self,
        dag_id: str,
        conf: Mapping[str, object] | None,
        when: Callable[[], bool],
        *,
        timeout: float = 600,
    ) -> DagRunResult | None:
        """``airflow dags test`` SIGKILLed, with its process group (its tasks, their spark-submit),
        as soon as ``when()`` is true (polled every 0.1 s): a worker machine lost mid-run.

        Returns None once killed, or the run's result when it ended first.
        """
        self.migrate()
        airflow = str(Path(sys.executable).with_name("airflow"))
        args = [airflow, "dags", "test", dag_id, *(["--conf", json.dumps(conf)] if conf else [])]
        started = time.monotonic()
        with tempfile.TemporaryFile() as output:
            process = subprocess.Popen(
                args, env=self.environment(), stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                while process.poll() is None and time.monotonic() - started < timeout:
                    if when():
                        os.killpg(process.pid, signal.SIGKILL)  # no SIGTERM: nothing gets to clean up
                        process.wait()
                        return None
                    time.sleep(0.1)
            finally:
                if process.poll() is None:
                    terminate_process_groups([process], grace=0)
            output.seek(0)
            text = output.read().decode("utf-8", "replace")
        return DagRunResult(dag_id, process.returncode, text, time.monotonic() - started)

    def dags_test_at(
        self,
        dag_id: str,
        logical_date: str | datetime,
        conf: Mapping[str, object] | None = None,
        *,
        timeout: float = 900,
    ) -> DagRunResult:
        """``airflow dags test <dag_id> <logical_date>``: run the DAG again for a past date, no scheduler.

        This is not a re-run of the existing run: in Airflow 3 ``dags test`` deletes whatever run
        has that logical date (its task instances and history with it) and creates a new
        ``manual__<now>`` run, with only ``conf`` as its configuration. Use it when a test needs
        "the DAG ran again for that interval" cheaply; use :meth:`rerun` when the run itself (its
        run_id, run type and conf) must be cleared and run again.
        """
        self.migrate()
        when = logical_date.isoformat() if isinstance(logical_date, datetime) else logical_date
        args = ["dags", "test", dag_id, when]
        if conf:
            args += ["--conf", json.dumps(conf)]
        started = time.monotonic()
        result = self.airflow(*args, timeout=timeout)
        return DagRunResult(dag_id, result.returncode, result.stdout, time.monotonic() - started)

    def services(
        self, *, triggerer: bool = False, parallelism: int = 2, job_schedule: bool = False
    ) -> AirflowServices:
        """The scheduler and API server for this home, not yet started; use it as a context manager.

        Starting them once and calling :meth:`AirflowServices.backfill` and
        :meth:`AirflowServices.rerun` on the same instance saves their start-up (several
        seconds each) when a test needs both. ``job_schedule=True`` lets the scheduler create
        runs by schedule: Asset-triggered ones among them.
        """
        return AirflowServices(self, triggerer=triggerer, parallelism=parallelism, job_schedule=job_schedule)

    def backfill(
        self,
        dag_id: str,
        from_date: str | date,
        to_date: str | date,
        *,
        conf: Mapping[str, object] | None = None,
        max_active_runs: int = 1,
        reprocess_behavior: str | None = None,
        timeout: float = 600,
    ) -> SchedulerResult:
        """``airflow backfill create`` with a scheduler running it; see :meth:`AirflowServices.backfill`."""
        with self.services() as services:
            return services.backfill(
                dag_id,
                from_date,
                to_date,
                conf=conf,
                max_active_runs=max_active_runs,
                reprocess_behavior=reprocess_behavior,
                timeout=timeout,
            )

    def rerun(self, dag_id: str, run: str | datetime, *, timeout: float = 600) -> SchedulerResult:
        """Clear a past run and let a scheduler run it again; see :meth:`AirflowServices.rerun`."""
        with self.services() as services:
            return services.rerun(dag_id, run, timeout=timeout)
