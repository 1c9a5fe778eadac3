"""The drain against a real server: both transports, bounds, retries, empty batches and bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.staging import read_manifest
from airflow_provider_postgres_cdc.errors import (
    PublicationNotFoundError,
    SlotActiveError,
    SlotNotFoundError,
    StagingNotWritableError,
)
from airflow_provider_postgres_cdc.replication import (
    advance_slot,
    connect,
    connect_replication,
    create_slot,
    describe_slot,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.drain.staged import staged_tables
from tests.pg_majors import ALSO_ON_PG18

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10, 2), at timestamptz, doc jsonb);
CREATE TABLE unpublished (id int);
CREATE PUBLICATION pub FOR TABLE items;
"""


@pytest.fixture
def source(pg_cluster: PostgresCluster, pg_dbname: str) -> tuple[PostgresCluster, str]:
    pg_cluster.execute(SCHEMA, pg_dbname)
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "cdc")
    conn.close()
    return pg_cluster, pg_dbname


def _workload(cluster: PostgresCluster, db: str) -> None:
    cluster.execute(
        "INSERT INTO items SELECT g, 'item ' || g, g * 1.25, "
        "'2026-01-01 00:00+00'::timestamptz + g * interval '1 min', jsonb_build_object('g', g) "
        "FROM generate_series(1, 2000) g",
        db,
    )
    cluster.execute("UPDATE items SET price = price + 1 WHERE id % 7 = 0", db)
    cluster.execute("DELETE FROM items WHERE id > 1990; INSERT INTO unpublished VALUES (1)", db)
    cluster.execute("UPDATE items SET id = id + 10000 WHERE id = 5", db)  # a key change
    cluster.execute("TRUNCATE unpublished; INSERT INTO items VALUES (3000, NULL, NULL, NULL, 'null')", db)


@ALSO_ON_PG18
def test_both_transports_stage_identical_batches_without_moving_the_slot(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    _workload(cluster, db)
    conn = connect(cluster.dsn(db))
    before = describe_slot(conn, "cdc").confirmed_flush_lsn
    results = {
        transport: drain_batch(
            cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path / transport), transport=transport)
        )
        for transport in ("peek", "stream")
    }
    assert describe_slot(conn, "cdc").confirmed_flush_lsn == before
    conn.close()
    peek, stream = results["peek"], results["stream"]
    # Each drain bounds its window by the WAL flushed when it starts: WAL the server writes between the
    # two (autovacuum, a running-xacts record) moves the second bound on, and holds no published change.
    assert before < peek.manifest.end_lsn <= stream.manifest.end_lsn
    assert peek.manifest.stats.transactions == stream.manifest.stats.transactions == 5
    staged = staged_tables(peek)["public.items"]
    assert staged.equals(staged_tables(stream)["public.items"])
    ops = staged.column("_pgl_op").to_pylist()
    assert ops.count("I") == 2001 and ops.count("U") == 285 + 1 and ops.count("D") == 10
    key_change = staged.filter(pa.compute.equal(staged.column("id"), 10005)).to_pylist()[0]
    assert key_change["_pgl_op"] == "U" and key_change["_pgl_old"]["id"] == 5
    last = staged.to_pylist()[-1]
    assert last["id"] == 3000 and last["doc"] == "null" and last["name"] is None  # JSON null is not SQL NULL
    table = peek.manifest.tables[0]
    assert table.key_columns == ("id",) and [c.pg_type for c in table.columns][:3] == [
        "int4",
        "text",
        "numeric",
    ]
    assert read_manifest(peek.manifest_uri) == peek.manifest


