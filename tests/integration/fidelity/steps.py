"""Pipeline steps the seeded tests (fidelity and crash soak) share with each other."""

from __future__ import annotations

from airflow_provider_postgres_cdc.engine.lake_catalog import unapplied_tables
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.replication import advance_slot, connect


def acknowledge(dsn: str, slot: str, lake: LakeConfig, manifest: Manifest) -> None:
    """``PostgresCdcAckOperator``: advance the slot only once every table of the batch holds it."""
    missing = unapplied_tables(lake, manifest)
    if missing:
        raise AssertionError(f"the ack found batch {manifest.batch_id} unapplied for {missing}")
    conn = connect(dsn)
    try:
        advance_slot(conn, slot, manifest.end_lsn, whole=True)
    finally:
        conn.close()
