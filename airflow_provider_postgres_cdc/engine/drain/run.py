"""One drain from start to end: check the slot, fix the batch's bound, stage it, write its manifest."""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_postgres_cdc.engine.catalog_facts import record_catalog_facts
from airflow_provider_postgres_cdc.engine.drain.pipeline import read_and_stage
from airflow_provider_postgres_cdc.engine.drain.settings import DrainResult, DrainSettings
from airflow_provider_postgres_cdc.engine.drain.stager import BatchStager
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.errors import (
    SlotActiveError,
    SlotLostError,
    SlotPluginError,
    StagingNotWritableError,
)
from airflow_provider_postgres_cdc.formats.layout import change_batch_id
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, ManifestStats
from airflow_provider_postgres_cdc.replication import (
    connect,
    describe_publications,
    describe_slot,
    hold_drain_lock,
)
from airflow_provider_postgres_cdc.replication.connection import ConnParams
from airflow_provider_postgres_cdc.replication.failover import (
    check_not_promoted,
    require_standby_feedback,
    standbys_flushed,
)
from airflow_provider_postgres_cdc.replication.slots import SlotInfo, decodable_end, invalidation_message

log = logging.getLogger(__name__)


def _check_slot(conn: Any, settings: DrainSettings) -> SlotInfo:
    """The slot, once it is known to be drainable (it may live on a hot standby, PostgreSQL 16+) and
    every published table to have a name in the lake."""
    slot = describe_slot(conn, settings.slot)
    if slot.invalidated:
        raise SlotLostError(invalidation_message(slot))
    if slot.active:
        raise SlotActiveError(
            f"replication slot {settings.slot!r} is active (pid {slot.active_pid}): another drain or a "
            "subscriber is reading it. One consumer at a time; run the pipeline with max_active_runs=1."
        )
    if slot.plugin != "pgoutput" or slot.confirmed_flush_lsn is None:
        raise SlotPluginError(
            f"slot {settings.slot!r} is not a pgoutput logical slot (plugin {slot.plugin!r})"
        )
    publications = describe_publications(conn, settings.publications)  # raises PublicationNotFoundError
    if settings.lake is not None:  # a table the lake cannot name stops here, before anything is staged
        settings.lake.check_names((t.schema, t.table) for p in publications for t in p.tables)
    if settings.transforms is not None:  # so is a transform of a column that is not published
        settings.transforms.check_published((t.qualified, t.columns) for p in publications for t in p.tables)
    return slot


def _bound(conn: Any, start: Lsn, max_bytes: int | None, *, failover: bool = False) -> tuple[Lsn, bool]:
    """Where the batch ends: the WAL flushed (replayed on a standby), capped by ``max_bytes``; and
    whether that cap cut the window short of the WAL there is to read.

    A failover slot's batch also stops where its standbys have flushed, so that the lake never
    holds a change a promoted standby does not have.
    """
    flushed = decodable_end(conn)
    standbys = standbys_flushed(conn, start) if failover else None
    if standbys is not None:
        flushed = min(flushed, standbys)
    capped = False
    if max_bytes is not None and Lsn(start + max_bytes) < flushed:
        flushed, capped = Lsn(start + max_bytes), True
    return max(flushed, start), capped


def _prepare_staging(location: StagingLocation, slot: str, batch_id: str) -> str | None:
    """Return the manifest path of a complete earlier attempt, else clear a half-written one."""
    batch_dir = location.batch_dir(slot, batch_id)
    for name, complete in location.list_batches(slot, batch_id):
        if name != batch_id:
            continue
        if complete:
            return f"{batch_dir}/_manifest.json"
        log.warning("discarding half-written batch %s from an earlier attempt", location.uri_of(batch_dir))
        location.delete_dir(batch_dir)
    try:
        location.filesystem.create_dir(batch_dir, recursive=True)
    except OSError as exc:
        raise StagingNotWritableError(
            f"cannot create {location.uri_of(batch_dir)}: {exc}. "
            "Check the staging location and its permissions."
        ) from exc
    return None


def drain_batch(params: ConnParams, settings: DrainSettings) -> DrainResult:
    """Drain one batch (see module docstring); the slot is never moved here."""
    location = StagingLocation.resolve(settings.staging, settings.staging_options)
    location.check_access()  # a missing bucket or refused key stops here, before the slot is touched
    conn = connect(params)
    try:
        slot = _check_slot(conn, settings)
        start = slot.confirmed_flush_lsn
        assert start is not None  # _check_slot refuses a slot without one
        if slot.in_recovery:
            require_standby_feedback(conn, settings.slot)
        hold_drain_lock(conn, settings.slot)
        batch_id = change_batch_id(start)
        batch_dir = location.batch_dir(settings.slot, batch_id)
        existing = _prepare_staging(location, settings.slot, batch_id)
        if existing is not None:
            manifest = location.read_manifest(batch_dir)
            if manifest.tables or manifest.end_lsn > manifest.start_lsn:
                log.info("reusing complete staged batch %s (%s..%s)", batch_id, start, manifest.end_lsn)
                uri = location.uri_of(existing)
                return DrainResult(manifest, uri, location.uri_of(batch_dir), reused=True)
            # Empty and ending where it starts (an idle source): nothing of it can be applied, and reused
            # it would end every later drain at the same LSN, so the slot would never move again.
            location.delete_dir(batch_dir)
            _prepare_staging(location, settings.slot, batch_id)
        bound, capped = _bound(conn, start, settings.max_bytes, failover=slot.failover)
        log.info("draining slot %s from %s up to %s via %s", settings.slot, start, bound, settings.transport)
        started = time.monotonic()
        stager = BatchStager(location, batch_dir)
        try:
            result, decoded_end = read_and_stage(params, conn, settings, start, bound, stager)
            tables = record_catalog_facts(conn, location, batch_dir, stager.close(), settings.transforms)
            if slot.in_recovery:
                check_not_promoted(conn, settings.slot, start)
        except BaseException:
            stager.abort()
            location.delete_dir(batch_dir)
            raise
        end = decoded_end if result.truncated and decoded_end is not None else bound
        manifest = Manifest(
            kind="batch",
            slot=settings.slot,
            database=conn.get_dsn_parameters()["dbname"],
            batch_id=batch_id,
            start_lsn=start,
            end_lsn=max(end, start),
            tables=tuple(tables),
            stats=ManifestStats(
                changes=sum(t.rows for t in tables),
                transactions=result.extra.get("transactions", 0),
                bytes=result.bytes,
                seconds=round(time.monotonic() - started, 3),
                newest_commit_time=result.extra.get("newest_commit_time"),
                full=result.truncated or capped,
            ),
        )
        try:
            path = location.write_manifest(batch_dir, manifest)
        except OSError as exc:  # the batch stays without a manifest: the retry redoes it
            raise stager.write_error(exc) from exc
        log.info(
            "staged batch %s: %s..%s, %d changes in %d transactions, %.1fs",
            batch_id, manifest.start_lsn, manifest.end_lsn, manifest.stats.changes,
            manifest.stats.transactions, manifest.stats.seconds,
        )  # fmt: skip
        return DrainResult(manifest, location.uri_of(path), location.uri_of(batch_dir), reused=False)
    finally:
        conn.close()
