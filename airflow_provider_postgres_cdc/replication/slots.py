"""Logical replication slots (pgoutput): create, describe, measure lag, advance, drop.

Slot names are validated the way PostgreSQL validates them (lower-case letters, digits and
underscores, at most 63 bytes) before any SQL is built, and are then passed as literals or
quoted identifiers, so a hostile name is rejected, never executed.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from airflow_provider_postgres_cdc.errors import (
    INITIAL_SNAPSHOT,
    RECOVERY,
    SlotActiveError,
    SlotAdvanceError,
    SlotExistsError,
    SlotLostError,
    SlotNotFoundError,
    SlotShortOfBatchError,
)
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication.features import FAILOVER_SLOTS, require

OUTPUT_PLUGIN = "pgoutput"
SNAPSHOT_HOLDER_OPTIONS = "-c idle_in_transaction_session_timeout=0"
"""libpq ``options`` for the connection that holds an exported snapshot: that timeout would end
the idle walsender, and the snapshot with it, in the middle of a long copy."""
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


def validate_slot_name(name: str) -> str:
    """Return ``name`` if PostgreSQL would accept it as a slot name, else raise ``ValueError``."""
    if not _SLOT_NAME.match(name):
        raise ValueError(
            f"invalid replication slot name {name!r}: use 1 to 63 lower-case letters, digits or underscores"
        )
    return name


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    """What creating a slot returns: its consistent point and, if exported, the snapshot name."""

    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None
    output_plugin: str


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A row of ``pg_replication_slots`` plus the server's current WAL position."""

    slot_name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    safe_wal_size: int | None
    two_phase: bool
    current_wal_lsn: Lsn
    failover: bool = False
    synced: bool = False
    invalidation_reason: str | None = None
    in_recovery: bool = False

    @property
    def invalidated(self) -> bool:
        """Whether the server invalidated the slot: it can never be read again."""
        return self.invalidation_reason is not None or self.wal_status == "lost"

    @property
    def lag_bytes(self) -> int | None:
        """WAL written since the slot's confirmed position: what a drain still has to read."""
        if self.confirmed_flush_lsn is None:
            return None
        return max(0, self.current_wal_lsn - self.confirmed_flush_lsn)

    @property
    def retained_bytes(self) -> int | None:
        """WAL the slot keeps on the server's disk (from its restart position)."""
        if self.restart_lsn is None:
            return None
        return max(0, self.current_wal_lsn - self.restart_lsn)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("restart_lsn", "confirmed_flush_lsn", "current_wal_lsn"):
            data[key] = None if data[key] is None else str(data[key])
        data["lag_bytes"] = self.lag_bytes
        data["retained_bytes"] = self.retained_bytes
        return data


# Why the server invalidated a slot (pg_replication_slots.invalidation_reason) -> how to prevent it.
INVALIDATION_FIXES: dict[str, str] = {
    "wal_removed": "the WAL it still needed was removed (max_slot_wal_keep_size was exceeded): drain more "
    "often, or raise max_slot_wal_keep_size",
    "rows_removed": "the primary removed catalog rows the slot still needed (a slot on a standby): set "
    "hot_standby_feedback = on on the standby and give it a physical slot on the primary "
    "(primary_slot_name)",
    "wal_level_insufficient": "wal_level on the primary was lowered below 'logical': run \"ALTER SYSTEM "
    "SET wal_level = 'logical';\" on the primary and restart it",
    "idle_timeout": "the slot was idle longer than idle_replication_slot_timeout: schedule the pipeline "
    'more often than that timeout, or raise it ("ALTER SYSTEM SET idle_replication_slot_timeout = 0;" '
    "turns it off)",
}


def invalidation_message(slot: SlotInfo) -> str:
    """What an invalidated slot means, why the server invalidated it, and the fix for that reason."""
    reason = slot.invalidation_reason or "wal_removed"
    why = INVALIDATION_FIXES.get(reason, f"the server gave the reason {reason!r}")
    return (
        f"replication slot {slot.slot_name!r} was invalidated (invalidation_reason = {reason}, wal_status = "
        f"{slot.wal_status}) and cannot be read again: changes were lost. Cause: {why}. Then run the "
        f"{RECOVERY}: it recreates the slot and reloads every table."
    )


def _lsn(value: str | None) -> Lsn | None:
    return None if value is None else Lsn.parse(value)


def create_slot_with_snapshot(
    repl_conn: Any, name: str, *, temporary: bool = False, failover: bool = False
) -> CreatedSlot:
    """``CREATE_REPLICATION_SLOT … LOGICAL pgoutput (SNAPSHOT 'export')`` on a replication connection.

    The exported snapshot stays importable (``SET TRANSACTION SNAPSHOT``) only while
    ``repl_conn`` stays open and runs no other command: the caller keeps it idle for the
    whole copy. A temporary slot disappears with the connection. ``failover`` (PostgreSQL 17+,
    never temporary) lets a standby with ``sync_replication_slots`` keep a copy of the slot.
    """
    validate_slot_name(name)
    if failover:
        require(repl_conn, FAILOVER_SLOTS)
    command = sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL {} (SNAPSHOT 'export'{})").format(
        sql.Identifier(name),
        sql.SQL("TEMPORARY " if temporary else ""),
        sql.Identifier(OUTPUT_PLUGIN),
        sql.SQL(", FAILOVER true" if failover else ""),
    )
    try:
        with repl_conn.cursor() as cur:
            cur.execute(command)
            slot_name, consistent_point, snapshot_name, plugin = cur.fetchone()
    except psycopg2.errors.DuplicateObject as exc:
        raise SlotExistsError(
            f"replication slot {name!r} already exists; drop it first (a re-snapshot drops and recreates it)"
        ) from exc
    return CreatedSlot(slot_name, Lsn.parse(consistent_point), snapshot_name, plugin)


