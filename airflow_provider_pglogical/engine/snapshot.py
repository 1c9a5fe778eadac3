"""The initial snapshot: a slot with an exported snapshot, and a parallel copy of the published tables.

``CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`` returns the slot's consistent point and a
snapshot showing the database exactly there (DESIGN.md invariant 2). The replication
connection that created it is kept open and idle for the whole copy (the snapshot dies with
it); worker connections import it (``SET TRANSACTION SNAPSHOT``) and stream
``COPY (SELECT <published columns> FROM t WHERE <row filter>) TO STDOUT`` (text format), cut
into whole-row chunks that pyarrow's CSV parser reads as strings, typed with
``types.text_to_arrow`` (the conversion the drain uses too) and written to Parquet files of
bounded size. Large tables are split into ``ctid`` ranges so several workers share them.

:class:`SnapshotRun` is the orchestration; the local engine is :meth:`SnapshotRun.copy_local`,
the Spark engine (``spark/snapshot_jdbc.py``) gets its job description from
:meth:`SnapshotRun.spark_job_spec`. :func:`take_snapshot` does a whole local run. Nothing here
imports Airflow.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import math
import os
import posixpath
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from psycopg2 import sql

from airflow_provider_pglogical.engine.sequencing import DEFAULT_MAX_MEMORY_BYTES
from airflow_provider_pglogical.engine.staging import DEFAULT_MAX_FILE_BYTES, PartFileWriter, StagingLocation
from airflow_provider_pglogical.errors import (
    RECOVERY_DAG,
    ConnectionLostError,
    PgLogicalError,
    PrivilegeError,
    PublicationEmptyError,
    SlotActiveError,
    SlotExistsError,
    SlotLostError,
    SlotNotFoundError,
    StagingNotWritableError,
)
from airflow_provider_pglogical.formats.lsn import Lsn
from airflow_provider_pglogical.formats.manifest import (
    MANIFEST_NAME,
    ColumnManifest,
    Manifest,
    ManifestStats,
    TableManifest,
    sibling_name,
    snapshot_batch_id,
    table_dir_name,
)
from airflow_provider_pglogical.replication import connect, connect_replication
from airflow_provider_pglogical.replication.connection import (
    SESSION_OPTIONS,
    ConnParams,
    connection_lost_detail,
    is_connection_loss,
    read_raw_text,
    stores_raw_text,
)
from airflow_provider_pglogical.replication.publications import PublishedTable, published_tables
from airflow_provider_pglogical.replication.slots import (
    SNAPSHOT_HOLDER_OPTIONS,
    CreatedSlot,
    create_slot_with_snapshot,
    describe_slot,
    drop_slot,
    validate_slot_name,
)
from airflow_provider_pglogical.values import overflow
from airflow_provider_pglogical.values.arrow_types import arrow_type, pg_type_name
from airflow_provider_pglogical.values.raw_text import escape_raw_text

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_MIN_RANGE_BYTES",
    "DEFAULT_PARALLELISM",
    "DEFAULT_RANGE_BYTES",
    "SPARK_JOB_PATH",
    "SPARK_PASSWORD_ENV",
    "ColumnPlan",
    "RowSecurityError",
    "RowTooLargeError",
    "SlotMode",
    "SnapshotLostError",
    "SnapshotProgress",
    "SnapshotRun",
    "TableCopy",
    "TableDroppedError",
    "TablePlan",
    "decode_copy_text",
    "import_snapshot",
    "jdbc_connection",
    "staged_snapshot",
    "take_snapshot",
    "temporary_slot_name",
]

log = logging.getLogger(__name__)

# Workers sit idle in their transaction between ranges, like the holder (SNAPSHOT_HOLDER_OPTIONS).
# row_security = off makes a policy fail the copy loudly instead of hiding rows from it.
WORKER_OPTIONS = "-c idle_in_transaction_session_timeout=0 -c row_security=off"
IMPORT_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

DEFAULT_PARALLELISM = 2
DEFAULT_RANGE_BYTES = 256 * 1024 * 1024
DEFAULT_MIN_RANGE_BYTES = 16 * 1024 * 1024
# COPY text per record batch (and Parquet row group): 2-4 MiB measured faster than 8 MiB here.
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
# A row is held in pieces, joined, then parsed into Arrow strings and typed: about four copies.
_ROW_COPIES = 4
_PIPE_BUFFER = 1024 * 1024

SlotMode = Literal["create", "temporary", "recover"]
SLOT_MODES: tuple[SlotMode, ...] = ("create", "temporary", "recover")
_SNAPSHOT_NAME = re.compile(r"^[0-9A-F]+(-[0-9A-F]+)+$")
SPARK_JOB_PATH = str(Path(__file__).with_name("spark") / "snapshot_jdbc.py")
"""The Spark copy engine's job file, for ``spark-submit``."""
SPARK_PASSWORD_ENV = "PGLOGICAL_JDBC_PASSWORD"
"""Environment variable the Spark job reads the JDBC password from (``PASSWORD_ENV`` there)."""


class SnapshotLostError(PgLogicalError):
    """The exported snapshot can no longer be imported: the connection holding it was lost."""


class RowTooLargeError(PgLogicalError):
    """A single row is larger than ``max_memory_bytes`` lets one copy worker hold."""


class TableDroppedError(PgLogicalError):
    """A published table was dropped while the snapshot was being copied."""


