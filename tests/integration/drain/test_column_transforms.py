"""Column transforms that cannot be applied stop the drain and the snapshot before anything is staged.

A transform naming a table or column the publication does not publish, or dropping a replica
identity column (updates and deletes find their lake row by it), fails with the error that says
what to do; the slot does not move and no batch or snapshot is left in staging.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.replication import connect, create_slot, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = pytest.mark.integration

KEY = b"a-hash-key-long-enough-for-tests"
SCHEMA = """
CREATE TABLE accounts (email text PRIMARY KEY, plan text, secret text);
CREATE TABLE other (id int PRIMARY KEY);
CREATE PUBLICATION pub FOR TABLE accounts (email, plan);
"""


def _slot_position(cluster: PostgresCluster, db: str) -> object:
    conn = connect(cluster.dsn(db))
    try:
        return describe_slot(conn, "cdc").confirmed_flush_lsn
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("transforms", "message"),
    [
        ({"public.accounts": {"secret": "drop"}}, r"names 'secret', which the publication does not publish"),
        ({"public.other": {"id": "hash"}}, r"names public\.other, which the publication\(s\) do not publish"),
        ({"public.accounts": {"email": "drop"}}, r"drops 'email', part of the table's replica identity"),
    ],
)
def test_a_transform_that_cannot_apply_stops_the_drain_before_anything_is_staged(
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    tmp_path: Path,
    transforms: dict[str, dict[str, str]],
    message: str,
) -> None:
    pg_cluster.execute(SCHEMA, pg_dbname)
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "cdc")
    conn.close()
    pg_cluster.execute(
        "INSERT INTO accounts VALUES ('a@example.com', 'free', 's'); DELETE FROM accounts", pg_dbname
    )
    before = _slot_position(pg_cluster, pg_dbname)
    staging = tmp_path / "staging"
    settings = DrainSettings("cdc", ("pub",), str(staging), transforms=ColumnTransformer(transforms, KEY))
    with pytest.raises(ColumnTransformsError, match=message):
        drain_batch(pg_cluster.dsn(pg_dbname), settings)
    assert _slot_position(pg_cluster, pg_dbname) == before
    assert [p for p in staging.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(
    ("transforms", "message"),
    [
        ({"public.accounts": {"secret": "hash"}}, r"names 'secret', which the publication does not publish"),
        ({"public.accounts": {"email": "drop"}}, r"drops 'email', part of the table's replica identity"),
    ],
)
def test_a_transform_that_cannot_apply_stops_the_snapshot_and_leaves_no_slot(
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    tmp_path: Path,
    transforms: dict[str, dict[str, str]],
    message: str,
) -> None:
    pg_cluster.execute(SCHEMA + "INSERT INTO accounts VALUES ('a@example.com', 'free', 's');", pg_dbname)
    staging = tmp_path / "staging"
    with pytest.raises(ColumnTransformsError, match=message):
        take_snapshot(
            pg_cluster.dsn(pg_dbname),
            "cdc",
            ["pub"],
            str(staging),
            transforms=ColumnTransformer(transforms, KEY),
        )
    assert pg_cluster.execute("SELECT slot_name FROM pg_replication_slots", pg_dbname) == []
    assert [p for p in staging.rglob("*.parquet")] == []


def test_hashing_without_a_key_is_refused() -> None:
    with pytest.raises(ColumnTransformsError, match="no hash key was given: create an Airflow connection"):
        ColumnTransformer({"public.accounts": {"email": "hash"}})
