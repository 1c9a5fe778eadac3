"""Column transforms that cannot be applied stop the drain and the snapshot before anything is staged.

A transform naming a table or column the publication does not publish, or dropping a replica
identity column (updates and deletes find their lake row by it), fails with the error that says
what to do; the slot does not move and no batch or snapshot is left in staging.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.replication import connect, create_slot, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.drain.staged import staged_tables

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


# Each transform that cannot apply, with what its error says.
UNPUBLISHED_COLUMN = (
    {"public.accounts": {"secret": "drop"}},
    "names 'secret', which the publication does not publish",
)
UNPUBLISHED_TABLE = (
    {"public.other": {"id": "hash"}},
    r"names public\.other, which the publication\(s\) do not publish",
)
DROPPED_KEY = ({"public.accounts": {"email": "drop"}}, "drops 'email', part of the table's replica identity")


@pytest.mark.parametrize(("transforms", "message"), [UNPUBLISHED_COLUMN, UNPUBLISHED_TABLE, DROPPED_KEY])
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


@pytest.mark.parametrize(("transforms", "message"), [UNPUBLISHED_COLUMN, UNPUBLISHED_TABLE, DROPPED_KEY])
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


HOSTILE = """
CREATE SCHEMA "Sales.EU";
CREATE TABLE "Sales.EU"."Order Items" (
    "Id" int PRIMARY KEY, "E-Mail" text, "Tags" text[], amount numeric(12, 3), at timestamptz,
    doc jsonb, raw bytea, "Born Ö" date, secret text
);
CREATE PUBLICATION hostile FOR TABLE "Sales.EU"."Order Items";
"""
ROWS = """
INSERT INTO "Sales.EU"."Order Items" VALUES
  (1, 'Ann@Example.com', '{a,"b c"}', 1.5, '2026-01-02 03:04:05.678+02', '{"k": [1, 2]}', '\\x00ff',
   '1990-01-02', 's1'),
  (2, NULL, '{}', -0.001, '1999-12-31 23:59:59+00', 'null', '', '2000-02-29', 's2')
"""
HASHED = ("Id", "E-Mail", "Tags", "amount", "at", "doc", "raw", "Born Ö")


def _expected(cluster: PostgresCluster, db: str) -> list[tuple[str | None, ...]]:
    """Each row's hashed columns as the HMAC of PostgreSQL's text form of the value (format('%s'))."""
    columns = ", ".join(f"""CASE WHEN "{c}" IS NOT NULL THEN format('%s', "{c}") END""" for c in HASHED)
    rows = cluster.execute(f'SELECT {columns}, "Id" FROM "Sales.EU"."Order Items" ORDER BY "Id"', db)
    hashed = [
        tuple(None if v is None else hmac.new(KEY, v.encode(), hashlib.sha256).hexdigest() for v in row[:-1])
        for row in rows
    ]
    return sorted(hashed, key=repr)


def test_hostile_names_and_every_type_hash_alike_in_the_snapshot_and_in_batches(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db, staging = pg_dbname, tmp_path / "staging"
    pg_cluster.execute(HOSTILE + ROWS, db)
    transforms = ColumnTransformer(
        {"Sales.EU.Order Items": {**dict.fromkeys(HASHED, "hash"), "secret": "drop"}}, KEY
    )
    _, snapshot = take_snapshot(pg_cluster.dsn(db), "cdc", ["hostile"], str(staging), transforms=transforms)
    expected = _expected(pg_cluster, db)
    (entry,) = snapshot.tables
    copied = pa.concat_tables([pq.read_table(staging / "cdc" / snapshot.batch_id / f) for f in entry.files])
    assert "secret" not in copied.column_names
    assert sorted((tuple(row[name] for name in HASHED) for row in copied.to_pylist()), key=repr) == expected
    pg_cluster.execute('DELETE FROM "Sales.EU"."Order Items"; ' + ROWS, db)  # the same values again
    batch = drain_batch(
        pg_cluster.dsn(db), DrainSettings("cdc", ("hostile",), str(staging), transforms=transforms)
    )
    changes = staged_tables(batch)["Sales.EU.Order Items"]
    deleted = sorted(row["_pgl_old"]["Id"] for row in changes.to_pylist() if row["_pgl_op"] == "D")
    inserted = [tuple(row[name] for name in HASHED) for row in changes.to_pylist() if row["_pgl_op"] == "I"]
    assert deleted == sorted(h[0] for h in expected)  # a delete names its row by the hashed key
    assert sorted(inserted, key=repr) == expected
    assert "secret" not in changes.column_names and "s1" not in str(changes.to_pylist())
