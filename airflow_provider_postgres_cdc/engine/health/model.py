"""What a slot health measurement holds: the slot's row, its counters, and the age of its lag.

Plain frozen values with no I/O, so the verdict can be tested without a server and a
measurement travels in trigger events and ``pgcdc lag --json`` as the dict ``as_dict`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_postgres_cdc.replication.slots import SlotInfo

__all__ = ["SlotHealth", "SlotStats"]


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
        """A JSON-ready summary (for XCom, trigger events and ``pgcdc lag --json``)."""
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
