"""Measuring a slot: the queries, written once as a generator that does no I/O, and their drivers.

:func:`measure_slots` yields the SQL that measures one slot (or every slot) and is sent the rows
(see :mod:`.drivers` for the protocol); :func:`assess_slot` and :func:`assess_slots` run it on a
blocking psycopg2 connection, :func:`assess_slot_async` on an asynchronous one, so the hook, the
CLI and the trigger take the same measurement.

The age of the lag is the commit time of the oldest change not yet confirmed. It is read without
decoding the backlog: ``pg_logical_slot_peek_binary_changes(slot, NULL, 1, ...)`` stops after the
first transaction that has a published change, and the first row of that transaction is its Begin
message, which carries the commit timestamp. Peeking needs the publication names (pgoutput will not
decode without them), materialises that one transaction on the server, takes the slot for the
duration of the call (a drain starting at that instant gets "slot is active" and should retry), and
counts in ``pg_stat_replication_slots`` like any other decoding.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg2
import psycopg2.errors

from airflow_provider_postgres_cdc.engine.health.drivers import Query, Rows, connect_async, drive, drive_async
from airflow_provider_postgres_cdc.engine.health.model import SlotHealth, SlotStats
from airflow_provider_postgres_cdc.errors import (
    RECOVERY,
    PgOutputDecodeError,
    SlotNotFoundError,
)
from airflow_provider_postgres_cdc.formats.pgtypes import pg_timestamp
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import Begin
from airflow_provider_postgres_cdc.replication.publications import publication_names_option
from airflow_provider_postgres_cdc.replication.slots import (
    OUTPUT_PLUGIN,
    SLOTS_QUERY,
    SlotInfo,
    slot_info_from_row,
    validate_slot_name,
)

__all__ = ["assess_slot", "assess_slot_async", "assess_slots", "begin_commit_time", "measure_slots"]

_CONTEXT_SQL = (
    "SELECT pg_size_bytes(current_setting('max_slot_wal_keep_size')), current_database()::text, "
    "clock_timestamp()"
)
# to_jsonb(s) reads inactive_since where it exists (PostgreSQL 17+) and yields NULL before.
_STATS_SQL = """
SELECT s.slot_name::text, (to_jsonb(s) ->> 'inactive_since')::timestamptz,
       st.spill_txns, st.spill_count, st.spill_bytes, st.stream_txns, st.stream_count, st.stream_bytes,
       st.total_txns, st.total_bytes, st.stats_reset
FROM pg_replication_slots s LEFT JOIN pg_stat_replication_slots st ON st.slot_name = s.slot_name
WHERE %(slot)s::text IS NULL OR s.slot_name = %(slot)s
"""
# upto_nchanges = 1 ends decoding after the first transaction with output; LIMIT 1 keeps the rest
# of that transaction on the server. Only its Begin message is needed, and the clock once decoding
# is over (the function returns its rows only then), so a long peek does not shorten the age.
_PEEK_SQL = (
    "SELECT data, clock_timestamp() FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, "
    "'proto_version', '1', 'publication_names', %s) LIMIT 1"
)


def begin_commit_time(data: bytes) -> datetime:
    """The commit time in a pgoutput Begin message (the first row of a peeked transaction).

    The package's per-message decoder reads it; importing it loads neither numpy nor pyarrow, so
    the sensor and trigger that measure slots stay light to import.
    """
    message = PgOutputDecoder().decode(data)
    if not isinstance(message, Begin):
        raise PgOutputDecodeError(
            f"expected a Begin message first in a peeked transaction, got {type(message).__name__}",
            message_type=chr(data[0]),
            offset=0,
        )
    return pg_timestamp(message.commit_time)


def _slot_stats(row: tuple[Any, ...] | None) -> tuple[datetime | None, SlotStats | None]:
    """The slot's ``inactive_since`` and counters from its row of ``_STATS_SQL`` (``None`` without one)."""
    if row is None:
        return None, None
    inactive_since, *counters, stats_reset = row[1:]
    if counters[0] is None:
        return inactive_since, None
    spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes, total_txns, total_bytes = (
        int(counter) for counter in counters
    )
    return inactive_since, SlotStats(
        spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes,
        total_txns, total_bytes, stats_reset,
    )  # fmt: skip


def _peek_refusal(slot: SlotInfo, current_database: str, publications: Sequence[str]) -> str | None:
    """Why the slot's oldest pending change cannot be peeked now, or ``None`` if it can."""
    if not publications:
        return "no publications given (the age of the lag needs them to decode)"
    if slot.slot_type != "logical" or slot.plugin != OUTPUT_PLUGIN:
        return f"not a logical {OUTPUT_PLUGIN} slot"
    if slot.database != current_database:
        return f"the slot belongs to database {slot.database!r}; connect to it to measure the age"
    if slot.invalidated:
        return f"the slot is invalidated ({slot.invalidation_reason}): its changes can no longer be read"
    if slot.active:
        return (
            f"the slot is active (pid {slot.active_pid}): another consumer is reading it, and only one "
            "process may hold a slot, so its oldest pending change cannot be peeked until it lets go"
        )
    return None


