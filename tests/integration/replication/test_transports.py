"""Both transports read the same messages, stop on transaction boundaries, and never move the slot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_postgres_cdc.errors import SlotActiveError, TransportError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import connect, connect_replication, create_slot, describe_slot
from airflow_provider_postgres_cdc.replication.raw_messages import RawMessages
from airflow_provider_postgres_cdc.replication.transports import (
    PeekTransport,
    ReadResult,
    StreamingTransport,
    plugin_options,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster


def _flush_lsn(conn) -> Lsn:  # type: ignore[no-untyped-def]
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()::text")
        return Lsn.parse(cur.fetchone()[0])


def _kinds(chunks: list[RawMessages]) -> list[str]:
    return [payload[:1].decode() for chunk in chunks for _, payload in chunk]


@pytest.fixture
def source(pg_cluster: PostgresCluster, pg_dbname: str) -> Iterator[tuple[PostgresCluster, str]]:
    pg_cluster.execute(
        "CREATE TABLE pub_t (id int PRIMARY KEY, v text); CREATE TABLE other_t (id int);"
        "CREATE PUBLICATION p FOR TABLE pub_t",
        pg_dbname,
    )
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "s")
    conn.close()
    yield pg_cluster, pg_dbname


def test_peek_reads_whole_transactions_in_chunks_and_never_moves(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    for txn in range(5):
        cluster.execute(
            f"INSERT INTO pub_t SELECT g, repeat('x', 100) "
            f"FROM generate_series({txn * 1000}, {txn * 1000 + 999}) g",
            db,
        )
    conn = connect(cluster.dsn(db))
    before = describe_slot(conn, "s").confirmed_flush_lsn
    bound = _flush_lsn(conn)
    result = ReadResult()
    chunks = list(
        PeekTransport(conn, chunk_bytes=50_000).read(
            "s", plugin_options(["p"]), upto_lsn=bound, max_messages=None, result=result
        )
    )
    assert len(chunks) > 5  # the 64 kB-ish chunks cut one COPY stream
    kinds = _kinds(chunks)
    assert kinds.count("I") == 5000 and kinds.count("B") == 5 and kinds.count("C") == 5
    assert result.messages == len(kinds) and not result.truncated
    lsns = [int(lsn) for chunk in chunks for lsn, _ in chunk]
    assert lsns == sorted(lsns)
    # A message limit stops at the first transaction boundary past it.
    limited = ReadResult()
    kinds = _kinds(
        list(
            PeekTransport(conn).read(
                "s", plugin_options(["p"]), upto_lsn=bound, max_messages=1500, result=limited
            )
        )
    )
    assert limited.truncated and kinds.count("C") == 2 and kinds[-1] == "C"
    assert describe_slot(conn, "s").confirmed_flush_lsn == before
    conn.close()


def test_streaming_matches_peek_and_never_moves(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    cluster.execute("INSERT INTO pub_t SELECT g, 'a' FROM generate_series(1, 300) g", db)
    cluster.execute("UPDATE pub_t SET v = 'b' WHERE id < 50; DELETE FROM pub_t WHERE id > 250", db)
    conn = connect(cluster.dsn(db))
    bound = _flush_lsn(conn)
    before = describe_slot(conn, "s").confirmed_flush_lsn
    peeked = _kinds(
        list(
            PeekTransport(conn).read(
                "s", plugin_options(["p"]), upto_lsn=bound, max_messages=None, result=ReadResult()
            )
        )
    )
    repl = connect_replication(cluster.dsn(db))
    result = ReadResult()
    streamed = list(
        StreamingTransport(repl, idle_timeout=0.2).read(
            "s", plugin_options(["p"], proto_version=2, streaming=True), start_lsn=before, upto_lsn=bound,
            max_messages=None, result=result,
        )
    )  # fmt: skip
    repl.close()
    kinds = _kinds(streamed)
    assert kinds == peeked
    assert describe_slot(conn, "s").confirmed_flush_lsn == before
    conn.close()


def test_streaming_with_only_unpublished_writes_does_not_move_the_slot() -> None:
    # A short wal_sender_timeout makes the server ask for replies often: exactly when psycopg2
    # would otherwise confirm the keepalive's WAL end by itself.
    with PostgresCluster({"wal_sender_timeout": "2s"}) as cluster:
        cluster.execute(
            "CREATE TABLE pub_t (id int PRIMARY KEY); CREATE TABLE other_t (id int);"
            "CREATE PUBLICATION p FOR TABLE pub_t"
        )
        conn = connect(cluster.dsn())
        start = create_slot(conn, "s").consistent_point
        cluster.execute("INSERT INTO other_t SELECT generate_series(1, 10000)")
        repl = connect_replication(cluster.dsn())
        with pytest.raises(TransportError, match="deadline"):
            list(
                StreamingTransport(repl, idle_timeout=0.2).read(
                    "s", plugin_options(["p"], proto_version=2), start_lsn=start, upto_lsn=Lsn(2**62),
                    max_messages=None, result=ReadResult(), deadline_seconds=6,
                )
            )  # fmt: skip
        repl.close()
        slot = describe_slot(conn, "s")
        assert slot.confirmed_flush_lsn == start, (slot.confirmed_flush_lsn, start)
        # The temporary copy the stream used is gone with its connection.
        cluster.wait_for("SELECT count(*) = 1 FROM pg_replication_slots")
        conn.close()


def test_peek_on_an_active_slot_is_refused(source: tuple[PostgresCluster, str]) -> None:
    cluster, db = source
    conn = connect(cluster.dsn(db))
    repl = connect_replication(cluster.dsn(db))
    with repl.cursor() as cur:
        cur.start_replication(slot_name="s", options={"proto_version": "1", "publication_names": "p"})
        cluster.wait_for("SELECT active FROM pg_replication_slots WHERE slot_name = 's'", db)
        with pytest.raises(SlotActiveError, match="active in another connection"):
            list(
                PeekTransport(conn).read(
                    "s",
                    plugin_options(["p"]),
                    upto_lsn=_flush_lsn(conn),
                    max_messages=None,
                    result=ReadResult(),
                )
            )
    repl.close()
    conn.close()