class RowSecurityError(PrivilegeError):
    """A published table has row-level security and the role may not bypass it."""


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """A published column: name, type OID, typmod, and whether it belongs to the replica identity."""

    name: str
    type_oid: int
    typmod: int
    key: bool

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type_oid, self.typmod)

    def manifest(self) -> ColumnManifest:
        return ColumnManifest(
            self.name, pg_type_name(self.type_oid), self.type_oid, self.typmod, str(self.arrow_type), self.key
        )


@dataclass(frozen=True, slots=True)
class TablePlan:
    """What to copy from one table, read from the catalogs inside the exported snapshot.

    ``block_ranges`` split the table by ``ctid``: ``(None, b)`` is everything before block
    ``b``, ``(a, None)`` everything from block ``a`` on, so the ranges cover the table even
    if it grew after it was measured. A partitioned table (published via its root) is ranged
    by its largest partition: the predicate applies to each partition's own ctids.
    """

    schema: str
    table: str
    relkind: str
    columns: tuple[ColumnPlan, ...]
    key_columns: tuple[str, ...]
    replica_identity: str
    row_filter: str | None
    column_list: tuple[str, ...] | None
    publications: tuple[str, ...]
    blocks: int
    block_ranges: tuple[tuple[int | None, int | None], ...]
    warnings: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def dir_name(self) -> str:
        return table_dir_name(self.schema, self.table)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(column.name, column.arrow_type) for column in self.columns])

    def select(self, block_range: tuple[int | None, int | None], *, as_text: bool = False) -> sql.Composed:
        """``SELECT <columns> FROM [ONLY] t WHERE (<row filter>) AND <ctid range>``.

        ``ONLY`` for plain tables, as PostgreSQL's own table sync does, so inheritance
        children are not copied into their parent; a partitioned root reads its partitions.
        ``as_text`` selects every column in its output-function text form, exactly as COPY
        writes it (for the Spark engine): ``format('%s', …)`` calls the output function, where a
        ``::text`` cast would differ for some types (``bpchar`` loses its padding, ``bool``
        becomes ``true``, ``inet`` gains a ``/32``).
        """
        if as_text:
            items = [
                sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE format('%s', {0}) END AS {0}").format(
                    sql.Identifier(c.name)
                )
                for c in self.columns
            ]
        else:
            items = [sql.Identifier(c.name) for c in self.columns]
        conditions: list[sql.Composable] = []
        if self.row_filter:
            conditions.append(sql.SQL("({})").format(sql.SQL(self.row_filter)))
        low, high = block_range
        if low is not None:
            conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({low},0)")))
        if high is not None:
            conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({high},0)")))
        query = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(items),
            sql.SQL("" if self.relkind == "p" else "ONLY "),
            sql.Identifier(self.schema, self.table),
        )
        if conditions:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(conditions))
        return query

    def manifest(self, rows: int, files: Sequence[str], staged: Sequence[str] = ()) -> TableManifest:
        """The table's manifest entry; ``staged`` are the field names of its files (for siblings)."""
        columns = [column.manifest() for column in self.columns]
        columns += overflow.sibling_manifests([c.name for c in self.columns], staged)
        return TableManifest(
            schema=self.schema,
            table=self.table,
            columns=tuple(columns),
            key_columns=self.key_columns,
            replica_identity=self.replica_identity,  # type: ignore[arg-type]
            rows=rows,
            files=tuple(files),
            row_filter=self.row_filter,
            column_list=self.column_list,
            warnings=self.warnings,
        )


@dataclass(frozen=True, slots=True)
class TableCopy:
    """The staged result of one table: files relative to the snapshot directory, rows, bytes, and
    the names of the fields its files hold (overflow siblings only where needed)."""

    plan: TablePlan
    files: tuple[str, ...]
    rows: int
    bytes: int
    fields: tuple[str, ...] = ()


@dataclass(slots=True)
class SnapshotProgress:
    """Counters passed to the progress callback.

    ``phase`` is ``planned`` (slot created, tables planned, nothing copied yet) or ``copying``.
    """

    phase: str
    slot: str
    tables_total: int
    tables_done: int = 0
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


ProgressCallback = Callable[[SnapshotProgress], None]


# --- planning -------------------------------------------------------------------------------

_TABLE_SQL = """
SELECT c.oid, c.relkind, c.relreplident,
       c.relrowsecurity AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
           AND NOT (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = current_user),
       (CASE WHEN c.relkind = 'p'
             THEN (SELECT coalesce(max(pg_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t
                   WHERE t.isleaf)
             ELSE pg_relation_size(c.oid) END) / current_setting('block_size')::bigint,
       current_setting('block_size')::int,
       current_user::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_COLUMNS_SQL = """
SELECT a.attname::text, a.atttypid::int, a.atttypmod, has_column_privilege(a.attrelid, a.attnum, 'SELECT')
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

_KEY_SQL = """
SELECT a.attname::text
FROM pg_index i
JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END)
ORDER BY k.pos
"""


def _block_ranges(
    blocks: int, parallelism: int, range_bytes: int, min_range_bytes: int, block_size: int
) -> tuple[tuple[int | None, int | None], ...]:
    """Split ``blocks`` into equal ranges: at least ``min_range_bytes`` each, at most ``range_bytes``.

    Tables big enough get two ranges per worker, so the largest-first schedule balances.
    """
    if blocks <= 0:
        return ((None, None),)
    most = max(1, math.ceil(blocks * block_size / min_range_bytes))
    wanted = max(2 * parallelism, math.ceil(blocks * block_size / range_bytes))
    count = min(most, wanted)
    if count <= 1:
        return ((None, None),)
    step = math.ceil(blocks / count)
    bounds = list(range(step, blocks, step))
    lows: list[int | None] = [None, *bounds]
    highs: list[int | None] = [*bounds, None]
    return tuple(zip(lows, highs, strict=True))


