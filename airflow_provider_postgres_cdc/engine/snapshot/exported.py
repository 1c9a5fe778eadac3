"""Joining the exported snapshot: the session every copy connection reads in.

``CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`` names a snapshot that lives only as long as the
replication connection that created it (the holder) stays open. The planner, every local copy
worker and every Spark JDBC partition start a read-only repeatable-read transaction and import it
by that name, so all of them see the database exactly at the slot's consistent point; the run
checks the holder while the copy goes on (:func:`check_holder`), since the snapshot dies with it.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.errors

from airflow_provider_postgres_cdc.errors import SnapshotLostError
from airflow_provider_postgres_cdc.replication.connection import connection_lost_detail, is_connection_loss

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


def check_holder(catalog: Any, holder: Any, holder_pid: int, snapshot_name: str) -> None:
    """Raise :class:`SnapshotLostError` unless ``holder`` (backend ``holder_pid``), the connection
    holding ``snapshot_name``, is alive; ``catalog`` is another connection to ask the server."""
    if holder is None or holder.closed:
        raise SnapshotLostError(f"the connection holding snapshot {snapshot_name} is closed")
    try:
        with catalog.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (holder_pid,))
            alive = cur.fetchone() is not None
    except psycopg2.Error as exc:
        if not is_connection_loss(exc):
            raise
        raise SnapshotLostError(
            f"lost the connection to PostgreSQL during the snapshot copy ({connection_lost_detail(exc)}):"
            f" the server restarted or its backends were terminated, and snapshot {snapshot_name} "
            "went with them. The copy was discarded and its slot dropped; run the snapshot again."
        ) from exc
    if not alive:
        raise SnapshotLostError(
            f"the replication connection holding snapshot {snapshot_name} (backend pid "
            f"{holder_pid}) was terminated during the copy; the copy may mix states, so it was "
            f"discarded and its slot dropped; run it again. {HOLDER_ADVICE}"
        )
