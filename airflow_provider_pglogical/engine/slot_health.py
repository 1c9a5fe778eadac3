"""Slot health: how far behind a replication slot is, and whether PostgreSQL is about to drop its WAL.

A slot nobody drains keeps WAL on the server's disk until the disk fills, or, when
``max_slot_wal_keep_size`` caps it, until PostgreSQL invalidates the slot (``wal_status = lost``)
and every change not yet drained is gone. This module measures a slot (:class:`SlotHealth`) and
judges it with pure functions (:func:`decide`, :func:`wal_safety`, :func:`judge_lag`), so the
sensor, its trigger, the hook and the ``pglogical lag`` CLI all reach the same verdict with the
same message.

The measurement is written once, as a generator of SQL queries (:func:`_assessment`) that does no
I/O itself; :func:`assess_slot` runs it on a blocking psycopg2 connection and
:func:`assess_slot_async` on an asynchronous one (``async_=True``, waited on with the event loop's
``add_reader``/``add_writer``), so a trigger never blocks its event loop.

The age of the lag is the commit time of the oldest change not yet confirmed. It is read without
decoding the backlog: ``pg_logical_slot_peek_binary_changes(slot, NULL, 1, ...)`` stops after the
first transaction that has a published change, and the first row of that transaction is its Begin
message, which carries the commit timestamp. Peeking needs the publication names (pgoutput will not
decode without them), materialises that one transaction on the server, takes the slot for the
duration of the call (a drain starting at that instant gets "slot is active" and should retry), and
counts in ``pg_stat_replication_slots`` like any other decoding.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import itertools
import math
import re
import socket
import struct
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from airflow_provider_pglogical.errors import RECOVERY_DAG, PgLogicalError, SlotLostError, SlotNotFoundError
from airflow_provider_pglogical.replication.connection import libpq_arguments
from airflow_provider_pglogical.replication.publications import publication_names_option
from airflow_provider_pglogical.replication.slots import (
    OUTPUT_PLUGIN,
    SLOTS_QUERY,
    SlotInfo,
    slot_info_from_row,
    validate_slot_name,
)

__all__ = [
    "LagThresholds",
    "Outcome",
    "SlotHealth",
    "SlotLagDecision",
    "SlotStats",
    "WalRetentionError",
    "WalRisk",
    "WalSafety",
    "assess_slot",
    "assess_slot_async",
    "assess_slots",
    "check_threshold_kinds",
    "decide",
    "format_size",
    "judge_lag",
    "parse_duration",
    "parse_size",
    "publication_names_option",
    "stale_warning",
    "wal_safety",
]


class WalRetentionError(PgLogicalError):
    """A slot's WAL is at risk: ``wal_status = unreserved``, or ``safe_wal_size`` is under the floor."""


# --------------------------------------------------------------------------- sizes and durations

_UNITS = {
    "": 1,
    "b": 1,
    "bytes": 1,
    "kb": 1 << 10,
    "mb": 1 << 20,
    "gb": 1 << 30,
    "tb": 1 << 40,
    "pb": 1 << 50,
}
_SIZE_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a PostgreSQL-style size (``"64MB"``, ``"1.5 GB"``, ``"8192"``).

    Templated operator fields arrive as strings, so sizes are accepted in the form an operator
    would type them, with the units ``pg_size_bytes`` knows (powers of 1024).
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        amount = value
    else:
        match = _SIZE_TEXT.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"not a size: {value!r} (use bytes or a number with B, kB, MB, GB, TB or PB)")
        amount = int(float(match.group(1)) * _UNITS[unit])
    if amount < 0:
        raise ValueError(f"a size cannot be negative: {value!r}")
    return amount