def create_slot(
    conn: Any, name: str, *, temporary: bool = False, two_phase: bool = False, failover: bool = False
) -> CreatedSlot:
    """Create a pgoutput slot through SQL (no exported snapshot); its stream starts now.

    ``failover`` needs PostgreSQL 17 (``ServerFeatureError`` before).
    """
    validate_slot_name(name)
    query = "SELECT slot_name, lsn::text FROM pg_create_logical_replication_slot(%s, %s, %s, %s)"
    arguments: tuple[Any, ...] = (name, OUTPUT_PLUGIN, temporary, two_phase)
    if failover:  # the fifth argument arrived with failover slots (PostgreSQL 17)
        require(conn, FAILOVER_SLOTS)
        query = "SELECT slot_name, lsn::text FROM pg_create_logical_replication_slot(%s, %s, %s, %s, %s)"
        arguments += (True,)
    try:
        with conn.cursor() as cur:
            cur.execute(query, arguments)
            slot_name, lsn = cur.fetchone()
    except psycopg2.errors.DuplicateObject as exc:
        raise SlotExistsError(f"replication slot {name!r} already exists") from exc
    return CreatedSlot(slot_name, Lsn.parse(lsn), None, OUTPUT_PLUGIN)


# failover, synced and invalidation_reason arrived in PostgreSQL 17, conflicting in 16: read through
# to_jsonb so that one query serves 15 to 18 (a missing column reads as NULL).
SLOTS_QUERY = """
SELECT slot_name::text, plugin::text, slot_type, database::text, temporary, active, active_pid,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size, two_phase,
       (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text,
       coalesce((to_jsonb(s) ->> 'failover')::boolean, false),
       coalesce((to_jsonb(s) ->> 'synced')::boolean, false),
       coalesce(to_jsonb(s) ->> 'invalidation_reason',
                CASE WHEN (to_jsonb(s) ->> 'conflicting')::boolean THEN 'rows_removed'
                     WHEN wal_status = 'lost' THEN 'wal_removed' END),
       pg_is_in_recovery()
FROM pg_replication_slots s
"""


def slot_info_from_row(row: tuple[Any, ...]) -> SlotInfo:
    (
        name,
        plugin,
        slot_type,
        database,
        temporary,
        active,
        pid,
        restart,
        confirmed,
        wal_status,
        safe,
        two_phase,
        now,
        failover,
        synced,
        reason,
        in_recovery,
    ) = row
    return SlotInfo(
        name, plugin, slot_type, database, temporary, active, pid, _lsn(restart), _lsn(confirmed),
        wal_status, safe, two_phase, Lsn.parse(now), failover, synced, reason, in_recovery,
    )  # fmt: skip


def list_slots(conn: Any, *, database: str | None = None) -> list[SlotInfo]:
    """All slots of the server, or of one database, sorted by name."""
    query = SLOTS_QUERY + (" WHERE database = %s" if database else "") + " ORDER BY slot_name"
    with conn.cursor() as cur:
        cur.execute(query, (database,) if database else None)
        return [slot_info_from_row(row) for row in cur.fetchall()]


def describe_slot(conn: Any, name: str) -> SlotInfo:
    """One slot's state; ``SlotNotFoundError`` names the slots that do exist."""
    validate_slot_name(name)
    with conn.cursor() as cur:
        cur.execute(SLOTS_QUERY + " WHERE slot_name = %s", (name,))
        row = cur.fetchone()
    if row is None:
        database = conn.get_dsn_parameters().get("dbname")
        existing = [slot.slot_name for slot in list_slots(conn, database=database)]
        raise SlotNotFoundError(
            f"replication slot {name!r} does not exist in database {database!r} "
            f"(its slots: {', '.join(existing) or 'none'}). "
            f"A new pipeline creates it with {INITIAL_SNAPSHOT}; if a "
            f"running pipeline's slot was dropped, run {RECOVERY}, which recreates it and "
            "reloads every table. If this server was promoted from a standby, the slot was not a "
            "sync-ready failover slot there at the promotion ('pgcdc check --slot-name' on a standby "
            f"says so beforehand): run {RECOVERY} against this server."
        )
    return slot_info_from_row(row)


def slot_lag_bytes(conn: Any, name: str) -> int:
    """``pg_current_wal_lsn() - confirmed_flush_lsn`` in bytes."""
    lag = describe_slot(conn, name).lag_bytes
    if lag is None:
        raise SlotNotFoundError(f"slot {name!r} is not a logical slot with a confirmed position")
    return lag


