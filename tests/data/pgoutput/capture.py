"""Regenerate the captured pgoutput messages in this directory from a throwaway PostgreSQL server.

Run ``python tests/data/pgoutput/capture.py``. Each scenario creates a fresh database, a
publication and a slot, runs a workload meant to make the server emit every message type the
option set allows, then stores the raw bytes of ``pg_logical_slot_peek_binary_changes`` (one
message per row, as hex) with their LSNs and xids in ``<scenario>.json``. The golden tests decode
these files; LSNs, xids and timestamps differ per run, the decoded contents do not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing import PostgresCluster

HERE = Path(__file__).resolve().parent
SETTINGS = {"max_prepared_transactions": "10", "logical_decoding_work_mem": "'64kB'"}

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE t (
    id int PRIMARY KEY, name text, ts timestamptz, amount numeric(12,2), doc jsonb, raw bytea,
    flag bool, tags text[], nums int[], m mood, big text, d date, f8 float8
);
ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (a int, b text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE parent (id serial PRIMARY KEY);
CREATE TABLE child (id int PRIMARY KEY, pid int REFERENCES parent);
CREATE TABLE bulk (id int PRIMARY KEY, payload text);
CREATE TABLE scalars (
    id int8 PRIMARY KEY, i2 int2, i4 int4, f4 float4, f8 float8, b bool, n numeric(12,3), nn numeric,
    d date, tm time, ts timestamp, tz timestamptz, u uuid, j json, jb jsonb, by bytea, c varchar(5),
    bp char(3), nm name, o oid, tx text
);
CREATE PUBLICATION pub FOR ALL TABLES;
"""

# Built-in scalar types whose binary send format the decoder types into Arrow (scenario "binary").
SCALARS_WORKLOAD = [
    "INSERT INTO scalars VALUES (1, -32768, 2147483647, 1.5, 'NaN', true, -12345.678, 0.00001234,"
    " '2024-02-29', '23:59:59.999999', '1999-12-31 23:59:59.5', '2000-01-01 00:00:00+00',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, null]}', '{\"k\": null}', '\\x00ff10', 'héllo',"
    " 'ab', 'name', 4294967295, 'ünïcode')",
    "INSERT INTO scalars (id, nn, n, f8, d)"
    " VALUES (2, 123456789012345678901234567890.5, 0, '-Infinity', '0001-01-01')",
    "INSERT INTO scalars (id, nn, jb) VALUES (3, 'NaN', 'null')",
    "UPDATE scalars SET i4 = -1, nn = -0.5 WHERE id = 1",
    "DELETE FROM scalars WHERE id = 2",
]

BASIC_WORKLOAD = [
    "INSERT INTO t VALUES (1, 'a', '2024-01-02 03:04:05.123456+00', 1.50, '{\"k\": null}', '\\x00ff', true,"
    " '{\"a,b\",NULL}', '{1,2}', 'happy', repeat('x', 5000), '2024-02-29', 'NaN')",
    "INSERT INTO t VALUES (2, NULL, NULL, NULL, 'null', NULL, NULL, '{}', '{}', NULL, NULL, NULL, NULL)",
    "UPDATE t SET name = 'b' WHERE id = 1",
    "UPDATE t SET id = 10 WHERE id = 2",
    "DELETE FROM t WHERE id = 10",
    "INSERT INTO full_t VALUES (1, 'one'), (2, NULL)",
    "UPDATE full_t SET b = 'uno' WHERE a = 1",
    "DELETE FROM full_t WHERE a = 2",
    "BEGIN; INSERT INTO full_t VALUES (3, 'kept'); SAVEPOINT s; INSERT INTO full_t VALUES (4, 'gone');"
    " ROLLBACK TO SAVEPOINT s; INSERT INTO full_t VALUES (5, 'kept too'); COMMIT",
    "BEGIN; INSERT INTO full_t VALUES (6, 'aborted'); ROLLBACK",
    "ALTER TABLE t ADD COLUMN extra int",
    "INSERT INTO t (id, name, extra) VALUES (3, 'after add', 42)",
    "ALTER TABLE t DROP COLUMN flag",
    "INSERT INTO t (id, name, extra) VALUES (4, 'after drop', 43)",
    "INSERT INTO parent DEFAULT VALUES",
    "INSERT INTO child VALUES (1, 1)",
    "TRUNCATE parent RESTART IDENTITY CASCADE",
    "TRUNCATE full_t",
    "SELECT pg_logical_emit_message(true, 'txn-prefix', 'transactional content')",
    "SELECT pg_logical_emit_message(false, 'plain-prefix', '\\x00ff'::bytea)",
    "BEGIN; INSERT INTO full_t VALUES (7, 'with message');"
    " SELECT pg_logical_emit_message(true, 'in-txn', 'x'); COMMIT",
]

