"""Joining the exported snapshot: the session every copy connection reads in.

``CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`` names a snapshot that lives only as long as the
replication connection that created it (the holder) stays open. The planner, every local copy
worker and every Spark JDBC partition start a read-only repeatable-read transaction and import it
by that name, so all of them see the database exactly at the slot's consistent point.
"""

from __future__ import annotations

from typing import Any

import psycopg2.errors

from airflow_provider_postgres_cdc.errors import SnapshotLostError

# Workers sit idle in their transaction between ranges, like the holder (SNAPSHOT_HOLDER_OPTIONS).
# row_security = off makes a policy fail the copy loudly instead of hiding rows from it.
WORKER_OPTIONS = "-c idle_in_transaction_session_timeout=0 -c row_security=off"
IMPORT_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

# What ends the connection that holds an exported snapshot, when it is not a one-off restart.
HOLDER_ADVICE = (
    "If it happens again, look for what ends idle connections: pg_terminate_backend jobs, proxies, "
    "idle_in_transaction_session_timeout or idle_session_timeout set for the role or database."
)


def import_snapshot(conn: Any, snapshot_name: str) -> None:
    """Start a read-only repeatable-read transaction on ``conn`` that sees ``snapshot_name``."""
    with conn.cursor() as cur:
        cur.execute(IMPORT_SNAPSHOT)
        try:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        except (psycopg2.errors.InvalidParameterValue, psycopg2.errors.UndefinedObject) as exc:
            raise SnapshotLostError(
                f"exported snapshot {snapshot_name} can no longer be imported ({exc.pgerror or exc}): the "
                "replication connection holding it was closed or terminated. The snapshot was discarded "
                f"and its slot dropped; run it again. {HOLDER_ADVICE}"
            ) from exc
