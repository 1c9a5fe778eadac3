"""A private ``AIRFLOW_HOME`` in which the ``airflow`` CLI runs real DAGs: ``airflow dags test`` and friends.

:class:`AirflowSandbox` needs no running Airflow: ``airflow dags test`` runs a DAG in one process
against a SQLite metadata database. When a test needs the scheduler (backfills, re-runs of a
past run), :meth:`AirflowSandbox.services` starts it (see :mod:`.airflow_services`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing.airflow_services import AirflowServices, SchedulerResult
from airflow_provider_postgres_cdc.testing.processes import run_merged_output

__all__ = ["AirflowSandbox", "DagRunResult"]


@dataclass(frozen=True, slots=True)
class DagRunResult:
    """What ``airflow dags test`` printed and how it exited."""

    dag_id: str
    returncode: int
    output: str
    seconds: float

    def check(self) -> DagRunResult:
        """Raise with the output's tail when the run failed."""
        if self.returncode != 0:
            raise RuntimeError(
                f"airflow dags test {self.dag_id} exited {self.returncode}:\n{self.output[-6000:]}"
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


class AirflowSandbox:
    """A private ``AIRFLOW_HOME`` (SQLite metadata DB, chosen DAG folder) for real ``airflow dags test`` runs.

    Connections are given as ``AIRFLOW_CONN_<ID>`` URIs in ``connections``; nothing of the
    caller's Airflow configuration leaks in. The metadata DB is migrated on first use.

    :param home: directory for ``AIRFLOW_HOME`` (created).
    :param dags_folder: the DAG files to load (e.g. the package's ``dags_examples``).
    """

    def __init__(
        self,
        home: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str],
        connections: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = Path(home)
        self.dags_folder = Path(dags_folder)
        self.connections = dict(connections or {})
        self.extra_env = dict(env or {})
        self._migrated = False

    def environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")  # airflow and spark-submit of this venv
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        env.update({f"AIRFLOW_CONN_{conn_id.upper()}": uri for conn_id, uri in self.connections.items()})
        env.update(self.extra_env)
        return env

    def airflow(
        self,
        *args: str,
        timeout: float = 900,
        env: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command in the sandbox (stdout and stderr merged).

        ``env`` replaces the sandbox environment (``AirflowServices`` adds its components' settings);
        ``on_line`` sees each output line as it is printed (see :func:`.processes.run_merged_output`).
        """
        airflow = str(Path(sys.executable).with_name("airflow"))
        environment = dict(env) if env is not None else self.environment()
        return run_merged_output([airflow, *args], env=environment, timeout=timeout, on_line=on_line)

    def migrate(self) -> None:
        if self._migrated:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        result = self.airflow("db", "migrate")
        if result.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-4000:]}")
        self._migrated = True

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