_PRETTY_UNITS = (("bytes", 1), ("kB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("TB", 1 << 40))


def format_size(num_bytes: int | None) -> str:
    """A byte count as ``pg_size_pretty`` prints it (``"12 MB"``, a unit from 10 of it on), or ``"-"``."""
    if num_bytes is None:
        return "-"
    for (unit, size), (_, next_size) in itertools.pairwise(_PRETTY_UNITS):
        if abs(num_bytes) < 10 * next_size:
            return f"{round(num_bytes / size)} {unit}"
    unit, size = _PRETTY_UNITS[-1]
    return f"{round(num_bytes / size)} {unit}"


def parse_duration(value: timedelta | float | str) -> timedelta:
    """A ``timedelta`` from itself, from seconds, or from a string of seconds (templated fields)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    else:
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"not a duration: {value!r} (use a timedelta or a number of seconds)") from None
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number of seconds >= 0: {value!r}")
    return timedelta(seconds=seconds)


def _format_age(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    if seconds < 120:
        return f"{age.total_seconds():.1f}s"
    if seconds < 7200:
        return f"{seconds // 60}min {seconds % 60}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60}min"


# --------------------------------------------------------------------------- the measurement


@dataclass(frozen=True, slots=True)
class SlotStats:
    """The slot's row of ``pg_stat_replication_slots``: how decoding it has spilled and streamed.

    ``spill_*`` grow when a transaction's changes outgrow ``logical_decoding_work_mem`` and are
    written to disk under ``pg_replslot``; ``stream_*`` when they are streamed in progress
    (protocol 2+ with ``streaming``). ``total_*`` count every decoded transaction, peeks included.
    """

    spill_txns: int
    spill_count: int
    spill_bytes: int
    stream_txns: int
    stream_count: int
    stream_bytes: int
    total_txns: int
    total_bytes: int
    stats_reset: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "spill_txns": self.spill_txns,
            "spill_count": self.spill_count,
            "spill_bytes": self.spill_bytes,
            "stream_txns": self.stream_txns,
            "stream_count": self.stream_count,
            "stream_bytes": self.stream_bytes,
            "total_txns": self.total_txns,
            "total_bytes": self.total_bytes,
            "stats_reset": None if self.stats_reset is None else self.stats_reset.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """One slot, measured: its ``pg_replication_slots`` row plus what judging its health needs.

    :param slot: the slot's row and the server's WAL position (``lag_bytes``, ``retained_bytes``).
    :param checked_at: the server's clock when measured (ages are taken on the server's clock).
    :param max_slot_wal_keep_size: the cap on WAL a slot may hold, in bytes; ``None`` is unlimited.
    :param current_database: the database measured from (a slot is only peekable from its own).
    :param inactive_since: when the slot was last released (PostgreSQL 17+; ``None`` before).
    :param stats: spill/stream counters; ``None`` when the server has no row for the slot yet.
    :param oldest_unconfirmed_commit: commit time of the oldest change not yet confirmed,
        ``None`` when nothing is pending or it was not measured.
    :param lag_age: ``checked_at - oldest_unconfirmed_commit``; zero when nothing is pending,
        ``None`` when not measured (``age_unknown_reason`` says why).
    """

    slot: SlotInfo
    checked_at: datetime
    max_slot_wal_keep_size: int | None
    current_database: str
    inactive_since: datetime | None = None
    stats: SlotStats | None = None
    oldest_unconfirmed_commit: datetime | None = None
    lag_age: timedelta | None = None
    age_unknown_reason: str | None = None

    @property
    def slot_name(self) -> str:
        return self.slot.slot_name

    @property
    def lag_bytes(self) -> int | None:
        return self.slot.lag_bytes

    @property
    def retained_bytes(self) -> int | None:
        return self.slot.retained_bytes

    @property
    def idle_for(self) -> timedelta | None:
        """How long nobody has read the slot: since ``inactive_since`` (17+), else the lag's age.

        Before PostgreSQL 17 the server does not record when a slot was last used; the age of the
        oldest change still waiting is then the best available lower bound of the idle time.
        """
        if self.slot.active:
            return timedelta(0)
        if self.inactive_since is not None:
            return max(timedelta(0), self.checked_at - self.inactive_since)
        return self.lag_age

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for XCom, trigger events and ``pglogical lag --json``)."""
        data = self.slot.as_dict()
        data.update(
            checked_at=self.checked_at.isoformat(),
            max_slot_wal_keep_size=self.max_slot_wal_keep_size,
            current_database=self.current_database,
            inactive_since=None if self.inactive_since is None else self.inactive_since.isoformat(),
            stats=None if self.stats is None else self.stats.as_dict(),
            oldest_unconfirmed_commit=(
                None if self.oldest_unconfirmed_commit is None else self.oldest_unconfirmed_commit.isoformat()
            ),
            lag_age_seconds=None if self.lag_age is None else self.lag_age.total_seconds(),
            age_unknown_reason=self.age_unknown_reason,
        )
        return data


_Rows = list[tuple[Any, ...]]
_Query = tuple[str, Sequence[Any] | Mapping[str, Any] | None]
_T = TypeVar("_T")

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
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_BEGIN = struct.Struct("!BQqI")


def _begin_commit_time(data: bytes) -> datetime:
    """The commit time in a pgoutput Begin message (the first row of a peeked transaction).

    Begin is ``'B'``, Int64 final LSN, Int64 commit time (microseconds since 2000-01-01 UTC),
    Int32 xid. It is unpacked here rather than by ``pgoutput.PgOutputDecoder`` because importing
    the ``pgoutput`` package loads pyarrow and numpy, a second of DAG-parse time for every DAG
    that uses the sensor.
    """
    if len(data) != _BEGIN.size or data[0] != ord("B"):
        raise PgLogicalError(
            f"expected a {_BEGIN.size}-byte Begin message first in a peeked transaction, "
            f"got {bytes(data[:32])!r}"
        )
    _, _, commit_time, _ = _BEGIN.unpack(data)
    return _PG_EPOCH + timedelta(microseconds=commit_time)


def _stats(row: tuple[Any, ...] | None) -> tuple[datetime | None, SlotStats | None]:
    if row is None:
        return None, None
    inactive_since, counters = row[1], row[2:]
    if counters[0] is None:
        return inactive_since, None
    spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes, txns, total, reset = (
        counters
    )
    return inactive_since, SlotStats(
        int(spill_txns), int(spill_count), int(spill_bytes), int(stream_txns), int(stream_count),
        int(stream_bytes), int(txns), int(total), reset,
    )  # fmt: skip


def _peek_refusal(slot: SlotInfo, current_database: str, publications: Sequence[str]) -> str | None:
    """Why the slot's oldest pending change cannot be peeked now, or ``None`` if it can."""
    if not publications:
        return "no publications given (the age of the lag needs them to decode)"
    if slot.slot_type != "logical" or slot.plugin != OUTPUT_PLUGIN:
        return f"not a logical {OUTPUT_PLUGIN} slot"
    if slot.database != current_database:
        return f"the slot belongs to database {slot.database!r}; connect to it to measure the age"
    if slot.wal_status == "lost":
        return "the slot is lost: its changes can no longer be read"
    if slot.active:
        return (
            f"the slot is active (pid {slot.active_pid}): another consumer is reading it, and only one "
            "process may hold a slot, so its oldest pending change cannot be peeked until it lets go"
        )
    return None


def _assessment(
    slot_name: str | None, publications: Sequence[str], previous: SlotHealth | None = None
) -> Generator[_Query, _Rows, list[SlotHealth]]:
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
            f"{', '.join(existing) or 'none'}). If it was dropped, run the {RECOVERY_DAG} DAG: it creates "
            "the slot again and reloads every published table."
        )
    (keep_size, current_database, checked_at), *_ = yield _CONTEXT_SQL, None
    stats = {row[0]: row for row in (yield _STATS_SQL, {"slot": slot_name})}
    healths = []
    for slot in slots:
        inactive_since, slot_stats = _stats(stats.get(slot.slot_name))
        health = SlotHealth(
            slot,
            checked_at,
            None if keep_size < 0 else keep_size,
            current_database,
            inactive_since,
            slot_stats,
        )
        healths.append((yield from _with_age(health, publications, previous)))
    return healths


