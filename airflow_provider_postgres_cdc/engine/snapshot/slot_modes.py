"""Where a snapshot's slot comes from: the three slot modes, and undoing a slot a failed run created.

An initial snapshot creates the pipeline's slot, a re-snapshot borrows a temporary one beside it,
and a recovery recreates a lost one. Each mode refuses the slot states it must not touch, before
anything is created, with the procedure that fits instead.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_postgres_cdc.engine.choices import SlotMode
from airflow_provider_postgres_cdc.errors import (
    BACKFILL,
    RECOVERY,
    ServerFeatureError,
    SlotActiveError,
    SlotExistsError,
    SlotLostError,
    SlotNotFoundError,
)
from airflow_provider_postgres_cdc.replication import connect
from airflow_provider_postgres_cdc.replication.connection import ConnParams
from airflow_provider_postgres_cdc.replication.features import FAILOVER_SLOTS, require, supports
from airflow_provider_postgres_cdc.replication.slots import describe_slot, drop_slot

log = logging.getLogger(__name__)


def temporary_slot_name(slot: str, backend_pid: int) -> str:
    """A re-snapshot's temporary slot: the pipeline slot's name, ``_rs_`` and the holder's pid.

    The pid keeps two re-snapshots of one pipeline apart; the name fits PostgreSQL's 63 bytes.
    """
    suffix = f"_rs_{backend_pid}"
    return slot[: 63 - len(suffix)] + suffix


def prepare_slot(catalog: Any, slot: str, slot_mode: SlotMode, *, recreate_slot: bool = False) -> None:
    """Check ``slot`` fits ``slot_mode`` (see :class:`~.run.SnapshotRun`), dropping it where the mode
    recreates it: a lost slot in ``"recover"``, any slot in ``"create"`` with ``recreate_slot``."""
    try:
        existing = describe_slot(catalog, slot)
    except SlotNotFoundError as exc:
        if slot_mode == "temporary":
            raise SlotNotFoundError(
                f"{exc} A re-snapshot continues an existing pipeline: recreate its slot and reload "
                f"every table with {RECOVERY}."
            ) from None
        return
    if slot_mode == "temporary":
        if existing.invalidated:
            raise SlotLostError(
                f"replication slot {slot!r} was invalidated ({existing.invalidation_reason}): it "
                "cannot deliver its changes any more: re-snapshotting some tables cannot repair the "
                f"others; run {RECOVERY}, which recreates the slot and reloads every table"
            )
        return
    if slot_mode == "recover":
        if not existing.invalidated:
            raise SlotExistsError(
                f"replication slot {slot!r} exists and is healthy (wal_status = "
                f"{existing.wal_status}, confirmed up to {existing.confirmed_flush_lsn}): there is "
                "nothing to recover. To reload tables while it runs, re-snapshot them with "
                f"{BACKFILL}."
            )
        log.warning(
            "slot %s was invalidated (%s): dropping it to recreate it and reload every table",
            slot, existing.invalidation_reason,
        )  # fmt: skip
        drop_slot(catalog, slot)
        return
    if not recreate_slot:
        raise SlotExistsError(
            f"replication slot {slot!r} already exists (confirmed up to "
            f"{existing.confirmed_flush_lsn}); "
            "the initial snapshot creates its slot. To snapshot again use the backfill/re-snapshot, or "
            "pass recreate_slot=True to drop it (its unconsumed changes are lost) and start over."
        )
    log.warning("dropping existing slot %s to recreate it (recreate_slot=True)", slot)
    drop_slot(catalog, slot)


def wants_failover(catalog: Any, slot: str, failover: bool | None) -> bool:
    """``failover`` resolved against the server: ``None`` means "where available".

    A slot created on a standby cannot be a failover slot: only a primary's are synchronized.
    """
    with catalog.cursor() as cur:
        cur.execute("SELECT pg_is_in_recovery()")
        on_standby = bool(cur.fetchone()[0])
    if failover is None:
        return supports(catalog, FAILOVER_SLOTS) and not on_standby
    if failover:
        require(catalog, FAILOVER_SLOTS)
        if on_standby:
            raise ServerFeatureError(
                f"slot {slot!r} cannot be a failover slot: this server is a standby, and only a "
                "primary's slots are synchronized to standbys. Take the snapshot on the primary, or "
                "pass failover=False to keep the slot on this standby."
            )
    return failover


def await_temporary_slot_gone(conn: Any, slot: str, timeout: float = 10.0) -> None:
    """Wait until PostgreSQL has dropped a re-snapshot's temporary slot after its holder closed.

    The slot goes with the walsender that held it, which exits asynchronously after its connection
    closes: waiting here means a finished or failed re-snapshot leaves no slot of its own behind.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            describe_slot(conn, slot)
        except SlotNotFoundError:
            return
        time.sleep(0.05)
    log.warning(
        "temporary slot %s still exists %.0f s after its snapshot's connection closed; PostgreSQL drops "
        "it when that connection's walsender exits",
        slot, timeout,
    )  # fmt: skip


def drop_created_slot(conn_params: ConnParams, slot: str, timeout: float = 30.0) -> None:
    """Drop the slot a failed run created, waiting for the walsender that held it to let go.

    That walsender exits asynchronously after its connection closes, so the slot stays active
    for a moment.
    """
    conn = connect(conn_params)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if drop_slot(conn, slot):
                    log.info("dropped slot %s of the failed snapshot", slot)
                return
            except SlotActiveError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        conn.close()
