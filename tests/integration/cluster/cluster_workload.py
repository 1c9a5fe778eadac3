"""A source for the cluster tests: three tables the Spark JDBC engine can copy, and a racing writer."""

from __future__ import annotations

import random
import threading

import psycopg2

PUBLICATION = "cluster_pub"
TABLES = ("public.accounts", "public.events", "public.ledger")
SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12, 2), opened date,
                       updated timestamptz, payload jsonb, raw bytea);
CREATE TABLE events (id bigint PRIMARY KEY, account int, kind text, at timestamptz);
CREATE TABLE ledger (account int, amount numeric(12, 2), note text);
ALTER TABLE ledger REPLICA IDENTITY FULL;
INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.5, date '2020-01-01' + g % 900, now(),
    jsonb_build_object('g', g, 'n', CASE WHEN g % 5 = 0 THEN 'null'::jsonb END), decode(md5(g::text), 'hex')
    FROM generate_series(1, 20000) g;
INSERT INTO events SELECT g, g % 20000, 'open', now() FROM generate_series(1, 20000) g;
INSERT INTO ledger SELECT g % 500, (g % 7) * 10, 'n' || (g % 3) FROM generate_series(1, 5000) g;
CREATE PUBLICATION cluster_pub FOR TABLE accounts, events, ledger;
"""


class Writer:
    """Small transactions (updates, inserts, deletes, duplicates of keyless rows) until stopped."""

    def __init__(self, dsn: str, seed: int = 5) -> None:
        self.dsn = dsn
        self.random = random.Random(seed)
        self.transactions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._next_event = 10_000_000

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.transactions

    def burst(self, transactions: int) -> None:
        """Write ``transactions`` transactions now, in this thread (a batch big enough to interrupt)."""
        conn = psycopg2.connect(self.dsn)
        try:
            for _ in range(transactions):
                self._transaction(conn, rows=200)
        finally:
            conn.close()

    def _run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            while not self._stop.wait(0.05):
                self._transaction(conn, rows=5)
        finally:
            conn.close()

    def _transaction(self, conn: psycopg2.extensions.connection, rows: int) -> None:
        pick = self.random.randrange
        with conn, conn.cursor() as cur:
            for _ in range(rows):
                op = pick(6)
                account = pick(1, 20000)
                if op == 0:
                    cur.execute(
                        "UPDATE accounts SET balance = balance + 1, updated = now() WHERE id = %s", (account,)
                    )
                elif op == 1:
                    cur.execute(
                        "UPDATE accounts SET payload = payload || '{\"t\": 1}' WHERE id = %s", (account,)
                    )
                elif op == 2:
                    self._next_event += 1
                    cur.execute(
                        "INSERT INTO events VALUES (%s, %s, 'move', now())", (self._next_event, account)
                    )
                elif op == 3:
                    cur.execute("DELETE FROM events WHERE id = %s", (pick(1, 20000),))
                elif op == 4:
                    cur.execute("INSERT INTO ledger VALUES (%s, 10, 'n1')", (account % 500,))
                else:
                    cur.execute(
                        "DELETE FROM ledger WHERE ctid = "
                        "(SELECT ctid FROM ledger WHERE account = %s LIMIT 1)",
                        (account % 500,),
                    )
        self.transactions += 1
