"""The ack moves the slot only for a batch of its own slot that every lake table has committed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.errors import (
    BatchNotAppliedError,
    ManifestSlotMismatchError,
    SlotShortOfBatchError,
)
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator
from airflow_provider_postgres_cdc.replication import connect, create_slot, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster


@pytest.fixture
def source(
    pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int);CREATE PUBLICATION pub FOR TABLE t",
        pg_dbname,
    )
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "cdc")
    create_slot(conn, "cdc_other")
    conn.close()
    monkeypatch.setenv("AIRFLOW_CONN_ACK_SRC", pg_cluster.uri(pg_dbname))
    (tmp_path / "lake").mkdir()  # an empty local lake: a SQLite Iceberg catalog
    monkeypatch.setenv("AIRFLOW_CONN_ACK_LAKE", connection_json(local_lake(str(tmp_path / "lake"))))
    return pg_cluster.dsn(pg_dbname)


def _ack(slot: str, manifest: str) -> PostgresCdcAckOperator:
    return PostgresCdcAckOperator(
        task_id="ack", slot_name=slot, manifest=manifest, lake_conn_id="ack_lake", postgres_conn_id="ack_src"
    )


def test_unapplied_batch_and_foreign_manifest_are_refused(
    pg_cluster: PostgresCluster, pg_dbname: str, source: str, tmp_path: Path
) -> None:
    pg_cluster.execute("INSERT INTO t SELECT generate_series(1, 10)", pg_dbname)
    batch = drain_batch(source, DrainSettings("cdc", ("pub",), str(tmp_path / "staging")))
    conn = connect(source)
    before = describe_slot(conn, "cdc").confirmed_flush_lsn
    with pytest.raises(BatchNotAppliedError, match=r"public\.t.*Run \(or re-run\) the apply task"):
        _ack("cdc", batch.manifest_uri).execute({})  # type: ignore[arg-type]
    with pytest.raises(ManifestSlotMismatchError, match="belongs to slot 'cdc', not 'cdc_other'"):
        _ack("cdc_other", batch.manifest_uri).execute({})  # type: ignore[arg-type]
    assert describe_slot(conn, "cdc").confirmed_flush_lsn == before
    conn.close()


def test_empty_batch_is_acknowledged_without_a_commit(
    pg_cluster: PostgresCluster, pg_dbname: str, source: str, tmp_path: Path
) -> None:
    pg_cluster.execute("INSERT INTO other SELECT generate_series(1, 1000)", pg_dbname)
    batch = drain_batch(source, DrainSettings("cdc", ("pub",), str(tmp_path / "staging")))
    assert batch.manifest.tables == ()
    result = _ack("cdc", batch.manifest_uri).execute({})  # type: ignore[arg-type]
    conn = connect(source)
    assert describe_slot(conn, "cdc").confirmed_flush_lsn == batch.manifest.end_lsn
    conn.close()
    assert result["confirmed_flush_lsn"] == str(batch.manifest.end_lsn)


def test_a_slot_that_would_end_short_of_the_batch_is_refused_and_stays(
    pg_cluster: PostgresCluster, pg_dbname: str, source: str, tmp_path: Path
) -> None:
    """A batch ending past this server's WAL (drained from a primary that died before its standby
    had everything) must not leave the slot short of what the lake holds."""
    pg_cluster.execute("INSERT INTO other SELECT generate_series(1, 10)", pg_dbname)
    batch = drain_batch(source, DrainSettings("cdc", ("pub",), str(tmp_path / "staging")))
    elsewhere = replace(batch.manifest, end_lsn=Lsn(batch.manifest.end_lsn + (1 << 30)))
    batch_dir = str(tmp_path / "staging" / "cdc" / batch.manifest.batch_id)
    uri = StagingLocation.resolve(str(tmp_path / "staging")).write_manifest(batch_dir, elsewhere)
    conn = connect(source)
    before = describe_slot(conn, "cdc").confirmed_flush_lsn
    with pytest.raises(SlotShortOfBatchError, match=r"short of the batch's end .*postgres_cdc_recover_slot"):
        _ack("cdc", uri).execute({})  # type: ignore[arg-type]
    assert describe_slot(conn, "cdc").confirmed_flush_lsn == before
    conn.close()
