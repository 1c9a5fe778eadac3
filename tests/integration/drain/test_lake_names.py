"""A published table the lake cannot name stops the drain and the snapshot before anything is staged.

The check needs no catalog (docs/LAKE.md, "Names"): a "preserve" lake refuses a table that would
be another table's changelog, a "portable" lake a name longer than restrictive catalogs take.
Either way nothing is staged, no snapshot slot is created, and the pipeline's slot does not move.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import SnapshotRun
from airflow_provider_postgres_cdc.errors import LakeNameError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.replication import connect, create_slot, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

LONG = "%" * 63  # PostgreSQL's longest name; portable, its changelog is 268 characters
SCHEMA = f"""
CREATE SCHEMA "My Schema";
CREATE TABLE "My Schema"."v1.2 sales%" (id int PRIMARY KEY);
CREATE TABLE "UPPER" (id int PRIMARY KEY);
CREATE TABLE t (id int PRIMARY KEY);
CREATE TABLE t__pgl_changelog (id int PRIMARY KEY);
CREATE TABLE "{LONG}" (id int PRIMARY KEY);
CREATE PUBLICATION hostile FOR TABLE "My Schema"."v1.2 sales%", "UPPER", t;
CREATE PUBLICATION clash FOR TABLE t, t__pgl_changelog;
CREATE PUBLICATION long FOR TABLE t, "{LONG}";
"""
SLOT = "names"


@pytest.fixture
def dsn(pg_cluster: PostgresCluster, pg_dbname: str) -> str:
    """A source whose slot has changes of every table waiting."""
    pg_cluster.execute(SCHEMA, pg_dbname)
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, SLOT)
    conn.close()
    tables = ['"My Schema"."v1.2 sales%"', '"UPPER"', "t", "t__pgl_changelog", f'"{LONG}"']
    pg_cluster.execute("".join(f"INSERT INTO {t} SELECT generate_series(1, 5);" for t in tables), pg_dbname)
    return pg_cluster.dsn(pg_dbname)


def _confirmed(dsn: str) -> object:
    conn = connect(dsn)
    try:
        return describe_slot(conn, SLOT).confirmed_flush_lsn
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("publication", "lake", "refused"),
    [
        ("clash", LakeConfig(), "public.t and public.t__pgl_changelog would share the lake table"),
        ("long", LakeConfig(names="portable"), 'source table public."%%%'),
    ],
    ids=["preserve-clash", "portable-too-long"],
)
def test_a_table_the_lake_cannot_name_stops_the_drain_and_the_snapshot(
    dsn: str, pg_cluster: PostgresCluster, tmp_path: Path, publication: str, lake: LakeConfig, refused: str
) -> None:
    before = _confirmed(dsn)
    with pytest.raises(LakeNameError, match="slot has not moved") as stopped:
        drain_batch(dsn, DrainSettings(SLOT, (publication,), str(tmp_path), lake=lake))
    assert refused in str(stopped.value)
    snapshot = SnapshotRun(dsn, "names_copy", [publication], str(tmp_path), tables=["public.t"], lake=lake)
    with pytest.raises(LakeNameError, match="slot has not moved"), snapshot:
        pass  # the publication's other table counts too: the next drain would stage it
    assert list(tmp_path.iterdir()) == []  # nothing staged
    assert _confirmed(dsn) == before
    slots = pg_cluster.execute("SELECT slot_name FROM pg_replication_slots ORDER BY 1")
    assert slots == [(SLOT,)]  # the snapshot created none

    result = drain_batch(dsn, DrainSettings(SLOT, (publication,), str(tmp_path)))  # no lake: no check
    assert {t.qualified for t in result.manifest.tables} >= {"public.t"}


def test_the_drain_operator_checks_the_names_of_its_lake_connection(
    dsn: str, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NAMES_SRC", pg_cluster.uri(pg_dbname))
    monkeypatch.setenv("AIRFLOW_CONN_NAMES_LAKE", connection_json(LakeConfig()))
    drain = PostgresCdcDrainOperator(
        task_id="drain", slot_name=SLOT, publications="clash", staging=str(tmp_path),
        postgres_conn_id="names_src", lake_conn_id="names_lake",
    )  # fmt: skip
    with pytest.raises(LakeNameError, match=r"would share the lake table public\.t__pgl_changelog"):
        drain.execute({})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_portable_lake_drains_names_a_preserve_lake_would_keep(dsn: str, tmp_path: Path) -> None:
    lake = LakeConfig(names="portable")
    result = drain_batch(dsn, DrainSettings(SLOT, ("hostile",), str(tmp_path), lake=lake))
    staged = {(t.schema, t.table): t.rows for t in result.manifest.tables}
    assert staged == {("My Schema", "v1.2 sales%"): 5, ("public", "UPPER"): 5, ("public", "t"): 5}
    names = {lake.identifier(*source) for source in staged}
    assert names == {("0_my_220_schema", "0v1_22e2_220sales_225"), ("public", "0_u_p_p_e_r"), ("public", "t")}
