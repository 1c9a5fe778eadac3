"""The Airflow components a sandbox needs to run DAGs the way production does: scheduler and API server.

:class:`AirflowServices` starts them as subprocesses in an :class:`~.airflow_home.AirflowHome` (an
:class:`~.airflow_cli.AirflowSandbox`), drives backfills and re-runs of past runs through the CLI
and the REST API, and reports the runs as :class:`~.airflow_runs.DagRunRecord` values in a
:class:`~.airflow_runs.SchedulerResult`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing.airflow_home import AirflowHome
from airflow_provider_postgres_cdc.testing.airflow_runs import (
    FINISHED_RUN_STATES,
    DagRunRecord,
    SchedulerResult,
    parse_time,
)
from airflow_provider_postgres_cdc.testing.errors import AirflowApiError
from airflow_provider_postgres_cdc.testing.processes import free_port, terminate_process_groups

__all__ = ["AirflowServices"]


def _tail(path: Path, chars: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"
    return text[-chars:]


def _date_text(value: str | date) -> str:
    return value.isoformat() if isinstance(value, date) else value


def _quote_path_segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class AirflowServices:
    """A scheduler (LocalExecutor) and an API server for an ``AirflowSandbox``, as subprocesses.

    Airflow 3 runs no task without them: the scheduler starts queued runs and hands tasks to
    the LocalExecutor, whose task processes talk to the execution API of the API server. The
    DAG folder is serialized once by ``airflow dags reserialize`` at start, so no DAG processor
    runs (no DAG-level callbacks either); ``triggerer=True`` adds a triggerer for deferrable
    tasks. LocalExecutor works with the sandbox's SQLite database in 3.3.2.

    The scheduler runs with ``[scheduler] use_job_schedule = False`` unless ``job_schedule=True``:
    it starts queued runs (backfill, cleared and triggered runs) but creates no scheduled ones,
    Asset-triggered runs included, although the DAGs must be unpaused for their runs to start.
    With ``job_schedule=True`` it creates them too, for the unpaused DAGs; a DAG scheduled on an
    Asset with an ``AssetWatcher`` also needs ``triggerer=True`` and :meth:`watch`. The API server listens
    on a free loopback port, with the simple auth manager's all-admins mode so it can be polled
    without a token. Each component is its own process group, terminated (then killed) on
    ``stop()``, on leaving the ``with`` block and at interpreter exit; their output is kept in
    ``log_dir``.
    """

    STARTUP_TIMEOUT = 180.0
    STOP_GRACE = 15.0
    API_STOP_GRACE = 1.5

    def __init__(
        self,
        sandbox: AirflowHome,
        *,
        triggerer: bool = False,
        parallelism: int = 2,
        job_schedule: bool = False,
    ) -> None:
        self.sandbox = sandbox
        self.triggerer = triggerer
        self.parallelism = parallelism
        self.job_schedule = job_schedule
        self.port = 0
        self.log_dir: Path | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._jwt_secret = uuid.uuid4().hex + uuid.uuid4().hex

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return bool(self._processes)

    @property
    def pids(self) -> dict[str, int]:
        """Each component's process (and process group) id."""
        return {name: process.pid for name, process in self._processes.items()}

    def __enter__(self) -> AirflowServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The sandbox environment plus what the components need to find each other."""
        env = self.sandbox.environment()
        env.update(
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM=str(self.parallelism),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.api_url}/execution/",
            AIRFLOW__CORE__AUTH_MANAGER=(
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__API_AUTH__JWT_SECRET=self._jwt_secret,
            AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE=str(self.job_schedule),
        )
        return env

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command with the components' environment (output merged)."""
        return self.sandbox.airflow(*args, timeout=timeout, env=self.environment())

    def _check_cli(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise RuntimeError(f"{what} exited {result.returncode}:\n{result.stdout[-6000:]}")

    def start(self, attempts: int = 3) -> None:
        """Serialize the DAGs, then start the components and wait for the API (retrying the port)."""
        if self._processes:
            return
        self.sandbox.migrate()
        self.log_dir = Path(tempfile.mkdtemp(prefix="services-", dir=self.sandbox.home))
        atexit.register(self.stop)
        try:
            for attempt in range(1, attempts + 1):
                self.port = free_port()
                self._spawn("api-server", "api-server", "--apps", "all", "-H", "127.0.0.1",
                            "-p", str(self.port), "-w", "1", "-t", "10")  # fmt: skip
                self._spawn("scheduler", "scheduler", "--skip-serve-logs")
                if self.triggerer:
                    self._spawn("triggerer", "triggerer", "--skip-serve-logs")
                if attempt == 1:  # while the components start up; they need no DAG to do so
                    self.reserialize()
                try:
                    self._wait_for_api()
                    return
                except RuntimeError:
                    if self._processes["api-server"].poll() is None or attempt == attempts:
                        raise  # only a lost race for the port is worth another attempt
                    self.stop(forget=False)
        except BaseException:
            self.stop()
            raise

    def reserialize(self) -> None:
        """``airflow dags reserialize``: parse the DAG folder, write its DAGs and assets to the database."""
        self._check_cli(self.airflow("dags", "reserialize"), "airflow dags reserialize")

    def _spawn(self, name: str, *args: str) -> None:
        assert self.log_dir is not None
        airflow = str(Path(sys.executable).with_name("airflow"))
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self._processes[name] = subprocess.Popen(
                [airflow, *args], env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.sandbox.home,
            )  # fmt: skip

    def _wait_for_api(self) -> None:
        deadline = time.monotonic() + self.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError, AirflowApiError):
                health = self.api("GET", "/monitor/health")
                if isinstance(health, dict) and health.get("metadatabase", {}).get("status") == "healthy":
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the API server did not answer within {self.STARTUP_TIMEOUT}s\n{self.logs()}")

    def _check_alive(self) -> None:
        dead = {
            name: process.returncode
            for name, process in self._processes.items()
            if process.poll() is not None
        }
        if dead:
            raise RuntimeError(f"Airflow component(s) exited: {dead}\n{self.logs()}")

    def stop(self, forget: bool = True) -> None:
        """Terminate every component's process group, killing what is left after a grace period.

        The scheduler (and triggerer) go first: on SIGTERM the LocalExecutor lets running task
        processes finish, and those report to the API server. The API server goes last, with a
        short grace: uvicorn is done within a fraction of a second, after which the interpreter
        spends seconds in its final garbage collection, which is not worth waiting for.
        """
        processes, self._processes = self._processes, {}
        if forget:
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
        api = processes.pop("api-server", None)
        terminate_process_groups(list(processes.values()), self.STOP_GRACE)
        if api is not None:
            terminate_process_groups([api], self.API_STOP_GRACE)

    def logs(self, chars: int = 4000) -> str:
        """The tail of each component's output, for error messages."""
        if self.log_dir is None:
            return ""
        parts = [
            f"--- {path.name} (tail) ---\n{_tail(path, chars)}" for path in sorted(self.log_dir.glob("*.log"))
        ]
        return "\n".join(parts)

    def task_logs(self, dag_id: str, run_id: str, chars: int = 4000) -> str:
        """The tail of each task log of one run (the default ``$AIRFLOW_HOME/logs`` layout)."""
        run_dir = self.sandbox.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        parts = [
            f"--- {path.relative_to(run_dir)} (tail) ---\n{_tail(path, chars)}"
            for path in sorted(run_dir.glob("**/*.log"))
        ]
        return "\n".join(parts) or f"(no task logs under {run_dir})"

    # -- REST API ----------------------------------------------------------------------------

    def api(
        self,
        method: str,
        path: str,
        body: Mapping[str, object] | None = None,
        query: Mapping[str, str | int] | None = None,
    ) -> Any:
        """Call ``/api/v2<path>`` of the sandbox's API server and return the decoded JSON."""
        url = f"{self.api_url}/api/v2{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise AirflowApiError(exc.code, f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        return json.loads(payload) if payload else None

    def set_paused(self, dag_id: str, paused: bool) -> None:
        """Pause or unpause a DAG; the scheduler starts no run, backfill or not, of a paused DAG."""
        try:
            self.api("PATCH", f"/dags/{_quote_path_segment(dag_id)}", {"is_paused": paused})
        except AirflowApiError as exc:
            if exc.status != 404:
                raise
            errors = self.airflow("dags", "list-import-errors").stdout[-4000:]
            raise RuntimeError(f"DAG {dag_id!r} is not in the sandbox's DAG folder:\n{errors}") from exc

    def watch(self, *dag_ids: str) -> None:
        """Unpause asset-scheduled DAGs and serialize the DAG folder again, so their watchers run.

        Airflow registers an asset's ``AssetWatcher`` triggers when it writes the DAGs, and only for
        assets that an unpaused DAG is scheduled on; a DAG processor would do so on its next
        parse, here :meth:`reserialize` does at once. The triggerer picks the new trigger rows up
        within about a second. Runs from the watchers' events need ``triggerer=True`` and
        ``job_schedule=True``.
        """
        for dag_id in dag_ids:
            self.set_paused(dag_id, False)
        self.reserialize()

    def dag_runs(self, dag_id: str, **filters: str | int) -> list[DagRunRecord]:
        """The DAG's runs matching the REST API's list filters, in logical-date order (all pages)."""
        runs: list[DagRunRecord] = []
        while True:
            query: dict[str, str | int] = {"order_by": "logical_date", "limit": 100, "offset": len(runs)}
            page = self.api("GET", f"/dags/{_quote_path_segment(dag_id)}/dagRuns", query={**filters, **query})
            runs += [DagRunRecord.from_api(item) for item in page["dag_runs"]]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def dag_run(self, dag_id: str, run_id: str) -> DagRunRecord:
        return DagRunRecord.from_api(
            self.api("GET", f"/dags/{_quote_path_segment(dag_id)}/dagRuns/{_quote_path_segment(run_id)}")
        )

    # -- runs --------------------------------------------------------------------------------

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
        """``airflow backfill create`` over ``[from_date, to_date]``, waiting for all its runs to finish.

        The DAG is unpaused first (queued runs of a paused DAG never start). Backfill runs obey
        the backfill's ``--max-active-runs``, not the DAG's ``max_active_runs``; the CLI's
        default is 10, which starts every run at once, so the default here is 1: the runs go
        strictly one after another in logical-date order. ``conf`` becomes every run's conf
        (``--dag-run-conf``, validated against the DAG's params). ``reprocess_behavior``
        (``none``/``failed``/``completed``) decides whether existing runs for a date are
        cleared and re-run as part of the backfill (they keep their run_id) or skipped.

        Returns the runs this backfill created or cleared, once all of them have finished;
        raises with the components' logs on a CLI error, a dead component or the timeout.
        """
        started = time.monotonic()
        self.set_paused(dag_id, False)
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", _date_text(from_date),
                "--to-date", _date_text(to_date), "--max-active-runs", str(max_active_runs)]  # fmt: skip
        if conf is not None:
            args += ["--dag-run-conf", json.dumps(conf)]
        if reprocess_behavior is not None:
            args += ["--reprocess-behavior", reprocess_behavior]
        self._check_cli(self.airflow(*args), f"airflow {' '.join(args)}")
        backfill = self.api("GET", "/backfills", query={"dag_id": dag_id, "order_by": "-id", "limit": 1})
        latest = backfill["backfills"][0]
        created = parse_time(latest["created_at"])
        assert created is not None

        def mine() -> list[DagRunRecord]:
            # Runs the backfill created or cleared were queued after it was created; runs it
            # skipped for a date (already there, in flight) were not.
            runs = self.dag_runs(
                dag_id,
                run_type="backfill",
                logical_date_gte=latest["from_date"],
                logical_date_lte=latest["to_date"],
            )
            return [run for run in runs if run.queued_at is not None and run.queued_at >= created]

        runs = self._wait(dag_id, mine, started + timeout)
        return self._result(dag_id, runs, started)

    def rerun(self, dag_id: str, run: str | datetime, *, timeout: float = 600) -> SchedulerResult:
        """Clear one past run (by run_id or logical date) and wait until the scheduler ran it again.

        Clearing is the only way Airflow 3 re-runs an existing run: it resets the run's task
        instances and queues the run, which keeps its run_id, run type and conf, and a scheduler
        then runs it. ``airflow dags test`` cannot do this (it replaces the run, see
        :meth:`AirflowSandbox.dags_test_at`). The clear goes through the REST API's
        ``POST .../dagRuns/{run_id}/clear``, exact by run_id and seconds faster than the
        equivalent ``airflow tasks clear <dag> -s <date> -e <date> -y`` in a new process.
        """
        started = time.monotonic()
        record = self._find_run(dag_id, run)
        self.set_paused(dag_id, False)
        path = f"/dags/{_quote_path_segment(dag_id)}/dagRuns/{_quote_path_segment(record.run_id)}"
        before = datetime.now(UTC)
        self.api("POST", f"{path}/clear", {"dry_run": False})

        def cleared() -> list[DagRunRecord]:
            again = self.dag_run(dag_id, record.run_id)
            if again.queued_at is None or again.queued_at < before:
                raise RuntimeError(f"clearing did not queue {record.run_id} again: {again}")
            return [again]

        runs = self._wait(dag_id, cleared, started + timeout)
        return self._result(dag_id, runs, started)

    def trigger(
        self, dag_id: str, conf: Mapping[str, object] | None = None, *, timeout: float = 600
    ) -> SchedulerResult:
        """Trigger a run now (as the UI's trigger button does) and wait until it finished."""
        started = time.monotonic()
        self.set_paused(dag_id, False)
        created = self.api(
            "POST",
            f"/dags/{_quote_path_segment(dag_id)}/dagRuns",
            {"logical_date": None, "conf": dict(conf or {})},
        )
        run_id = str(created["dag_run_id"])
        runs = self._wait(dag_id, lambda: [self.dag_run(dag_id, run_id)], started + timeout)
        return self._result(dag_id, runs, started)

    def wait_for_runs(self, dag_id: str, count: int = 1, *, timeout: float = 600) -> SchedulerResult:
        """Wait until the scheduler created ``count`` runs of a DAG by itself and all have finished
        (runs by schedule or by Asset events: the DAG must be unpaused first)."""
        started = time.monotonic()

        def created() -> list[DagRunRecord]:
            runs = self.dag_runs(dag_id)
            if len(runs) < count:
                return [DagRunRecord(dag_id, "(not yet created)", None, "none", "", None, None, None, {})]
            return runs

        runs = self._wait(dag_id, created, started + timeout)
        return self._result(dag_id, runs, started)

    def asset_events(self, **filters: str | int) -> list[dict[str, Any]]:
        """Asset events as the REST API lists them (``source_dag_id=``, ``asset_id=``, ...), oldest first."""
        events: list[dict[str, Any]] = []
        while True:
            query: dict[str, str | int] = {"order_by": "timestamp", "limit": 100, "offset": len(events)}
            page = self.api("GET", "/assets/events", query={**filters, **query})
            events += page["asset_events"]
            if not page["asset_events"] or len(events) >= page["total_entries"]:
                return events

    def _find_run(self, dag_id: str, run: str | datetime) -> DagRunRecord:
        if isinstance(run, str):
            try:
                return self.dag_run(dag_id, run)
            except AirflowApiError as exc:
                if exc.status != 404:
                    raise
                try:
                    run = datetime.fromisoformat(run)
                except ValueError:
                    raise LookupError(f"{dag_id} has no run {run!r}") from exc
        if run.tzinfo is None:
            run = run.replace(tzinfo=UTC)
        stamp = run.isoformat()
        found = self.dag_runs(dag_id, logical_date_gte=stamp, logical_date_lte=stamp)
        if not found:
            raise LookupError(f"{dag_id} has no run with logical date {stamp}")
        return found[0]

    def _wait(
        self, dag_id: str, poll: Callable[[], list[DagRunRecord]], deadline: float
    ) -> list[DagRunRecord]:
        """Poll until every run ``poll`` returns has finished; raise on a dead component or timeout."""
        runs: list[DagRunRecord] = []
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                runs = poll()
                last_error = None
            except (OSError, AirflowApiError) as exc:  # e.g. SQLite busy under the scheduler
                last_error = exc
            if last_error is None and all(run.state in FINISHED_RUN_STATES for run in runs):
                return runs
            time.sleep(0.5)
        states = ", ".join(f"{run.run_id}: {run.state}" for run in runs) or "no runs"
        raise TimeoutError(
            f"runs of {dag_id} not finished in time ({states}; last error: {last_error})\n{self.logs()}"
        )

    def _result(self, dag_id: str, runs: list[DagRunRecord], started: float) -> SchedulerResult:
        failed = [self.task_logs(dag_id, run.run_id) for run in runs if run.state != "success"]
        logs = "\n".join([*failed, self.logs()]) if failed else ""
        return SchedulerResult(dag_id, tuple(runs), time.monotonic() - started, logs)
