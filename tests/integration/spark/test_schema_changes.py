"""Schema changes of every kind through the real drain and the apply job, compared with ``verify``.

Real DDL on a throwaway PostgreSQL, the real drain (peek transport) into staging, the apply job in
this process's Spark with the Iceberg runtime, the ack's own check of the lake, and
``verify.compare_tables`` (a fresh snapshot of the source against the lake, as multisets).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import unapplied_tables
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.staging import read_manifest
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import ResnapshotNeededError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.replication import advance_slot, connect
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.testing import PostgresCluster

SLOT = "schema_cdc"
pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Pipeline:
    """One source database, its slot and publication, a staging root and a lake."""

    def __init__(
        self, pg: PostgresCluster, db: str, spark: SparkSession, lake: LakeConfig, tmp: Path, ddl: str
    ) -> None:
        self.pg, self.db, self.spark, self.lake = pg, db, spark, lake
        self.dsn = pg.dsn(db)
        self.staging = str(tmp / "staging")
        pg.execute(ddl + "; CREATE PUBLICATION pub FOR ALL TABLES", db)
        path, _ = take_snapshot(self.dsn, SLOT, ["pub"], self.staging)
        apply_manifest(spark, path, lake)

    def sql(self, statement: str) -> None:
        self.pg.execute(statement, self.db)

    def drain(self) -> Manifest:
        result = drain_batch(self.dsn, DrainSettings(slot=SLOT, publications=("pub",), staging=self.staging))
        return read_manifest(result.manifest_uri)

    def apply(self, manifest: Manifest) -> None:
        apply_manifest(self.spark, self._path(manifest), self.lake)

    def ack(self, manifest: Manifest) -> None:
        assert unapplied_tables(self.lake, manifest) == []
        conn = connect(self.dsn)
        try:
            advance_slot(conn, SLOT, manifest.end_lsn)
        finally:
            conn.close()

    def cycle(self) -> Manifest:
        manifest = self.drain()
        self.apply(manifest)
        self.ack(manifest)
        return manifest

    def resnapshot(self, table: str) -> None:
        """What the backfill DAG does: a snapshot of the table from a temporary slot, loaded."""
        path, _ = take_snapshot(self.dsn, SLOT, ["pub"], self.staging, tables=[table], slot_mode="temporary")
        apply_manifest(self.spark, path, self.lake)

    def assert_equal(self) -> None:
        results = compare_tables(self.dsn, ["pub"], self.lake)
        assert all(r.equal for r in results), format_report(results)

    def lake_rows(self, table: str, columns: str) -> list[tuple[object, ...]]:
        name = f"`{self.lake.catalog}`.`public`.`{table}`"
        return [tuple(r) for r in self.spark.sql(f"SELECT {columns} FROM {name} ORDER BY id").collect()]

    def _path(self, manifest: Manifest) -> str:
        return f"{self.staging}/{SLOT}/{manifest.batch_id}/_manifest.json"


@pytest.fixture
def make_pipeline(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> Callable[[str], Pipeline]:
    return lambda ddl: Pipeline(pg_cluster, pg_dbname, spark, lake_config, tmp_path, ddl)


def test_added_columns_hold_what_postgresql_keeps_for_older_rows(
    make_pipeline: Callable[[str], Pipeline],
) -> None:
    p = make_pipeline(
        "CREATE TABLE t (id int PRIMARY KEY, a text);"
        "INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 5) g;"
        # matched on the whole old row: rows staged before the ADD COLUMN need the value too
        "CREATE TABLE f (id int, a text); ALTER TABLE f REPLICA IDENTITY FULL;"
        "INSERT INTO f SELECT g, 'f' || g FROM generate_series(1, 3) g"
    )
    # Batch 1: rows before and after each ADD COLUMN in the same batch.
    p.sql("INSERT INTO t VALUES (6, 'a6'); INSERT INTO f VALUES (4, 'f4'); UPDATE f SET a = 'u' WHERE id = 1")
    p.sql("ALTER TABLE t ADD COLUMN k int DEFAULT 5; ALTER TABLE f ADD COLUMN k int DEFAULT 5")
    p.sql("INSERT INTO t VALUES (7, 'a7'); UPDATE t SET a = 'x' WHERE id = 2")
    p.sql("UPDATE f SET a = 'w' WHERE id = 2; DELETE FROM f WHERE id = 3")
    p.sql("ALTER TABLE t ADD COLUMN n int")  # no default: older rows read NULL
    # now() is stable, not volatile: PostgreSQL keeps the ALTER's time as the missing value
    p.sql(
        "ALTER TABLE t ADD COLUMN at timestamptz DEFAULT now(), ADD COLUMN tags text[] DEFAULT '{x,\"y z\"}'"
    )
    p.sql("INSERT INTO t VALUES (8, 'a8', 9, 1, '2020-01-01 00:00+00')")
    first = p.cycle()
    assert len(first.table("public", "t").versions) == 3  # ALTERs with no change between: one step
    assert p.lake_rows("t", "id, k") == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5), (6, 5), (7, 5), (8, 9)]
    p.assert_equal()
    # Batch 2: the ADD COLUMN comes before the batch's first change of t (older rows are in the
    # lake only); then a column dropped and added again under its old name, with no default.
    p.sql("ALTER TABLE t ADD COLUMN c text DEFAULT 'hello'")
    p.sql("UPDATE t SET k = 7 WHERE id = 1; INSERT INTO t (id, a) VALUES (9, 'a9')")
    p.sql("ALTER TABLE t DROP COLUMN a")
    p.sql("INSERT INTO t (id) VALUES (10)")
    p.sql("ALTER TABLE t ADD COLUMN a text")
    p.sql("INSERT INTO t (id, a) VALUES (11, 'new')")
    p.cycle()
    assert p.lake_rows("t", "id, a, c") == [
        *[(i, None, "hello") for i in range(1, 11)],
        (11, "new", "hello"),
    ]
    p.assert_equal()
    # Batch 3: a DROP COLUMN alone keeps going; the lake keeps the column, no longer written.
    p.sql("ALTER TABLE t DROP COLUMN n; INSERT INTO t (id) VALUES (12)")
    p.cycle()
    p.assert_equal()


def test_a_column_dropped_and_added_again_with_a_default_fills_every_older_row(
    make_pipeline: Callable[[str], Pipeline],
) -> None:
    # The re-added column is the last again, so the shape before the DROP comes back: it must stay
    # a version of its own, or the rows between lose the missing value (fidelity seed 16).
    p = make_pipeline(
        "CREATE TABLE r (id int PRIMARY KEY, a text); INSERT INTO r VALUES (1, 'a1');"
        "CREATE TABLE m (id int, a text); INSERT INTO m VALUES (1, 'm1')"  # keyless: the multiset path
    )
    for table in ("r", "m"):
        p.sql(f"ALTER TABLE {table} ADD COLUMN b bool; INSERT INTO {table} VALUES (2, 'x', false)")
        p.sql(f"ALTER TABLE {table} DROP COLUMN b; INSERT INTO {table} VALUES (3, 'y')")
        p.sql(
            f"ALTER TABLE {table} ADD COLUMN b bool DEFAULT true; INSERT INTO {table} VALUES (4, 'z', false)"
        )
    manifest = p.cycle()
    assert len(manifest.table("public", "r").versions) == 3
    for table in ("r", "m"):
        assert p.lake_rows(table, "id, b") == [(1, True), (2, True), (3, True), (4, False)]
    p.assert_equal()


def test_a_keyless_table_removes_rows_after_a_drop_column(make_pipeline: Callable[[str], Pipeline]) -> None:
    # Without a key rows match on every column, but the old tuples after the DROP lack the column
    # the lake's rows (and the batch's earlier changes) still hold (fidelity seed 6).
    p = make_pipeline(
        "CREATE TABLE d (id int, a text, b text); ALTER TABLE d REPLICA IDENTITY FULL;"
        "INSERT INTO d VALUES (1, 'a1', 'b1'), (2, 'a2', 'b2'), (2, 'a2', 'b2'), (3, 'a3', 'b3')"
    )
    p.sql("INSERT INTO d VALUES (4, 'a4', 'b4'); ALTER TABLE d DROP COLUMN b")
    p.sql("DELETE FROM d WHERE id = 1; UPDATE d SET a = 'x' WHERE id = 4")
    p.sql("DELETE FROM d WHERE ctid = (SELECT ctid FROM d WHERE id = 2 LIMIT 1)")
    p.cycle()
    assert p.lake_rows("d", "id, a") == [(2, "a2"), (3, "a3"), (4, "x")]
    p.assert_equal()


def test_widening_type_changes_widen_the_lake(make_pipeline: Callable[[str], Pipeline]) -> None:
    p = make_pipeline(
        "CREATE TABLE w (id int PRIMARY KEY, s int2, i int4, f float4, d numeric(10, 2), v varchar(10),"
        " u varchar(5));"
        "INSERT INTO w VALUES (1, 1, 2, 0.1, 12345678.91, 'ten chars!', 'five5')"
    )
    p.sql("INSERT INTO w VALUES (2, 2, 3, 1.5, 1.25, 'b', 'c')")  # before, in the same batch
    p.sql(
        "ALTER TABLE w ALTER COLUMN s TYPE int4, ALTER COLUMN i TYPE int8, ALTER COLUMN f TYPE float8, "
        "ALTER COLUMN d TYPE numeric(12, 2), ALTER COLUMN v TYPE varchar(20), ALTER COLUMN u TYPE text"
    )
    p.sql(
        "INSERT INTO w VALUES (3, 100000, 1099511627776, 0.1, 1234567890.12, 'twenty characters!!!',"
        " 'longer text');"
        "UPDATE w SET i = i + 1 WHERE id = 1"
    )
    p.cycle()
    p.assert_equal()
    p.sql("ALTER TABLE w ALTER COLUMN s TYPE int8")  # across batches: the lake's last version
    p.sql("INSERT INTO w VALUES (4, 9223372036854775807, 1, 2.5, 0, 'x', 'y')")
    p.cycle()
    p.assert_equal()


@pytest.mark.parametrize(
    ("ddl", "change"),
    [
        (
            "ALTER TABLE r ADD COLUMN at timestamptz DEFAULT clock_timestamp()",
            "'at' was added with a default",
        ),
        ("ALTER TABLE r ADD COLUMN seq serial", "'seq' was added with a default"),
        ("ALTER TABLE r RENAME COLUMN a TO b", "RENAME COLUMN"),
        ("ALTER TABLE r ALTER COLUMN a TYPE text", "column 'a' changed from int4 to text"),
    ],
    ids=["volatile-default", "serial", "rename", "int-to-text"],
)
def test_changes_the_stream_cannot_show_stop_until_the_table_is_resnapshotted(
    make_pipeline: Callable[[str], Pipeline],
    ddl: str,
    change: str,
) -> None:
    p = make_pipeline(
        "CREATE TABLE r (id int PRIMARY KEY, a int); INSERT INTO r SELECT g, g FROM generate_series(1, 5) g;"
        "CREATE TABLE other (id int PRIMARY KEY)"
    )
    p.sql("INSERT INTO other VALUES (1); INSERT INTO r VALUES (6, 6)")  # other is applied first
    p.sql(ddl)
    p.sql("INSERT INTO r (id) VALUES (7); UPDATE r SET id = 8 WHERE id = 1")
    batch = p.drain()
    with pytest.raises(ResnapshotNeededError) as failure:
        p.apply(batch)
    message = str(failure.value)
    assert "public.r" in message and change in message
    assert (
        'airflow dags trigger postgres_cdc_backfill_tables --conf \'{"slot_name": "schema_cdc", "staging": '
        in message
    )
    assert '"tables": ["public.r"]}' in message
    assert unapplied_tables(p.lake, batch) == ["public.r"]  # the ack refuses the batch
    p.resnapshot("public.r")
    p.apply(batch)  # the re-run after the backfill: r already holds it
    p.ack(batch)
    p.sql("INSERT INTO r (id) VALUES (9)")
    p.cycle()
    p.assert_equal()


def test_a_resnapshot_past_an_add_column_is_the_new_baseline(
    make_pipeline: Callable[[str], Pipeline],
) -> None:
    """A batch straddling a re-snapshot: its versions below the base LSN are in the snapshot, whose
    columns (newer) stay what the next batch is classified against."""
    p = make_pipeline(
        "CREATE TABLE r (id int PRIMARY KEY, a int); INSERT INTO r VALUES (1, 1); CREATE TABLE o (id int)"
    )
    p.sql("INSERT INTO r VALUES (2, 2)")  # under the old version, below the re-snapshot's point
    p.sql("ALTER TABLE r ADD COLUMN at timestamptz DEFAULT clock_timestamp()")
    p.resnapshot("public.r")
    p.sql("INSERT INTO o VALUES (1)")  # the batch reaches past the re-snapshot's point
    manifest = p.cycle()
    assert [len(t.versions) for t in manifest.tables] == [1, 1]  # r: the old version only
    p.sql("INSERT INTO r (id) VALUES (3)")
    p.cycle()
    p.assert_equal()


def test_added_column_after_a_snapshot_with_overflow_siblings_is_no_rename(
    make_pipeline: Callable[[str], Pipeline],
) -> None:
    # The snapshot stages d__pgl_text (infinity fits no date32): a staged column, not a source one.
    # Recorded as the table's last source columns, it made the next ADD COLUMN look like a rename.
    p = make_pipeline(
        "CREATE TABLE o (id int PRIMARY KEY, d date);"
        "INSERT INTO o VALUES (1, 'infinity'), (2, '2020-01-02'), (3, '0044-03-15 BC')"
    )
    p.sql("ALTER TABLE o ADD COLUMN b bool; INSERT INTO o VALUES (4, '-infinity', true)")
    p.sql("UPDATE o SET b = false WHERE id = 2")
    p.cycle()
    assert p.lake_rows("o", "id, b") == [(1, None), (2, False), (3, None), (4, True)]
    p.assert_equal()
