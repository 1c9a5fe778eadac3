"""The local copy engine against a real server: the seam with the stream, filters, partitions, splitting."""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.snapshot import SnapshotProgress, take_snapshot
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.snapshot.snapshot_helpers import (
    load_manifest,
    peek_inserts,
    sorted_rows,
    source_rows,
    staged_table,
)
from tests.pg_majors import ALSO_ON_PG18

pytestmark = pytest.mark.integration


@ALSO_ON_PG18
def test_rows_before_the_slot_are_copied_rows_after_it_are_streamed(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute("CREATE TABLE t (id int PRIMARY KEY, note text)", db)
    pg_cluster.execute("INSERT INTO t SELECT g, 'before ' || g FROM generate_series(1, 500) g", db)
    pg_cluster.execute("CREATE PUBLICATION p FOR TABLE t", db)
    clock = "SELECT clock_timestamp()"
    moments = [pg_cluster.execute(clock, db)[0][0]]  # after the snapshot's commits

    def write_after_slot(progress: SnapshotProgress) -> None:
        # The slot and its snapshot exist now; these commits come after the consistent point.
        if progress.phase == "planned":
            moments.append(pg_cluster.execute(clock, db)[0][0])  # before the stream's commits
            pg_cluster.execute("INSERT INTO t SELECT g, 'after ' || g FROM generate_series(501, 530) g", db)
            pg_cluster.execute("UPDATE t SET note = 'changed' WHERE id = 1", db)

    path, manifest = take_snapshot(
        pg_cluster.dsn(db), "seam", ["p"], str(tmp_path), on_progress=write_after_slot
    )

    entry = manifest.table("public", "t")
    staged = staged_table(path, entry)
    assert entry.rows == staged.num_rows == 500
    assert sorted(staged.column("id").to_pylist()) == list(range(1, 501))
    assert "changed" not in staged.column("note").to_pylist()
    # The stream from the slot holds exactly the later commits: 30 inserts, none of the first 500.
    assert peek_inserts(pg_cluster, db, "seam", "p") == 30
    confirmed = pg_cluster.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'seam'", db
    )[0][0]
    assert manifest.start_lsn == manifest.end_lsn == Lsn.parse(confirmed)
    assert manifest.snapshot_name
    assert manifest.snapshot_taken_at is not None  # the source as the snapshot holds it: between the two
    taken = datetime.fromisoformat(manifest.snapshot_taken_at.replace("Z", "+00:00"))
    assert moments[0] <= taken <= moments[1]
    assert Path(path) == tmp_path / "seam" / f"snapshot-{int(manifest.start_lsn):016X}" / "_manifest.json"
    assert load_manifest(path) == manifest


@ALSO_ON_PG18
def test_row_filters_and_column_lists_copy_what_the_publication_selects(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10, 2), region text, secret text);"
        "INSERT INTO orders SELECT g, g * 1.5, (ARRAY['eu', 'us', 'ap'])[g % 3 + 1], 's' || g "
        "FROM generate_series(1, 300) g;"
        "CREATE TABLE items (id int PRIMARY KEY, qty int);"
        "INSERT INTO items SELECT g, g % 7 FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION big FOR TABLE orders (id, amount, region) WHERE (amount > 300), "
        "  items WHERE (qty > 3) WITH (publish = 'insert');"
        "CREATE PUBLICATION eu FOR TABLE orders (id, amount, region) WHERE (region = 'eu'), items "
        "  WITH (publish = 'insert');",
        db,
    )
    path, manifest = take_snapshot(pg_cluster.dsn(db), "filters", ["big", "eu"], str(tmp_path))

    orders = manifest.table("public", "orders")
    assert [c.name for c in orders.columns] == ["id", "amount", "region"]
    assert orders.column_list == ("id", "amount", "region")
    assert orders.row_filter is not None and "OR" in orders.row_filter
    expected = source_rows(
        pg_cluster, db, orders,
        "SELECT id::text, amount::text, region FROM orders WHERE (amount > 300) OR (region = 'eu')",
    )  # fmt: skip
    assert expected.num_rows < 300
    assert sorted_rows(staged_table(path, orders)) == sorted_rows(expected)
    assert staged_table(path, orders).schema.field("amount").type == pa.decimal128(10, 2)

    # items is published unfiltered by "eu", which makes the filter of "big" redundant.
    items = manifest.table("public", "items")
    assert items.row_filter is None and items.column_list is None
    assert items.rows == 100


