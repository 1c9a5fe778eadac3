"""The read loop of a drain: chunks from a transport, sequenced into pieces, decoded and staged.

Reading, decoding and writing overlap: the caller's thread reads and sequences, worker threads
type the pieces, and one more thread writes them, so a batch costs about its slowest stage.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain.settings import DrainSettings
from airflow_provider_postgres_cdc.engine.drain.stager import BatchStager
from airflow_provider_postgres_cdc.engine.sequencing import MemoryBudget, Piece, Sequencer
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.arrow import DecodedBatch
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.replication import connect_replication
from airflow_provider_postgres_cdc.replication.connection import ConnParams, read_raw_text, stores_raw_text
from airflow_provider_postgres_cdc.replication.features import PROTOCOL_4, require
from airflow_provider_postgres_cdc.replication.raw_messages import RawMessages
from airflow_provider_postgres_cdc.replication.transports import (
    PeekTransport,
    ReadResult,
    StreamingTransport,
    plugin_options,
)

log = logging.getLogger(__name__)


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
    thread that owns the Parquet writers (after ``transforms``, so the Parquet files never see a
    clear value of a hashed or dropped column). At most ``depth`` pieces are in flight, which bounds
    memory.
    """

    def __init__(
        self,
        decoder: BatchDecoder,
        stager: BatchStager,
        progress: _Progress,
        transforms: ColumnTransformer | None = None,
        workers: int = 2,
        depth: int = 3,
    ) -> None:
        self.decoder = decoder
        self.transforms = transforms
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
            self.stager.add(table if self.transforms is None else self.transforms.changes(table))
        self.progress.update(decoded, commits)

    def finish(self) -> None:
        try:
            while self.pending:
                self._wait(self.pending.popleft())
        finally:
            self.staging.shutdown(wait=True, cancel_futures=True)
            self.typing.shutdown(wait=True, cancel_futures=True)


def read_and_stage(
    params: ConnParams, conn: Any, settings: DrainSettings, start: Lsn, bound: Lsn, stager: BatchStager
) -> tuple[ReadResult, Lsn | None]:
    """Stage the window's committed transactions piece by piece; returns the read result and
    the end LSN of the last transaction staged."""
    # The sequencer hands over protocol 1; a SQL_ASCII database's text comes as stored (raw_text.py).
    transforms = settings.transforms
    decoder = BatchDecoder(
        1,
        max_rows=settings.max_rows_per_batch,
        raw_text=stores_raw_text(conn),
        text_columns=None if transforms is None else transforms.text_columns(),
    )
    progress = _Progress(settings.slot, settings.progress_seconds)
    stage = _DecodeStage(decoder, stager, progress, transforms)
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
