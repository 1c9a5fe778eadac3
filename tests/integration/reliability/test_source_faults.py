"""Faults of the source and of staging, each on a throwaway cluster of its own: the run fails with an
error that says what to do, leaves nothing that looks complete, acknowledges nothing, and a retry
converges (the drain: the same staged rows as a clean run; the snapshot: the source's rows).

The faults strike at a known point, not after a sleep:

* a drain is cut once it has staged its first piece: the drain's progress record for that piece
  is logged on the staging thread, so a log handler that restarts the server (or terminates the
  backend reading the slot) holds staging while it does; the reader stops a few pieces later on
  its bounded queue, so the server is cut in the middle of sending the window (the workload is
  several times larger than the pieces in flight);
* a snapshot is cut while one worker's COPY waits for a lock another session holds on the second
  table (taken as soon as the snapshot is planned), after the first table was staged.

A fast shutdown waits for walsenders to deliver what they have, and the cut drain's reader is held
still, so the streaming transport is restarted ``immediate`` (a crash) only; the SQL peek is a
normal backend, which a fast shutdown ends at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainResult, DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import SnapshotLostError, SnapshotProgress, take_snapshot
from airflow_provider_postgres_cdc.errors import ConnectionLostError, StagingNotWritableError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.replication import connect, create_slot, describe_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TRANSACTIONS, ROWS_PER_TRANSACTION = 8, 40_000
TOTAL = TRANSACTIONS * ROWS_PER_TRANSACTION
PIECE_BYTES = 256 << 10  # ~60 pieces for the workload; 3 in flight at most


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    with PostgresCluster() as pg:
        yield pg


def _workload(pg: PostgresCluster) -> None:
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, pad text); CREATE PUBLICATION p FOR TABLE big")
    for i in range(TRANSACTIONS):
        first = i * ROWS_PER_TRANSACTION + 1
        pg.execute(
            f"INSERT INTO big SELECT g, md5(g::text) || repeat('x', 60) "
            f"FROM generate_series({first}, {first + ROWS_PER_TRANSACTION - 1}) g"
        )


def _confirmed(pg: PostgresCluster, slot: str) -> Lsn | None:
    conn = connect(pg.dsn())
    try:
        return describe_slot(conn, slot).confirmed_flush_lsn
    finally:
        conn.close()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _staged(result: DrainResult) -> dict[str, pa.Table]:
    root = Path(result.batch_uri.removeprefix("file://"))
    return {
        entry.qualified: pa.concat_tables([pq.read_table(root / f) for f in entry.files]).sort_by(
            [("_pgl_commit_lsn", "ascending"), ("_pgl_seq", "ascending")]
        )
        for entry in result.manifest.tables
    }


class _OnFirstPiece(logging.Handler):
    """Runs ``action`` once, on the drain's first progress record (a piece was just staged)."""

    def __init__(self, action: Callable[[], None]) -> None:
        super().__init__()
        self.action = action
        self.changes_then: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("drain %s: %d changes") and not self.changes_then:
            self.changes_then.append(int(record.args[1]))  # type: ignore[index]
            self.action()


def _drain_with_fault(settings: DrainSettings, dsn: str, action: Callable[[], None]) -> tuple[Exception, int]:
    logger = logging.getLogger("airflow_provider_postgres_cdc.engine.drain")
    handler, level = _OnFirstPiece(action), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(Exception) as failure:
            drain_batch(dsn, settings)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert handler.changes_then, "the fault never fired: the drain staged nothing"
    return failure.value, handler.changes_then[0]


def _terminate_reader(pg: PostgresCluster, transport: str) -> None:
    """The stream's walsender, or the peek's backend: the holder of the drain's slot lock, which
    runs the peek's calls (between two calls it is idle, and its next read still fails)."""
    reader = (
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'"
        if transport == "stream"
        else "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
    )
    rows = pg.execute(f"SELECT pg_terminate_backend(pid) FROM ({reader}) AS reader")
    assert rows == [(True,)], rows


