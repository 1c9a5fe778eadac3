"""Bad input and broken snapshots: a clear error, no slot and no staged files left, and a retry that works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.snapshot import (
    RowSecurityError,
    SnapshotLostError,
    SnapshotProgress,
    TableDroppedError,
    take_snapshot,
)
from airflow_provider_postgres_cdc.errors import (
    PrivilegeError,
    PublicationEmptyError,
    PublicationNotFoundError,
    SlotExistsError,
    TableNotPublishedError,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = pytest.mark.integration


def _slots(pg: PostgresCluster) -> list[str]:
    return [row[0] for row in pg.execute("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")]


def _staged(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _two_tables(pg: PostgresCluster, db: str) -> None:
    pg.execute(
        "CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a SELECT generate_series(1, 1000);"
        "CREATE TABLE z (id int PRIMARY KEY); INSERT INTO z SELECT generate_series(1, 1000);"
        "CREATE PUBLICATION p FOR TABLE a, z;",
        db,
    )


def test_missing_or_empty_publication_fails_before_creating_a_slot(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    with pytest.raises(PublicationNotFoundError, match="nope"):
        take_snapshot(dsn, "s_missing", ["nope"], str(tmp_path))
    pg_cluster.execute("CREATE PUBLICATION empty", pg_dbname)
    with pytest.raises(PublicationEmptyError, match="publish no table"):
        take_snapshot(dsn, "s_empty", ["empty"], str(tmp_path))
    pg_cluster.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t", pg_dbname)
    with pytest.raises(TableNotPublishedError, match=r"other are not published.*published: public\.t"):
        take_snapshot(dsn, "s_subset", ["p"], str(tmp_path), tables=["other"])
    assert not [s for s in _slots(pg_cluster) if s.startswith("s_")]
    assert _staged(tmp_path) == []


def test_existing_slot_is_refused_unless_recreate_is_asked(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    _two_tables(pg_cluster, pg_dbname)
    dsn = pg_cluster.dsn(pg_dbname)
    first_path, first = take_snapshot(dsn, "again", ["p"], str(tmp_path))
    with pytest.raises(SlotExistsError, match="recreate_slot=True"):
        take_snapshot(dsn, "again", ["p"], str(tmp_path))
    pg_cluster.execute("INSERT INTO a VALUES (1001)", pg_dbname)
    second_path, second = take_snapshot(dsn, "again", ["p"], str(tmp_path), recreate_slot=True)
    assert second.start_lsn > first.start_lsn and second.table("public", "a").rows == 1001
    assert Path(first_path).exists() and Path(second_path).exists()


def test_table_dropped_during_the_copy_discards_everything_and_a_retry_works(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    _two_tables(pg_cluster, db)

    def drop_z(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            pg_cluster.execute("DROP TABLE z", db)

    with pytest.raises(TableDroppedError, match=r"public\.z"):
        take_snapshot(pg_cluster.dsn(db), "dropped", ["p"], str(tmp_path), on_progress=drop_z)
    assert "dropped" not in _slots(pg_cluster)
    assert _staged(tmp_path) == []
    _, manifest = take_snapshot(pg_cluster.dsn(db), "dropped", ["p"], str(tmp_path))
    assert [t.qualified for t in manifest.tables] == ["public.a"]


def test_lost_snapshot_holder_fails_clearly_and_leaves_nothing_behind(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    _two_tables(pg_cluster, db)

    def kill_holder(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            pg_cluster.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE backend_type = 'walsender' AND datname = current_database()",
                db,
            )

    with pytest.raises(SnapshotLostError, match="snapshot"):
        take_snapshot(pg_cluster.dsn(db), "lost", ["p"], str(tmp_path), on_progress=kill_holder)
    assert "lost" not in _slots(pg_cluster)
    assert _staged(tmp_path) == []
    _, manifest = take_snapshot(pg_cluster.dsn(db), "lost", ["p"], str(tmp_path))
    assert manifest.total_rows == 2000


def test_holder_killed_after_the_workers_imported_is_detected(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    """Workers that imported the snapshot already keep reading; the run must still notice and fail."""
    db = pg_dbname
    _two_tables(pg_cluster, db)

    def kill_holder_once_copying(progress: SnapshotProgress) -> None:
        if progress.phase == "copying":
            pg_cluster.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE backend_type = 'walsender' AND datname = current_database()",
                db,
            )

    with pytest.raises(SnapshotLostError, match="terminated"):
        take_snapshot(
            pg_cluster.dsn(db), "midway", ["p"], str(tmp_path), on_progress=kill_holder_once_copying
        )
    assert "midway" not in _slots(pg_cluster)
    assert _staged(tmp_path) == []


@pytest.fixture
def copier_role(pg_cluster: PostgresCluster, pg_dbname: str) -> Iterator[str]:
    """A role that may replicate but owns nothing: what a CDC pipeline should run as."""
    role = f"copier_{pg_dbname}"
    pg_cluster.execute(f'CREATE ROLE "{role}" LOGIN REPLICATION')
    yield role
    pg_cluster.drop_database(pg_dbname)
    pg_cluster.execute(f'DROP ROLE "{role}"')


def test_row_level_security_never_hides_rows(
    pg_cluster: PostgresCluster, pg_dbname: str, copier_role: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE secure (id int PRIMARY KEY, owner_name text);"
        "INSERT INTO secure SELECT g, CASE WHEN g % 2 = 0 THEN 'alice' ELSE 'bob' END "
        "FROM generate_series(1, 100) g;"
        "ALTER TABLE secure ENABLE ROW LEVEL SECURITY;"
        "CREATE POLICY only_alice ON secure USING (owner_name = 'alice');"
        f'GRANT SELECT ON secure TO "{copier_role}";'
        "CREATE PUBLICATION p FOR TABLE secure;",
        db,
    )
    dsn = pg_cluster.dsn(db, user=copier_role)
    with pytest.raises(RowSecurityError, match=r"public\.secure.*BYPASSRLS"):
        take_snapshot(dsn, "rls", ["p"], str(tmp_path))
    assert "rls" not in _slots(pg_cluster)
    pg_cluster.execute(f'ALTER ROLE "{copier_role}" BYPASSRLS')
    _, manifest = take_snapshot(dsn, "rls", ["p"], str(tmp_path))
    assert manifest.table("public", "secure").rows == 100


def test_role_without_select_gets_the_grant_to_run(
    pg_cluster: PostgresCluster, pg_dbname: str, copier_role: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE open_t (id int PRIMARY KEY); CREATE TABLE closed_t (id int PRIMARY KEY);"
        f'GRANT SELECT ON open_t TO "{copier_role}";'
        "CREATE PUBLICATION p FOR TABLE open_t, closed_t;",
        db,
    )
    with pytest.raises(PrivilegeError, match=r"GRANT SELECT ON public\.closed_t"):
        take_snapshot(pg_cluster.dsn(db, user=copier_role), "nosel", ["p"], str(tmp_path))
    assert "nosel" not in _slots(pg_cluster)
    assert _staged(tmp_path) == []
