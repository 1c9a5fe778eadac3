"""Staging on a real S3 server: drain, local snapshot, manifest, the ack's read and retention on ``s3://``.

The store is SeaweedFS (``S3Server``) with real authentication; the operators take its endpoint
and credentials from an Airflow ``aws`` connection. A wrong key or a missing bucket must stop a
drain and a snapshot before anything moves, and the secret must appear in no log, XCom value or
manifest.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.retention import prune_staging
from airflow_provider_postgres_cdc.engine.staging import read_manifest
from airflow_provider_postgres_cdc.errors import StagingAccessError
from airflow_provider_postgres_cdc.hooks.staging import PostgresCdcStagingHook
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcStagingRetentionOperator
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster, S3Server

SLOT = "s3_cdc"


def _objects(s3: S3Server, prefix: str) -> list[str]:
    selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return sorted(info.path for info in s3.filesystem().get_file_info(selector))


@pytest.fixture
def connections(
    s3_server: S3Server, pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The source and the store as Airflow connections; returns a fresh staging root on the store."""
    monkeypatch.setenv("AIRFLOW_CONN_S3_SRC", pg_cluster.uri(pg_dbname))
    monkeypatch.setenv("AIRFLOW_CONN_S3_STORE", s3_server.connection_json())
    monkeypatch.setenv("AIRFLOW_CONN_S3_BAD_KEY", s3_server.connection_json(secret_key="not-the-secret"))
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t;"
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g",
        pg_dbname,
    )
    return f"s3://staging/{uuid.uuid4().hex[:8]}"