ORIGIN_WORKLOAD = (
    "SELECT pg_replication_origin_create('upstream');"
    " SELECT pg_replication_origin_session_setup('upstream');"
    " BEGIN; SELECT pg_replication_origin_xact_setup('0/ABCDEF', now());"
    " INSERT INTO full_t VALUES (8, 'from origin'); COMMIT;"
    " SELECT pg_replication_origin_session_reset()"
)

STREAM_WORKLOAD = [
    # Larger than logical_decoding_work_mem (64kB): streamed in chunks, then committed.
    "BEGIN; INSERT INTO bulk SELECT g, repeat('p', 100) FROM generate_series(1, 1200) g;"
    " SAVEPOINT s1; INSERT INTO bulk SELECT g, repeat('q', 100) FROM generate_series(1201, 2400) g;"
    " ROLLBACK TO SAVEPOINT s1;"
    " UPDATE bulk SET payload = 'changed' WHERE id <= 10; DELETE FROM bulk WHERE id = 11; COMMIT",
    # Streamed, then aborted as a whole.
    "BEGIN; INSERT INTO bulk SELECT g, repeat('r', 100) FROM generate_series(10001, 11200) g; ROLLBACK",
    "INSERT INTO t (id, name) VALUES (5, 'small after streams')",
]

TWO_PHASE_WORKLOAD = [
    "BEGIN; INSERT INTO full_t VALUES (20, 'prepared then committed'); PREPARE TRANSACTION 'gid-commit'",
    "COMMIT PREPARED 'gid-commit'",
    "BEGIN; INSERT INTO full_t VALUES (21, 'prepared then rolled back'); PREPARE TRANSACTION 'gid-rollback'",
    "ROLLBACK PREPARED 'gid-rollback'",
    # Large enough to be streamed before its prepare: Stream Prepare.
    "BEGIN; INSERT INTO bulk SELECT g, repeat('s', 100) FROM generate_series(20001, 21200) g;"
    " PREPARE TRANSACTION 'gid-stream'",
    "COMMIT PREPARED 'gid-stream'",
]

SCENARIOS: dict[str, dict[str, Any]] = {
    "proto1": {
        "options": {"proto_version": "1", "messages": "true"},
        "workload": BASIC_WORKLOAD,
        "origin": True,
    },
    "binary": {
        "options": {"proto_version": "1", "binary": "true"},
        "workload": BASIC_WORKLOAD[:8] + SCALARS_WORKLOAD,
        "also_text": True,
    },
    "stream": {"options": {"proto_version": "2", "streaming": "on"}, "workload": STREAM_WORKLOAD},
    "two_phase": {
        "options": {"proto_version": "3", "two_phase": "on", "streaming": "on"},
        "workload": TWO_PHASE_WORKLOAD,
        "two_phase_slot": True,
    },
}


def peek(pg: PostgresCluster, db: str, slot: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """All pending messages of the slot, without consuming them."""
    with pg.connect(db) as conn, conn.cursor() as cur:
        args = [slot, "publication_names", "pub"]
        for key, value in options.items():
            args += [key, value]
        placeholders = ", ".join(["%s"] * (len(args) - 1))
        function = f"pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {placeholders})"
        cur.execute(f"SELECT lsn::text, xid::text, data FROM {function}", args)
        return [{"lsn": lsn, "xid": int(xid), "data": bytes(data).hex()} for lsn, xid, data in cur.fetchall()]


def wait_flushed(pg: PostgresCluster, db: str) -> None:
    """Logical decoding reads only flushed WAL, and the test cluster runs with synchronous_commit off."""
    insert_lsn = pg.execute("SELECT pg_current_wal_insert_lsn()::text", db)[0][0]
    pg.wait_for(f"SELECT pg_current_wal_flush_lsn() >= '{insert_lsn}'::pg_lsn", db)


def capture(pg: PostgresCluster, name: str, scenario: dict[str, Any]) -> dict[str, Any]:
    db = f"capture_{name}"
    pg.create_database(db)
    pg.execute(SCHEMA, db)
    two_phase = "true" if scenario.get("two_phase_slot") else "false"
    pg.execute(f"SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, {two_phase})", db)
    for statement in scenario["workload"]:
        pg.execute(statement, db)
    if scenario.get("origin"):
        pg.execute(ORIGIN_WORKLOAD, db)
    wait_flushed(pg, db)
    messages = peek(pg, db, "s", scenario["options"])
    version = pg.execute("SHOW server_version", db)[0][0]
    result = {"server_version": version, "options": scenario["options"], "messages": messages}
    if scenario.get("also_text"):
        # The same changes in text format, to check the binary route against the text one.
        text_options = {k: v for k, v in scenario["options"].items() if k != "binary"}
        result["text_messages"] = peek(pg, db, "s", text_options)
    pg.drop_database(db)
    return result


def main() -> int:
    with PostgresCluster(settings=SETTINGS) as pg:
        for name, scenario in SCENARIOS.items():
            result = capture(pg, name, scenario)
            (HERE / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
            print(f"{name}: {len(result['messages'])} messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