def _with_age(
    health: SlotHealth, publications: Sequence[str], previous: SlotHealth | None
) -> Generator[_Query, _Rows, SlotHealth]:
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
        and slot.wal_status != "lost"
    ):
        return _aged(health, previous.oldest_unconfirmed_commit, health.checked_at)
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
            return _aged(health, _begin_commit_time(bytes(data)), decoded_at)
    return replace(health, age_unknown_reason=reason)


def _aged(health: SlotHealth, commit: datetime, now: datetime) -> SlotHealth:
    return replace(health, oldest_unconfirmed_commit=commit, lag_age=max(timedelta(0), now - commit))


def _first_line(exc: psycopg2.Error) -> str:
    text = (exc.pgerror or str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _drive(conn: Any, steps: Generator[_Query, _Rows, _T]) -> _T:
    """Run a query generator on a blocking connection (autocommit, so a failed peek aborts nothing)."""
    try:
        query = next(steps)
        while True:
            try:
                with conn.cursor() as cur:
                    cur.execute(*query)
                    rows = list(cur.fetchall()) if cur.description else []
            except psycopg2.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
    except StopIteration as stop:
        result: _T = stop.value
        return result


def assess_slot(
    conn: Any, slot_name: str, publications: Sequence[str] = (), *, previous: SlotHealth | None = None
) -> SlotHealth:
    """Measure one slot on an autocommit psycopg2 connection to the slot's database.

    With ``publications`` the age of the lag is measured too (by peeking, see the module doc);
    pass the ``previous`` measurement of a repeated check to skip the peek while the slot's
    confirmed position has not moved. Raises ``SlotNotFoundError`` when the slot does not exist.
    """
    return _drive(conn, _assessment(slot_name, publications, previous))[0]


def assess_slots(conn: Any, publications: Sequence[str] = ()) -> list[SlotHealth]:
    """Measure every slot of the server (ages only for this database's slots, with ``publications``)."""
    return _drive(conn, _assessment(None, publications))


# --------------------------------------------------------------------------- asynchronous driver


async def _wait(conn: Any) -> None:
    """Wait for an asynchronous psycopg2 connection to finish its current step, without blocking.

    ``poll()`` says whether libpq next needs the socket readable or writable; the event loop's
    reader/writer callbacks resolve a future when it is. The socket is read anew at each step
    because libpq may change it while connecting.
    """
    loop = asyncio.get_running_loop()
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        fd = conn.fileno()
        ready: asyncio.Future[None] = loop.create_future()

        def wake(future: asyncio.Future[None] = ready) -> None:
            if not future.done():
                future.set_result(None)

        if state == psycopg2.extensions.POLL_READ:
            loop.add_reader(fd, wake)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
        elif state == psycopg2.extensions.POLL_WRITE:
            loop.add_writer(fd, wake)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
        else:
            raise psycopg2.OperationalError(f"unexpected psycopg2 poll state {state}")


async def _resolved(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the host name resolved through the event loop into ``hostaddr``.

    libpq resolves a host name inside ``PQconnectStart`` with a blocking ``getaddrinfo``; handing
    it the addresses keeps the connect non-blocking. Every address is kept (``host`` repeated to
    match, as libpq's multi-host syntax wants), so libpq still tries the next one when the first
    refuses, and ``host`` still names the server for TLS verification. Sockets, literal addresses
    and multi-host lists are passed through unchanged.
    """
    resolved = dict(params)
    host = str(params.get("host") or "")
    if not host or "hostaddr" in params or host.startswith("/") or "," in host:
        return resolved
    try:
        ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, params.get("port") or 5432, type=socket.SOCK_STREAM
        )
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        resolved["host"] = ",".join([host] * len(addresses))
        resolved["hostaddr"] = ",".join(addresses)
    return resolved


async def _aconnect(params: Mapping[str, Any], timeout: float) -> Any:
    """An asynchronous psycopg2 connection with the package's session settings and keepalives.

    libpq ignores ``connect_timeout`` in non-blocking mode, so the wait is bounded here.
    """
    dsn, kwargs = libpq_arguments(await _resolved(params), {})
    conn = psycopg2.connect(dsn, async_=True, **kwargs)
    try:
        await asyncio.wait_for(_wait(conn), timeout)
    except BaseException:
        conn.close()
        raise
    return conn


async def _adrive(conn: Any, steps: Generator[_Query, _Rows, _T]) -> _T:
    """Run a query generator on an asynchronous connection (always autocommit)."""
    try:
        query = next(steps)
        while True:
            cur = conn.cursor()
            try:
                cur.execute(*query)
                await _wait(conn)
                rows = list(cur.fetchall()) if cur.description else []
            except psycopg2.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
            finally:
                cur.close()
    except StopIteration as stop:
        result: _T = stop.value
        return result


async def assess_slot_async(
    params: Mapping[str, Any],
    slot_name: str,
    publications: Sequence[str] = (),
    *,
    previous: SlotHealth | None = None,
    connect_timeout: float = 30.0,
) -> SlotHealth:
    """:func:`assess_slot` on a fresh asynchronous connection, never blocking the event loop.

    :param params: libpq keywords (as ``PgLogicalHook.connection_params`` returns them).
    """
    conn = await _aconnect(params, connect_timeout)
    try:
        return (await _adrive(conn, _assessment(slot_name, publications, previous)))[0]
    finally:
        conn.close()


# --------------------------------------------------------------------------- the judgement


@dataclass(frozen=True, slots=True)
class LagThresholds:
    """When a lag sensor fires: either once enough has piled up, or once the slot has caught up.

    ``min_*`` thresholds ("piled up", worth a drain) fire when ANY of them is reached; ``max_*``
    thresholds ("caught up", e.g. before a cut-over) fire when ALL of them hold. The two kinds do
    not mix: a window between them is not a lag condition anyone gates on, and mixing them would
    make the any/all reading ambiguous.
    """

    min_lag_bytes: int | None = None
    max_lag_bytes: int | None = None
    min_lag_age: timedelta | None = None
    max_lag_age: timedelta | None = None

    def __post_init__(self) -> None:
        check_threshold_kinds(
            min_lag_bytes=self.min_lag_bytes,
            max_lag_bytes=self.max_lag_bytes,
            min_lag_age=self.min_lag_age,
            max_lag_age=self.max_lag_age,
        )

    @classmethod
    def parse(
        cls,
        *,
        min_lag_bytes: int | str | None = None,
        max_lag_bytes: int | str | None = None,
        min_lag_age: timedelta | float | str | None = None,
        max_lag_age: timedelta | float | str | None = None,
    ) -> LagThresholds:
        """Thresholds from the loose forms operator fields take after templating."""
        return cls(
            None if min_lag_bytes is None else parse_size(min_lag_bytes),
            None if max_lag_bytes is None else parse_size(max_lag_bytes),
            None if min_lag_age is None else parse_duration(min_lag_age),
            None if max_lag_age is None else parse_duration(max_lag_age),
        )

    @property
    def fires_when_caught_up(self) -> bool:
        return self.max_lag_bytes is not None or self.max_lag_age is not None

    @property
    def needs_age(self) -> bool:
        return self.min_lag_age is not None or self.max_lag_age is not None


def check_threshold_kinds(**thresholds: object) -> None:
    """Raise ``ValueError`` unless at least one threshold is set and min/max kinds are not mixed.

    Works on unrendered values too (only ``None``-ness matters), so operators check at DAG parse.
    """
    given = {name for name, value in thresholds.items() if value is not None}
    if not given:
        raise ValueError("set at least one of min_lag_bytes, max_lag_bytes, min_lag_age, max_lag_age")
    if any(name.startswith("min_") for name in given) and any(name.startswith("max_") for name in given):
        raise ValueError(
            f"min_* and max_* thresholds cannot be combined (got {', '.join(sorted(given))}): min_* fire "
            "when enough lag has piled up, max_* when the slot has caught up; use two sensors for both"
        )


def judge_lag(health: SlotHealth, thresholds: LagThresholds) -> tuple[bool, str]:
    """Whether the lag has crossed the thresholds, and a sentence saying where it stands."""
    lag = health.lag_bytes
    if lag is None:
        raise PgLogicalError(
            f"slot {health.slot_name!r} has no confirmed position (a {health.slot.slot_type} slot): "
            "lag is only defined for logical slots"
        )
    age = health.lag_age
    age_text = "unknown" if age is None else _format_age(age)
    checks: list[tuple[bool, str]] = []
    if thresholds.min_lag_bytes is not None:
        checks.append(
            (
                lag >= thresholds.min_lag_bytes,
                f"lag {format_size(lag)} >= {format_size(thresholds.min_lag_bytes)}",
            )
        )
    if thresholds.max_lag_bytes is not None:
        checks.append(
            (
                lag <= thresholds.max_lag_bytes,
                f"lag {format_size(lag)} <= {format_size(thresholds.max_lag_bytes)}",
            )
        )
    if thresholds.min_lag_age is not None:
        met = age is not None and age >= thresholds.min_lag_age
        checks.append((met, f"age {age_text} >= {_format_age(thresholds.min_lag_age)}"))
    if thresholds.max_lag_age is not None:
        met = age is not None and age <= thresholds.max_lag_age
        checks.append((met, f"age {age_text} <= {_format_age(thresholds.max_lag_age)}"))
    met = all(ok for ok, _ in checks) if thresholds.fires_when_caught_up else any(ok for ok, _ in checks)
    parts = "; ".join(f"{text}: {'yes' if ok else 'no'}" for ok, text in checks)
    verdict = "threshold crossed" if met else "waiting"
    return met, f"slot {health.slot_name!r} {verdict} ({parts})"


class WalRisk(enum.StrEnum):
    OK = "ok"
    AT_RISK = "at_risk"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class WalSafety:
    """How safe the slot's WAL is, and the message that says what to do about it."""

    risk: WalRisk
    message: str


def wal_safety(health: SlotHealth, min_safe_wal_bytes: int | None = None) -> WalSafety:
    """Judge ``wal_status`` and ``safe_wal_size`` against ``max_slot_wal_keep_size`` and a floor.

    ``unreserved`` means the slot holds more WAL than ``max_slot_wal_keep_size`` allows and the
    next checkpoint may remove some of it; ``safe_wal_size`` is how much more WAL the server can
    write before that happens. ``lost`` means it has happened.
    """
    slot, name = health.slot, health.slot_name
    keep = (
        "unlimited" if health.max_slot_wal_keep_size is None else format_size(health.max_slot_wal_keep_size)
    )
    pending = format_size(health.lag_bytes)
    if slot.wal_status == "lost":
        return WalSafety(
            WalRisk.LOST,
            f"replication slot {name!r} was invalidated (wal_status = lost): PostgreSQL removed WAL it still "
            f"needed (max_slot_wal_keep_size = {keep}), so the changes not yet drained (about {pending} "
            f"of WAL after its confirmed position {slot.confirmed_flush_lsn}) can no longer be read from it "
            f"and no drain from it can succeed. Recovery: trigger the {RECOVERY_DAG} DAG with this "
            f"pipeline's params (airflow dags trigger {RECOVERY_DAG} --conf '{{\"slot\": "
            f'"{name}", ...}}\'): it recreates the slot with an exported snapshot and reloads every '
            "published table, so the targets are equal again. Then drain more often or raise "
            "max_slot_wal_keep_size so it does not happen again.",
        )
    advice = (
        "Drain the slot now; to buy time, raise the cap if the disk has room "
        f"(ALTER SYSTEM SET max_slot_wal_keep_size = '{_suggested_keep(health)}'; "
        "SELECT pg_reload_conf();)."
    )
    if slot.wal_status == "unreserved":
        return WalSafety(
            WalRisk.AT_RISK,
            f"replication slot {name!r} is unreserved: it holds {format_size(health.retained_bytes)} of WAL, "
            f"more than max_slot_wal_keep_size = {keep} allows, and the next checkpoint may remove WAL it "
            f"needs and invalidate it, losing {pending} of changes not yet drained. {advice}",
        )
    safe = slot.safe_wal_size
    if min_safe_wal_bytes is not None and safe is not None and safe < min_safe_wal_bytes:
        return WalSafety(
            WalRisk.AT_RISK,
            f"replication slot {name!r} is close to being invalidated: only {format_size(safe)} more WAL can "
            f"be written before PostgreSQL may remove WAL it needs (safe_wal_size, floor "
            f"{format_size(min_safe_wal_bytes)}; max_slot_wal_keep_size = {keep}); {pending} of changes "
            f"not yet drained are at risk. {advice}",
        )
    note = f"wal_status {slot.wal_status}, safe_wal_size {format_size(safe)}, max_slot_wal_keep_size {keep}"
    return WalSafety(WalRisk.OK, note)


def _suggested_keep(health: SlotHealth) -> str:
    """A cap to suggest: double what the slot holds (or the current cap), in whole GB (GUC syntax)."""
    base = max(health.retained_bytes or 0, health.max_slot_wal_keep_size or 0, 1)
    return f"{-(-2 * base // (1 << 30))}GB"


def stale_warning(health: SlotHealth, stale_after: timedelta | None) -> str | None:
    """A warning when nobody has read an inactive slot for ``stale_after`` or longer."""
    idle = health.idle_for
    if stale_after is None or health.slot.active or idle is None or idle < stale_after:
        return None
    return (
        f"replication slot {health.slot_name!r} is inactive and stale: nobody has drained it for at least "
        f"{_format_age(idle)} (stale after {_format_age(stale_after)}), and it keeps "
        f"{format_size(health.retained_bytes)} of WAL on the server. Drain it, or drop it if nothing will "
        "ever read it again."
    )


class Outcome(enum.StrEnum):
    """What a lag check concluded; every outcome but ``waiting`` ends a sensor."""

    MET = "met"
    WAITING = "waiting"
    WAL_AT_RISK = "wal_at_risk"
    LOST = "lost"
    SLOT_MISSING = "slot_missing"
    ERROR = "error"


_FAILURES: dict[Outcome, type[PgLogicalError]] = {
    Outcome.WAL_AT_RISK: WalRetentionError,
    Outcome.LOST: SlotLostError,
    Outcome.SLOT_MISSING: SlotNotFoundError,
    Outcome.ERROR: PgLogicalError,
}


@dataclass(frozen=True, slots=True)
class SlotLagDecision:
    """The verdict of one check: outcome, the main message, and warnings to log on the way."""

    outcome: Outcome
    message: str
    warnings: tuple[str, ...] = ()
    health: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def done(self) -> bool:
        return self.outcome is not Outcome.WAITING

    def raise_for_failure(self) -> None:
        """Raise the package error matching a failed outcome (they are not Airflow exceptions, so
        ``soft_fail`` does not turn a lost slot into a skipped task)."""
        error = _FAILURES.get(self.outcome)
        if error is not None:
            raise error(self.message)

    def to_event(self) -> dict[str, Any]:
        """The JSON payload a trigger fires."""
        return {
            "outcome": self.outcome.value,
            "message": self.message,
            "warnings": list(self.warnings),
            "health": self.health,
        }

    @classmethod
    def from_event(cls, event: Mapping[str, Any] | None) -> SlotLagDecision:
        if not event or "outcome" not in event:
            return cls(Outcome.ERROR, f"the slot lag trigger fired an unexpected event: {event!r}")
        return cls(
            Outcome(event["outcome"]),
            str(event["message"]),
            tuple(event.get("warnings") or ()),
            event.get("health"),
        )


def decide(
    health: SlotHealth,
    thresholds: LagThresholds,
    *,
    min_safe_wal_bytes: int | None = None,
    on_wal_risk: str = "fail",
    stale_after: timedelta | None = None,
) -> SlotLagDecision:
    """One check of a lag sensor: WAL safety first (a lost slot always fails), then the thresholds.

    :param on_wal_risk: ``"fail"`` ends the check with ``wal_at_risk``; ``"warn"`` only warns.
    """
    if on_wal_risk not in ("fail", "warn"):
        raise ValueError(f"on_wal_risk must be 'fail' or 'warn', not {on_wal_risk!r}")
    summary = health.as_dict()
    safety = wal_safety(health, min_safe_wal_bytes)
    if safety.risk is WalRisk.LOST:
        return SlotLagDecision(Outcome.LOST, safety.message, health=summary)
    if safety.risk is WalRisk.AT_RISK and on_wal_risk == "fail":
        return SlotLagDecision(Outcome.WAL_AT_RISK, safety.message, health=summary)
    warnings = [safety.message] if safety.risk is WalRisk.AT_RISK else []
    stale = stale_warning(health, stale_after)
    if stale:
        warnings.append(stale)
    if thresholds.needs_age and health.lag_age is None:
        warnings.append(
            f"slot {health.slot_name!r}: the age of its lag is unknown: {health.age_unknown_reason}"
        )
    try:
        met, message = judge_lag(health, thresholds)
    except PgLogicalError as exc:
        return SlotLagDecision(Outcome.ERROR, str(exc), tuple(warnings), summary)
    return SlotLagDecision(Outcome.MET if met else Outcome.WAITING, message, tuple(warnings), summary)