def _plan_table(
    cur: Any, published: PublishedTable, parallelism: int, range_bytes: int, min_range_bytes: int
) -> TablePlan:
    name = published.qualified
    cur.execute(_TABLE_SQL, (published.schema, published.table))
    row = cur.fetchone()
    if row is None:
        raise TableDroppedError(f"published table {name} does not exist in the snapshot")
    oid, relkind, identity, rls_applies, blocks, block_size, role = row
    if rls_applies:
        raise RowSecurityError(
            f'table {name} has row-level security and role "{role}" may not bypass it, so a policy could '
            f'silently hide rows from the copy. Run ALTER ROLE "{role}" BYPASSRLS; or copy as the table\'s '
            "owner (without FORCE ROW LEVEL SECURITY). The copy runs with row_security = off, as the "
            "PostgreSQL docs advise for dumps (options=-crow_security=off)."
        )
    cur.execute(_COLUMNS_SQL, (oid,))
    all_columns = cur.fetchall()
    wanted = set(published.columns)
    chosen = [c for c in all_columns if c[0] in wanted]
    denied = [c[0] for c in chosen if not c[3]]
    if denied:
        raise PrivilegeError(
            f'role "{role}" lacks SELECT on published table {name} (columns {", ".join(denied)}). '
            f'As the table\'s owner run: GRANT SELECT ON {name} TO "{role}";'
        )
    cur.execute(_KEY_SQL, (oid, identity))
    index_keys = tuple(r[0] for r in cur.fetchall())
    key_columns = tuple(c[0] for c in chosen) if identity == "f" else () if identity == "n" else index_keys
    warnings: list[str] = []
    if not key_columns:
        warnings.append(
            f"table {name} has no primary key or replica identity (REPLICA IDENTITY "
            f"{'NOTHING' if identity == 'n' else 'DEFAULT without a primary key'}): it is copied, but its "
            "UPDATEs and DELETEs cannot be replicated. Add a primary key or run ALTER TABLE … REPLICA "
            "IDENTITY FULL (or USING INDEX)."
        )
    keys = set(key_columns)
    columns = tuple(ColumnPlan(c[0], c[1], c[2], c[0] in keys) for c in chosen)
    column_list = None if len(chosen) == len(all_columns) else tuple(c.name for c in columns)
    return TablePlan(
        schema=published.schema,
        table=published.table,
        relkind=relkind,
        columns=columns,
        key_columns=key_columns,
        replica_identity=identity,
        row_filter=published.row_filter,
        column_list=column_list,
        publications=published.publications,
        blocks=int(blocks),
        block_ranges=_block_ranges(int(blocks), parallelism, range_bytes, min_range_bytes, block_size),
        warnings=tuple(warnings),
    )


def _select_tables(published: list[PublishedTable], tables: Sequence[str] | None) -> list[PublishedTable]:
    """The subset named in ``tables`` (``schema.table`` or ``table`` for public), all when None."""
    if not tables:
        return published
    by_name = {entry.qualified: entry for entry in published}
    chosen, unknown = [], []
    for name in tables:
        qualified = name if "." in name else f"public.{name}"
        if qualified in by_name:
            chosen.append(by_name[qualified])
        else:
            unknown.append(name)
    if unknown:
        raise PgLogicalError(
            f"table(s) {', '.join(unknown)} are not published by the given publication(s); published: "
            f"{', '.join(sorted(by_name)) or 'none'}. Add them with ALTER PUBLICATION … ADD TABLE."
        )
    return chosen


# What ends the connection that holds an exported snapshot, when it is not a one-off restart.
_HOLDER_ADVICE = (
    "If it happens again, look for what ends idle connections: pg_terminate_backend jobs, proxies, "
    "idle_in_transaction_session_timeout or idle_session_timeout set for the role or database."
)


def import_snapshot(conn: Any, snapshot_name: str) -> None:
    """Start a read-only repeatable-read transaction on ``conn`` that sees ``snapshot_name``."""
    with conn.cursor() as cur:
        cur.execute(IMPORT_SNAPSHOT)
        try:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        except (psycopg2.errors.InvalidParameterValue, psycopg2.errors.UndefinedObject) as exc:
            raise SnapshotLostError(
                f"exported snapshot {snapshot_name} can no longer be imported ({exc.pgerror or exc}): the "
                "replication connection holding it was closed or terminated. The snapshot was discarded "
                f"and its slot dropped; run it again. {_HOLDER_ADVICE}"
            ) from exc


def _spark_can_type(data_type: pa.DataType) -> bool:
    """Whether ``spark/snapshot_jdbc.py`` can cast text to this staged type exactly."""
    return not pa.types.is_list(data_type)


def _spark_column(column: ColumnPlan) -> dict[str, Any]:
    """A column of the Spark job spec; ``sibling`` names its overflow column when values may not fit."""
    may_overflow = overflow.may_need_sibling(column.type_oid, column.typmod)
    return {
        "name": column.name,
        "arrow_type": str(column.arrow_type),
        "sibling": sibling_name(column.name) if may_overflow else None,
    }


