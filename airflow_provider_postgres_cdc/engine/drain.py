"""Drain one bounded micro-batch from a slot into staged Parquet, without moving the slot.

The batch starts at the slot's ``confirmed_flush_lsn`` and ends at a bound fixed when the
drain starts (the server's flushed WAL position, lowered by ``max_bytes``) or at the first
commit after ``max_messages``, whichever comes first; it always ends on a commit boundary.
Its end LSN is where the slot may be advanced once the batch is applied:

* the last transaction's end LSN when the message limit cut the read short;
* the bound otherwise, even when nothing was published in between (an idle or filtered
  database must not pin WAL forever): every transaction committing before the bound has been
  read, and one committing after it is still ahead of the slot.

Staging is ``<staging>/<slot>/batch-<start LSN hex16>/`` (tables, then ``_manifest.json``
last). The start LSN names the batch because the slot cannot have moved while the batch is
unapplied, so a retry of the same drain finds its own complete batch and reuses it; a
directory without a manifest is a half-written attempt and is deleted and redone. One drain
per slot at a time: the drain's connection holds a lock on the slot's name while it runs.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from airflow_provider_postgres_cdc.engine.catalog_facts import record_catalog_facts
from airflow_provider_postgres_cdc.engine.choices import Transport
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.sequencing import (
    DEFAULT_MAX_MEMORY_BYTES,
    MemoryBudget,
    Piece,
    Sequencer,
)
from airflow_provider_postgres_cdc.engine.staging import PartFileWriter, StagingLocation
from airflow_provider_postgres_cdc.errors import (
    SlotActiveError,
    SlotLostError,
    SlotPluginError,
    StagingNotWritableError,
)
from airflow_provider_postgres_cdc.formats.layout import change_batch_id, change_part_prefix, table_dir_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import (
    ColumnManifest,
    Manifest,
    ManifestStats,
    TableManifest,
)
from airflow_provider_postgres_cdc.formats.schema_changes import RelationVersion, SourceColumn
from airflow_provider_postgres_cdc.pgoutput import BatchDecoder, DecodedBatch, Relation, TableChanges
from airflow_provider_postgres_cdc.replication import (
    connect,
    connect_replication,
    describe_publications,
    describe_slot,
    hold_drain_lock,
)
from airflow_provider_postgres_cdc.replication.connection import ConnParams, read_raw_text, stores_raw_text
from airflow_provider_postgres_cdc.replication.failover import (
    check_not_promoted,
    decodable_end,
    require_standby_feedback,
    standbys_flushed,
)
from airflow_provider_postgres_cdc.replication.features import PROTOCOL_4, require
from airflow_provider_postgres_cdc.replication.raw_messages import RawMessages
from airflow_provider_postgres_cdc.replication.slots import SlotInfo, invalidation_message
from airflow_provider_postgres_cdc.replication.transports import (
    PeekTransport,
    ReadResult,
    StreamingTransport,
    plugin_options,
)
from airflow_provider_postgres_cdc.values import overflow
from airflow_provider_postgres_cdc.values.arrow_types import pg_type_name

log = logging.getLogger(__name__)

MIN_MEMORY_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class DrainSettings:
    """What to drain and how.

    :param slot: the replication slot (pgoutput).
    :param publications: publication names passed to pgoutput.
    :param staging: staging root (local path, ``file://``, ``s3://``, ``gs://``, ``hdfs://``).
    :param transport: ``"peek"`` (SQL interface, the default: several times faster for
        batches; it reads a temporary copy of the slot in a few calls, see
        ``replication/peek_calls.py``) or ``"stream"`` (``START_REPLICATION`` protocol 2 with
        ``streaming on``).
    :param streaming: the stream transport's ``streaming`` mode: ``"on"`` (protocol 2) or
        ``"parallel"`` (protocol 4, PostgreSQL 16+; its Stream Abort carries the abort's LSN and
        time). Either way in-progress transactions count only at their commit.
    :param max_messages: stop at the first commit after this many pgoutput messages.
    :param max_bytes: bound the WAL window read to this many bytes after the start.
    :param max_memory_bytes: the drain's memory budget, whatever the transaction sizes (default
        512 MiB; at least 32 MiB). Transactions not yet committed are kept in memory up to an
        eighth of it and spilled to ``spill_dir`` beyond; committed ones are decoded and staged
        in pieces of a 48th of it. Peak RSS stays under this plus the interpreter's fixed
        overhead (``benchmarks/big_transaction.py`` measures both).
    :param spill_dir: where spill files go (``$TMPDIR`` or ``/tmp`` by default); they are
        unlinked as soon as created, so nothing is left behind even by a killed drain.
    :param chunk_bytes: transport chunk size (default: a 48th of ``max_memory_bytes``).
    :param chunk_messages: the stream also yields a chunk after this many messages.
    :param staging_options: endpoint and credentials of an ``s3://`` staging store (default: pyarrow's
        environment chain); the store is checked before the slot is read.
    """

    slot: str
    publications: tuple[str, ...]
    staging: str
    transport: Transport = "peek"
    streaming: Literal["on", "parallel"] = "on"
    max_messages: int | None = 1_000_000
    max_bytes: int | None = None
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES
    spill_dir: str | None = None
    chunk_bytes: int | None = None
    chunk_messages: int = 100_000
    max_rows_per_batch: int = 65_536
    progress_seconds: float = 5.0
    staging_options: S3Options | None = None

    def __post_init__(self) -> None:
        if self.max_memory_bytes < MIN_MEMORY_BYTES:
            raise ValueError(
                f"max_memory_bytes={self.max_memory_bytes} is too small: give the drain at least 32 MiB"
            )
        if self.max_messages is not None and self.max_messages < 1:
            raise ValueError(f"max_messages={self.max_messages}: use at least 1, or None for no limit")


@dataclass(frozen=True, slots=True)
class DrainResult:
    """The staged batch: its manifest, where it is, and whether an earlier attempt made it."""

    manifest: Manifest
    manifest_uri: str
    batch_uri: str
    reused: bool

    def summary(self) -> dict[str, Any]:
        """Small JSON for XCom: where the manifest is and what the batch holds."""
        return {
            "manifest": self.manifest_uri,
            "batch_uri": self.batch_uri,
            "slot": self.manifest.slot,
            "batch_id": self.manifest.batch_id,
            "start_lsn": str(self.manifest.start_lsn),
            "end_lsn": str(self.manifest.end_lsn),
            "changes": self.manifest.stats.changes,
            "transactions": self.manifest.stats.transactions,
            "tables": {t.qualified: t.rows for t in self.manifest.tables},
            "reused": self.reused,
            "seconds": self.manifest.stats.seconds,
            "newest_commit_time": self.manifest.stats.newest_commit_time,
        }


@dataclass(slots=True)
class _TableOutput:
    """The part files of one table across the relation versions seen in this batch."""

    schema: str
    table: str
    relation: Relation
    writers: list[PartFileWriter] = field(default_factory=list)
    shapes: list[Relation] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(w.rows for w in self.writers)


class _Stager:
    """Routes decoded table changes to bounded Parquet part files, one writer per relation version."""

    def __init__(self, location: StagingLocation, batch_dir: str) -> None:
        self.location = location
        self.batch_dir = batch_dir
        self.tables: dict[tuple[str, str], _TableOutput] = {}

    def add(self, changes: TableChanges) -> None:
        try:
            self._add(changes)
        except OSError as exc:
            raise self.write_error(exc) from exc

    def write_error(self, exc: OSError) -> StagingNotWritableError:
        """A failed write (disk full, read-only, permissions) as the error that says what to do."""
        return StagingNotWritableError(
            f"cannot write the batch to {self.location.uri_of(self.batch_dir)}: {exc}. Nothing of this "
            "batch is kept and the slot did not move: free space in (or fix) the staging location, then "
            "run the drain again."
        )

    def _add(self, changes: TableChanges) -> None:
        relation = changes.relation
        key = (relation.namespace, relation.name)
        out = self.tables.get(key)
        if out is None:
            out = self.tables[key] = _TableOutput(relation.namespace, relation.name, relation)
        if not out.shapes or not out.shapes[-1].same_shape(relation):
            directory = self.location.path(self.batch_dir, table_dir_name(*key))
            prefix = change_part_prefix(len(out.shapes))
            schema = changes.batches[0].schema if changes.batches else changes.to_table().schema
            out.writers.append(PartFileWriter(self.location, directory, schema, prefix=prefix))
            out.shapes.append(relation)
            out.relation = relation
        out.writers[-1].write_all(changes.batches)

    def close(self) -> list[TableManifest]:
        manifests = []
        for out in self.tables.values():
            for writer in out.writers:
                try:
                    writer.close()
                except OSError as exc:
                    raise self.write_error(exc) from exc
            manifests.append(_table_manifest(out, self.location, self.batch_dir))
        return manifests

    def abort(self) -> None:
        for out in self.tables.values():
            for writer in out.writers:
                writer.abort()


def _table_manifest(out: _TableOutput, location: StagingLocation, batch_dir: str) -> TableManifest:
    """Columns of the latest relation version first, then any dropped mid-batch (still in older files)."""
    columns: dict[str, ColumnManifest] = {}
    for relation, writer in zip(reversed(out.shapes), reversed(out.writers), strict=True):
        for column in relation.columns:
            if column.name not in columns:
                columns[column.name] = ColumnManifest(
                    name=column.name,
                    pg_type=pg_type_name(column.type_oid),
                    type_oid=column.type_oid,
                    typmod=column.typmod,
                    arrow_type=str(writer.schema.field(column.name).type),
                    key=column.is_key,
                )
    staged = [name for writer in out.writers for name in writer.fields]
    for sibling in overflow.sibling_manifests(list(columns), staged):
        columns.setdefault(sibling.name, sibling)
    prefix = location.path(batch_dir) + "/"
    files = tuple(path[len(prefix) :] for writer in out.writers for path in writer.files)
    versions = tuple(
        RelationVersion(
            tuple(SourceColumn(c.name, c.type_oid, c.typmod) for c in relation.columns),
            tuple(path[len(prefix) :] for path in writer.files),
        )
        for relation, writer in zip(out.shapes, out.writers, strict=True)
    )
    identity = out.relation.replica_identity
    warnings: tuple[str, ...] = ()
    if identity == "n" or not out.relation.key_columns:
        warnings = (
            f"{out.schema}.{out.table} has no replica identity key: UPDATE and DELETE cannot be replicated. "
            "Add a primary key or set REPLICA IDENTITY.",
        )
    return TableManifest(
        schema=out.schema,
        table=out.table,
        columns=tuple(columns.values()),
        key_columns=out.relation.key_columns,
        replica_identity=identity if identity in ("d", "f", "i", "n") else "d",  # type: ignore[arg-type]
        rows=out.rows,
        files=files,
        warnings=warnings,
        versions=versions,
    )


class _Progress:
    """Logs changes, LSN reached and rate at most every ``interval`` seconds; while a large
    transaction is only being read and spilled (nothing staged yet), logs the reading instead."""

    def __init__(self, slot: str, interval: float) -> None:
        self.slot = slot
        self.interval = interval
        self.started = self.last = self.last_read = time.monotonic()
        self.changes = 0
        self.transactions = 0
        self.newest_commit: datetime | None = None  # commit order: the last staged transaction's

    def reading(self, result: ReadResult, lsn: Lsn, sequencer: Sequencer) -> None:
        now = time.monotonic()
        if now - max(self.last, self.last_read) >= self.interval:
            self.last_read = now
            log.info(
                "drain %s: read %d messages up to %s, %d bytes of undecided transactions spilled so far",
                self.slot, result.messages, lsn, sequencer.spilled_bytes,
            )  # fmt: skip

    def update(self, decoded: DecodedBatch, transactions: int) -> None:
        self.changes += decoded.changes
        self.transactions += transactions
        if len(decoded.transactions):
            self.newest_commit = decoded.transactions.column("commit_time")[-1].as_py()
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            rate = self.changes / max(now - self.started, 1e-9)
            log.info(
                "drain %s: %d changes in %d transactions, at %s, %.0f changes/s",
                self.slot, self.changes, self.transactions, decoded.end_lsn, rate,
            )  # fmt: skip


def _check_slot(conn: Any, settings: DrainSettings) -> SlotInfo:
    """The slot, once it is known to be drainable (it may live on a hot standby, PostgreSQL 16+)."""
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
    describe_publications(conn, settings.publications)  # raises PublicationNotFoundError
    return slot


def _bound(conn: Any, start: Lsn, max_bytes: int | None, *, failover: bool = False) -> Lsn:
    """Where the batch ends: the WAL flushed (replayed on a standby), capped by ``max_bytes``.

    A failover slot's batch also stops where its standbys have flushed, so that the lake never
    holds a change a promoted standby does not have.
    """
    flushed = decodable_end(conn)
    standbys = standbys_flushed(conn, start) if failover else None
    if standbys is not None:
        flushed = min(flushed, standbys)
    if max_bytes is not None:
        flushed = min(flushed, Lsn(start + max_bytes))
    return max(flushed, start)


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
        bound = _bound(conn, start, settings.max_bytes, failover=slot.failover)
        log.info("draining slot %s from %s up to %s via %s", settings.slot, start, bound, settings.transport)
        started = time.monotonic()
        stager = _Stager(location, batch_dir)
        try:
            result, decoded_end = _read_and_stage(params, conn, settings, start, bound, stager)
            tables = record_catalog_facts(conn, location, batch_dir, stager.close())
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


def _chunks(
    params: ConnParams, conn: Any, settings: DrainSettings, start: Lsn, bound: Lsn, result: ReadResult
) -> Iterator[RawMessages]:
    chunk_bytes = settings.chunk_bytes or MemoryBudget(settings.max_memory_bytes).chunk_bytes
    if settings.transport == "peek":
        read_raw_text(conn)
        options = plugin_options(settings.publications, proto_version=1)
        yield from PeekTransport(conn, chunk_bytes=chunk_bytes).read(
            settings.slot, options, upto_lsn=bound, max_messages=settings.max_messages, result=result
        )
        return
    repl = connect_replication(params)
    try:
        read_raw_text(repl)
        if settings.streaming == "parallel":
            require(repl, PROTOCOL_4)
            options = plugin_options(settings.publications, proto_version=4, streaming="parallel")
        else:
            options = plugin_options(settings.publications, proto_version=2, streaming=True)
        transport = StreamingTransport(repl, chunk_messages=settings.chunk_messages, chunk_bytes=chunk_bytes)
        yield from transport.read(
            settings.slot, options, start_lsn=start, upto_lsn=bound, max_messages=settings.max_messages,
            result=result,
        )  # fmt: skip
    finally:
        repl.close()


class _DecodeStage:
    """Decodes and stages pieces while the caller reads the next ones.

    Each piece is prepared in order on the caller's thread (cheap: the control messages and the
    relation cache), typed on ``workers`` threads at once (numpy and pyarrow release the GIL for
    most of it, so two pieces type in parallel on two cores), then staged in order on one more
    thread that owns the Parquet writers. At most ``depth`` pieces are in flight, which bounds
    memory.
    """

    def __init__(
        self, decoder: BatchDecoder, stager: _Stager, progress: _Progress, workers: int = 2, depth: int = 3
    ) -> None:
        self.decoder = decoder
        self.stager = stager
        self.progress = progress
        self.typing = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="drain-type")
        self.staging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drain-stage")
        self.pending: deque[Future[None]] = deque()
        self.depth = depth
        self.next_seq = 0  # where a transaction continued in the next piece goes on numbering
        self.failure: BaseException | None = None

    def _wait(self, future: Future[None]) -> None:
        """Re-raise a decode or staging error, the first one only: pieces staged after it fail
        because of it (a full disk closes the file they write to), and would hide the cause."""
        try:
            future.result()
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
                raise

    def submit(self, piece: Piece) -> None:
        while len(self.pending) >= self.depth:
            self._wait(self.pending.popleft())
        raw = piece.raw
        first_seq = self.next_seq if piece.continues else 0
        prepared = self.decoder.prepare(raw.buffer, raw.offsets, raw.lengths, raw.lsns, first_seq=first_seq)
        self.next_seq = first_seq + prepared.last_changes
        built = self.typing.submit(prepared.build)
        self.pending.append(self.staging.submit(self._stage, built, piece.commits))

    def _stage(self, built: Future[DecodedBatch], commits: int) -> None:
        decoded = built.result()
        for table in decoded.tables:
            self.stager.add(table)
        self.progress.update(decoded, commits)

    def finish(self) -> None:
        try:
            while self.pending:
                self._wait(self.pending.popleft())
        finally:
            self.staging.shutdown(wait=True, cancel_futures=True)
            self.typing.shutdown(wait=True, cancel_futures=True)


def _read_and_stage(
    params: ConnParams, conn: Any, settings: DrainSettings, start: Lsn, bound: Lsn, stager: _Stager
) -> tuple[ReadResult, Lsn | None]:
    """Stage the window's committed transactions piece by piece; returns the read result and
    the end LSN of the last transaction staged."""
    # The sequencer hands over protocol 1; a SQL_ASCII database's text comes as stored (raw_text.py).
    decoder = BatchDecoder(1, max_rows=settings.max_rows_per_batch, raw_text=stores_raw_text(conn))
    progress = _Progress(settings.slot, settings.progress_seconds)
    stage = _DecodeStage(decoder, stager, progress)
    sequencer = Sequencer(MemoryBudget(settings.max_memory_bytes), settings.spill_dir)
    result = ReadResult()
    try:
        for raw in _chunks(params, conn, settings, start, bound, result):
            for piece in sequencer.feed(raw):
                stage.submit(piece)
            if len(raw):
                progress.reading(result, Lsn(int(raw.lsns[-1])), sequencer)
        sequencer.finish()
    finally:
        sequencer.close()
        stage.finish()
    if sequencer.spilled_bytes:
        log.info(
            "drain %s spilled %d bytes of undecided transactions to disk",
            settings.slot,
            sequencer.spilled_bytes,
        )
    result.extra["transactions"] = sequencer.commits
    if progress.newest_commit is not None:
        result.extra["newest_commit_time"] = progress.newest_commit.isoformat()
    result.extra["spilled_bytes"] = sequencer.spilled_bytes
    return result, sequencer.last_end
