"""Batches end exactly on commit boundaries, whatever the bound, the message limit and the
server's streaming of large transactions (``logical_decoding_work_mem=64kB``) do.

Every staged batch is compared with ``test_decoding``'s view of the same slot window: a copy of
the pgoutput slot made before the workload, advanced to the batch's start and peeked up to its
end. ``test_decoding`` through the SQL interface shows committed transactions only, whole, in
commit order, which is exactly what a batch must hold.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainResult, DrainSettings, drain_batch
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import advance_slot, connect, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text);
CREATE PUBLICATION pub FOR TABLE items;
"""
_CHANGE = re.compile(r"^table public\.items: (INSERT|UPDATE|DELETE): id\[integer\]:(-?\d+)")
_OPS = {"INSERT": "I", "UPDATE": "U", "DELETE": "D"}
Change = tuple[str, int]


@pytest.fixture(scope="module")
def streaming_cluster() -> Iterator[PostgresCluster]:
    """A server that streams any transaction over 64 kB of decoded changes before it commits."""
    with PostgresCluster({"logical_decoding_work_mem": "64kB"}) as cluster:
        yield cluster


@pytest.fixture
def db(streaming_cluster: PostgresCluster) -> Iterator[str]:
    """A fresh database with the pgoutput slot ``cdc`` and its ``test_decoding`` twin ``td``."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    streaming_cluster.create_database(name)
    streaming_cluster.execute(SCHEMA, name)
    conn = connect(streaming_cluster.dsn(name))
    create_slot(conn, "cdc")
    conn.close()
    streaming_cluster.execute(
        "SELECT pg_copy_logical_replication_slot('cdc', 'td', false, 'test_decoding')", name
    )
    yield name
    streaming_cluster.drop_database(name)


def _staged(result: DrainResult) -> list[Change]:
    """The batch's changes to ``items`` as ``(op, id)`` in commit order."""
    root = Path(result.batch_uri.removeprefix("file://"))
    rows: list[tuple[int, int, str, int]] = []
    for entry in result.manifest.tables:
        table = pa.concat_tables([pq.read_table(root / f) for f in entry.files], promote_options="default")
        for row in table.to_pylist():
            key = row["id"] if row["id"] is not None else row["_pgl_old"]["id"]
            rows.append((row["_pgl_commit_lsn"], row["_pgl_seq"], row["_pgl_op"], key))
    return [(op, key) for _, _, op, key in sorted(rows)]


def _test_decoding_window(cluster: PostgresCluster, db: str, start: Lsn, end: Lsn) -> list[Change]:
    """What ``test_decoding`` shows for the slot window ``start``..``end``."""
    cluster.execute(f"SELECT pg_replication_slot_advance('td', '{start}')", db)
    lines = cluster.execute(f"SELECT data FROM pg_logical_slot_peek_changes('td', '{end}', NULL)", db)
    changes = []
    for (line,) in lines:
        match = _CHANGE.match(line)
        if match:
            changes.append((_OPS[match[1]], int(match[2])))
    return changes


def _drain_all(cluster: PostgresCluster, db: str, tmp_path: Path, **settings: object) -> list[list[Change]]:
    """Drain and ack batch after batch until one is empty, checking each against test_decoding."""
    batches: list[list[Change]] = []
    conn = connect(cluster.dsn(db))
    try:
        for number in range(100):
            staging = str(tmp_path / f"{settings.get('transport', 'peek')}-{number}")
            result = drain_batch(cluster.dsn(db), DrainSettings("cdc", ("pub",), staging, **settings))  # type: ignore[arg-type]
            staged = _staged(result)
            window = _test_decoding_window(cluster, db, result.manifest.start_lsn, result.manifest.end_lsn)
            assert staged == window, f"batch {number} differs from test_decoding's view of its window"
            if not staged:
                assert not result.manifest.stats.full, "a batch that read to the end is not full"
                return batches
            batches.append(staged)
            advance_slot(conn, "cdc", result.manifest.end_lsn)
    finally:
        conn.close()
    raise AssertionError("the drain did not finish in 100 batches")


def _inserts(first: int, last: int) -> list[Change]:
    return [("I", key) for key in range(first, last + 1)]


@pytest.mark.parametrize("transport", ["stream", "peek"])
def test_message_limit_inside_a_streamed_transaction_takes_it_whole(
    streaming_cluster: PostgresCluster, db: str, tmp_path: Path, transport: str
) -> None:
    """A loss this guards against: the server streams the 20,000 inserts in blocks, the limit falls
    inside them; the batch used to stage nothing and end past the commit, skipping every row."""
    streaming_cluster.execute(
        "INSERT INTO items SELECT g, repeat('x', 50) FROM generate_series(1, 20000) g", db
    )
    batches = _drain_all(streaming_cluster, db, tmp_path, transport=transport, max_messages=1000)
    assert batches == [_inserts(1, 20000)]


