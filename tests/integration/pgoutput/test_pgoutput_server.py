"""The pgoutput decoder against a live PostgreSQL server.

* cross-check: for a mixed workload, the decoded change list equals what the ``test_decoding``
  plugin reports for the same changes (a second slot created at the same point);
* captures: the stored golden captures still match what the server sends today;
* random workloads from the server: the drain's columnar decoder equals the test oracle;
* ``pgcdc peek`` prints the pending changes and leaves the slot where it was.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import pytest

from airflow_provider_postgres_cdc.cli import peek as peek_command
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    Delete,
    Insert,
    StreamAbort,
    StreamStart,
    StreamStop,
    Update,
)
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.data.pgoutput import capture
from tests.oracle.assembly import Transaction, committed_transactions
from tests.oracle.tables import reference_tables
from tests.pg_majors import ALSO_ON_PG18

pytestmark = pytest.mark.integration

MIXED_SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, name text, ts timestamptz, amount numeric(12,2), doc jsonb, big text);
ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (a int, b text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR ALL TABLES;
"""

MIXED_WORKLOAD = [
    "INSERT INTO t SELECT g, 'n' || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour',"
    " g / 7.0, jsonb_build_object('g', g, 'q', 'it''s'), CASE WHEN g % 5 = 0 THEN repeat('x', 3000) END"
    " FROM generate_series(1, 200) g",
    "UPDATE t SET name = 'renamed ''quoted''' WHERE id % 3 = 0",
    "UPDATE t SET id = id + 1000 WHERE id % 10 = 1",
    "UPDATE t SET name = NULL, doc = 'null' WHERE id % 5 = 0",
    "DELETE FROM t WHERE id % 4 = 0",
    "INSERT INTO full_t SELECT g, CASE WHEN g % 2 = 0 THEN 'b' || g END FROM generate_series(1, 50) g",
    "UPDATE full_t SET b = 'changed' WHERE a < 10",
    "DELETE FROM full_t WHERE a > 40",
    "BEGIN; INSERT INTO t (id, name) VALUES (5000, 'kept'); SAVEPOINT s;"
    " INSERT INTO t (id, name) VALUES (5001, 'rolled back'); ROLLBACK TO SAVEPOINT s;"
    " UPDATE t SET ts = NULL WHERE id = 5000; COMMIT",
    "BEGIN; DELETE FROM t; ROLLBACK",
    "TRUNCATE full_t",
    "INSERT INTO full_t VALUES (1, 'after truncate')",
]

# test_decoding: "table public.t: UPDATE: old-key: id[integer]:2 new-tuple: id[integer]:10 ..."
TD_CHANGE = re.compile(r"^table (\S+)\.(\S+): (INSERT|UPDATE|DELETE|TRUNCATE): ?(.*)$")
TD_COLUMN = re.compile(r"(\w+)\[([^\]]+)\]:('(?:[^']|'')*'|\S+)")


def wait_flushed(pg: PostgresCluster, db: str) -> None:
    """Logical decoding reads only flushed WAL, and the test cluster runs with synchronous_commit off."""
    insert_lsn = pg.execute("SELECT pg_current_wal_insert_lsn()::text", db)[0][0]
    pg.wait_for(f"SELECT pg_current_wal_flush_lsn() >= '{insert_lsn}'::pg_lsn", db)


def peek_rows(pg: PostgresCluster, db: str, slot: str) -> list[tuple[str, int, bytes]]:
    rows = pg.execute(
        f"SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'pub')",
        db,
    )
    return [(lsn, int(xid), bytes(data)) for lsn, xid, data in rows]


def td_values(text: str) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for name, _type, raw in TD_COLUMN.findall(text):
        if raw == "null":
            values[name] = None
        elif raw == "unchanged-toast-datum":
            values[name] = "<unchanged>"
        elif raw.startswith("'"):
            values[name] = raw[1:-1].replace("''", "'")
        else:
            values[name] = raw
    return values


def changes_from_test_decoding(pg: PostgresCluster, db: str) -> list[tuple[int, str, str, Any, Any]]:
    """(xid, op, table, new values, old key values) per change, as test_decoding reports them."""
    rows = pg.execute(
        "SELECT xid::text, data FROM pg_logical_slot_peek_changes('td', NULL, NULL, 'skip-empty-xacts', '1')",
        db,
    )
    out: list[tuple[int, str, str, Any, Any]] = []
    for xid, data in rows:
        match = TD_CHANGE.match(data)
        if match is None:
            continue
        _schema, table, op, rest = match.groups()
        if op == "TRUNCATE":
            out.append((int(xid), "T", table, None, None))
        elif op == "INSERT":
            out.append((int(xid), "I", table, td_values(rest), None))
        elif op == "DELETE":
            out.append((int(xid), "D", table, None, td_values(rest)))
        elif rest.startswith("old-key: "):
            old, new = rest.removeprefix("old-key: ").split(" new-tuple: ")
            out.append((int(xid), "U", table, td_values(new), td_values(old)))
        else:
            out.append((int(xid), "U", table, td_values(rest), None))
    return out


