"""Staging retention: delete a slot's staged batches and snapshots nothing can need any more.

Airflow-free (the CLI and the retention operator share it). Staging is the pipeline's only copy
of a batch until the slot is acknowledged past it, and of a snapshot until a reload no longer
hands it to the load, so a directory ``<staging>/<slot>/<batch id>`` is deleted only when:

* it is complete (its ``_manifest.json`` exists and reads), and its manifest's ``created_at``
  is older than the retention;
* a batch: its end LSN is at or below the slot's ``confirmed_flush_lsn`` (the ack has moved the
  slot past it, which it does only once every lake table holds the batch);
* a snapshot: its consistent point is at or below ``confirmed_flush_lsn``, and it is not the
  newest staged snapshot of any of its tables (a re-run of the initial snapshot or a lost-slot
  recovery hands the newest one to the load again), nor the newest snapshot of the slot.

A directory without a manifest is a drain or copy still writing, or a leftover of a failed one
(which the next run of that step deletes and redoes); it is deleted only once its newest file is
older than the retention, so a long copy in progress is never touched.
"""

from __future__ import annotations

import logging
import posixpath
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs

from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.errors import ManifestFormatError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest

log = logging.getLogger("postgres_cdc.retention")


def _created_at(manifest: Manifest) -> datetime:
    moment = datetime.fromisoformat(manifest.created_at)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _newest_write(location: StagingLocation, directory: str) -> datetime | None:
    """The newest modification time of ``directory`` or anything under it (None when unknown).

    The directory's own time counts: a drain creates it before its first file.
    """
    selector = pafs.FileSelector(directory, recursive=True, allow_not_found=True)
    infos = [location.filesystem.get_file_info(directory), *location.filesystem.get_file_info(selector)]
    times = [info.mtime for info in infos if info.mtime is not None]
    if not times:
        return None
    newest: datetime = max(times)
    return newest if newest.tzinfo is not None else newest.replace(tzinfo=UTC)


def _read(location: StagingLocation, directory: str) -> Manifest | None:
    try:
        manifest = location.read_manifest(directory)
        _created_at(manifest)
        return manifest
    except (ManifestFormatError, OSError, ValueError) as exc:
        log.warning("%s: manifest unreadable (%s); kept, inspect it by hand", directory, exc)
        return None


def _newest_snapshots(manifests: list[Manifest]) -> set[str]:
    """Batch ids of the slot's newest snapshot and of the newest snapshot of each table."""
    snapshots = sorted((m for m in manifests if m.kind == "snapshot"), key=lambda m: m.end_lsn)
    newest = {(t.schema, t.table): m.batch_id for m in snapshots for t in m.tables}  # later ones win
    return set(newest.values()) | ({snapshots[-1].batch_id} if snapshots else set())


def prune_staging(
    staging_uri: str,
    slot: str,
    confirmed_flush_lsn: Lsn,
    older_than: timedelta,
    now: datetime | None = None,
    staging_options: S3Options | None = None,
) -> list[str]:
    """Delete the slot's staged directories that are acknowledged and older than ``older_than``.

    Returns the deleted directories' paths. ``now`` (default: the current time) is what the
    retention counts back from; ``staging_options`` the credentials of an ``s3://`` store.
    """
    if older_than < timedelta(0):
        raise ValueError(f"staging retention must not be negative (got {older_than})")
    location = StagingLocation.resolve(staging_uri, staging_options)
    location.check_access()
    cutoff = (now or datetime.now(UTC)) - older_than
    manifests: dict[str, Manifest] = {}
    deleted: list[str] = []
    for batch_id, complete in location.list_batches(slot):
        directory = location.batch_dir(slot, batch_id)
        if complete:
            manifest = _read(location, directory)
            if manifest is not None:
                manifests[batch_id] = manifest
            continue
        written = _newest_write(location, directory)
        if written is not None and written < cutoff:
            log.info("deleting %s: incomplete (no manifest), last written %s", directory, written)
            location.delete_dir(directory)
            deleted.append(directory)

    protected = _newest_snapshots(list(manifests.values()))

    for batch_id, manifest in sorted(manifests.items()):
        directory = location.batch_dir(slot, batch_id)
        if manifest.end_lsn > confirmed_flush_lsn or _created_at(manifest) >= cutoff:
            continue
        if manifest.kind == "snapshot" and batch_id in protected:
            continue
        log.info(
            "deleting %s: %s ending at %s, acknowledged (slot at %s), created %s",
            directory, manifest.kind, manifest.end_lsn, confirmed_flush_lsn, manifest.created_at,
        )  # fmt: skip
        location.delete_dir(directory)
        deleted.append(directory)
    log.info(
        "staging retention of slot %s under %s: %d directory(ies) deleted",
        slot, posixpath.join(location.uri, slot), len(deleted),
    )  # fmt: skip
    return deleted