def test_schema_publication_makes_filters_redundant_and_odd_names_survive(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        'CREATE SCHEMA "odd.schema"; CREATE TABLE "odd.schema"."we""ird/na.me" (id int PRIMARY KEY, v text);'
        """INSERT INTO "odd.schema"."we""ird/na.me" SELECT g, NULLIF(g % 3, 0)::text """
        "FROM generate_series(1, 50) g;"
        """CREATE PUBLICATION f FOR TABLE "odd.schema"."we""ird/na.me" WHERE (id < 5);"""
        'CREATE PUBLICATION s FOR TABLES IN SCHEMA "odd.schema";',
        db,
    )
    path, manifest = take_snapshot(pg_cluster.dsn(db), "odd", ["f", "s"], str(tmp_path))
    entry = manifest.table("odd.schema", 'we"ird/na.me')
    assert entry.row_filter is None
    assert entry.path == 'odd%2Eschema.we"ird%2Fna%2Eme'
    assert all(name.startswith(entry.path + "/part-") for name in entry.files)
    staged = staged_table(path, entry)
    assert staged.num_rows == 50
    assert staged.column("v").null_count == 16


@pytest.mark.parametrize("via_root", [True, False])
def test_partitioned_table_honours_publish_via_partition_root(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, via_root: bool
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);"
        "CREATE TABLE m_low PARTITION OF m FOR VALUES FROM (0) TO (1000);"
        "CREATE TABLE m_high PARTITION OF m FOR VALUES FROM (1000) TO (100000);"
        "INSERT INTO m SELECT g, 'v' || g FROM generate_series(1, 5000) g;"
        f"CREATE PUBLICATION p FOR TABLE m WITH (publish_via_partition_root = {str(via_root).lower()});",
        db,
    )
    # Tiny ranges force ctid splitting, which on a root applies to every partition's own ctids.
    path, manifest = take_snapshot(
        pg_cluster.dsn(db), "parts", ["p"], str(tmp_path), min_range_bytes=8192, parallelism=3
    )
    if via_root:
        assert [t.qualified for t in manifest.tables] == ["public.m"]
        entry = manifest.tables[0]
        assert len(entry.files) > 1
        assert sorted(staged_table(path, entry).column("id").to_pylist()) == list(range(1, 5001))
        assert entry.key_columns == ("id",)
    else:
        assert [t.qualified for t in manifest.tables] == ["public.m_high", "public.m_low"]
        high, low = manifest.tables
        assert sorted(staged_table(path, low).column("id").to_pylist()) == list(range(1, 1000))
        assert sorted(staged_table(path, high).column("id").to_pylist()) == list(range(1000, 5001))