def test_stream_commit_after_the_bound_waits_for_the_next_batch(
    streaming_cluster: PostgresCluster, db: str, tmp_path: Path
) -> None:
    """A transaction streamed before the bound but committed after it belongs to the next batch only."""
    big = connect(streaming_cluster.dsn(db), autocommit=False)
    with big.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, repeat('x', 50) FROM generate_series(1, 5000) g")
    streaming_cluster.execute("INSERT INTO items VALUES (-1, 'small')", db)
    ((bound,),) = streaming_cluster.execute("SELECT pg_current_wal_insert_lsn()::text", db)
    big.commit()
    big.close()
    ((start,),) = streaming_cluster.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdc'", db
    )
    max_bytes = int(Lsn.parse(bound)) - int(Lsn.parse(start))
    first = drain_batch(
        streaming_cluster.dsn(db),
        DrainSettings("cdc", ("pub",), str(tmp_path / "first"), transport="stream", max_bytes=max_bytes),
    )
    assert first.manifest.end_lsn == Lsn.parse(bound)
    assert first.manifest.stats.full and first.summary()["full"]  # cut by max_bytes, the commit behind
    assert (
        _staged(first)
        == [("I", -1)]
        == _test_decoding_window(streaming_cluster, db, first.manifest.start_lsn, first.manifest.end_lsn)
    )
    conn = connect(streaming_cluster.dsn(db))
    advance_slot(conn, "cdc", first.manifest.end_lsn)
    conn.close()
    rest = _drain_all(streaming_cluster, db, tmp_path / "rest", transport="stream")
    assert rest == [_inserts(1, 5000)]


@pytest.mark.parametrize("transport", ["stream", "peek"])
def test_interleaved_aborted_and_committed_streamed_transactions(
    streaming_cluster: PostgresCluster, db: str, tmp_path: Path, transport: str
) -> None:
    """Two streamed transactions interleave with small ones; one aborts, one rolls back a
    savepoint; small message limits cut everywhere. Nothing aborted shows, nothing is lost or
    staged twice, and every batch equals test_decoding's view of its window."""
    a = connect(streaming_cluster.dsn(db), autocommit=False)
    b = connect(streaming_cluster.dsn(db), autocommit=False)
    with a.cursor() as ca, b.cursor() as cb:
        ca.execute("INSERT INTO items SELECT g, repeat('a', 50) FROM generate_series(1, 2000) g")
        cb.execute("INSERT INTO items SELECT g, repeat('b', 50) FROM generate_series(100001, 102000) g")
        streaming_cluster.execute("INSERT INTO items VALUES (-1, 'between')", db)
        ca.execute("SAVEPOINT s; INSERT INTO items SELECT g, 'gone' FROM generate_series(50001, 51000) g")
        ca.execute("ROLLBACK TO SAVEPOINT s")
        cb.execute("INSERT INTO items SELECT g, repeat('b', 50) FROM generate_series(102001, 103000) g")
        ca.execute("INSERT INTO items SELECT g, repeat('a', 50) FROM generate_series(2001, 3000) g")
        streaming_cluster.execute("INSERT INTO items VALUES (-2, 'before the abort')", db)
    b.rollback()
    streaming_cluster.execute("DELETE FROM items WHERE id = -1", db)
    a.commit()
    streaming_cluster.execute("INSERT INTO items VALUES (-3, 'last')", db)
    a.close()
    b.close()
    batches = _drain_all(streaming_cluster, db, tmp_path, transport=transport, max_messages=7)
    assert [change for batch in batches for change in batch] == [
        ("I", -1), ("I", -2), ("D", -1), *_inserts(1, 3000), ("I", -3),
    ]  # fmt: skip


@pytest.mark.parametrize("transport", ["stream", "peek"])
def test_transaction_larger_than_memory_spills_and_stages_in_pieces(
    streaming_cluster: PostgresCluster,
    db: str,
    tmp_path: Path,
    transport: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the smallest budget (32 MiB: 4 MiB held, pieces of about 680 kB) a ~9 MB transaction with a
    rolled-back savepoint goes to disk and comes back in many pieces, numbered as one."""
    big = connect(streaming_cluster.dsn(db), autocommit=False)
    with big.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, repeat('x', 100) FROM generate_series(1, 40000) g")
        streaming_cluster.execute("INSERT INTO items VALUES (-1, 'interleaved')", db)
        cur.execute("SAVEPOINT s; INSERT INTO items SELECT g, 'gone' FROM generate_series(50001, 60000) g")
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute("INSERT INTO items SELECT g, repeat('y', 100) FROM generate_series(40001, 60000) g")
    big.commit()
    big.close()
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    caplog.set_level("INFO", logger="airflow_provider_postgres_cdc")
    settings = {
        "transport": transport,
        "max_memory_bytes": 32 << 20,
        "spill_dir": str(spill_dir),
        "progress_seconds": 0,
    }
    result = drain_batch(
        streaming_cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path / "s"), **settings)
    )  # type: ignore[arg-type]
    staged = _staged(result)
    window = _test_decoding_window(streaming_cluster, db, result.manifest.start_lsn, result.manifest.end_lsn)
    assert staged == window == [("I", -1), *_inserts(1, 60000)]
    assert result.manifest.stats.transactions == 2
    root = Path(result.batch_uri.removeprefix("file://"))
    (entry,) = result.manifest.tables
    table = pa.concat_tables([pq.read_table(root / f) for f in entry.files])
    big_rows = table.filter(pa.compute.greater(table.column("id"), 0))
    assert sorted(big_rows.column("_pgl_seq").to_pylist()) == list(
        range(60000)
    )  # one numbering across pieces
    logged = [r.getMessage() for r in caplog.records]
    assert any(
        "bytes of undecided transactions spilled so far" in m for m in logged
    )  # progress while reading
    assert any("spilled" in m and "to disk" in m for m in logged)  # the total, at the end
    assert not list(spill_dir.iterdir())  # spill files never outlive the drain