# On a hot standby (PostgreSQL 16+ decodes there) the WAL that can be decoded is what was replayed.
_DECODABLE_END_SQL = (
    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
    "ELSE pg_current_wal_flush_lsn() END)::text"
)


def decodable_end(conn: Any) -> Lsn:
    """The end of the WAL a slot can decode now: flushed on a primary, replayed on a standby."""
    with conn.cursor() as cur:
        cur.execute(_DECODABLE_END_SQL)
        return Lsn.parse(cur.fetchone()[0])


def advance_slot(conn: Any, name: str, lsn: Lsn, *, whole: bool = False) -> Lsn:
    """Move the slot's confirmed position forward to ``lsn`` and return where it now stands.

    A target at or behind the current position changes nothing (advancing is idempotent,
    and a slot never moves backwards). PostgreSQL stops at the WAL flushed so far (replayed, on a
    standby), so the returned position may be short of a target beyond it; with ``whole`` (the
    ack of a batch ending at ``lsn``) that is refused with :class:`SlotShortOfBatchError` before
    the slot moves. Refuses lost and active slots with specific errors.
    """
    slot = describe_slot(conn, name)
    if slot.invalidated:
        raise SlotLostError(invalidation_message(slot))
    if slot.confirmed_flush_lsn is not None and lsn <= slot.confirmed_flush_lsn:
        return slot.confirmed_flush_lsn
    if whole:
        _refuse_short(name, lsn, decodable_end(conn))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)", (name, str(lsn))
            )
            (end_lsn,) = cur.fetchone()
    except psycopg2.errors.ObjectInUse as exc:
        raise SlotActiveError(
            f"replication slot {name!r} is active (pid {slot.active_pid}); stop the other consumer or wait "
            "for it to finish before advancing"
        ) from exc
    except psycopg2.Error as exc:
        raise SlotAdvanceError(f"could not advance slot {name!r} to {lsn}: {exc.pgerror or exc}") from exc
    position = Lsn.parse(end_lsn)
    if whole:
        _refuse_short(name, lsn, position)
    return position


def _refuse_short(name: str, batch_end: Lsn, reachable: Lsn) -> None:
    """Refuse an ack whose slot would stop at ``reachable``, before the end of its batch.

    The batch was read from WAL this server does not have: another server (a primary that died
    before its standby received its last transactions), so the lake holds changes this one never
    had, and moving the slot to where its WAL ends would skip the transactions it writes there next.
    """
    if reachable >= batch_end:
        return
    raise SlotShortOfBatchError(
        f"slot {name!r} would end at {reachable}, short of the batch's end {batch_end}: this server's "
        "WAL ends before the batch does, so the batch was drained from another server (a primary "
        "that died before this standby received its last transactions?) and the lake holds changes "
        "this server never had. The slot is not acknowledged. Point the connection at the server the "
        "batch was drained from; if that server is gone, the lake must be reloaded from this one: "
        f"drop the slot (SELECT pg_drop_replication_slot('{name}')) and run {RECOVERY}"
    )


DRAIN_LOCK_GRACE_SECONDS = 5.0
_DRAIN_LOCK = "SELECT hashtextextended('airflow_provider_postgres_cdc drain of ' || %s, 0)"


def hold_drain_lock(conn: Any, name: str) -> None:
    """Make ``conn`` the one drain of slot ``name`` until it closes, or raise ``SlotActiveError``.

    The peek reads a temporary copy of the slot, so the slot itself no longer shows a drain as
    its active consumer; this session-level advisory lock does, and the server releases it
    when the connection ends, however it ends. A drain that has just ended (a retry right after
    a failed attempt) may still hold it while its backend exits, so a held lock is retried for
    ``DRAIN_LOCK_GRACE_SECONDS`` before the drain gives up.
    """
    deadline = time.monotonic() + DRAIN_LOCK_GRACE_SECONDS
    with conn.cursor() as cur:
        while True:
            cur.execute(f"SELECT pg_try_advisory_lock(({_DRAIN_LOCK}))", (name,))
            if cur.fetchone()[0]:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        cur.execute(
            "SELECT min(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            f"AND (classid::bigint << 32) | objid::bigint = ({_DRAIN_LOCK})",
            (name,),
        )
        (pid,) = cur.fetchone()
    raise SlotActiveError(
        f"another drain is reading replication slot {name!r} (backend pid {pid}): one drain per slot at a "
        "time; run the pipeline with max_active_runs=1, or wait for that drain to finish."
    )


def drop_slot(conn: Any, name: str, *, if_exists: bool = True) -> bool:
    """Drop a slot; returns whether one was dropped. An active slot raises ``SlotActiveError``."""
    validate_slot_name(name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg2.errors.UndefinedObject as exc:
        if if_exists:
            return False
        raise SlotNotFoundError(f"replication slot {name!r} does not exist") from exc
    except psycopg2.errors.ObjectInUse as exc:
        raise SlotActiveError(
            f"replication slot {name!r} is in use by another connection; stop that consumer first"
        ) from exc
    return True