def pgoutput_changes(transactions: list[Transaction]) -> list[tuple[int, str, str, Any, Any]]:
    out: list[tuple[int, str, str, Any, Any]] = []
    for txn in transactions:
        for change in txn.changes:
            names = [c.name for c in change.relation.columns]
            new = old = None
            if change.new is not None:
                new = {
                    n: "<unchanged>" if change.new.is_unchanged(i) else change.new.text(i)
                    for i, n in enumerate(names)
                }
            if change.old is not None:
                keys = {c.name for c in change.relation.columns if c.is_key}
                # test_decoding prints the identity columns of an old key, all of an old row, and
                # skips NULLs in both.
                old = {
                    n: change.old.text(i)
                    for i, n in enumerate(names)
                    if (change.old_kind == "O" or n in keys) and change.old.values[i] is not None
                }
            out.append((txn.xid, change.op, change.relation.name, new, old))
    return out


@ALSO_ON_PG18
def test_changes_equal_test_decoding_for_a_mixed_workload(
    pg_cluster: PostgresCluster, pg_dbname: str
) -> None:
    db = pg_dbname
    pg_cluster.execute(MIXED_SCHEMA, db)
    pg_cluster.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')", db)
    pg_cluster.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')", db)
    for statement in MIXED_WORKLOAD:
        pg_cluster.execute(statement, db)
    wait_flushed(pg_cluster, db)
    rows = peek_rows(pg_cluster, db, "po")
    transactions = committed_transactions(
        [data for _, _, data in rows], 1, [Lsn.parse(lsn) for lsn, _, _ in rows]
    )
    ours = pgoutput_changes(transactions)
    theirs = changes_from_test_decoding(pg_cluster, db)
    assert len(ours) > 400
    assert ours == theirs
    columnar = BatchDecoder(1).decode(
        [data for _, _, data in rows], [int(Lsn.parse(lsn)) for lsn, _, _ in rows]
    )
    assert columnar.changes == len(theirs)
    assert columnar.transactions.column("xid").to_pylist() == [t.xid for t in transactions]
    assert columnar.transactions.column("changes").to_pylist() == [len(t.changes) for t in transactions]
    assert columnar.end_lsn == transactions[-1].end_lsn


def shape(messages: list[dict[str, Any]], protocol: int) -> Iterator[tuple[str, Any]]:
    """What a capture must reproduce: message classes and tuple contents (not LSNs, xids, oids) of
    what a client applies.

    Left out: the framing of streamed chunks, and what the server streamed of a (sub)transaction it
    then aborted. How much of a large transaction is streamed before its end is decoded follows the
    server's memory accounting, which changes between minor releases (15.18 streamed 120 more rows
    of the aborted transaction below than 15.20, and cut another into chunks elsewhere); what a
    client must apply does not.
    """
    decoder = PgOutputDecoder(protocol)
    decoded = [decoder.decode(bytes.fromhex(raw["data"])) for raw in messages]
    aborted = {m.subxid for m in decoded if isinstance(m, StreamAbort)}
    whole = {m.xid for m in decoded if isinstance(m, StreamAbort) and m.subxid == m.xid}
    chunk: int | None = None  # the transaction whose streamed chunk the messages are in
    for message in decoded:
        if isinstance(message, StreamStart | StreamStop):
            chunk = message.xid if isinstance(message, StreamStart) else None
            continue
        if isinstance(message, StreamAbort) or chunk in whole:
            continue
        if isinstance(message, Insert | Update | Delete) and message.xid in aborted:
            continue
        values = [getattr(message, f) for f in ("new", "old") if hasattr(message, f)]
        yield type(message).__name__, [(v.kinds, v.values) if v is not None else None for v in values]


def test_stored_captures_match_the_server() -> None:
    with PostgresCluster(settings=capture.SETTINGS) as pg:
        for name, scenario in capture.SCENARIOS.items():
            live = capture.capture(pg, name, scenario)
            stored = json.loads((capture.HERE / f"{name}.json").read_text())
            protocol = int(stored["options"]["proto_version"])
            assert list(shape(live["messages"], protocol)) == list(shape(stored["messages"], protocol)), name


