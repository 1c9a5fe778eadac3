"""Helpers for the slot lag sensor tests: a published table with a slot, a writer, and `airflow dags test`.

``run_dags_test`` is written to be promoted to ``airflow_provider_pglogical.testing`` (it needs
nothing from this package): it runs a real ``airflow dags test`` on a DAG file in a private
AIRFLOW_HOME, streaming the output to a callback so a test can act at a given moment (for
example once the task has deferred).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_pglogical.formats.lsn import Lsn
from airflow_provider_pglogical.testing import PostgresCluster

PASSWORD = "s3cret-pass-7f1e"
"""Trust authentication ignores it; tests assert it never leaks into kwargs, events or logs."""

SLOT = "lag_slot"
PUBLICATION = "lag_pub"


@dataclass
class PublishedSlot:
    """A database with a published table ``t``, an unpublished table ``other`` and a pgoutput slot."""

    cluster: PostgresCluster
    dbname: str
    conn_id: str
    slot: str = SLOT
    publication: str = PUBLICATION

    def connect(self) -> Any:
        conn = psycopg2.connect(self.cluster.dsn(self.dbname))
        conn.autocommit = True
        with conn.cursor() as cur:
            # The test cluster runs with synchronous_commit=off; a change must be flushed
            # before the slot can decode it.
            cur.execute("SET synchronous_commit = on")
        return conn

    def write(self, rows: int, table: str = "t", payload: int = 200) -> Lsn:
        """Insert ``rows`` rows in one committed transaction; returns the WAL position after it."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(
                sql.SQL("INSERT INTO {} (v) SELECT repeat('x', %s) FROM generate_series(1, %s)").format(
                    sql.Identifier(table)
                ),
                (payload, rows),
            )
            cur.execute("SELECT pg_current_wal_lsn()::text")
            lsn = Lsn.parse(cur.fetchone()[0])
        conn.close()
        return lsn

    def lag_bytes(self) -> int:
        rows = self.cluster.execute(
            sql.SQL(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots "
                "WHERE slot_name = {}"
            ).format(sql.Literal(self.slot)),
            self.dbname,
        )
        return int(rows[0][0])

    def advance_to_now(self) -> None:
        self.cluster.execute(
            sql.SQL("SELECT pg_replication_slot_advance({}, pg_current_wal_lsn())").format(
                sql.Literal(self.slot)
            ),
            self.dbname,
        )


def connection_uri(cluster: PostgresCluster, dbname: str) -> str:
    return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{cluster.port}/{dbname}"


def make_published_slot(
    cluster: PostgresCluster, dbname: str, conn_id: str, monkeypatch: pytest.MonkeyPatch
) -> PublishedSlot:
    cluster.execute("CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)", dbname)
    cluster.execute("CREATE TABLE other (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)", dbname)
    cluster.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE t").format(sql.Identifier(PUBLICATION)), dbname)
    cluster.execute(
        sql.SQL("SELECT pg_create_logical_replication_slot({}, 'pgoutput')").format(sql.Literal(SLOT)), dbname
    )
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_uri(cluster, dbname))
    return PublishedSlot(cluster, dbname, conn_id)


@dataclass
class DagsTestResult:
    returncode: int
    output: str
    seconds: float


def airflow_env(home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    env.update(extra)
    return env


def run_dags_test(
    home: Path,
    dag_id: str,
    dag_source: str,
    *,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float = 300,
) -> DagsTestResult:
    """Write ``dag_source`` as a DAG file and run ``airflow dags test <dag_id>`` on it.

    ``on_line`` sees every output line as it is printed (stdout and stderr merged), from the
    reader thread; the process is killed after ``timeout`` seconds.
    """
    (home / "dags" / f"{dag_id}.py").write_text(textwrap.dedent(dag_source))
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("airflow")), "dags", "test", dag_id],
        env=airflow_env(home, env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        reader.join(timeout=10)
    return DagsTestResult(returncode, "".join(lines), time.monotonic() - started)