def test_large_table_in_ranges_and_bounded_files_copies_every_row_once(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE big (id bigint PRIMARY KEY, txt text, f float8, d date, b bytea, flag bool, "
        "  tags int[], j jsonb, ts timestamp);"
        "INSERT INTO big SELECT g, CASE WHEN g % 10 = 0 THEN NULL WHEN g % 10 = 1 THEN '' "
        "  WHEN g % 10 = 2 THEN E'\\\\N' WHEN g % 10 = 3 THEN E'tab\\there\\\\n\\r\\x01\\\\\\\\ é ✓' "
        "  ELSE repeat('x', g % 50) || E'\\n,\"' END, "
        "  CASE WHEN g % 100 = 0 THEN 'NaN'::float8 ELSE g / 7.0 END, date '2020-01-01' + g % 1000, "
        "  decode(md5(g::text), 'hex'), g % 2 = 0, ARRAY[g, NULL, -g], "
        "  CASE WHEN g % 5 = 0 THEN 'null'::jsonb ELSE jsonb_build_object('g', g) END, "
        "  timestamp '2024-01-01 00:00:00.5' + g * interval '1 minute' "
        "FROM generate_series(1, 40000) g;"
        "DELETE FROM big WHERE id % 13 = 0;"
        # One value four times the batch size: a row never has to fit a parser block.
        "INSERT INTO big (id, txt) VALUES (40001, repeat(E'long\\tvalue\\n', 100000));"
        "CREATE PUBLICATION p FOR TABLE big;",
        db,
    )
    pg_cluster.execute("VACUUM big", db)
    progress: list[SnapshotProgress] = []
    caplog.set_level(logging.INFO, logger="airflow_provider_postgres_cdc.engine.snapshot")
    path, manifest = take_snapshot(
        pg_cluster.dsn(db), "big", ["p"], str(tmp_path),
        parallelism=3, min_range_bytes=64 * 1024, max_file_bytes=200_000, batch_bytes=256 * 1024,
        progress_interval=0.01, on_progress=progress.append,
    )  # fmt: skip
    entry = manifest.table("public", "big")
    assert len(entry.files) > 6  # several ranges, and several bounded files per range
    sizes = [os.path.getsize(os.path.join(os.path.dirname(path), name)) for name in entry.files]
    assert max(sizes) < 600_000
    staged = staged_table(path, entry)
    expected = source_rows(
        pg_cluster, db, entry,
        "SELECT id::text, txt, f::text, d::text, b::text, left(flag::text, 1), tags::text, j::text, ts::text "
        "FROM big",
    )  # fmt: skip
    assert staged.num_rows == entry.rows == 40000 - 40000 // 13 + 1
    assert staged.schema == expected.schema
    assert sorted_rows(staged) == sorted_rows(expected)
    assert progress[-1].rows == entry.rows and progress[-1].phase == "copying"
    assert any("rows/s" in record.getMessage() for record in caplog.records)


def test_table_without_key_is_copied_with_a_warning(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE nokey (a int, b text); INSERT INTO nokey VALUES (1, 'x'), (1, 'x');"
        "CREATE TABLE full_ident (a int, b text); ALTER TABLE full_ident REPLICA IDENTITY FULL;"
        "CREATE TABLE by_index (a int NOT NULL, b text, c int); CREATE UNIQUE INDEX bi ON by_index (b, a);"
        "ALTER TABLE by_index ALTER b SET NOT NULL; ALTER TABLE by_index REPLICA IDENTITY USING INDEX bi;"
        "CREATE PUBLICATION p FOR ALL TABLES;",
        db,
    )
    caplog.set_level(logging.WARNING)
    _, manifest = take_snapshot(pg_cluster.dsn(db), "keys", ["p"], str(tmp_path))
    nokey = manifest.table("public", "nokey")
    assert nokey.rows == 2 and nokey.key_columns == ()
    assert nokey.warnings and "REPLICA IDENTITY" in nokey.warnings[0]
    assert any("public.nokey" in r.getMessage() and "UPDATE" in r.getMessage() for r in caplog.records)
    full = manifest.table("public", "full_ident")
    assert full.replica_identity == "f" and full.key_columns == ("a", "b") and not full.warnings
    by_index = manifest.table("public", "by_index")
    assert by_index.replica_identity == "i" and by_index.key_columns == ("b", "a")
    assert [c.key for c in by_index.columns] == [True, True, False]


def test_copy_outlives_a_small_idle_in_transaction_timeout(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    """The holder of the snapshot is idle in its transaction for the whole copy, far past the timeout."""
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(1, 50000) g;"
        "CREATE PUBLICATION p FOR TABLE t;",
        db,
    )
    pg_cluster.execute(f"ALTER DATABASE \"{db}\" SET idle_in_transaction_session_timeout = '100ms'")

    def dawdle(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            time.sleep(1.0)  # ten times the timeout, with the holder idle in its transaction

    _, manifest = take_snapshot(pg_cluster.dsn(db), "slow", ["p"], str(tmp_path), on_progress=dawdle)
    assert manifest.table("public", "t").rows == 50000


def test_memory_is_bounded_by_the_batch_size_not_the_table(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE wide (id int PRIMARY KEY, v text);"
        "INSERT INTO wide SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, 200000) g;"
        "CREATE PUBLICATION p FOR TABLE wide;",
        db,
    )
    heap = int(pg_cluster.execute("SELECT pg_relation_size('wide')", db)[0][0])
    peak = 0

    def sample(progress: SnapshotProgress) -> None:
        nonlocal peak
        peak = max(peak, pa.total_allocated_bytes())

    _, manifest = take_snapshot(
        pg_cluster.dsn(db), "mem", ["p"], str(tmp_path),
        batch_bytes=256 * 1024, min_range_bytes=4 * 1024 * 1024, progress_interval=0.005, on_progress=sample,
    )  # fmt: skip
    assert manifest.table("public", "wide").rows == 200000
    assert heap > 40_000_000
    assert 0 < peak < heap / 4, f"Arrow held {peak} bytes at once for a {heap}-byte table"
