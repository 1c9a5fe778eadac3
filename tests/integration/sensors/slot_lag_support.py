"""Helpers for the slot lag sensor tests: a published table with a slot, and a writer.

``airflow dags test`` runs come from the package's test kit (``testing.AirflowSandbox``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.testing import PostgresCluster

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


class Heartbeat:
    """Measures the event loop's longest stall: a blocking call in a coroutine shows up here.

    The clock starts on entering, not on the first beat, so a call that blocks before the
    heartbeat task ever runs is counted too; the gap up to leaving is counted as well.
    """

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.worst = 0.0
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    def _tick(self) -> None:
        now = time.monotonic()
        self.worst = max(self.worst, now - self._last - self.period)
        self._last = now

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self._tick()

    def __enter__(self) -> Heartbeat:
        self._last = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._tick()