def jdbc_connection(conn_params: ConnParams) -> tuple[str, dict[str, str], str | None]:
    """``(jdbc url, properties without password, password)`` for the same database as ``conn_params``.

    libpq keywords with a PostgreSQL JDBC equivalent are carried over (TLS settings, application
    name, timeouts, ``options``); keepalives become ``tcpKeepAlive``. Unix-socket hosts have no
    JDBC form and are refused.
    """
    params = dict(psycopg2.extensions.parse_dsn(conn_params) if isinstance(conn_params, str) else conn_params)
    host = str(params.get("host") or "localhost")
    if host.startswith("/"):
        raise PgLogicalError(
            f"the Spark copy engine needs a TCP host; {host!r} is a Unix socket directory. Use the "
            "server's host name or address in the connection."
        )
    port = str(params.get("port") or 5432)
    dbname = str(params.get("dbname") or params.get("user") or "")
    url = f"jdbc:postgresql://{host}:{port}/{urllib.parse.quote(dbname, safe='')}"
    renames = {
        "user": "user",
        "sslmode": "sslmode",
        "sslrootcert": "sslrootcert",
        "sslcert": "sslcert",
        "sslkey": "sslkey",
        "application_name": "ApplicationName",
        "connect_timeout": "connectTimeout",
        "options": "options",
    }
    properties = {jdbc: str(params[libpq]) for libpq, jdbc in renames.items() if params.get(libpq)}
    if str(params.get("keepalives", "1")) != "0":
        properties["tcpKeepAlive"] = "true"
    password = params.get("password")
    return url, properties, None if password is None else str(password)


# --- the local copy engine --------------------------------------------------------------------


@dataclass(slots=True)
class _Counters:
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
class _Task:
    plan: TablePlan
    index: int
    block_range: tuple[int | None, int | None]


@dataclass(slots=True)
class _TableState:
    remaining: int
    files: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    fields: set[str] = field(default_factory=set)


class _LocalCopy:
    """Worker threads, each with one connection that imports the snapshot again for every range it copies."""

    def __init__(
        self,
        run: SnapshotRun,
        parallelism: int,
        max_file_bytes: int,
        batch_bytes: int,
        max_memory_bytes: int,
    ) -> None:
        self.run = run
        self.parallelism = parallelism
        self.max_file_bytes = max_file_bytes
        self.batch_bytes = batch_bytes
        self.max_memory_bytes = max_memory_bytes
        self.tasks: queue.Queue[_Task] = queue.Queue()
        self.states: dict[str, _TableState] = {}
        self.counters = _Counters()
        self.cancelled = threading.Event()
        self.connections: list[Any] = []
        self.lock = threading.Lock()

    def execute(self) -> list[TableCopy]:
        plans = self.run.plan
        tasks = [_Task(p, i, r) for p in plans for i, r in enumerate(p.block_ranges)]
        # Largest ranges first: the last ones to finish are then the short ones.
        tasks.sort(key=lambda t: -(t.plan.blocks / len(t.plan.block_ranges)))
        for task in tasks:
            self.tasks.put(task)
        self.states = {p.qualified: _TableState(len(p.block_ranges)) for p in plans}
        workers = max(1, min(self.parallelism, len(tasks)))
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pglogical-copy") as pool:
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
                pending, timeout=self.run.progress_interval, return_when=concurrent.futures.FIRST_EXCEPTION
            )
            failures = [exc for exc in (f.exception() for f in done) if exc is not None]
            if failures:
                # Workers stopped by another's failure raise _CancelledError; report the cause.
                failures.sort(key=lambda exc: isinstance(exc, _CancelledError))
                raise failures[0]
            self.run._report("copying", self.counters, time.monotonic() - started)
            if pending:
                self.run.check_holder()

    def _cancel(self) -> None:
        self.cancelled.set()
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(Exception):
                    conn.cancel()

    def _work(self) -> None:
        conn = connect(self.run.conn_params, options=WORKER_OPTIONS)
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
                import_snapshot(conn, self.run.snapshot_name)
                self._copy(conn, task, raw_text)
                with conn.cursor() as cur:
                    cur.execute("COMMIT")
        except BaseException:
            self.cancelled.set()
            raise
        finally:
            conn.close()

    def _copy(self, conn: Any, task: _Task, raw_text: bool) -> None:
        plan = task.plan
        writer = PartFileWriter(
            self.run.location,
            self.run.location.path(self.run.batch_dir, plan.dir_name),
            plan.arrow_schema,
            prefix=f"part-{task.index:05d}",
            max_file_bytes=self.max_file_bytes,
        )
        command = sql.SQL("COPY ({}) TO STDOUT").format(plan.select(task.block_range))
        try:
            with _copy_stream(conn, command) as stream:
                for batch in _typed_batches(stream, plan, self.batch_bytes, self.max_memory_bytes, raw_text):
                    if self.cancelled.is_set():
                        raise _CancelledError
                    writer.write(batch)
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
        relative = [posixpath.relpath(path, self.run.batch_dir) for path in writer.files]
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

    producer = threading.Thread(target=produce, name="pglogical-copy-out", daemon=True)
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


# COPY's text format escapes exactly these (and the backslash itself) as backslash + letter.
_COPY_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
# Text values never contain NUL, so it can mark where each escape sequence starts.
_MARK = "\x00"


def decode_copy_text(values: pa.Array) -> pa.Array:
    """Undo ``COPY … TO STDOUT`` text-format escaping (``\\n`` → newline, ``\\\\`` → ``\\``), vectorised.

    COPY writes every backslash in a value as the start of a two-character escape, so one
    regex pass marks each sequence's start with NUL and plain replacements then resolve
    ``NUL+letter`` unambiguously (``\\\\n`` is a backslash and an ``n``, never a newline).
    Columns without a backslash are returned as they are.
    """
    if not pc.any(pc.match_substring(values, "\\")).as_py():
        return values
    marked = pc.replace_substring_regex(values, pattern=r"\\(.)", replacement=_MARK + r"\1")
    for letter, char in _COPY_ESCAPES.items():
        marked = pc.replace_substring(marked, pattern=_MARK + letter, replacement=char)
    return marked


