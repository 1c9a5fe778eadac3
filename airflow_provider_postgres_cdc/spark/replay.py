"""A re-snapshot loaded after the CDC applied batches past its consistent point: the changelog's
changes from that point on, replayed on top of the snapshot's rows, so the table ends where it was.

Every change the table received at or above its base LSN is in its changelog once; changes at or
above the applied end belong to batches not applied yet.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import TableManifest
from airflow_provider_postgres_cdc.spark import multiset, soft_deletes
from airflow_provider_postgres_cdc.spark.changes import (
    BATCH_ID,
    COMMIT_LSN,
    COMMIT_TIME,
    EVENT_KIND,
    ROW_KEY,
    UPSERT,
    batch_facts,
    key_struct,
    materialize,
    net_effect,
    table_columns,
)
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.staged import key_columns

log = logging.getLogger("postgres_cdc.apply")


def replay_changelog(
    tables: IcebergTables, spec: TableManifest, rows: DataFrame, window: tuple[Lsn, Lsn], soft: bool
) -> tuple[DataFrame, int]:
    """``rows`` (a snapshot at ``window[0]``) with the changelog's changes in ``window`` applied, and
    how many there were; ``soft``: a soft-deletes table's rows (``spark/soft_deletes.py``)."""
    changelog = tables.config.changelog_identifier(spec.schema, spec.table)
    if tables.table(changelog) is None:
        return rows, 0
    point, until = window
    logged = tables.spark.table(tables.name(changelog))
    changes = logged.where((sf.col(COMMIT_LSN) >= int(point)) & (sf.col(COMMIT_LSN) < int(until)))
    changes = materialize(changes.drop(BATCH_ID))
    columns = table_columns(changes)
    keys = [] if spec.counts_rows else key_columns(spec, [c.name for c in columns])
    facts = batch_facts(changes)
    log.info(
        "%s: its snapshot is older than the applied end %s: replaying %d logged change(s)",
        spec.qualified, until, facts.changes,
    )  # fmt: skip
    if not facts.changes:
        return rows, 0
    if spec.counts_rows:
        replayed = multiset.replay(rows, changes, columns, spec.qualified, facts.truncate)
        return materialize(replayed), facts.changes
    net = net_effect(changes, columns, keys, rows, facts)
    if soft:
        return materialize(soft_deletes.replayed(rows, net, keys, facts.truncate_mark)), facts.changes
    kept = rows.limit(0) if net.truncated else rows
    kept = kept.join(net.rows.select(ROW_KEY), key_struct(keys) == sf.col(ROW_KEY), "left_anti")
    upserts = net.rows.where(sf.col(EVENT_KIND) == UPSERT).drop(EVENT_KIND, ROW_KEY, COMMIT_LSN, COMMIT_TIME)
    return materialize(kept.unionByName(upserts, allowMissingColumns=True)), facts.changes
