"""A throwaway PostgreSQL cluster for tests of CDC pipelines, ours and our users'.

``PostgresCluster`` runs ``initdb`` and ``pg_ctl`` from the local server binaries into a
private temporary directory, with ``wal_level=logical`` and room for slots and senders,
listening on a free loopback port with a socket directory it owns. When the caller is
root it runs the server as the ``postgres`` OS user, because ``initdb`` refuses root.
Everything is removed on ``stop()``, on leaving the ``with`` block, and at interpreter
exit, so a failing test leaves nothing behind.

Example::

    with PostgresCluster() as pg:
        dsn = pg.create_database("shop")
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2 import sql

__all__ = [
    "AirflowApiError",
    "AirflowSandbox",
    "AirflowServices",
    "DagRunRecord",
    "DagRunResult",
    "PostgresCluster",
    "PostgresNotFoundError",
    "SchedulerResult",
    "find_postgres_bindir",
]

DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "listen_addresses": "'127.0.0.1'",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


class PostgresNotFoundError(RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``) were found."""


def find_postgres_bindir() -> Path:
    """Locate the server binaries: ``pg_config --bindir``, then ``PATH``, then Debian's layout.

    Debian puts ``initdb`` under ``/usr/lib/postgresql/<major>/bin`` and off ``PATH``,
    while ``pg_config`` may belong to a client-only package; each candidate must hold
    all three programs to count.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                [pg_config, "--bindir"], check=True, capture_output=True, text=True
            ).stdout.strip()
            candidates.append(Path(out))
    for name in ("initdb", "pg_ctl", "postgres"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(os.path.realpath(found)).parent)
    versioned = glob.glob("/usr/lib/postgresql/*/bin")
    versioned.sort(key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    candidates.extend(Path(p) for p in reversed(versioned))
    for bindir in candidates:
        if all((bindir / prog).is_file() for prog in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise PostgresNotFoundError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found via pg_config, PATH "
        "or /usr/lib/postgresql/*/bin. Install them, e.g. 'apt-get install postgresql-15', "
        "or pass bindir= to PostgresCluster."
    )


def free_port() -> int:
    """Ask the kernel for a currently free loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """A private PostgreSQL server that lives as long as this object is started.

    :param settings: ``postgresql.conf`` overrides on top of ``DEFAULT_SETTINGS``
        (values as they would be written in the file, e.g. ``"'replica'"`` or ``"10MB"``).
    :param bindir: directory holding ``initdb``/``pg_ctl``/``postgres``; found when omitted.
    :param superuser: name of the bootstrap superuser.
    """

    def __init__(
        self,
        settings: Mapping[str, str] | None = None,
        *,
        bindir: str | os.PathLike[str] | None = None,
        superuser: str = "postgres",
    ) -> None:
        self.bindir = Path(bindir) if bindir else find_postgres_bindir()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.superuser = superuser
        self.host = "127.0.0.1"
        self.port = 0
        self._root: Path | None = None
        self._run_as: str | None = "postgres" if os.geteuid() == 0 else None

    @property
    def datadir(self) -> Path:
        if self._root is None:
            raise RuntimeError("cluster not started")
        return self._root / "data"

    @property
    def running(self) -> bool:
        return self._root is not None

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a server program, as the ``postgres`` OS user when we are root."""
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        env.pop("PGDATA", None)
        try:
            return subprocess.run(
                args,
                check=True,
                capture_output=True,
                text=True,
                user=self._run_as,
                env=env,
                cwd="/",
                **kwargs,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(
                f"{Path(args[0]).name} failed (exit {exc.returncode}): {exc.stderr or exc.stdout}"
            ) from exc

    def start(self, attempts: int = 3) -> None:
        """initdb a fresh cluster and start it on a free port (retrying if the port is taken)."""
        if self._root is not None:
            return
        root = Path(tempfile.mkdtemp(prefix="pglogical-pg-"))
        self._root = root
        atexit.register(self.stop)
        if self._run_as:
            pw = pwd.getpwnam(self._run_as)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o700)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                self.superuser,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ]
        )
        (root / "sock").mkdir()
        if self._run_as:
            pw = pwd.getpwnam(self._run_as)
            os.chown(root / "sock", pw.pw_uid, pw.pw_gid)
        with open(self.datadir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        last_error: Exception | None = None
        for _ in range(attempts):
            self.port = free_port()
            self._write_config()
            try:
                self._run(
                    [
                        str(self.bindir / "pg_ctl"),
                        "-D",
                        str(self.datadir),
                        "-l",
                        str(root / "server.log"),
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                )
                return
            except RuntimeError as exc:
                last_error = exc
        log = (root / "server.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"could not start PostgreSQL: {last_error}\nserver log tail:\n{log}")

    def _write_config(self) -> None:
        lines = [f"{key} = {value}" for key, value in self.settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self._root}/sock'"]
        (self.datadir / "postgresql.auto.conf").write_text("\n".join(lines) + "\n")

    def restart(self, mode: str = "fast") -> None:
        """Restart the server, e.g. after ``ALTER SYSTEM`` of a setting that needs it.

        ``mode`` is pg_ctl's shutdown mode: ``"fast"`` ends sessions cleanly, ``"immediate"`` is a
        crash (every process killed, recovery on start). The new server logs to the same file as
        the first: left on pg_ctl's captured output, it would hold that pipe open and this call
        would never return.
        """
        if self._root is None:
            raise RuntimeError("cluster not started")
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self._root / "server.log"),
                "-w",
                "-t",
                "60",
                "restart",
                "-m",
                mode,
            ]
        )

    def stop(self) -> None:
        """Stop the server immediately and delete its files; safe to call twice."""
        root, self._root = self._root, None
        if root is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if (root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self._run(
                    [str(self.bindir / "pg_ctl"), "-D", str(root / "data"), "-w", "stop", "-m", "immediate"]
                )
        shutil.rmtree(root, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", user: str | None = None, **options: str) -> str:
        """A libpq key/value DSN for a database of this cluster (over TCP, trust auth)."""
        parts = {"host": self.host, "port": str(self.port), "dbname": dbname, "user": user or self.superuser}
        parts.update(options)
        return " ".join(f"{key}={_dsn_quote(value)}" for key, value in parts.items())

    def uri(self, dbname: str = "postgres", user: str | None = None) -> str:
        """A ``postgresql://`` URI, the form Airflow connections take."""
        return f"postgresql://{user or self.superuser}@{self.host}:{self.port}/{dbname}"

    @contextlib.contextmanager
    def connect(self, dbname: str = "postgres", autocommit: bool = True) -> Iterator[Any]:
        """A short-lived psycopg2 connection, closed on exit."""
        conn = psycopg2.connect(self.dsn(dbname))
        conn.autocommit = autocommit
        try:
            yield conn
        finally:
            conn.close()

    def execute(self, statement: str | sql.Composable, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode and return its rows (empty when it has none)."""
        with self.connect(dbname) as conn, conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database (a unique name when omitted) and return its DSN."""
        name = name or f"db_{uuid.uuid4().hex[:12]}"
        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, first dropping the replication slots that pin it.

        A walsender exits a moment after its client closed the connection, and its slot (a
        temporary one too) stays active until then: wait for that before dropping anything.
        """
        with contextlib.suppress(TimeoutError):
            self.wait_for(
                sql.SQL(
                    "SELECT NOT EXISTS (SELECT FROM pg_replication_slots WHERE database = {} AND active)"
                ).format(sql.Literal(name)),
                timeout=10.0,
            )
        self.execute(
            sql.SQL(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = {} AND NOT active"
            ).format(sql.Literal(name))
        )
        self.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def wait_for(self, query: str | sql.Composable, dbname: str = "postgres", timeout: float = 30.0) -> None:
        """Poll ``query`` until its first column is true (e.g. a slot becoming inactive)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.execute(query, dbname)
            if rows and rows[0][0]:
                return
            time.sleep(0.1)
        raise TimeoutError(f"condition not met within {timeout}s: {query}")

    def server_log(self) -> str:
        """The server's log so far, for diagnosing a failed test."""
        if self._root is None:
            return ""
        path = self._root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _dsn_quote(value: str) -> str:
    if value and all(ch not in value for ch in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
        self, *args: str, timeout: float = 900, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command in the sandbox (stdout and stderr merged).

        ``env`` replaces the sandbox environment (``AirflowServices`` adds its components' settings).
        """
        airflow = str(Path(sys.executable).with_name("airflow"))
        environment = dict(env) if env is not None else self.environment()
        return subprocess.run(
            [airflow, *args], env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=timeout,
        )  # fmt: skip

    def migrate(self) -> None:
        if self._migrated:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        result = self.airflow("db", "migrate")
        if result.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-4000:]}")
        self._migrated = True

    def dags_test(
        self, dag_id: str, conf: Mapping[str, object] | None = None, *, timeout: float = 900
    ) -> DagRunResult:
        """``airflow dags test <dag_id> --conf <json>``; check ``returncode`` or call ``.check()``."""
        self.migrate()
        args = ["dags", "test", dag_id]
        if conf:
            args += ["--conf", json.dumps(conf)]
        started = time.monotonic()
        result = self.airflow(*args, timeout=timeout)
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

    def services(self, *, triggerer: bool = False, parallelism: int = 2) -> AirflowServices:
        """The scheduler and API server for this home, not yet started; use it as a context manager.

        Starting them once and calling :meth:`AirflowServices.backfill` and
        :meth:`AirflowServices.rerun` on the same instance saves their start-up (several
        seconds each) when a test needs both.
        """
        return AirflowServices(self, triggerer=triggerer, parallelism=parallelism)

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


FINISHED_RUN_STATES = frozenset({"success", "failed"})


def _parse_time(value: object) -> datetime | None:
    """An API timestamp (``...Z`` or ``+00:00``) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _iso(value: str | date) -> str:
    return value.isoformat() if isinstance(value, date) else value


def _tail(path: Path, chars: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"
    return text[-chars:]


@dataclass(frozen=True, slots=True)
class DagRunRecord:
    """One DAG run as the REST API reports it."""

    dag_id: str
    run_id: str
    logical_date: datetime | None
    state: str
    run_type: str
    queued_at: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    conf: dict[str, Any]

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> DagRunRecord:
        return cls(
            dag_id=str(data["dag_id"]),
            run_id=str(data["dag_run_id"]),
            logical_date=_parse_time(data.get("logical_date")),
            state=str(data["state"]),
            run_type=str(data["run_type"]),
            queued_at=_parse_time(data.get("queued_at")),
            start_date=_parse_time(data.get("start_date")),
            end_date=_parse_time(data.get("end_date")),
            conf=dict(data.get("conf") or {}),
        )


@dataclass(frozen=True, slots=True)
class SchedulerResult:
    """The runs a scheduler finished for :meth:`AirflowServices.backfill` or ``rerun``.

    ``runs`` are in logical-date order; ``logs`` holds the tails of the components' logs and of
    the task logs of every run that did not succeed, so a failing test shows why.
    """

    dag_id: str
    runs: tuple[DagRunRecord, ...]
    seconds: float
    logs: str

    def check(self) -> SchedulerResult:
        """Raise with the logs when a run did not succeed."""
        bad = [f"{run.run_id}: {run.state}" for run in self.runs if run.state != "success"]
        if bad:
            raise RuntimeError(f"runs of {self.dag_id} did not succeed: {', '.join(bad)}\n{self.logs}")
        return self


class AirflowApiError(RuntimeError):
    """The sandbox's REST API answered with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AirflowServices:
    """A scheduler (LocalExecutor) and an API server for an ``AirflowSandbox``, as subprocesses.

    Airflow 3 runs no task without them: the scheduler starts queued runs and hands tasks to
    the LocalExecutor, whose task processes talk to the execution API of the API server. The
    DAG folder is serialized once by ``airflow dags reserialize`` at start, so no DAG processor
    runs (no DAG-level callbacks either); ``triggerer=True`` adds a triggerer for deferrable
    tasks. LocalExecutor works with the sandbox's SQLite database in 3.3.2.

    The scheduler runs with ``[scheduler] use_job_schedule = False``: it starts queued runs
    (backfill and cleared runs) but creates no scheduled ones, although the DAGs must be
    unpaused for their runs to start. The API server listens on a free loopback port, with the
    simple auth manager's all-admins mode so it can be polled without a token. Each component
    is its own process group, terminated (then killed) on ``stop()``, on leaving the ``with``
    block and at interpreter exit; their output is kept in ``log_dir``.
    """

    STARTUP_TIMEOUT = 180.0
    STOP_GRACE = 15.0
    API_STOP_GRACE = 1.5

    def __init__(self, sandbox: AirflowSandbox, *, triggerer: bool = False, parallelism: int = 2) -> None:
        self.sandbox = sandbox
        self.triggerer = triggerer
        self.parallelism = parallelism
        self.port = 0
        self.log_dir: Path | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._jwt_secret = uuid.uuid4().hex + uuid.uuid4().hex

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return bool(self._procs)

    @property
    def pids(self) -> dict[str, int]:
        """Each component's process (and process group) id."""
        return {name: proc.pid for name, proc in self._procs.items()}

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
            AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False",
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
        if self._procs:
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
                    self._check_cli(self.airflow("dags", "reserialize"), "airflow dags reserialize")
                try:
                    self._wait_for_api()
                    return
                except RuntimeError:
                    if self._procs["api-server"].poll() is None or attempt == attempts:
                        raise  # only a lost race for the port is worth another attempt
                    self.stop(forget=False)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, *args: str) -> None:
        assert self.log_dir is not None
        airflow = str(Path(sys.executable).with_name("airflow"))
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self._procs[name] = subprocess.Popen(
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
        dead = {name: proc.returncode for name, proc in self._procs.items() if proc.poll() is not None}
        if dead:
            raise RuntimeError(f"Airflow component(s) exited: {dead}\n{self.logs()}")

    def stop(self, forget: bool = True) -> None:
        """Terminate every component's process group, killing what is left after a grace period.

        The scheduler (and triggerer) go first: on SIGTERM the LocalExecutor lets running task
        processes finish, and those report to the API server. The API server goes last, with a
        short grace: uvicorn is done within a fraction of a second, after which the interpreter
        spends seconds in its final garbage collection, which is not worth waiting for.
        """
        procs, self._procs = self._procs, {}
        if forget:
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
        api = procs.pop("api-server", None)
        _terminate(list(procs.values()), self.STOP_GRACE)
        if api is not None:
            _terminate([api], self.API_STOP_GRACE)

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
            self.api("PATCH", f"/dags/{_quote(dag_id)}", {"is_paused": paused})
        except AirflowApiError as exc:
            if exc.status != 404:
                raise
            errors = self.airflow("dags", "list-import-errors").stdout[-4000:]
            raise RuntimeError(f"DAG {dag_id!r} is not in the sandbox's DAG folder:\n{errors}") from exc

    def dag_runs(self, dag_id: str, **filters: str | int) -> list[DagRunRecord]:
        """The DAG's runs matching the REST API's list filters, in logical-date order (all pages)."""
        runs: list[DagRunRecord] = []
        while True:
            query: dict[str, str | int] = {"order_by": "logical_date", "limit": 100, "offset": len(runs)}
            page = self.api("GET", f"/dags/{_quote(dag_id)}/dagRuns", query={**filters, **query})
            runs += [DagRunRecord.from_api(item) for item in page["dag_runs"]]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def dag_run(self, dag_id: str, run_id: str) -> DagRunRecord:
        return DagRunRecord.from_api(self.api("GET", f"/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}"))

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
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", _iso(from_date),
                "--to-date", _iso(to_date), "--max-active-runs", str(max_active_runs)]  # fmt: skip
        if conf is not None:
            args += ["--dag-run-conf", json.dumps(conf)]
        if reprocess_behavior is not None:
            args += ["--reprocess-behavior", reprocess_behavior]
        self._check_cli(self.airflow(*args), f"airflow {' '.join(args)}")
        backfill = self.api("GET", "/backfills", query={"dag_id": dag_id, "order_by": "-id", "limit": 1})
        latest = backfill["backfills"][0]
        created = _parse_time(latest["created_at"])
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
        path = f"/dags/{_quote(dag_id)}/dagRuns/{_quote(record.run_id)}"
        before = datetime.now(UTC)
        self.api("POST", f"{path}/clear", {"dry_run": False})

        def cleared() -> list[DagRunRecord]:
            again = self.dag_run(dag_id, record.run_id)
            if again.queued_at is None or again.queued_at < before:
                raise RuntimeError(f"clearing did not queue {record.run_id} again: {again}")
            return [again]

        runs = self._wait(dag_id, cleared, started + timeout)
        return self._result(dag_id, runs, started)

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


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _terminate(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM the process groups led by ``procs``, wait up to ``grace`` seconds, SIGKILL the rest."""
    for proc in procs:
        _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(proc):
            _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether any process of the group led by ``proc`` is left (reaping the leader first)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