def _whole_rows(stream: io.BufferedReader[io.FileIO], size: int, max_row_bytes: int) -> Iterator[memoryview]:
    """Chunks of about ``size`` bytes of COPY text, each ending at a row end.

    A raw newline always ends a row in COPY's text format (newlines in values are escaped),
    so cutting at the last one is safe; a row longer than ``size`` (a large TOASTed value)
    makes its chunk as long as the row instead of failing, as a fixed parser block would, up
    to ``max_row_bytes``: beyond, :class:`RowTooLargeError` stops the copy before memory does.
    """
    parts: list[memoryview] = []
    held = 0
    while data := stream.read(size):
        view = memoryview(data)
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            parts.append(view)
            held += len(view)
            if held > max_row_bytes:
                raise RowTooLargeError(
                    f"a row is larger than {max_row_bytes} bytes, the most a copy worker may hold with "
                    f"max_memory_bytes={max_row_bytes * _ROW_COPIES}; raise max_memory_bytes to at least "
                    f"{_ROW_COPIES} times the largest row"
                )
            continue
        parts.append(view[:cut])
        yield memoryview(b"".join(parts)) if len(parts) > 1 else parts[0]
        parts = [view[cut:]] if cut < len(data) else []
        held = len(data) - cut
    if parts:
        # COPY ends every row with a newline; a tail without one is parsed so the error shows.
        yield memoryview(b"".join(parts))