def random_statements(seed: int) -> list[str]:
    rng = random.Random(seed)
    statements = []
    for step in range(40):
        key = rng.randint(1, 60)
        choice = rng.random()
        if step == 20:
            statements.append("ALTER TABLE r ADD COLUMN extra numeric(8,3)")
        elif choice < 0.45:
            doc = rng.choice(["null", '{"a": 1}', "[]", '"s"'])
            statements.append(
                f"INSERT INTO r (id, name, ts, doc) VALUES ({key}, 'v{rng.random()}', now(), '{doc}')"
                " ON CONFLICT (id) DO UPDATE SET name = excluded.name"
            )
        elif choice < 0.7:
            statements.append(f"UPDATE r SET name = NULL, id = id + 100 WHERE id = {key}")
        elif choice < 0.9:
            statements.append(f"DELETE FROM r WHERE id < {key} AND id % 3 = 0")
        else:
            statements.append(
                "BEGIN; INSERT INTO r (id) VALUES (999); TRUNCATE r; INSERT INTO r (id) VALUES (1); COMMIT"
            )
    return statements


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columnar_route_equals_reference_on_server_workloads(
    pg_cluster: PostgresCluster, pg_dbname: str, seed: int
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE r (id int PRIMARY KEY, name text, ts timestamptz, doc jsonb);"
        " CREATE PUBLICATION pub FOR ALL TABLES",
        db,
    )
    pg_cluster.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')", db)
    for statement in random_statements(seed):
        pg_cluster.execute(statement, db)
    wait_flushed(pg_cluster, db)
    messages = [data for _, _, data in peek_rows(pg_cluster, db, "po")]
    reference = reference_tables(messages, 1)
    columnar = BatchDecoder(1).decode(messages).tables
    assert [t.relation for t in columnar] == [t.relation for t in reference]
    assert len(reference) == 2  # before and after the ALTER TABLE
    for ours, theirs in zip(columnar, reference, strict=True):
        assert ours.to_table().equals(theirs.to_table())


def run_peek(argv: list[str]) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser()
    peek_command.register(parser.add_subparsers())
    args = parser.parse_args(["peek", *argv])
    out = io.StringIO()
    with redirect_stdout(out):
        assert args.func(args) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_peek_prints_json_lines_and_does_not_consume(pg_cluster: PostgresCluster, pg_dbname: str) -> None:
    db = pg_dbname
    pg_cluster.execute(MIXED_SCHEMA, db)
    pg_cluster.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')", db)
    pg_cluster.execute(
        "INSERT INTO t (id, name, big, ts) VALUES (1, 'a', repeat('x', 3000), '2024-01-02 03:04:05+00')", db
    )
    pg_cluster.execute("UPDATE t SET name = 'b' WHERE id = 1", db)
    pg_cluster.execute("UPDATE t SET id = 2 WHERE id = 1", db)
    pg_cluster.execute("INSERT INTO full_t VALUES (1, 'one'); DELETE FROM full_t", db)
    pg_cluster.execute("SELECT pg_logical_emit_message(true, 'p', 'hello')", db)
    wait_flushed(pg_cluster, db)
    argv = ["--dsn", pg_cluster.dsn(db), "--slot-name", "po", "--publications", "pub", "--messages"]
    lines = run_peek(argv)
    ops = [line["op"] for line in lines if line["op"] not in ("relation", "begin", "commit")]
    assert ops == ["insert", "update", "update", "insert", "delete", "message"]
    insert = next(line for line in lines if line["op"] == "insert")
    assert insert["new"]["ts"] == "2024-01-02 03:04:05+00"
    assert (insert["schema"], insert["table"], insert["old"], insert["key"]) == (
        "public",
        "t",
        None,
        {"id": "1"},
    )
    toast_update, key_update = [line for line in lines if line["op"] == "update"]
    assert toast_update["unchanged_toast"] == ["big"] and "big" not in toast_update["new"]
    assert key_update["key"] == {"id": "1"} and key_update["new"]["id"] == "2"
    delete = next(line for line in lines if line["op"] == "delete")
    assert delete["old"] == {"a": "1", "b": "one"} and delete["new"] is None
    begin = next(line for line in lines if line["op"] == "begin")
    Lsn.parse(begin["lsn"])
    assert isinstance(begin["xid"], int)
    assert run_peek(argv) == lines  # peeking consumed nothing
    limited = run_peek([*argv, "--limit", "1"])
    assert [line["op"] for line in limited] == ["begin", "relation", "insert", "commit"]
