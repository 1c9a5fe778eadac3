"""Collect a pipeline report from the source slot and the lake's Iceberg commit summaries (no Airflow).

Where the numbers come from, so nothing new is stored for the report:

- the slot now: :func:`~airflow_provider_postgres_cdc.engine.health.assess_slot` (lag in bytes, its
  age when publications are given, ``wal_status`` and ``safe_wal_size``);
- the batches: every pipeline commit of every pipeline table carries its batch id, LSN window and
  the changes it applied, when the job started the table and the newest source commit
  time; a batch is the union of its tables' commits. Commits written before those keys existed
  show "unknown", except the change count, which the table's changelog commit also records (its
  ``added-records``: every change lands in the changelog exactly once);
- the tables: the newest pipeline commit of each (applied-end LSN, base LSN, batch) and the
  current snapshot's ``total-records``;
- acks (when the orchestrator passes them in, e.g. from the cut Asset's events): the ack time,
  hence the end-to-end latency, and the slot's lag after each ack, hence the lag over time.

Every way a source can fail ends as a sentence in ``PipelineReport.problems``: a missing slot, a
lake that cannot be opened, a table with no commit yet, a source or lake that does not answer in
``timeout`` seconds ("timed out"). Connection secrets never enter a message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg2
import psycopg2.errors

from airflow_provider_postgres_cdc.engine.health import assess_slot, wal_safety
from airflow_provider_postgres_cdc.engine.lake_catalog import (
    latest_cut,
    lineage,
    open_catalog,
    owned_tables,
    summary_of,
    table_state,
)
from airflow_provider_postgres_cdc.engine.report.model import (
    AckPoint,
    BatchRow,
    CutRow,
    LakeTableRow,
    PipelineReport,
    SlotRow,
)
from airflow_provider_postgres_cdc.errors import LakeCatalogError, SlotNotFoundError
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import connect
from airflow_provider_postgres_cdc.replication.connection import connection_lost_detail

__all__ = ["collect_report", "read_lake", "read_slot"]

# Iceberg's own summary keys.
ADDED_RECORDS, TOTAL_RECORDS = "added-records", "total-records"
POSITION_DELETES, EQUALITY_DELETES = "total-position-deletes", "total-equality-deletes"

DEFAULT_TIMEOUT = 10.0
ResultT = TypeVar("ResultT")


def _within(seconds: float, work: Callable[[], ResultT]) -> ResultT:
    """``work()``, or ``TimeoutError`` after ``seconds``: a hung server must not hang the page.

    The work runs on a daemon thread that is abandoned on timeout (a blocked libpq or catalog
    call cannot be interrupted from outside); libpq's own timeouts end it soon after.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc

    thread = threading.Thread(target=run, name="postgres-cdc-report", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def read_slot(
    params: str | Mapping[str, Any],
    slot: str,
    publications: Sequence[str] = (),
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[SlotRow | None, str | None]:
    """The slot now, or (None, what went wrong). The connection and each statement get ``timeout``."""
    millis = max(1, int(timeout * 1000))

    def measure() -> SlotRow:
        conn = connect(
            params,
            connect_timeout=max(1, int(timeout)),
            options=f"-c statement_timeout={millis}",
            application_name="pgcdc report",
        )
        try:
            health = assess_slot(conn, slot, publications)
        finally:
            conn.close()
        safety = wal_safety(health)
        info = health.slot
        return SlotRow(
            measured_at=health.checked_at,
            lag_bytes=health.lag_bytes,
            lag_age_seconds=None if health.lag_age is None else health.lag_age.total_seconds(),
            age_note=health.age_unknown_reason,
            wal_status=info.wal_status,
            safe_wal_size=info.safe_wal_size,
            confirmed_flush_lsn=None if info.confirmed_flush_lsn is None else str(info.confirmed_flush_lsn),
            current_wal_lsn=str(info.current_wal_lsn),
            active=info.active,
            wal_risk=safety.risk.value,
            wal_message=safety.message,
        )

    try:
        return _within(timeout + 2, measure), None
    except SlotNotFoundError:
        return None, (
            f"replication slot {slot!r} does not exist on the source: check the slot name, or create the "
            "pipeline with its initial snapshot DAG"
        )
    except TimeoutError:
        return None, f"the source did not answer within {timeout:g} s (timed out); its lag is unknown"
    except psycopg2.errors.QueryCanceled:
        return None, f"measuring slot {slot!r} timed out after {timeout:g} s (statement_timeout)"
    except psycopg2.Error as exc:
        detail = connection_lost_detail(exc)[:300]
        if "timeout" in detail.lower():
            return None, f"the source did not answer within {timeout:g} s (timed out: {detail})"
        return None, f"cannot read slot {slot!r} from the source: {detail}"


@dataclass(slots=True)
class _Batch:
    """A batch's commits gathered over its tables (the pieces of a :class:`BatchRow`)."""

    batch_id: str
    kind: str
    start_lsn: Lsn
    end_lsn: Lsn
    tables: set[str] = field(default_factory=set)
    committed_ms: list[int] = field(default_factory=list)
    started_ms: list[int] = field(default_factory=list)
    changes: dict[str, int | None] = field(default_factory=dict)  # table -> changes (None: unknown)
    newest: list[datetime] = field(default_factory=list)

    def add(self, name: str, snapshot: Any, summary: Mapping[str, str]) -> None:
        self.tables.add(name)
        self.committed_ms.append(int(snapshot.timestamp_ms))
        started = _int(summary.get(lake.STARTED_MS))
        if started is not None:
            self.started_ms.append(started)
        counts = [_int(summary.get(key)) for key in (lake.INSERTED, lake.UPDATED, lake.DELETED)]
        if any(count is not None for count in counts):
            self.changes[name] = sum(count or 0 for count in counts)
        elif self.kind == "snapshot":
            self.changes[name] = _int(summary.get(ADDED_RECORDS))  # a load adds exactly its rows
        else:
            self.changes.setdefault(name, None)
        newest = _time(summary.get(lake.NEWEST_COMMIT_TIME))
        if newest is not None:
            self.newest.append(newest)

    def row(self) -> BatchRow:
        known = list(self.changes.values())
        changes = None if not known or any(c is None for c in known) else sum(c or 0 for c in known)
        apply_seconds = None
        if self.started_ms and len(self.started_ms) == len(self.committed_ms):
            apply_seconds = max(0.0, (max(self.committed_ms) - min(self.started_ms)) / 1000)
        return BatchRow(
            batch_id=self.batch_id,
            kind=self.kind,
            start_lsn=str(self.start_lsn),
            end_lsn=str(self.end_lsn),
            tables=len(self.tables),
            committed_at=datetime.fromtimestamp(max(self.committed_ms) / 1000, UTC),
            changes=changes,
            apply_seconds=apply_seconds,
            newest_commit_time=max(self.newest) if self.newest else None,
        )


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _changelog_changes(catalog: Any, identifier: tuple[str, str], slot: str) -> dict[str, int]:
    """batch id -> changes, from a table's changelog commits (each change is appended there once)."""
    from pyiceberg.exceptions import NoSuchTableError

    namespace, name = identifier
    try:
        changelog = catalog.load_table((namespace, name + lake.CHANGELOG_SUFFIX))
    except NoSuchTableError:
        return {}
    out: dict[str, int] = {}
    for snapshot in lineage(changelog):
        summary = summary_of(snapshot)
        added = _int(summary.get(ADDED_RECORDS))
        if summary.get(lake.SLOT) == slot and lake.BATCH_ID in summary and added is not None:
            out[summary[lake.BATCH_ID]] = out.get(summary[lake.BATCH_ID], 0) + added
    return out


def live_rows(summary: Mapping[str, str]) -> int | None:
    """A snapshot's row count from its summary: ``total-records`` less its position deletes.

    A merge-on-read table keeps deleted rows in its data files and marks them in position-delete
    files (each row once), so ``total-records`` alone overcounts; equality deletes cannot be
    netted without reading the table: then the count is unknown.
    """
    total = _int(summary.get(TOTAL_RECORDS))
    if total is None or (_int(summary.get(EQUALITY_DELETES)) or 0) > 0:
        return None
    return total - (_int(summary.get(POSITION_DELETES)) or 0)


def _table_row(name: str, table: Any, lake_name: str | None) -> LakeTableRow:
    current = table.current_snapshot()
    if current is None:
        return LakeTableRow(name, None, None, None, None, None, None, "no commits yet", lake_name)
    rows = live_rows(summary_of(current))
    state = table_state(table)
    if state is None:
        return LakeTableRow(name, None, None, None, None, rows, None, "no pipeline commit yet", lake_name)
    committed = datetime.fromtimestamp(table.snapshot_by_id(state.snapshot_id).timestamp_ms / 1000, UTC)
    return LakeTableRow(
        name,
        str(state.applied_end_lsn),
        str(state.base_lsn),
        state.batch_id,
        state.kind,
        rows,
        committed,
        lake_name=lake_name,
    )


def read_lake(
    config: LakeConfig, slot: str
) -> tuple[tuple[BatchRow, ...], tuple[LakeTableRow, ...], CutRow | None, tuple[str, ...]]:
    """(batches oldest first, tables, latest cut, problems) of ``slot``'s pipeline in the lake."""
    catalog = open_catalog(config)
    tables = sorted(owned_tables(catalog, config, slot), key=lambda t: ".".join(t.name()[-2:]))
    if not tables:
        problem = (
            f"the lake (catalog {config.catalog!r}) has no table of slot {slot!r} yet: run the pipeline's "
            "initial snapshot DAG, or check the slot name and the lake connection's namespace_prefix"
        )
        return (), (), None, (problem,)
    batches: dict[str, _Batch] = {}
    rows = []
    for table in tables:
        namespace, name = (str(part) for part in table.name()[-2:])
        source = config.source_of(namespace, name)  # the lake's names read back (LAKE.md, "Names")
        qualified = ".".join(source) if source is not None else f"{namespace}.{name}"
        lake_name = None if qualified == f"{namespace}.{name}" else f"{namespace}.{name}"
        rows.append(_table_row(qualified, table, lake_name))
        fallback = _changelog_changes(catalog, (namespace, name), slot)
        for snapshot in reversed(lineage(table)):
            summary = summary_of(snapshot)
            if not lake.is_pipeline_commit(summary) or summary.get(lake.SLOT) != slot:
                continue
            batch_id = summary.get(lake.BATCH_ID, "")
            batch = batches.get(batch_id)
            if batch is None:
                batch = batches[batch_id] = _Batch(
                    batch_id,
                    summary.get(lake.KIND, ""),
                    Lsn.parse(summary.get(lake.START_LSN, "0/0")),
                    Lsn.parse(summary.get(lake.END_LSN, summary[lake.APPLIED_END_LSN])),
                )
            if lake.INSERTED not in summary and batch_id in fallback:
                summary = {**summary, lake.INSERTED: str(fallback[batch_id])}
            batch.add(qualified, snapshot, summary)
    cut = latest_cut(config, slot)
    problems = tuple(f"table {row.name} has {row.note}" for row in rows if row.note)
    if cut is None:
        problems += ("no consistent cut yet: no batch tag is on every pipeline table",)
    ordered = sorted(batches.values(), key=lambda b: (b.end_lsn, min(b.committed_ms)))
    cut_row = None if cut is None else CutRow(str(cut.lsn), cut.tag, len(cut.snapshots))
    return tuple(b.row() for b in ordered), tuple(rows), cut_row, problems


def _with_acks(batches: Iterable[BatchRow], acks: Sequence[AckPoint]) -> tuple[BatchRow, ...]:
    """Each batch joined to its ack by end LSN: ack time and end-to-end latency where known."""
    by_end = {str(Lsn.parse(ack.end_lsn)): ack for ack in sorted(acks, key=lambda a: a.acked_at)}
    out = []
    for batch in batches:
        ack = by_end.get(batch.end_lsn)
        if ack is None:
            out.append(batch)
            continue
        latency = ack.latency_seconds
        if latency is None and batch.newest_commit_time is not None:
            latency = (ack.acked_at - batch.newest_commit_time).total_seconds()
        out.append(replace(batch, acked_at=ack.acked_at, latency_seconds=latency))
    return tuple(out)


def collect_report(
    params: str | Mapping[str, Any],
    slot: str,
    config: LakeConfig,
    *,
    publications: Sequence[str] = (),
    acks: Sequence[AckPoint] = (),
    timeout: float = DEFAULT_TIMEOUT,
    notes: Sequence[str] = (),
) -> PipelineReport:
    """The whole report of one pipeline; never raises for a source, lake or slot that fails."""
    now = datetime.now(UTC)
    source, source_problem = read_slot(params, slot, publications, timeout=timeout)
    problems = [source_problem] if source_problem else []
    batches: tuple[BatchRow, ...] = ()
    tables: tuple[LakeTableRow, ...] = ()
    cut = None
    try:
        batches, tables, cut, lake_problems = _within(timeout, lambda: read_lake(config, slot))
        problems += lake_problems
    except TimeoutError:
        problems.append(
            f"the lake (catalog {config.catalog!r}) did not answer within {timeout:g} s (timed out)"
        )
    except LakeCatalogError as exc:
        problems.append(f"the lake cannot be reached: {exc}")
    except Exception as exc:  # a catalog library's own error: said, not raised into the page
        problems.append(
            f"the lake cannot be read ({type(exc).__name__}: {connection_lost_detail(exc)[:300]})"
        )
    history = [(ack.acked_at, ack.lag_bytes) for ack in acks if ack.lag_bytes is not None]
    if source is not None and source.lag_bytes is not None:
        history.append((source.measured_at, source.lag_bytes))
    notes = list(notes)
    if not acks:
        notes.append(
            "no ack of this pipeline is known (its cut Asset's events, written by the ack task): the "
            "end-to-end latency and the lag over time are unknown; the lag shown is measured now"
        )
    return PipelineReport(
        slot=slot,
        catalog=config.catalog,
        generated_at=now,
        source=source,
        batches=_with_acks(batches, acks),
        tables=tables,
        cut=cut,
        lag_history=tuple(sorted((t, b) for t, b in history if b is not None)),
        problems=tuple(problems),
        notes=tuple(notes),
    )