def _typed_batches(
    stream: io.BufferedReader[io.FileIO],
    plan: TablePlan,
    batch_bytes: int,
    max_memory_bytes: int,
    raw_text: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Parse COPY's text format into string columns, then type each with ``types.text_to_arrow``;
    a chunk where some values do not fit their type carries their overflow siblings too.

    Text format (tab-separated, ``\\N`` for NULL, backslash escapes) costs the server less
    than CSV and parses faster: tabs and newlines inside values are always escaped, so
    rows and fields split on the raw characters. Every value is read as a string first
    because the conversion to Arrow types is the drain's too. ``raw_text``: the values are a
    SQL_ASCII database's bytes, read as binary and staged by the rule of ``raw_text.py``.
    """
    names = [f"c{i}" for i in range(len(plan.columns))]
    parse_options = pacsv.ParseOptions(
        delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False
    )
    convert_options = pacsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.binary() if raw_text else pa.string()),
        null_values=["\\N"],
        strings_can_be_null=True,
    )
    schema = plan.arrow_schema
    for chunk in _whole_rows(stream, batch_bytes, max_memory_bytes // _ROW_COPIES):
        table = pacsv.read_csv(
            pa.py_buffer(chunk),
            # One block, one thread: parallelism comes from the workers, threads here only contend.
            read_options=pacsv.ReadOptions(column_names=names, block_size=len(chunk) + 1, use_threads=False),
            parse_options=parse_options,
            convert_options=convert_options,
        )
        columns = [escape_raw_text(c) if raw_text else c for c in table.columns]
        converted = [
            overflow.typed_with_text(decode_copy_text(columns[i]), column.type_oid, column.typmod)
            for i, column in enumerate(plan.columns)
        ]
        typed = [values for values, _ in converted]
        fields, siblings = overflow.add_siblings(
            [column.name for column in plan.columns], typed, [text for _, text in converted]
        )
        if fields:
            yield pa.RecordBatch.from_arrays(typed + siblings, schema=pa.schema([*schema, *fields]))
        else:
            yield pa.RecordBatch.from_arrays(typed, schema=schema)


# --- orchestration ----------------------------------------------------------------------------


def temporary_slot_name(slot: str, backend_pid: int) -> str:
    """A re-snapshot's temporary slot: the pipeline slot's name, ``_rs_`` and the holder's pid.

    The pid keeps two re-snapshots of one pipeline apart; the name fits PostgreSQL's 63 bytes.
    """
    suffix = f"_rs_{backend_pid}"
    return slot[: 63 - len(suffix)] + suffix


class SnapshotRun:
    """One initial (or re-)snapshot of a slot: create the slot, plan, copy, write the manifest.

    Use as a context manager: leaving it with an exception calls :meth:`abort`, which drops
    the slot it created and the staged files, so a retry starts clean.

    :param conn_params: libpq DSN or keyword mapping (contains the password: never logged).
    ``slot_mode`` says where the snapshot comes from:

    * ``"create"``: the initial snapshot; ``slot`` is created (it must not exist unless
      ``recreate_slot``, which drops it first, losing its position);
    * ``"temporary"``: a re-snapshot while the pipeline runs; ``slot`` is the pipeline's slot and
      must exist and be healthy; it is not touched. A temporary slot, which PostgreSQL drops with
      the connection, exports the snapshot. The manifest is staged under ``slot`` and the apply
      job skips each table's changes below the new consistent point;
    * ``"recover"``: the recovery of a lost slot; ``slot`` is created when it is missing or when
      its WAL is lost (``wal_status = 'lost'``), and a healthy slot is refused.

    :param slot: the pipeline's slot (see ``slot_mode``).
    :param publications: the publications whose tables are copied.
    :param staging: staging root (local path or URI).
    :param tables: a subset of the published tables (``schema.table``); all when None.
    :param slot_mode: ``"create"``, ``"temporary"`` or ``"recover"`` (see above).
    :param recreate_slot: ``"create"`` only: drop an existing slot of that name first.
    :param progress_interval: seconds between progress log lines and holder checks.
    :param on_progress: called with :class:`SnapshotProgress` at each phase and interval.
    """

    def __init__(
        self,
        conn_params: ConnParams,
        slot: str,
        publications: Sequence[str],
        staging: str,
        *,
        tables: Sequence[str] | None = None,
        slot_mode: SlotMode = "create",
        recreate_slot: bool = False,
        parallelism: int = DEFAULT_PARALLELISM,
        range_bytes: int = DEFAULT_RANGE_BYTES,
        min_range_bytes: int = DEFAULT_MIN_RANGE_BYTES,
        progress_interval: float = 5.0,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        if not publications:
            raise ValueError("at least one publication is required")
        if slot_mode not in SLOT_MODES:
            raise ValueError(f"slot_mode must be one of {SLOT_MODES}, not {slot_mode!r}")
        self.conn_params = conn_params
        self.slot = validate_slot_name(slot)
        self.publications = tuple(publications)
        self.location = StagingLocation.resolve(staging)
        self.tables = tuple(tables) if tables else None
        self.slot_mode = slot_mode
        self.recreate_slot = recreate_slot
        self.parallelism = max(1, parallelism)
        self.range_bytes = range_bytes
        self.min_range_bytes = min_range_bytes
        self.progress_interval = progress_interval
        self.on_progress = on_progress
        self.created: CreatedSlot | None = None
        self.plan: list[TablePlan] = []
        self.database = ""
        self._holder: Any = None
        self._holder_pid = 0
        self._catalog: Any = None
        self._started = 0.0
        self._last_log = 0.0

    def __enter__(self) -> SnapshotRun:
        try:
            self.start()
        except BaseException:
            self.abort()
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    @property
    def snapshot_name(self) -> str:
        if self.created is None or self.created.snapshot_name is None:
            raise RuntimeError("the slot has not been created yet")
        return self.created.snapshot_name

    @property
    def consistent_point(self) -> Lsn:
        if self.created is None:
            raise RuntimeError("the slot has not been created yet")
        return self.created.consistent_point

    @property
    def batch_dir_name(self) -> str:
        return snapshot_batch_id(self.consistent_point)

    @property
    def batch_dir(self) -> str:
        return self.location.batch_dir(self.slot, self.batch_dir_name)

    def start(self) -> list[TablePlan]:
        """Check inputs, create the slot exporting its snapshot, and plan the tables inside it."""
        self._started = time.monotonic()
        self._catalog = connect(self.conn_params)
        self.database = self._catalog.get_dsn_parameters().get("dbname", "")
        # Fail on bad publications/tables before a slot exists; the snapshot re-reads them below.
        self._published(self._catalog)
        self._prepare_slot()
        self._holder = connect_replication(self.conn_params, options=SNAPSHOT_HOLDER_OPTIONS)
        self._holder_pid = self._holder.get_backend_pid()
        temporary = self.slot_mode == "temporary"
        exporter = temporary_slot_name(self.slot, self._holder_pid) if temporary else self.slot
        self.created = create_slot_with_snapshot(self._holder, exporter, temporary=temporary)
        log.info(
            "created %sslot %s at consistent point %s, exported snapshot %s",
            "temporary " if temporary else "", exporter, self.consistent_point, self.snapshot_name,
        )  # fmt: skip
        if not temporary:
            # A re-snapshot may run beside another one: it removes only what it staged itself.
            self._discard_incomplete()
        self.plan = self._plan()
        for plan in self.plan:
            for warning in plan.warnings:
                log.warning("%s", warning)
        log.info(
            "snapshot plan: %d table(s), %d range(s): %s",
            len(self.plan), sum(len(p.block_ranges) for p in self.plan),
            ", ".join(f"{p.qualified} ({p.blocks} blocks)" for p in self.plan),
        )  # fmt: skip
        self._report("planned", _Counters(), 0.0, force=True)
        return self.plan

    def _published(self, conn: Any) -> list[PublishedTable]:
        published = published_tables(conn, self.publications)
        if not published:
            raise PublicationEmptyError(
                f"publication(s) {', '.join(self.publications)} publish no table; add tables with "
                "ALTER PUBLICATION … ADD TABLE (or FOR TABLES IN SCHEMA)"
            )
        return _select_tables(published, self.tables)

    def _prepare_slot(self) -> None:
        try:
            existing = describe_slot(self._catalog, self.slot)
        except SlotNotFoundError as exc:
            if self.slot_mode == "temporary":
                raise SlotNotFoundError(
                    f"{exc} A re-snapshot continues an existing pipeline: recreate its slot and reload "
                    f"every table with the {RECOVERY_DAG} DAG."
                ) from None
            return
        if self.slot_mode == "temporary":
            if existing.wal_status == "lost":
                raise SlotLostError(
                    f"replication slot {self.slot!r} has lost WAL it had not delivered (wal_status = "
                    f"lost): re-snapshotting some tables cannot repair the others; run the {RECOVERY_DAG} "
                    "DAG, which recreates the slot and reloads every table"
                )
            return
        if self.slot_mode == "recover":
            if existing.wal_status != "lost":
                raise SlotExistsError(
                    f"replication slot {self.slot!r} exists and is healthy (wal_status = "
                    f"{existing.wal_status}, confirmed up to {existing.confirmed_flush_lsn}): there is "
                    "nothing to recover. To reload tables while it runs, re-snapshot them "
                    "(pglogical_backfill_tables)."
                )
            log.warning("slot %s lost its WAL: dropping it to recreate it and reload every table", self.slot)
            drop_slot(self._catalog, self.slot)
            return
        if not self.recreate_slot:
            raise SlotExistsError(
                f"replication slot {self.slot!r} already exists (confirmed up to "
                f"{existing.confirmed_flush_lsn}); "
                "the initial snapshot creates its slot. To snapshot again use the backfill/re-snapshot, or "
                "pass recreate_slot=True to drop it (its unconsumed changes are lost) and start over."
            )
        log.warning("dropping existing slot %s to recreate it (recreate_slot=True)", self.slot)
        drop_slot(self._catalog, self.slot)

    def _discard_incomplete(self) -> None:
        """Delete snapshot directories of this slot that have no manifest (failed earlier runs)."""
        for name, complete in self.location.list_batches(self.slot, prefix="snapshot-"):
            if not complete:
                log.info("deleting incomplete staged snapshot %s of slot %s", name, self.slot)
                self.location.delete_dir(self.location.batch_dir(self.slot, name))

    def _plan(self) -> list[TablePlan]:
        conn = connect(self.conn_params, options=WORKER_OPTIONS)
        try:
            import_snapshot(conn, self.snapshot_name)
            with conn.cursor() as cur:
                published = self._published(conn)
                plans = [
                    _plan_table(cur, p, self.parallelism, self.range_bytes, self.min_range_bytes)
                    for p in published
                ]
        finally:
            # Ends the transaction: it must not hold locks (pg_relation_size takes one) during the copy.
            conn.close()
        for plan in plans:
            overflow.check_names(plan.qualified, [c.name for c in plan.columns])
        return plans

    def _report(self, phase: str, counters: _Counters, seconds: float, *, force: bool = False) -> None:
        """Log progress (at most every ``progress_interval`` seconds unless forced) and call back."""
        progress = SnapshotProgress(
            phase, self.slot, len(self.plan), counters.tables_done, counters.rows, counters.bytes, seconds
        )
        now = time.monotonic()
        if force or now - self._last_log >= self.progress_interval:
            self._last_log = now
            log.info(
                "snapshot %s %s: %d/%d tables, %d rows, %.1f MB staged, %.0f rows/s",
                self.slot, phase, progress.tables_done, progress.tables_total, progress.rows,
                progress.bytes / 1e6, progress.rows_per_second,
            )  # fmt: skip
        if self.on_progress is not None:
            self.on_progress(progress)

    def check_holder(self) -> None:
        """Raise :class:`SnapshotLostError` unless the connection holding the snapshot is alive."""
        if self._holder is None or self._holder.closed:
            raise SnapshotLostError(f"the connection holding snapshot {self.snapshot_name} is closed")
        try:
            with self._catalog.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (self._holder_pid,))
                alive = cur.fetchone() is not None
        except psycopg2.Error as exc:
            if not is_connection_loss(exc):
                raise
            raise SnapshotLostError(
                f"lost the connection to PostgreSQL during the snapshot copy ({connection_lost_detail(exc)}):"
                f" the server restarted or its backends were terminated, and snapshot {self.snapshot_name} "
                "went with them. The copy was discarded and its slot dropped; run the snapshot again."
            ) from exc
        if not alive:
            raise SnapshotLostError(
                f"the replication connection holding snapshot {self.snapshot_name} (backend pid "
                f"{self._holder_pid}) was terminated during the copy; the copy may mix states, so it was "
                f"discarded and its slot dropped; run it again. {_HOLDER_ADVICE}"
            )

    def copy_local(
        self,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    ) -> list[TableCopy]:
        """Copy every planned table with ``parallelism`` worker connections into Parquet part files.

        ``max_memory_bytes`` is the drain's setting: a worker refuses a single row larger than a
        quarter of it (a row is held about four times over), the one case where a chunk grows
        past ``batch_bytes``."""
        copies = _LocalCopy(self, self.parallelism, max_file_bytes, batch_bytes, max_memory_bytes).execute()
        self.check_holder()
        return copies

    def spark_job_spec(self, jdbc_url: str, jdbc_properties: dict[str, str]) -> dict[str, Any]:
        """The description ``spark/snapshot_jdbc.py`` reads: where to read from, what, and where to write.

        ``jdbc_properties`` must not contain the password: the job takes it from the environment
        (see :func:`jdbc_connection`).
        """
        if "password" in jdbc_properties:
            raise ValueError("pass the JDBC password through the environment, not the job spec")
        unsupported = [
            f"{plan.qualified}.{column.name} ({column.arrow_type})"
            for plan in self.plan
            for column in plan.columns
            if not _spark_can_type(column.arrow_type)
        ]
        if unsupported:
            raise PgLogicalError(
                f"the Spark copy engine cannot type {', '.join(unsupported)} (arrays need the local "
                "engine's text conversion); use copy_engine='local' or choose other tables"
            )
        if stores_raw_text(self._catalog):
            raise PgLogicalError(
                f"database {self.database!r} is SQL_ASCII: the Spark copy engine reads through JDBC as "
                "UTF-8, which the server refuses for stored bytes that are not UTF-8; use "
                "copy_engine='local', which stages them by the SQL_ASCII rule (docs/FORMATS.md)"
            )
        session = " ".join(filter(None, [jdbc_properties.get("options"), WORKER_OPTIONS, SESSION_OPTIONS]))
        tables = []
        for plan in self.plan:
            tables.append(
                {
                    "name": plan.qualified,
                    "output": self.location.uri_of(
                        self.location.path(self.batch_dir, plan.dir_name), hadoop=True
                    ),
                    "queries": [
                        plan.select(r, as_text=True).as_string(self._catalog) for r in plan.block_ranges
                    ],
                    "columns": [_spark_column(c) for c in plan.columns],
                }
            )
        if not _SNAPSHOT_NAME.match(self.snapshot_name):
            raise PgLogicalError(f"unexpected exported snapshot name {self.snapshot_name!r}")
        return {
            "jdbc_url": jdbc_url,
            "properties": {**jdbc_properties, "options": session},
            "session_init": f"{IMPORT_SNAPSHOT}; SET TRANSACTION SNAPSHOT '{self.snapshot_name}'",
            "tables": tables,
        }

    def collect_staged(self) -> list[TableCopy]:
        """Inventory part files another engine (Spark) wrote into the table directories.

        Files other than ``part-*.parquet`` (Spark's ``_SUCCESS``, checksum files) are removed so the
        directory holds exactly what the manifest lists.
        """
        copies = []
        for plan in self.plan:
            directory = self.location.path(self.batch_dir, plan.dir_name)
            files, rows, size, fields = [], 0, 0, set()
            for path in self.location.list_files(directory):
                name = posixpath.basename(path)
                if not (name.startswith("part-") and name.endswith(".parquet")):
                    self.location.filesystem.delete_file(path)
                    continue
                info = self.location.filesystem.get_file_info(path)
                with self.location.filesystem.open_input_file(path) as handle:
                    staged = pq.ParquetFile(handle)
                    rows += staged.metadata.num_rows
                    fields.update(staged.schema_arrow.names)
                size += info.size or 0
                files.append(posixpath.relpath(path, self.batch_dir))
            copies.append(TableCopy(plan, tuple(files), rows, size, tuple(sorted(fields))))
        self.check_holder()
        return copies

    def finish(self, copies: Sequence[TableCopy]) -> tuple[str, Manifest]:
        """Write the manifest (last, atomically where possible), release the snapshot; return its path."""
        self.check_holder()
        seconds = time.monotonic() - self._started
        manifest = Manifest(
            kind="snapshot",
            slot=self.slot,
            database=self.database,
            batch_id=self.batch_dir_name,
            start_lsn=self.consistent_point,
            end_lsn=self.consistent_point,
            snapshot_name=self.snapshot_name,
            snapshot_slot=self.created.slot_name if self.created else None,
            tables=tuple(copy.plan.manifest(copy.rows, copy.files, copy.fields) for copy in copies),
            stats=ManifestStats(bytes=sum(c.bytes for c in copies), seconds=round(seconds, 3)),
        )
        path = self.location.write_manifest(self.batch_dir, manifest)
        rows = manifest.total_rows
        log.info(
            "snapshot of slot %s complete: %d table(s), %d rows in %.1f s (%.0f rows/s); manifest %s",
            self.slot, len(copies), rows, seconds, rows / seconds if seconds else 0.0, path,
        )  # fmt: skip
        self.close()
        return path, manifest

    def close(self) -> None:
        """Release the exported snapshot and the catalog connection (the slot stays)."""
        for conn in (self._holder, self._catalog):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        self._holder = self._catalog = None

    def abort(self) -> None:
        """Undo a failed run: close the holder, drop the slot this run created, delete staged files."""
        created = self.created
        self.close()
        if created is None:
            return
        with contextlib.suppress(Exception):
            self.location.delete_dir(self.batch_dir)
        if self.slot_mode == "temporary":
            return  # PostgreSQL dropped the temporary slot with its connection
        try:
            self._drop_created_slot()
        except Exception as exc:
            log.error("could not drop slot %s after the failed snapshot: %s; drop it by hand", self.slot, exc)

    def _drop_created_slot(self, timeout: float = 30.0) -> None:
        # The walsender that held the slot exits asynchronously after its connection closes.
        conn = connect(self.conn_params)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if drop_slot(conn, self.slot):
                        log.info("dropped slot %s of the failed snapshot", self.slot)
                    return
                except SlotActiveError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            conn.close()


def staged_snapshot(staging: str, slot: str) -> tuple[str, Manifest] | None:
    """The newest complete snapshot that ``slot`` itself exported (not a re-snapshot), if staged.

    Returns its manifest URI and manifest: what a re-run of an initial or recovery snapshot
    hands to its load again when the slot already exists.
    """
    location = StagingLocation.resolve(staging)
    for name, complete in sorted(location.list_batches(slot, prefix="snapshot-"), reverse=True):
        if not complete:
            continue
        batch_dir = location.batch_dir(slot, name)
        manifest = location.read_manifest(batch_dir)
        if manifest.snapshot_slot in (None, slot):
            return location.uri_of(posixpath.join(batch_dir, MANIFEST_NAME)), manifest
    return None


def take_snapshot(
    conn_params: ConnParams,
    slot: str,
    publications: Sequence[str],
    staging: str,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    **options: Any,
) -> tuple[str, Manifest]:
    """Create ``slot`` with an exported snapshot and copy the published tables with the local engine.

    Returns the manifest's path and the manifest. ``options`` are :class:`SnapshotRun` keywords.
    """
    with SnapshotRun(conn_params, slot, publications, staging, **options) as run:
        copies = run.copy_local(
            max_file_bytes=max_file_bytes, batch_bytes=batch_bytes, max_memory_bytes=max_memory_bytes
        )
        return run.finish(copies)
