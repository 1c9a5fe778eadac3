"""The split peek: several calls on a temporary copy of the slot read what one peek reads.

Each call starts a new decoding session, so pgoutput sends a relation's Relation message again
in every call that touches it; everything else must be the same bytes at the same LSNs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.errors import SlotActiveError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import (
    advance_slot,
    connect,
    create_slot,
    describe_slot,
    hold_drain_lock,
    peek_calls,
)
from airflow_provider_postgres_cdc.replication.transports import PeekTransport, ReadResult, plugin_options
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.drain.staged import staged_tables

Message = tuple[int, bytes]


@pytest.fixture
def source(pg_cluster: PostgresCluster, pg_dbname: str) -> Iterator[tuple[PostgresCluster, str]]:
    pg_cluster.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int, w text);"
        "ALTER TABLE b REPLICA IDENTITY FULL; CREATE TABLE unpublished (id int);"
        "CREATE PUBLICATION p FOR TABLE a, b",
        pg_dbname,
    )
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "s")
    conn.close()
    yield pg_cluster, pg_dbname


def _workload(cluster: PostgresCluster, db: str) -> None:
    """Many transactions of every kind of change, a schema change and a rollback in between."""
    for step in range(12):
        base = step * 100
        cluster.execute(
            f"INSERT INTO a SELECT g, 'v' || g FROM generate_series({base}, {base + 99}) g;"
            f"INSERT INTO b SELECT g, repeat('w', 3000) || g FROM generate_series({base}, {base + 9}) g;"
            f"INSERT INTO unpublished SELECT generate_series(1, 50)",
            db,
        )
        cluster.execute(
            f"UPDATE a SET v = v || '!' WHERE id % 7 = {step % 7}; DELETE FROM b WHERE id = {base}", db
        )
        if step == 5:
            cluster.execute("ALTER TABLE a ADD COLUMN extra int DEFAULT 5; TRUNCATE b", db)
        if step == 8:
            cluster.execute("BEGIN; INSERT INTO a VALUES (-1, 'never'); ROLLBACK", db)


def _read(
    conn: object, bound: Lsn, max_messages: int | None = None, **transport: int | bool
) -> list[Message]:
    result = ReadResult()
    chunks = PeekTransport(conn, **transport).read(  # type: ignore[arg-type]
        "s", plugin_options(["p"]), upto_lsn=bound, max_messages=max_messages, result=result
    )
    messages = [(int(lsn), payload) for chunk in chunks for lsn, payload in chunk]
    assert result.messages == len(messages)
    assert result.truncated == (max_messages is not None and len(messages) >= max_messages)
    return messages


def _without_relations(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m[1][:1] != b"R"]


def _bound(cluster: PostgresCluster, db: str) -> Lsn:
    return Lsn.parse(cluster.execute("SELECT pg_current_wal_flush_lsn()::text", db)[0][0])


def _slot_count(cluster: PostgresCluster, db: str) -> int:
    return int(cluster.execute("SELECT count(*) FROM pg_replication_slots", db)[0][0])


def test_split_read_is_the_one_peek_read(
    source: tuple[PostgresCluster, str], caplog: pytest.LogCaptureFixture
) -> None:
    cluster, db = source
    _workload(cluster, db)
    bound = _bound(cluster, db)
    conn = connect(cluster.dsn(db))
    before = describe_slot(conn, "s").confirmed_flush_lsn
    slots = _slot_count(cluster, db)
    whole = _read(conn, bound, split=False)
    with caplog.at_level(logging.DEBUG, "airflow_provider_postgres_cdc.replication.transports"):
        split = _read(conn, bound, first_call=40)
    assert any("calls on a temporary copy" in r.message for r in caplog.records)
    assert _without_relations(split) == _without_relations(whole)
    relations = [m for m in split if m[1][:1] == b"R"]
    assert {m[1] for m in relations} == {m[1] for m in whole if m[1][:1] == b"R"}
    assert len(relations) > len(whole) - len(_without_relations(whole))  # several calls, each sent them
    # The copy is gone and the slot has not moved.
    assert describe_slot(conn, "s").confirmed_flush_lsn == before
    assert _slot_count(cluster, db) == slots
    conn.close()


def test_a_transaction_open_across_calls_and_spilled_reads_the_same(
    source: tuple[PostgresCluster, str],
) -> None:
    cluster, db = source
    long = connect(cluster.dsn(db), autocommit=False)
    with long.cursor() as cur:
        cur.execute("INSERT INTO a SELECT g, repeat('l', 200) || g FROM generate_series(100000, 104999) g")
        cur.execute("SAVEPOINT sp; INSERT INTO a VALUES (-5, 'rolled back'); ROLLBACK TO SAVEPOINT sp")
    for i in range(30):  # small transactions commit while the long one is open, so calls end inside it
        cluster.execute(f"INSERT INTO a VALUES ({i}, 's{i}')", db)
    with long.cursor() as cur:
        cur.execute("UPDATE a SET v = 'by the long one' WHERE id < 30")
    long.commit()
    long.close()
    cluster.execute("INSERT INTO a VALUES (31, 'after')", db)
    bound = _bound(cluster, db)
    conn = connect(cluster.dsn(db))
    with conn.cursor() as cur:  # the long transaction is spilled to disk in every call that decodes it
        cur.execute("SET logical_decoding_work_mem = '64kB'")
    whole = _read(conn, bound, split=False)
    split = _read(conn, bound, first_call=5)
    assert _without_relations(split) == _without_relations(whole)
    kinds = [m[1][:1] for m in whole]
    assert kinds.count(b"I") == 5000 + 30 + 1 and kinds.count(b"U") == 30
    conn.close()


@pytest.mark.parametrize("max_messages", [1, 37, 250, 900])
def test_split_read_stops_at_a_commit_at_or_past_max_messages(
    source: tuple[PostgresCluster, str], max_messages: int
) -> None:
    cluster, db = source
    _workload(cluster, db)
    bound = _bound(cluster, db)
    conn = connect(cluster.dsn(db))
    whole = _without_relations(_read(conn, bound, split=False))
    split = _read(conn, bound, max_messages, first_call=30)
    assert split[-1][1][:1] == b"C"
    data = _without_relations(split)
    assert data == whole[: len(data)]
    last_begin = max(i for i, m in enumerate(split) if m[1][:1] == b"B")
    assert last_begin < max_messages <= len(split)  # the last transaction is the one that crossed it
    conn.close()


def test_without_a_free_slot_the_read_is_one_peek(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    _workload(cluster, db)
    bound = _bound(cluster, db)
    conn = connect(cluster.dsn(db))
    whole = _read(conn, bound, split=False)
    free = int(
        cluster.execute(
            "SELECT current_setting('max_replication_slots')::int - count(*) FROM pg_replication_slots", db
        )[0][0]
    )
    fillers = [f"fill_{i}" for i in range(free)]
    for name in fillers:
        cluster.execute(f"SELECT pg_create_physical_replication_slot('{name}')", db)
    try:
        assert _read(conn, bound, first_call=40) == whole
    finally:
        for name in fillers:
            cluster.execute(f"SELECT pg_drop_replication_slot('{name}')", db)
    conn.close()


def test_a_backlog_longer_than_the_window_is_read_in_one_call(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    holder = connect(cluster.dsn(db), autocommit=False)
    with holder.cursor() as cur:  # an open transaction keeps the slot's restart_lsn behind it
        cur.execute("INSERT INTO unpublished VALUES (1)")
    cluster.execute("INSERT INTO unpublished SELECT generate_series(1, 200000)", db)
    conn = connect(cluster.dsn(db))
    advance_slot(conn, "s", _bound(cluster, db))
    cluster.execute("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 300) g", db)
    bound = _bound(cluster, db)
    slot = describe_slot(conn, "s")
    assert slot.restart_lsn is not None and slot.confirmed_flush_lsn is not None
    assert slot.confirmed_flush_lsn - slot.restart_lsn > bound - slot.confirmed_flush_lsn
    assert not peek_calls.worth_splitting(slot.restart_lsn, slot.confirmed_flush_lsn, bound)
    split = _read(conn, bound, first_call=10)
    assert split == _read(conn, bound, split=False)  # one call: no Relation message sent twice
    assert [m[1][:1] for m in split].count(b"I") == 300
    holder.rollback()
    holder.close()
    conn.close()


def test_a_consumer_that_stops_early_leaves_no_copy_behind(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    _workload(cluster, db)
    conn = connect(cluster.dsn(db))
    slots = _slot_count(cluster, db)
    chunks = PeekTransport(conn, chunk_bytes=4096, first_call=20).read(
        "s", plugin_options(["p"]), upto_lsn=_bound(cluster, db), max_messages=None, result=ReadResult()
    )
    assert len(next(chunks))
    chunks.close()
    assert _slot_count(cluster, db) == slots
    conn.close()


def test_the_drain_stages_the_same_batch_split_or_not(
    source: tuple[PostgresCluster, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, db = source
    _workload(cluster, db)
    settings = DrainSettings("s", ("p",), str(tmp_path / "one"), max_messages=None)
    monkeypatch.setattr(peek_calls, "FIRST_CALL_MESSAGES", 10**9)
    one = drain_batch(cluster.dsn(db), settings)
    monkeypatch.setattr(peek_calls, "FIRST_CALL_MESSAGES", 25)
    split = drain_batch(
        cluster.dsn(db), DrainSettings("s", ("p",), str(tmp_path / "split"), max_messages=None)
    )
    # The second window may end later, by WAL written meanwhile that carries no change; what is staged
    # must be the same.
    assert split.manifest.start_lsn == one.manifest.start_lsn
    assert one.manifest.end_lsn <= split.manifest.end_lsn
    assert split.manifest.stats.changes == one.manifest.stats.changes > 1000
    assert staged_tables(split) == staged_tables(one)


def test_two_drains_of_one_slot_at_once_are_refused(
    source: tuple[PostgresCluster, str], tmp_path: Path
) -> None:
    cluster, db = source
    cluster.execute("INSERT INTO a VALUES (1, 'x')", db)
    other = connect(cluster.dsn(db))
    hold_drain_lock(other, "s")
    with pytest.raises(
        SlotActiveError, match=r"another drain is reading replication slot 's' \(backend pid \d+\)"
    ):
        drain_batch(cluster.dsn(db), DrainSettings("s", ("p",), str(tmp_path)))
    other.close()  # the lock goes with the connection
    assert drain_batch(cluster.dsn(db), DrainSettings("s", ("p",), str(tmp_path))).manifest.stats.changes == 1