def measure_slots(
    slot_name: str | None, publications: Sequence[str], previous: SlotHealth | None = None
) -> Generator[Query, Rows, list[SlotHealth]]:
    """The queries that measure one slot (or every slot), as a generator that does no I/O.

    It yields ``(sql, params)`` and is sent the result rows; a failed peek is thrown back into it
    (``generator.throw``) and recorded as the reason the age is unknown. A missing named slot
    raises ``SlotNotFoundError`` naming the slots that do exist.
    """
    if slot_name is not None:
        validate_slot_name(slot_name)
    slots_query = SLOTS_QUERY + (" WHERE slot_name = %s" if slot_name else "") + " ORDER BY slot_name"
    slots = [slot_info_from_row(row) for row in (yield slots_query, (slot_name,) if slot_name else None)]
    if slot_name is not None and not slots:
        existing = [
            row[0]
            for row in (
                yield (
                    "SELECT slot_name::text FROM pg_replication_slots "
                    "WHERE database = current_database() ORDER BY 1",
                    None,
                )
            )
        ]
        raise SlotNotFoundError(
            f"replication slot {slot_name!r} does not exist in this database (existing: "
            f"{', '.join(existing) or 'none'}). If it was dropped, run {RECOVERY}: it creates "
            "the slot again and reloads every published table."
        )
    (keep_size, current_database, checked_at), *_ = yield _CONTEXT_SQL, None
    stats_rows = {row[0]: row for row in (yield _STATS_SQL, {"slot": slot_name})}
    healths = []
    for slot in slots:
        inactive_since, slot_stats = _slot_stats(stats_rows.get(slot.slot_name))
        health = SlotHealth(
            slot,
            checked_at,
            None if keep_size < 0 else keep_size,
            current_database,
            inactive_since,
            slot_stats,
        )
        healths.append((yield from _with_lag_age(health, publications, previous)))
    return healths


def _with_lag_age(
    health: SlotHealth, publications: Sequence[str], previous: SlotHealth | None
) -> Generator[Query, Rows, SlotHealth]:
    """``health`` with the age of its lag: from the previous check when still valid, else by peeking.

    The oldest pending transaction stays the same for as long as the slot's confirmed position
    does (new commits only queue behind it), so a commit time found by an earlier check is reused
    instead of decoding that transaction again on every poke, which also leaves the slot free
    for a drain to take.
    """
    slot = health.slot
    if (
        previous is not None
        and previous.slot_name == slot.slot_name
        and previous.oldest_unconfirmed_commit is not None
        and previous.slot.confirmed_flush_lsn == slot.confirmed_flush_lsn
        and not slot.invalidated
    ):
        return _aged_since(health, previous.oldest_unconfirmed_commit, health.checked_at)
    reason = _peek_refusal(slot, health.current_database, publications)
    if reason is None and slot.lag_bytes == 0:
        return replace(health, lag_age=timedelta(0))
    if reason is None:
        try:
            rows = yield _PEEK_SQL, (slot.slot_name, publication_names_option(publications))
        except psycopg2.errors.ObjectInUse as exc:
            reason = f"the slot became active while peeking ({_first_line(exc)})"
        except psycopg2.Error as exc:
            reason = f"peeking the slot failed: {_first_line(exc)}"
        else:
            if not rows:  # no published change is pending
                return replace(health, lag_age=timedelta(0))
            data, decoded_at = rows[0]
            return _aged_since(health, begin_commit_time(bytes(data)), decoded_at)
    return replace(health, age_unknown_reason=reason)


def _aged_since(health: SlotHealth, commit: datetime, now: datetime) -> SlotHealth:
    return replace(health, oldest_unconfirmed_commit=commit, lag_age=max(timedelta(0), now - commit))


def _first_line(exc: psycopg2.Error) -> str:
    text = (exc.pgerror or str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def assess_slot(
    conn: Any, slot_name: str, publications: Sequence[str] = (), *, previous: SlotHealth | None = None
) -> SlotHealth:
    """Measure one slot on an autocommit psycopg2 connection to the slot's database.

    With ``publications`` the age of the lag is measured too (by peeking, see the module doc);
    pass the ``previous`` measurement of a repeated check to skip the peek while the slot's
    confirmed position has not moved. Raises ``SlotNotFoundError`` when the slot does not exist.
    """
    return drive(conn, measure_slots(slot_name, publications, previous))[0]


def assess_slots(conn: Any, publications: Sequence[str] = ()) -> list[SlotHealth]:
    """Measure every slot of the server (ages only for this database's slots, with ``publications``)."""
    return drive(conn, measure_slots(None, publications))


async def assess_slot_async(
    params: Mapping[str, Any],
    slot_name: str,
    publications: Sequence[str] = (),
    *,
    previous: SlotHealth | None = None,
    connect_timeout: float = 30.0,
) -> SlotHealth:
    """:func:`assess_slot` on a fresh asynchronous connection, never blocking the event loop.

    :param params: libpq keywords (as ``PostgresCdcHook.connection_params`` returns them).
    """
    conn = await connect_async(params, connect_timeout)
    try:
        return (await drive_async(conn, measure_slots(slot_name, publications, previous)))[0]
    finally:
        conn.close()