DRAIN_FAULTS = [
    pytest.param("peek", "fast", id="peek-restart-fast"),
    pytest.param("peek", "immediate", id="peek-restart-immediate"),
    pytest.param("stream", "immediate", id="stream-restart-immediate"),
    pytest.param("peek", "terminate", id="peek-backend-terminated"),
    pytest.param("stream", "terminate", id="stream-walsender-terminated"),
]


@pytest.mark.parametrize(("transport", "fault"), DRAIN_FAULTS)
def test_drain_cut_by_the_source_fails_clearly_and_a_retry_converges(
    cluster: PostgresCluster, transport: Any, fault: str, tmp_path: Path
) -> None:
    conn = connect(cluster.dsn())
    create_slot(conn, "cdc")
    create_slot(conn, "clean")  # the same starting point: what one clean run stages
    conn.close()
    _workload(cluster)
    clean = drain_batch(
        cluster.dsn(), DrainSettings("clean", ("p",), str(tmp_path / "clean"), transport=transport)
    )
    assert clean.manifest.stats.changes == TOTAL
    before = _confirmed(cluster, "cdc")
    staging = tmp_path / "staging"
    settings = DrainSettings(
        "cdc", ("p",), str(staging), transport=transport, progress_seconds=0, chunk_bytes=PIECE_BYTES,
        chunk_messages=20_000,
    )  # fmt: skip

    def cut() -> None:
        if fault == "terminate":
            _terminate_reader(cluster, transport)
        else:
            cluster.restart(fault)

    error, staged_then = _drain_with_fault(settings, cluster.dsn(), cut)
    assert 0 < staged_then < TOTAL
    assert isinstance(error, ConnectionLostError), repr(error)
    assert "lost the connection" in str(error) and "run the drain again" in str(error)
    assert _files(staging) == []  # no batch, so nothing a retry or the apply could take as complete
    assert _confirmed(cluster, "cdc") == before

    retry = drain_batch(cluster.dsn(), DrainSettings("cdc", ("p",), str(staging), transport=transport))
    assert not retry.reused
    assert (retry.manifest.stats.changes, retry.manifest.stats.transactions) == (TOTAL, TRANSACTIONS)
    assert _staged(retry) == _staged(clean)
    assert _confirmed(cluster, "cdc") == before


def test_full_staging_disk_fails_clearly_and_a_retry_converges(
    cluster: PostgresCluster, tmpfs: Path, remount: Callable[[Path, str], None], tmp_path: Path
) -> None:
    conn = connect(cluster.dsn())
    create_slot(conn, "cdc")
    create_slot(conn, "clean")
    conn.close()
    _workload(cluster)
    clean = drain_batch(cluster.dsn(), DrainSettings("clean", ("p",), str(tmp_path / "clean")))
    before = _confirmed(cluster, "cdc")
    with pytest.raises(StagingNotWritableError) as failure:
        drain_batch(cluster.dsn(), DrainSettings("cdc", ("p",), str(tmpfs)))
    assert "No space left on device" in str(failure.value)
    assert "free space in (or fix) the staging location" in str(failure.value)
    assert _files(tmpfs) == []  # the partial batch is gone, space freed for the next try
    assert _confirmed(cluster, "cdc") == before

    remount(tmpfs, "size=256m")
    retry = drain_batch(cluster.dsn(), DrainSettings("cdc", ("p",), str(tmpfs)))
    assert _staged(retry) == _staged(clean)
    assert _confirmed(cluster, "cdc") == before


# --- the snapshot ------------------------------------------------------------------------------


def _snapshot_source(pg: PostgresCluster) -> None:
    pg.execute(
        "CREATE TABLE big (id int PRIMARY KEY, pad text);"
        "INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 100000) g;"
        "CREATE TABLE small (id int PRIMARY KEY, pad text);"
        "INSERT INTO small SELECT g, md5(g::text) FROM generate_series(1, 10) g;"
        "CREATE PUBLICATION p FOR TABLE big, small;"
    )


