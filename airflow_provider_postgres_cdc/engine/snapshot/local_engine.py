"""The local copy engine: worker threads that stream each table's COPY into Parquet part files.

Every worker holds one connection and, for each ``ctid`` range it takes from a shared queue,
imports the exported snapshot in a fresh transaction, streams ``COPY (SELECT …) TO STDOUT``
through a bounded pipe, decodes it (``copy_text``) and writes size-bounded part files. The
largest ranges go first so the last to finish are short; the first failure cancels the other
workers' queries and is reported as the package error that says what to do.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import posixpath
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.errors
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.snapshot.copy_text import typed_batches
from airflow_provider_postgres_cdc.engine.snapshot.exported import WORKER_OPTIONS, import_snapshot
from airflow_provider_postgres_cdc.engine.snapshot.plan import TableCopy, TablePlan
from airflow_provider_postgres_cdc.engine.staging import PartFileWriter, StagingLocation
from airflow_provider_postgres_cdc.errors import (
    ConnectionLostError,
    PrivilegeError,
    RowSecurityError,
    StagingNotWritableError,
    TableDroppedError,
)
from airflow_provider_postgres_cdc.formats.layout import snapshot_part_prefix
from airflow_provider_postgres_cdc.replication import connect
from airflow_provider_postgres_cdc.replication.connection import (
    ConnParams,
    connection_lost_detail,
    is_connection_loss,
    read_raw_text,
)

# COPY text per record batch (and Parquet row group): 2-4 MiB measured faster than 8 MiB here.
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
_PIPE_BUFFER = 1024 * 1024


@dataclass(slots=True)
class CopyCounters:
    """Rows, bytes and finished tables so far, added to by every worker thread."""

    rows: int = 0
    bytes: int = 0
    tables_done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rows: int = 0, written: int = 0, tables: int = 0) -> None:
        with self.lock:
            self.rows += rows
            self.bytes += written
            self.tables_done += tables


@dataclass(frozen=True, slots=True)
class _RangeTask:
    """One ``ctid`` range of one table: the unit a worker takes from the queue."""

    plan: TablePlan
    index: int
    block_range: tuple[int | None, int | None]


@dataclass(slots=True)
class _TableState:
    """What the finished ranges of one table staged; ``remaining`` counts the ranges still to copy."""

    remaining: int
    files: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    fields: set[str] = field(default_factory=set)


ProgressReport = Callable[[str, CopyCounters, float], None]
"""Called with the phase, the counters and the seconds since the copy started."""

BatchTransform = Callable[[TablePlan, pa.RecordBatch], pa.RecordBatch]
"""Applied to every record batch before it is written (``engine/column_hashing.py``)."""


class LocalCopy:
    """Worker threads, each with one connection that imports the snapshot again for every range it copies.

    Every ``progress_interval`` seconds the counters go to ``report`` and, while workers still
    run, ``check_holder`` raises if the connection holding the exported snapshot is gone.
    """

    def __init__(
        self,
        conn_params: ConnParams,
        snapshot_name: str,
        plans: Sequence[TablePlan],
        location: StagingLocation,
        batch_dir: str,
        *,
        parallelism: int,
        max_file_bytes: int,
        batch_bytes: int,
        max_memory_bytes: int,
        progress_interval: float,
        report: ProgressReport,
        check_holder: Callable[[], None],
        transform: BatchTransform | None = None,
    ) -> None:
        self.conn_params = conn_params
        self.transform = transform
        self.snapshot_name = snapshot_name
        self.plans = plans
        self.location = location
        self.batch_dir = batch_dir
        self.progress_interval = progress_interval
        self.report = report
        self.check_holder = check_holder
        self.parallelism = parallelism
        self.max_file_bytes = max_file_bytes
        self.batch_bytes = batch_bytes
        self.max_memory_bytes = max_memory_bytes
        self.tasks: queue.Queue[_RangeTask] = queue.Queue()
        self.states: dict[str, _TableState] = {}
        self.counters = CopyCounters()
        self.cancelled = threading.Event()
        self.connections: list[Any] = []
        self.lock = threading.Lock()

    def execute(self) -> list[TableCopy]:
        plans = self.plans
        tasks = [
            _RangeTask(plan, index, block_range)
            for plan in plans
            for index, block_range in enumerate(plan.block_ranges)
        ]
        # Largest ranges first: the last ones to finish are then the short ones.
        tasks.sort(key=lambda task: -(task.plan.blocks / len(task.plan.block_ranges)))
        for task in tasks:
            self.tasks.put(task)
        self.states = {plan.qualified: _TableState(len(plan.block_ranges)) for plan in plans}
        workers = max(1, min(self.parallelism, len(tasks)))
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="postgres-cdc-copy") as pool:
            futures = [pool.submit(self._work) for _ in range(workers)]
            try:
                self._monitor(futures, started)
            except BaseException:
                self._cancel()
                raise
        copies = []
        for plan in plans:
            state = self.states[plan.qualified]
            copies.append(
                TableCopy(
                    plan, tuple(sorted(state.files)), state.rows, state.bytes, tuple(sorted(state.fields))
                )
            )
        return copies

    def _monitor(self, futures: list[concurrent.futures.Future[None]], started: float) -> None:
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(
                pending, timeout=self.progress_interval, return_when=concurrent.futures.FIRST_EXCEPTION
            )
            failures = [exc for exc in (future.exception() for future in done) if exc is not None]
            if failures:
                # Workers stopped by another's failure raise _CancelledError; report the cause.
                failures.sort(key=lambda exc: isinstance(exc, _CancelledError))
                raise failures[0]
            self.report("copying", self.counters, time.monotonic() - started)
            if pending:
                self.check_holder()

    def _cancel(self) -> None:
        self.cancelled.set()
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(Exception):
                    conn.cancel()

    def _work(self) -> None:
        conn = connect(self.conn_params, options=WORKER_OPTIONS)
        with self.lock:
            self.connections.append(conn)
        try:
            raw_text = read_raw_text(conn)
            while not self.cancelled.is_set():
                try:
                    task = self.tasks.get_nowait()
                except queue.Empty:
                    return
                # One transaction per range: its lock on the table is held for that range only, so
                # DDL elsewhere (and the queries queued behind it) never waits for the whole copy.
                import_snapshot(conn, self.snapshot_name)
                self._copy(conn, task, raw_text)
                with conn.cursor() as cur:
                    cur.execute("COMMIT")
        except BaseException:
            self.cancelled.set()
            raise
        finally:
            conn.close()

    def _copy(self, conn: Any, task: _RangeTask, raw_text: bool) -> None:
        plan = task.plan
        writer = PartFileWriter(
            self.location,
            posixpath.join(self.batch_dir, plan.dir_name),
            plan.arrow_schema,
            prefix=snapshot_part_prefix(task.index),
            max_file_bytes=self.max_file_bytes,
        )
        command = sql.SQL("COPY ({}) TO STDOUT").format(plan.select(task.block_range))
        try:
            with _copy_stream(conn, command) as stream:
                for batch in typed_batches(stream, plan, self.batch_bytes, self.max_memory_bytes, raw_text):
                    if self.cancelled.is_set():
                        raise _CancelledError
                    writer.write(batch if self.transform is None else self.transform(plan, batch))
                    self.counters.add(rows=batch.num_rows)
            # Every table keeps at least one file (its schema); other empty ranges leave none.
            writer.close(keep_empty=task.index == 0)
        except BaseException as exc:
            writer.abort()
            explained = _explain(exc, plan)
            if explained is exc:
                raise
            raise explained from exc
        self.counters.add(written=writer.bytes)
        relative = [posixpath.relpath(path, self.batch_dir) for path in writer.files]
        with self.lock:
            state = self.states[plan.qualified]
            state.files.extend(relative)
            state.rows += writer.rows
            state.bytes += writer.bytes
            state.fields.update(writer.fields)
            state.remaining -= 1
            if state.remaining == 0:
                self.counters.add(tables=1)


class _CancelledError(Exception):
    """Another worker failed; this one stops."""


def _explain(exc: BaseException, plan: TablePlan) -> BaseException:
    """Turn a server error during a table's copy into the package error that says what to do."""
    if isinstance(exc, psycopg2.errors.UndefinedTable | psycopg2.errors.UndefinedColumn):
        return TableDroppedError(
            f"table {plan.qualified} (or one of its published columns) was dropped or renamed during the "
            f"snapshot copy ({exc.pgerror or exc}). The snapshot is incomplete and was discarded; run it "
            "again (the table will no longer be part of it if it stays dropped)."
        )
    if isinstance(exc, psycopg2.errors.InsufficientPrivilege):
        if "row-level security" in str(exc):
            return RowSecurityError(
                f"table {plan.qualified}: {exc.pgerror or exc}. Grant the role BYPASSRLS or copy as the "
                "table's owner; the copy runs with row_security = off so that no policy hides rows."
            )
        return PrivilegeError(
            f"the role lacks SELECT on published table {plan.qualified}: GRANT SELECT ON {plan.qualified} "
            "TO <role>;"
        )
    if isinstance(exc, psycopg2.Error) and is_connection_loss(exc):
        return ConnectionLostError(
            f"lost the connection copying table {plan.qualified} ({connection_lost_detail(exc)}): the "
            "server restarted or the backend was terminated, so its COPY stream ended early. The "
            "snapshot was discarded and its slot dropped; run it again."
        )
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):  # not the COPY's own pipe
        return StagingNotWritableError(
            f"cannot write the snapshot of table {plan.qualified} to staging: {exc}. The snapshot was "
            "discarded and its slot dropped: free space in (or fix) the staging location, then run it again."
        )
    return exc


@contextlib.contextmanager
def _copy_stream(conn: Any, command: sql.Composable) -> Iterator[io.BufferedReader[io.FileIO]]:
    """The output of a ``COPY … TO STDOUT`` as a readable byte stream, with bounded buffering.

    psycopg2 pushes each row into a file object; a pipe with a 1 MiB write buffer lets
    another thread read it in large blocks, and blocks the producer when the reader lags.
    A server error is raised here even if the reader already saw a (truncated) end.
    """
    read_fd, write_fd = os.pipe()
    reader = io.BufferedReader(io.FileIO(read_fd, "rb"), buffer_size=_PIPE_BUFFER)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with open(write_fd, "wb", buffering=_PIPE_BUFFER) as out, conn.cursor() as cur:
                cur.copy_expert(command, out)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce, name="postgres-cdc-copy-out", daemon=True)
    producer.start()
    try:
        yield reader
    except BaseException:
        # Stop the server side too: the producer may be waiting for rows, not for the pipe.
        with contextlib.suppress(Exception):
            conn.cancel()
        reader.close()
        producer.join()
        raise
    finally:
        reader.close()
    producer.join()
    if errors:
        raise errors[0]