def test_retry_reuses_a_complete_batch_and_redoes_a_half_written_one(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    _workload(cluster, db)
    settings = DrainSettings("cdc", ("pub",), str(tmp_path))
    first = drain_batch(cluster.dsn(db), settings)
    first_rows = staged_tables(first)["public.items"].num_rows
    cluster.execute("INSERT INTO items VALUES (4000, 'later')", db)
    again = drain_batch(cluster.dsn(db), settings)
    assert again.reused and again.manifest == first.manifest  # the same window: the slot has not moved
    manifest_file = Path(first.manifest_uri.removeprefix("file://"))
    manifest_file.unlink()  # as if the first attempt died before writing its manifest
    redone = drain_batch(cluster.dsn(db), settings)
    assert not redone.reused and redone.manifest.start_lsn == first.manifest.start_lsn
    assert redone.manifest.end_lsn > first.manifest.end_lsn  # a fresh bound, now with the later row
    assert staged_tables(redone)["public.items"].num_rows == first_rows + 1


def test_an_empty_batch_ending_where_it_started_is_redone_not_reused(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    # Found by the crash soak (seed 17): reused, such a batch ended every later drain at its start.
    cluster, db = source
    settings = DrainSettings("cdc", ("pub",), str(tmp_path))
    conn = connect(cluster.dsn(db))
    try:
        for _ in range(5):  # an idle source: no WAL between the ack and the next drain
            acked = drain_batch(cluster.dsn(db), settings)
            advance_slot(conn, "cdc", acked.manifest.end_lsn)
            idle = drain_batch(cluster.dsn(db), settings)
            if idle.manifest.end_lsn == idle.manifest.start_lsn:
                break
        assert idle.manifest.end_lsn == idle.manifest.start_lsn and not idle.manifest.tables
        cluster.execute("INSERT INTO items (id, name) VALUES (4001, 'after an idle run')", db)
        after = drain_batch(cluster.dsn(db), settings)
        assert not after.reused and after.manifest.start_lsn == idle.manifest.start_lsn
        assert after.manifest.end_lsn > after.manifest.start_lsn
        assert staged_tables(after)["public.items"].column("id").to_pylist() == [4001]
    finally:
        conn.close()


def test_message_limit_ends_on_a_commit_and_consecutive_batches_meet(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    for start in range(0, 1000, 100):  # ten transactions of 100 inserts
        cluster.execute(f"INSERT INTO items (id) SELECT generate_series({start}, {start + 99})", db)
    conn = connect(cluster.dsn(db))
    seen: list[int] = []
    batches = 0
    while True:
        result = drain_batch(cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path), max_messages=250))
        staged = staged_tables(result)
        if not staged:
            break
        batches += 1
        ids = staged["public.items"].column("id").to_pylist()
        assert len(ids) % 100 == 0  # whole transactions only
        seen += ids
        advance_slot(conn, "cdc", result.manifest.end_lsn)
    conn.close()
    assert seen == list(range(1000)) and batches == 4  # 3 transactions (306 messages) per batch, then 1


def test_empty_batch_reports_the_bound_so_the_slot_can_advance(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    cluster.execute("INSERT INTO unpublished SELECT generate_series(1, 5000)", db)
    conn = connect(cluster.dsn(db))
    start = describe_slot(conn, "cdc").confirmed_flush_lsn
    for transport in ("peek", "stream"):
        result = drain_batch(
            cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path / transport), transport=transport)
        )
        assert result.manifest.tables == () and result.manifest.end_lsn > start
    assert advance_slot(conn, "cdc", result.manifest.end_lsn) == result.manifest.end_lsn
    conn.close()


def test_bad_input_is_refused_with_specific_errors(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    dsn = cluster.dsn(db)
    with pytest.raises(SlotNotFoundError, match="its slots: cdc"):
        drain_batch(dsn, DrainSettings("nope", ("pub",), str(tmp_path)))
    with pytest.raises(PublicationNotFoundError, match="missing_pub"):
        drain_batch(dsn, DrainSettings("cdc", ("missing_pub",), str(tmp_path)))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(StagingNotWritableError, match="Check the staging location"):
        drain_batch(dsn, DrainSettings("cdc", ("pub",), str(blocker / "staging")))
    repl = connect_replication(dsn)
    with repl.cursor() as cur:
        cur.start_replication(slot_name="cdc", options={"proto_version": "1", "publication_names": "pub"})
        cluster.wait_for("SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc'", db)
        with pytest.raises(SlotActiveError, match="max_active_runs=1"):
            drain_batch(dsn, DrainSettings("cdc", ("pub",), str(tmp_path)))
    repl.close()


def test_transactions_spanning_chunks_decode_the_same(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    _workload(cluster, db)
    whole = drain_batch(cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path / "whole")))
    # 8 kB chunks cut every transaction of the workload many times over.
    pieces = drain_batch(
        cluster.dsn(db), DrainSettings("cdc", ("pub",), str(tmp_path / "pieces"), chunk_bytes=8192)
    )
    # The second drain's window may end later, by WAL the server wrote meanwhile that carries no
    # change (its running-transactions records): the same start, and the same transactions staged.
    assert pieces.manifest.start_lsn == whole.manifest.start_lsn
    assert whole.manifest.end_lsn <= pieces.manifest.end_lsn
    assert pieces.manifest.stats.transactions == whole.manifest.stats.transactions == 5
    assert staged_tables(pieces)["public.items"].equals(staged_tables(whole)["public.items"])


def test_streamed_in_progress_transaction_interleaved_with_others(tmp_path: Path) -> None:
    # A tiny logical_decoding_work_mem makes the server stream the big transaction before it commits.
    with PostgresCluster({"logical_decoding_work_mem": "64kB"}) as cluster:
        cluster.execute(SCHEMA)
        conn = connect(cluster.dsn())
        create_slot(conn, "cdc")
        big = connect(cluster.dsn(), autocommit=False)
        with big.cursor() as cur:
            cur.execute(
                "INSERT INTO items (id, name) SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g"
            )
            cluster.execute("INSERT INTO items (id, name) VALUES (-1, 'committed first')")
            cur.execute("INSERT INTO items (id, name) SELECT g, 'y' FROM generate_series(3001, 4000) g")
            cur.execute("SAVEPOINT s; INSERT INTO items (id) VALUES (99999); ROLLBACK TO SAVEPOINT s")
        big.commit()
        big.close()
        cluster.execute("INSERT INTO items (id, name) VALUES (-2, 'committed last')")
        results = {
            name: drain_batch(cluster.dsn(), DrainSettings("cdc", ("pub",), str(tmp_path / name), **kwargs))
            for name, kwargs in {
                "peek": {},
                "stream": {"transport": "stream", "chunk_messages": 300},
            }.items()
        }
        conn.close()
    ids = {
        name: staged_tables(result)["public.items"].column("id").to_pylist()
        for name, result in results.items()
    }
    assert (
        ids["stream"] == ids["peek"] == [-1, *range(1, 4001), -2]
    )  # commit order; the aborted savepoint left no trace
    assert results["stream"].manifest.stats.transactions == 3
