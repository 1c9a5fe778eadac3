"""Decoder throughput: raw pgoutput messages -> typed Arrow tables, against the server's own rate.

Builds a throwaway cluster, writes ``--changes`` changes (inserts, updates, deletes over a table
with int, text, timestamptz, numeric and jsonb columns, in transactions of ``--txn-size``), then
measures on the same slot:

* the SQL peek interface counting the changes server-side (``SELECT count(*) FROM
  pg_logical_slot_peek_binary_changes(...)``): the baseline the decoder must keep up with,
* :class:`BatchDecoder` (columnar) from the fetched messages to typed Arrow tables,
* the test oracle's per-object route (``tests/oracle``: the per-message decoder, an assembler
  and ``transactions_to_tables``), which it must equal,
* pypgoutput's decoder classes, when that package is importable.

Run from the repository root: ``.venv/bin/python -m benchmarks.decode [--changes 1000000]``.
Prints rates and ratios.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.oracle.tables import reference_tables

SCHEMA = """
CREATE TABLE bench (id int PRIMARY KEY, name text, ts timestamptz, amount numeric(12,2), doc jsonb);
CREATE PUBLICATION pub FOR TABLE bench;
"""
OPTIONS = "'proto_version', '1', 'publication_names', 'pub'"
PEEK = f"pg_logical_slot_peek_binary_changes('bench', NULL, NULL, {OPTIONS})"


def workload(pg: PostgresCluster, db: str, changes: int, txn_size: int) -> int:
    """Write inserts (60%), updates (25%) and deletes (15%); returns the number of row changes."""
    inserts = changes * 60 // 100
    updates = changes * 25 // 100
    deletes = changes - inserts - updates
    for lo in range(0, inserts, txn_size):
        hi = min(lo + txn_size, inserts)
        pg.execute(
            "INSERT INTO bench SELECT g, 'name-' || g, timestamptz '2024-01-01' + g * interval '1 second',"
            " (g % 100000) / 100.0, jsonb_build_object('k', g, 'tag', 'x')"
            f" FROM generate_series({lo}, {hi - 1}) g",
            db,
        )
    for lo in range(0, updates, txn_size):
        hi = min(lo + txn_size, updates)
        pg.execute(
            f"UPDATE bench SET name = name || '!', amount = amount + 1 WHERE id >= {lo} AND id < {hi}", db
        )
    for lo in range(inserts - deletes, inserts, txn_size):
        pg.execute(f"DELETE FROM bench WHERE id >= {lo} AND id < {min(lo + txn_size, inserts)}", db)
    insert_lsn = pg.execute("SELECT pg_current_wal_insert_lsn()::text", db)[0][0]
    pg.wait_for(f"SELECT pg_current_wal_flush_lsn() >= '{insert_lsn}'::pg_lsn", db)
    return inserts + updates + deletes


def timed(function: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """Best wall time of ``repeat`` runs, with the garbage collector paused as a service would."""
    best = float("inf")
    result = None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = function()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best, result


def decode_reference(messages: list[bytes]) -> int:
    return sum(t.num_rows for t in reference_tables(messages, 1))


def decode_pypgoutput(messages: list[bytes]) -> int | None:
    try:
        from pypgoutput import decoders  # type: ignore[import-not-found]
    except ImportError:
        return None
    classes = {
        ord("B"): decoders.Begin,
        ord("C"): decoders.Commit,
        ord("R"): decoders.Relation,
        ord("I"): decoders.Insert,
        ord("U"): decoders.Update,
        ord("D"): decoders.Delete,
    }
    count = 0
    for message in messages:
        classes[message[0]](message)
        count += 1
    return count


def report(label: str, rate: float, seconds: float, note: str) -> None:
    print(f"{label + ':':<26}{rate:>12,.0f} changes/s  ({seconds:.2f} s)  {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--txn-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with PostgresCluster() as pg:
        db = "bench"
        pg.create_database(db)
        pg.execute(SCHEMA, db)
        pg.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')", db)
        started = time.perf_counter()
        changes = workload(pg, db, args.changes, args.txn_size)
        print(f"workload: {changes:,} changes written in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        rows = pg.execute(f"SELECT data FROM {PEEK}", db)
        messages = [bytes(row[0]) for row in rows]
        del rows
        fetch_s = time.perf_counter() - started
        size_mb = sum(map(len, messages)) / 1e6
        print(f"fetched {len(messages):,} messages ({size_mb:.0f} MB) in {fetch_s:.1f} s (not in the rates)")
        # Alternate the two measurements so that load from other processes hits both alike.
        peek_s = columnar_s = float("inf")
        batch = None
        for _ in range(args.repeat):
            seconds, _ = timed(lambda: pg.execute(f"SELECT count(*) FROM {PEEK}", db))
            peek_s = min(peek_s, seconds)
            seconds, batch = timed(lambda: BatchDecoder(1).decode(messages))
            columnar_s = min(columnar_s, seconds)
    decoded = sum(t.num_rows for t in batch.tables) if batch else 0
    if decoded != changes:
        print(f"ERROR: columnar route decoded {decoded} changes, expected {changes}", file=sys.stderr)
        return 1
    peek_rate = changes / peek_s
    columnar_rate = changes / columnar_s
    report("SQL peek count(*)", peek_rate, peek_s, "(the baseline)")
    report("columnar BatchDecoder", columnar_rate, columnar_s, f"= {columnar_rate / peek_rate:.2f}x SQL peek")
    reference_s, reference_count = timed(lambda: decode_reference(messages))
    if reference_count != changes:
        print(f"ERROR: the oracle decoded {reference_count} changes, expected {changes}", file=sys.stderr)
        return 1
    reference_rate = changes / reference_s
    report("test oracle", reference_rate, reference_s, f"= {reference_rate / peek_rate:.2f}x SQL peek")
    pyp_s, pyp_count = timed(lambda: decode_pypgoutput(messages))
    if pyp_count is None:
        print("pypgoutput: not installed, skipped (pip install pypgoutput to compare)")
    else:
        pyp_rate = changes / pyp_s
        report(
            "pypgoutput (decode only)",
            pyp_rate,
            pyp_s,
            f"columnar = {columnar_rate / pyp_rate:.1f}x pypgoutput",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