def _staged_snapshot(path: str, manifest: Manifest) -> dict[str, list[tuple[Any, ...]]]:
    root = Path(path).parent
    out = {}
    for entry in manifest.tables:
        table = pa.concat_tables([pq.read_table(root / f) for f in entry.files])
        out[entry.qualified] = sorted(
            zip(*(table.column(c.name).to_pylist() for c in entry.columns), strict=True)
        )
    return out


def _source(pg: PostgresCluster) -> dict[str, list[tuple[Any, ...]]]:
    return {f"public.{name}": sorted(pg.execute(f"SELECT id, pad FROM {name}")) for name in ("big", "small")}


class _CutWhileCopying:
    """Locks ``small`` once the snapshot is planned; when a worker's COPY waits for that lock (``big``
    is staged by then), runs the fault."""

    def __init__(self, pg: PostgresCluster, fault: Callable[[], None]) -> None:
        self.pg = pg
        self.fault = fault
        self.locker: Any = None
        self.fired = False

    def __call__(self, progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            self.locker = connect(self.pg.dsn(), autocommit=False)
            with self.locker.cursor() as cur:
                cur.execute("LOCK TABLE small IN ACCESS EXCLUSIVE MODE")
            return
        if self.fired or progress.phase != "copying":
            return
        waiting = self.pg.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND query LIKE 'COPY %' AND query LIKE '%small%'"
        )
        if waiting[0][0]:
            self.fired = True
            self.fault()

    def close(self) -> None:
        if self.locker is not None and not self.locker.closed:
            self.locker.close()


def _terminate_copy(pg: PostgresCluster) -> None:
    rows = pg.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' AND query LIKE 'COPY %'"
    )
    assert rows == [(True,)], rows


SNAPSHOT_FAULTS = [
    pytest.param("fast", SnapshotLostError, "run the snapshot again", id="restart-fast"),
    pytest.param("immediate", SnapshotLostError, "run the snapshot again", id="restart-immediate"),
    pytest.param(
        "terminate", ConnectionLostError, "lost the connection copying table public.small", id="copy-cut"
    ),
]


@pytest.mark.parametrize(("fault", "error", "words"), SNAPSHOT_FAULTS)
def test_snapshot_cut_in_the_middle_of_the_copy_fails_clearly_and_a_retry_converges(
    cluster: PostgresCluster, fault: str, error: type[Exception], words: str, tmp_path: Path
) -> None:
    _snapshot_source(cluster)
    staging = tmp_path / "staging"
    cut = _CutWhileCopying(
        cluster,
        (lambda: _terminate_copy(cluster)) if fault == "terminate" else (lambda: cluster.restart(fault)),
    )
    try:
        with pytest.raises(error) as failure:
            take_snapshot(
                cluster.dsn(),
                "cdc",
                ["p"],
                str(staging),
                parallelism=1,
                progress_interval=0.05,
                on_progress=cut,
            )
    finally:
        cut.close()
    # One worker copies the largest range first: big was copied, small's COPY was under way.
    assert cut.fired
    assert words in str(failure.value) and "slot dropped" in str(failure.value)
    assert _files(staging) == []
    assert cluster.execute("SELECT slot_name FROM pg_replication_slots") == []  # nothing left to consume

    path, manifest = take_snapshot(cluster.dsn(), "cdc", ["p"], str(staging))
    assert _staged_snapshot(path, manifest) == _source(cluster)


def test_full_staging_disk_during_a_snapshot_fails_clearly_and_a_retry_converges(
    cluster: PostgresCluster, tmpfs: Path, remount: Callable[[Path, str], None]
) -> None:
    _snapshot_source(cluster)
    with pytest.raises(StagingNotWritableError) as failure:
        take_snapshot(cluster.dsn(), "cdc", ["p"], str(tmpfs))
    assert "No space left on device" in str(failure.value) and "free space in" in str(failure.value)
    assert _files(tmpfs) == []
    assert cluster.execute("SELECT slot_name FROM pg_replication_slots") == []

    remount(tmpfs, "size=256m")
    path, manifest = take_snapshot(cluster.dsn(), "cdc", ["p"], str(tmpfs))
    assert _staged_snapshot(path, manifest) == _source(cluster)
