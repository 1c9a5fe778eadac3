"""Re-snapshots from a temporary slot, lost-slot recovery, snapshot re-runs and publishing tables.

The pipeline slot must not move or change while a re-snapshot runs; the re-snapshot must show the
database exactly at its own consistent point; and re-running an initial snapshot task must
neither fail nor create anything.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.errors import (
    PublicationAllTablesError,
    ReplicaIdentityFilterError,
    SlotExistsError,
    SlotNotFoundError,
)
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.replication import (
    TableSpec,
    advance_slot,
    connect,
    describe_slot,
    publish_tables,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.snapshot.snapshot_helpers import staged_table

pytestmark = pytest.mark.integration

SLOT = "pipe_slot"


@pytest.fixture
def pipeline(pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path) -> dict[str, Any]:
    """A published table and a pipeline slot created by an initial snapshot."""
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g;"
        "CREATE PUBLICATION pub FOR TABLE t;",
        pg_dbname,
    )
    dsn = pg_cluster.dsn(pg_dbname)
    staging = str(tmp_path / "staging")
    path, manifest = take_snapshot(dsn, SLOT, ["pub"], staging)
    return {"dsn": dsn, "staging": staging, "initial": path, "initial_manifest": manifest}


def slot_row(pg: PostgresCluster, dbname: str) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT slot_name::text, temporary, restart_lsn::text, confirmed_flush_lsn::text "
        "FROM pg_replication_slots WHERE database = current_database() ORDER BY 1",
        dbname,
    )


def test_resnapshot_leaves_the_pipeline_slot_alone_and_shows_its_own_point(
    pg_cluster: PostgresCluster, pg_dbname: str, pipeline: dict[str, Any]
) -> None:
    pg_cluster.execute("UPDATE t SET v = 'changed' WHERE id <= 100; DELETE FROM t WHERE id > 450", pg_dbname)
    before = slot_row(pg_cluster, pg_dbname)
    path, manifest = take_snapshot(pipeline["dsn"], SLOT, ["pub"], pipeline["staging"], slot_mode="temporary")
    assert slot_row(pg_cluster, pg_dbname) == before  # untouched, and the temporary slot is gone
    assert (
        manifest.slot == SLOT and manifest.snapshot_slot and manifest.snapshot_slot.startswith(SLOT + "_rs_")
    )
    assert manifest.end_lsn > pipeline["initial_manifest"].end_lsn
    assert Path(path).parent.parent.name == SLOT  # staged with the pipeline's batches
    staged = dict(zip(*staged_table(path, manifest.tables[0]).to_pydict().values(), strict=True))
    assert staged == {i: "changed" if i <= 100 else f"v{i}" for i in range(1, 451)}


def test_resnapshot_needs_a_live_pipeline_slot(
    pg_cluster: PostgresCluster, pg_dbname: str, pipeline: dict[str, Any]
) -> None:
    with pytest.raises(SlotNotFoundError, match="postgres_cdc_recover_slot"):
        take_snapshot(pipeline["dsn"], "no_such_slot", ["pub"], pipeline["staging"], slot_mode="temporary")


def test_recover_refuses_a_healthy_slot_and_recreates_a_dropped_one(
    pg_cluster: PostgresCluster, pg_dbname: str, pipeline: dict[str, Any]
) -> None:
    with pytest.raises(SlotExistsError, match="healthy"):
        take_snapshot(pipeline["dsn"], SLOT, ["pub"], pipeline["staging"], slot_mode="recover")
    pg_cluster.execute(f"SELECT pg_drop_replication_slot('{SLOT}')", pg_dbname)
    _, manifest = take_snapshot(pipeline["dsn"], SLOT, ["pub"], pipeline["staging"], slot_mode="recover")
    rows = slot_row(pg_cluster, pg_dbname)
    assert [(r[0], r[1], r[3]) for r in rows] == [(SLOT, False, str(manifest.end_lsn))]
    assert manifest.snapshot_slot == SLOT


def test_snapshot_operator_rerun_resumes_then_skips(
    pg_cluster: PostgresCluster, pg_dbname: str, pipeline: dict[str, Any]
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    conn_id = f"pgl_{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", pg_cluster.uri(pg_dbname))
        operator = PostgresCdcSnapshotOperator(
            task_id="snapshot", slot_name=SLOT, publications="pub", staging=pipeline["staging"],
            postgres_conn_id=conn_id,
        )  # fmt: skip
        # The slot exists and has not moved: the staged initial snapshot is handed over again.
        again = operator.execute({})  # type: ignore[arg-type]
        assert again["manifest"].endswith(pipeline["initial"]) and again["batch_id"].startswith("snapshot-")
        # A re-snapshot staged later is not the slot's own snapshot and is never handed over.
        take_snapshot(pipeline["dsn"], SLOT, ["pub"], pipeline["staging"], slot_mode="temporary")
        assert operator.execute({})["batch_id"] == again["batch_id"]  # type: ignore[arg-type]
        with psycopg2.connect(pipeline["dsn"]) as pg:
            pg.cursor().execute("INSERT INTO t VALUES (9999, 'new')")
        conn = connect(pipeline["dsn"])
        advance_slot(conn, SLOT, describe_slot(conn, SLOT).current_wal_lsn)
        conn.close()
        with pytest.raises(AirflowSkipException, match="has consumed changes up to"):
            operator.execute({})  # type: ignore[arg-type]


def test_publish_tables_is_idempotent_and_refuses_what_would_break_writes(
    pg_cluster: PostgresCluster, pg_dbname: str, pipeline: dict[str, Any]
) -> None:
    pg_cluster.execute(
        "CREATE TABLE refunds (id int PRIMARY KEY, amount int NOT NULL, reason text);"
        "CREATE UNIQUE INDEX refunds_identity ON refunds (id, amount);"
        "INSERT INTO refunds VALUES (1, 5, 'a')",
        pg_dbname,
    )
    spec = TableSpec("refunds", columns=("id", "amount"), row_filter="amount > 0")
    conn = connect(pipeline["dsn"], autocommit=False)
    try:
        # amount is not in the replica identity (the primary key): PostgreSQL would accept the
        # filter and then reject every UPDATE of refunds.
        with pytest.raises(
            ReplicaIdentityFilterError, match="would make every UPDATE and DELETE of the table fail"
        ):
            publish_tables(conn, "pub", [spec])
        assert not conn.closed and conn.status == psycopg2.extensions.STATUS_READY
        pg_cluster.execute("ALTER TABLE refunds REPLICA IDENTITY USING INDEX refunds_identity", pg_dbname)
        assert publish_tables(conn, "pub", [spec]) == ["public.refunds"]
        assert publish_tables(conn, "pub", [spec, TableSpec("t")]) == []  # nothing changes twice
        wider = TableSpec("refunds", row_filter="amount >= 0")
        assert publish_tables(conn, "pub", [wider]) == ["public.refunds"]
    finally:
        conn.close()
    pg_cluster.execute("UPDATE refunds SET reason = 'still writable', amount = 6", pg_dbname)
    rows = pg_cluster.execute(
        "SELECT tablename::text, attnames::text[], rowfilter FROM pg_publication_tables "
        "WHERE pubname = 'pub' ORDER BY 1",
        pg_dbname,
    )
    assert rows == [("refunds", ["id", "amount", "reason"], "(amount >= 0)"), ("t", ["id", "v"], None)]
    pg_cluster.execute("CREATE PUBLICATION everything FOR ALL TABLES", pg_dbname)
    conn = connect(pipeline["dsn"], autocommit=False)
    try:
        with pytest.raises(PublicationAllTablesError, match="FOR ALL TABLES"):
            publish_tables(conn, "everything", [spec])
    finally:
        conn.close()