def test_pipeline_steps_stage_on_s3_and_keep_the_secret(
    s3_server: S3Server,
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    connections: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    staging = connections
    caplog.set_level(logging.DEBUG)
    options = PostgresCdcStagingHook("s3_store").get_conn()
    assert options.endpoint_url == s3_server.endpoint_url and options.access_key == s3_server.access_key
    assert s3_server.secret_key not in repr(options)

    # The local snapshot engine writes its part files and manifest to the store.
    snapshot = PostgresCdcSnapshotOperator(
        task_id="snapshot", slot_name=SLOT, publications="pub", staging=staging,
        postgres_conn_id="s3_src", staging_conn_id="s3_store",
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    assert snapshot["manifest"].startswith(staging + "/") and snapshot["rows"] == 500
    manifest = read_manifest(snapshot["manifest"], options)  # what the ack and the apply read first
    assert manifest.kind == "snapshot" and manifest.total_rows == 500

    # Changes, drained by the operator onto the store.
    pg_cluster.execute("UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 490", pg_dbname)
    drained = PostgresCdcDrainOperator(
        task_id="drain", slot_name=SLOT, publications="pub", staging=staging,
        postgres_conn_id="s3_src", staging_conn_id="s3_store",
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    batch = read_manifest(drained["manifest"], options)
    assert [t.rows for t in batch.tables] == [20]
    parts = [p for p in _objects(s3_server, staging.removeprefix("s3://")) if p.endswith(".parquet")]
    staged = sum(pq.ParquetFile(p, filesystem=s3_server.filesystem()).metadata.num_rows for p in parts)
    assert staged == 500 + 20
    # Each manifest names its files relative to its own directory: they are there, nowhere else.
    for uri, staged_manifest in ((snapshot["manifest"], manifest), (drained["manifest"], batch)):
        base = uri.removeprefix("s3://").rsplit("/", 1)[0]
        files = [f"{base}/{name}" for table in staged_manifest.tables for name in table.files]
        infos = s3_server.filesystem().get_file_info(files)
        assert files and all(info.type == pafs.FileType.File for info in infos), files
    assert len(parts) == len(manifest.tables[0].files) + len(batch.tables[0].files)

    # A retried drain reuses the complete batch on the store instead of staging it again.
    again = drain_batch(
        pg_cluster.dsn(pg_dbname), DrainSettings(SLOT, ("pub",), staging, staging_options=options)
    )
    assert again.reused and again.manifest_uri == drained["manifest"]

    # Retention deletes the acknowledged batch from the store, and keeps the newest snapshot.
    conn = connect(pg_cluster.dsn(pg_dbname))
    conn.cursor().execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (SLOT, str(batch.end_lsn)))
    conn.close()
    deleted = PostgresCdcStagingRetentionOperator(
        task_id="retention", slot_name=SLOT, staging=staging, retention_hours=0,
        postgres_conn_id="s3_src", staging_conn_id="s3_store",
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    assert deleted["deleted"] == 1
    left = _objects(s3_server, f"{staging.removeprefix('s3://')}/{SLOT}")
    assert not [p for p in left if "/batch-" in p] and [p for p in left if "/snapshot-" in p]
    assert prune_staging(staging, SLOT, batch.end_lsn, timedelta(0), staging_options=options) == []

    # The secret is in no XCom value, no manifest and no log record.
    manifests = [p for p in _objects(s3_server, "staging") if p.endswith("_manifest.json")]
    with s3_server.filesystem().open_input_stream(manifests[0]) as stream:
        manifest_text = stream.read().decode()
    for text in (str(snapshot), str(drained), str(deleted), manifest_text, caplog.text):
        assert s3_server.secret_key not in text


def test_wrong_key_or_missing_bucket_moves_nothing(
    s3_server: S3Server, pg_cluster: PostgresCluster, pg_dbname: str, connections: str
) -> None:
    staging = connections
    dsn = pg_cluster.dsn(pg_dbname)
    snapshot = PostgresCdcSnapshotOperator(
        task_id="snapshot", slot_name=SLOT, publications="pub", staging=staging,
        postgres_conn_id="s3_src", staging_conn_id="s3_bad_key",
    )  # fmt: skip
    with pytest.raises(StagingAccessError, match="refused access to bucket 'staging'") as refused:
        snapshot.execute({})  # type: ignore[arg-type]
    assert "not-the-secret" not in str(refused.value) and s3_server.access_key in str(refused.value)
    assert pg_cluster.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]  # no slot created

    options = PostgresCdcStagingHook("s3_store").get_conn()
    PostgresCdcSnapshotOperator(
        task_id="snapshot", slot_name=SLOT, publications="pub", staging=staging,
        postgres_conn_id="s3_src", staging_conn_id="s3_store",
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    pg_cluster.execute("INSERT INTO t VALUES (1000, 'new')", pg_dbname)
    conn = connect(dsn)
    before = describe_slot(conn, SLOT)
    objects = _objects(s3_server, "staging")
    drain = PostgresCdcDrainOperator(
        task_id="drain", slot_name=SLOT, publications="pub", staging=staging,
        postgres_conn_id="s3_src", staging_conn_id="s3_bad_key",
    )  # fmt: skip
    with pytest.raises(StagingAccessError, match="access key id and secret"):
        drain.execute({})  # type: ignore[arg-type]
    with pytest.raises(StagingAccessError, match=r"bucket 'no-such-bucket' of staging .* does not exist"):
        drain_batch(dsn, DrainSettings(SLOT, ("pub",), "s3://no-such-bucket/x", staging_options=options))
    assert s3_server.filesystem().get_file_info("no-such-bucket").type == pafs.FileType.NotFound
    after = describe_slot(conn, SLOT)
    conn.close()
    assert (after.confirmed_flush_lsn, after.restart_lsn) == (before.confirmed_flush_lsn, before.restart_lsn)
    assert _objects(s3_server, "staging") == objects  # nothing staged, nothing deleted
    # The right key drains the same change afterwards: nothing was lost by the refusals.
    batch = drain_batch(dsn, DrainSettings(SLOT, ("pub",), staging, staging_options=options))
    assert [t.rows for t in batch.manifest.tables] == [1]
