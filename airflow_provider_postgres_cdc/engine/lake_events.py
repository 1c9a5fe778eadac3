"""What a batch did to the lake, read back with pyiceberg: the payloads of the Asset events.

docs/OBSERVABILITY.md, "Assets", describes them for users.

The apply job records, in the Iceberg commit of every table it writes, the batch, its LSN window,
the changes it applied by kind and when it began the table (formats/lake.py); the ack knows the cut.
These functions turn that into small JSON objects, the ``extra`` of one event per table written
and of one event per acknowledged cut. Airflow-free: the operators attach them to Assets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_postgres_cdc.engine.lake_catalog import (
    Cut,
    lineage,
    load_table,
    open_catalog,
    summary_of,
)
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest

# Iceberg's own snapshot summary: rows a load wrote and removed.
_ADDED_RECORDS = "added-records"
_DELETED_RECORDS = "deleted-records"


@dataclass(frozen=True, slots=True)
class TableWrite:
    """One lake table's commit of a batch: the snapshot, the cut tag on it, what it applied."""

    schema: str
    table: str
    namespace: str
    lake_table: str
    snapshot_id: int
    tag: str | None
    inserted: int
    updated: int
    deleted: int
    apply_seconds: float | None


def _counts(kind: str, summary: Mapping[str, str]) -> tuple[int, int, int]:
    """(inserted, updated, deleted): a batch's applied changes by kind; a load's rows written and replaced."""
    if kind == "snapshot":
        return (
            lake.summary_int(summary, _ADDED_RECORDS) or 0,
            0,
            lake.summary_int(summary, _DELETED_RECORDS) or 0,
        )
    inserted, updated, deleted = (
        lake.summary_int(summary, key) or 0 for key in (lake.INSERTED, lake.UPDATED, lake.DELETED)
    )
    return inserted, updated, deleted


def _table_write(
    table: Any, config: LakeConfig, manifest: Manifest, entry: TableManifest
) -> TableWrite | None:
    """The table's commit of this batch, newest first; None when the table holds none (skipped, or
    replaced by a newer load)."""
    for snapshot in lineage(table):
        summary = summary_of(snapshot)
        ours = summary.get(lake.SLOT) == manifest.slot and summary.get(lake.BATCH_ID) == manifest.batch_id
        if ours and lake.is_pipeline_commit(summary):
            break
    else:
        return None
    started = lake.summary_int(summary, lake.STARTED_MS)
    tag = lake.tag_name(manifest.end_lsn)
    namespace, name = config.identifier(entry.schema, entry.table)
    inserted, updated, deleted = _counts(manifest.kind, summary)
    return TableWrite(
        schema=entry.schema,
        table=entry.table,
        namespace=namespace,
        lake_table=f"{config.catalog}.{namespace}.{name}",
        snapshot_id=int(snapshot.snapshot_id),
        tag=tag if tag in table.metadata.refs else None,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        apply_seconds=None if started is None else max(0.0, (snapshot.timestamp_ms - started) / 1000),
    )


def batch_writes(config: LakeConfig, manifest: Manifest) -> list[TableWrite]:
    """Every table of ``manifest`` whose lake table holds a commit of this batch."""
    catalog = open_catalog(config)
    writes = []
    for entry in manifest.tables:
        table = load_table(catalog, config, entry.schema, entry.table)
        write = _table_write(table, config, manifest, entry) if table is not None else None
        if write is not None:
            writes.append(write)
    return writes


def table_event_extra(manifest: Manifest, write: TableWrite) -> dict[str, Any]:
    """The ``extra`` of one table's Asset event."""
    return {
        "slot": manifest.slot,
        "batch_id": manifest.batch_id,
        "kind": manifest.kind,
        "start_lsn": str(manifest.start_lsn),
        "end_lsn": str(manifest.end_lsn),
        "tag": write.tag,
        "snapshot_id": write.snapshot_id,
        "rows_inserted": write.inserted,
        "rows_updated": write.updated,
        "rows_deleted": write.deleted,
        "table": f"{write.schema}.{write.table}",
        "lake_table": write.lake_table,
        "apply_seconds": write.apply_seconds,
    }


def latency_seconds(newest_commit_time: str | None, acked_at: datetime) -> float | None:
    """Seconds from the batch's newest commit to its ack; None when the batch had no commit time."""
    if not newest_commit_time:
        return None
    committed = datetime.fromisoformat(newest_commit_time)
    if committed.tzinfo is None:
        committed = committed.replace(tzinfo=UTC)
    return max(0.0, (acked_at - committed).total_seconds())


def cut_event_extra(
    manifest: Manifest,
    cut: Cut,
    catalog: str,
    *,
    acked_at: datetime,
    lag_bytes: int | None,
) -> dict[str, Any]:
    """The ``extra`` of the pipeline's cut Asset event, sent once the ack moved the slot."""
    return {
        "slot": manifest.slot,
        "batch_id": manifest.batch_id,
        "start_lsn": str(manifest.start_lsn),
        "end_lsn": str(manifest.end_lsn),
        "lsn": str(cut.lsn),
        "tag": cut.tag,
        "catalog": catalog,
        "tables": {
            f"{namespace}.{table}": snapshot_id for (namespace, table), snapshot_id in cut.snapshots.items()
        },
        "changes": manifest.stats.changes,
        "transactions": manifest.stats.transactions,
        "newest_commit_time": manifest.stats.newest_commit_time,
        "acked_at": acked_at.isoformat(),
        "latency_seconds": latency_seconds(manifest.stats.newest_commit_time, acked_at),
        "drain_seconds": manifest.stats.seconds,
        "lag_bytes": lag_bytes,
    }


def cut_from_event(extra: Mapping[str, Any]) -> Cut:
    """The :class:`Cut` a cut event names, for :func:`~.lake_catalog.read_table` (``cut=``): every
    table at the snapshot it had at the event's LSN. The lake namespace holds no raw dot (it is
    encoded), so the first dot of a ``tables`` key ends it."""
    named = extra.get("tables")
    if not isinstance(named, Mapping) or not named:
        raise ValueError(f"not a postgres-cdc cut event (tables, lsn, tag): no tables in {sorted(extra)}")
    try:
        tables = {tuple(name.split(".", 1)): int(sid) for name, sid in named.items()}
        return Cut(Lsn.parse(str(extra["lsn"])), str(extra["tag"]), tables)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a postgres-cdc cut event (tables, lsn, tag): {exc}") from exc
