"""What a pipeline report holds: plain frozen values, JSON-ready, with every gap said in words.

A report is assembled from three sources that fail independently (the source server, the lake,
the Airflow metadata of acks), so each part carries either its numbers or a ``problem`` message;
a value that a source does not record yet is ``None`` and shown as "unknown", never guessed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["AckPoint", "BatchRow", "CutRow", "LakeTableRow", "PipelineReport", "SlotRow"]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True, slots=True)
class AckPoint:
    """One acknowledged batch as the orchestrator saw it (the cut Asset's event; Airflow-free here).

    :param end_lsn: the batch's end LSN (PostgreSQL text), which joins it to the lake's batch.
    :param acked_at: when the slot was advanced past it.
    :param latency_seconds: commit time of the batch's newest change to its ack, when known.
    :param lag_bytes: the slot's lag measured right after the ack, when known.
    """

    end_lsn: str
    acked_at: datetime
    latency_seconds: float | None = None
    lag_bytes: int | None = None
    batch_id: str | None = None

    @classmethod
    def from_event(cls, extra: Mapping[str, Any], fallback_time: datetime) -> AckPoint | None:
        """From a cut event's ``extra`` (the ack's summary keys); None when it names no end LSN."""
        end_lsn = extra.get("end_lsn") or extra.get("lsn")
        if not isinstance(end_lsn, str):
            return None
        acked_at = fallback_time
        if isinstance(extra.get("acked_at"), str):
            with contextlib.suppress(ValueError):
                acked_at = datetime.fromisoformat(str(extra["acked_at"]).replace("Z", "+00:00"))
        latency = extra.get("latency_seconds")
        lag = extra.get("lag_bytes")
        batch = extra.get("batch_id")
        return cls(
            end_lsn=end_lsn,
            acked_at=acked_at,
            latency_seconds=float(latency) if isinstance(latency, int | float) else None,
            lag_bytes=int(lag) if isinstance(lag, int) else None,
            batch_id=str(batch) if batch is not None else None,
        )


@dataclass(frozen=True, slots=True)
class SlotRow:
    """The slot now: lag in bytes and age, WAL status and the room left before ``safe_wal_size`` runs out."""

    measured_at: datetime
    lag_bytes: int | None
    lag_age_seconds: float | None
    age_note: str | None
    wal_status: str | None
    safe_wal_size: int | None
    confirmed_flush_lsn: str | None
    current_wal_lsn: str
    active: bool
    wal_risk: str
    wal_message: str


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch (or snapshot load) of the pipeline, from the commit summaries of the tables it wrote.

    ``changes``, ``apply_seconds`` and ``newest_commit_time`` are None when the commits do not
    record them (commits written before the apply job recorded those keys).
    """

    batch_id: str
    kind: str
    start_lsn: str
    end_lsn: str
    tables: int
    committed_at: datetime
    changes: int | None
    apply_seconds: float | None
    newest_commit_time: datetime | None
    acked_at: datetime | None = None
    latency_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class LakeTableRow:
    """A pipeline table: where the pipeline has brought it, or why it has nothing yet.

    ``name`` is the source's ``schema.table``; ``lake_name`` the lake's ``namespace.table`` when
    the lake's name rule made it differ (docs/LAKE.md, "Names").
    """

    name: str
    applied_end_lsn: str | None
    base_lsn: str | None
    last_batch: str | None
    last_kind: str | None
    rows: int | None
    committed_at: datetime | None
    note: str | None = None
    lake_name: str | None = None


@dataclass(frozen=True, slots=True)
class CutRow:
    """The lake's latest consistent cut: one source LSN at which every pipeline table is tagged."""

    lsn: str
    tag: str
    tables: int


@dataclass(frozen=True, slots=True)
class PipelineReport:
    """A pipeline (slot + lake), measured; ``problems`` lists what could not be read, in words."""

    slot: str
    catalog: str
    generated_at: datetime
    source: SlotRow | None
    batches: tuple[BatchRow, ...] = ()
    tables: tuple[LakeTableRow, ...] = ()
    cut: CutRow | None = None
    lag_history: tuple[tuple[datetime, int], ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (datetimes as ISO text)."""
        data = asdict(self)
        return _jsonable(data)  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value
