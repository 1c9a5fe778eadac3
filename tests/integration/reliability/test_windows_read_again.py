"""Exactly once per change: a window of the slot read again with another end changes nothing twice.

An applied but unacknowledged batch loses its staged files (a lifecycle rule, the retention, a
changed staging path); the next drain, with a larger ``max_messages``, reads a longer window from
the same slot position; a drain with a smaller one then reads a window wholly inside what the
lake holds. Real PostgreSQL, the drain, the apply job in the suite's Spark session, the ack's
check and advance: a keyed table and a keyless REPLICA IDENTITY FULL table (identical rows
included) end equal to the source as multisets, and every change is in each changelog once.
A re-run of the initial snapshot then is skipped, or refused naming the backfill once its staged
snapshot is gone: lake tables hold changes from the slot, also after empty batches moved it past
every table's applied end. A slot created anew by a recovery that died is dropped instead.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainResult, DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.engine.snapshot import rerun_snapshot, take_snapshot
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import BACKFILL_DAG, SlotExistsError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.fidelity.steps import acknowledge

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(600)]

SLOT = "again"
TABLES = ("keyed", "loose")
CHANGE_KEY = ("_pgl_commit_lsn", "_pgl_seq")
SOURCE = """
CREATE TABLE keyed (id int PRIMARY KEY, v text);
CREATE TABLE loose (k int, v text);
ALTER TABLE loose REPLICA IDENTITY FULL;
INSERT INTO keyed SELECT g, 'k' || g FROM generate_series(1, 40) g;
INSERT INTO loose SELECT g % 4, 'same' FROM generate_series(1, 40) g;
CREATE PUBLICATION again FOR TABLE keyed, loose;
CREATE TABLE noise (id int);
"""


def write(pg: PostgresCluster, db: str, first: int, count: int) -> None:
    """``count`` transactions touching both tables: identical keyless rows added and removed."""
    for n in range(first, first + count):
        pg.execute(
            f"BEGIN; INSERT INTO keyed VALUES ({100 + n}, 'new{n}');"
            f"UPDATE keyed SET v = 'u{n}' WHERE id = {n};"
            f"INSERT INTO loose VALUES ({n % 4}, 'same'), ({n % 4}, 'same');"
            f"DELETE FROM loose WHERE ctid = (SELECT ctid FROM loose WHERE k = {(n + 1) % 4} LIMIT 1);"
            f"UPDATE loose SET v = 'moved' WHERE ctid = (SELECT ctid FROM loose WHERE v = 'same' LIMIT 1);"
            "COMMIT",
            db,
        )


def logged(lake: LakeConfig) -> dict[str, Counter[tuple[int, int]]]:
    catalog = open_catalog(lake)
    out = {}
    for table in TABLES:
        log = catalog.load_table(lake.changelog_identifier("public", table))
        out[table] = Counter(
            zip(*log.scan(selected_fields=CHANGE_KEY).to_arrow().to_pydict().values(), strict=True)
        )
    return out


def staged_keys(staging: Path, batch: DrainResult) -> dict[str, set[tuple[int, int]]]:
    """The (commit LSN, sequence) of every change staged in ``batch``, by table."""
    root = staging / SLOT / batch.manifest.batch_id
    keys: dict[str, set[tuple[int, int]]] = {table: set() for table in TABLES}
    for entry in batch.manifest.tables:
        for part in entry.files:
            columns = pq.read_table(root / part, columns=list(CHANGE_KEY)).to_pydict().values()
            keys[entry.table].update(zip(*columns, strict=True))
    return keys


def commits(lake: LakeConfig) -> list[int | None]:
    """The current snapshot of every table and changelog: unchanged when nothing was committed."""
    catalog = open_catalog(lake)
    identifiers = [lake.identifier("public", t) for t in TABLES]
    identifiers += [lake.changelog_identifier("public", t) for t in TABLES]
    return [getattr(catalog.load_table(i).current_snapshot(), "snapshot_id", None) for i in identifiers]


def test_a_window_read_again_applies_and_logs_each_change_once(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    pg_cluster.execute(SOURCE, pg_dbname)
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"), catalog=f"again_{tmp_path.name[-8:]}")
    register_lake(spark, lake)
    staging = tmp_path / "staging"
    path, _ = take_snapshot(dsn, SLOT, ["again"], str(staging))
    apply_manifest(spark, path, lake)

    def drain(max_messages: int) -> DrainResult:
        return drain_batch(dsn, DrainSettings(SLOT, ("again",), str(staging), max_messages=max_messages))

    # A batch of both tables applied, not acknowledged; its staged files are lost.
    write(pg_cluster, pg_dbname, 1, 4)
    short = drain(20)
    apply_manifest(spark, short.manifest_uri, lake)
    shutil.rmtree(staging / SLOT / short.manifest.batch_id)
    write(pg_cluster, pg_dbname, 5, 4)
    # A larger max_messages reads a longer window from the same position: only the rest is applied.
    long = drain(100_000)
    assert long.manifest.start_lsn == short.manifest.start_lsn
    assert long.manifest.end_lsn > short.manifest.end_lsn
    apply_manifest(spark, long.manifest_uri, lake)
    window = staged_keys(staging, long)
    assert {t: set(c) for t, c in logged(lake).items()} == window

    # Lost again before the ack; a smaller max_messages now reads a window the lake holds whole:
    # nothing is committed, and the ack moves the slot past it.
    shutil.rmtree(staging / SLOT / long.manifest.batch_id)
    inside = drain(20)
    assert inside.manifest.start_lsn == long.manifest.start_lsn
    assert inside.manifest.end_lsn < long.manifest.end_lsn
    before = commits(lake)
    apply_manifest(spark, inside.manifest_uri, lake)
    assert commits(lake) == before
    acknowledge(dsn, SLOT, lake, inside.manifest)
    conn = connect(dsn)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == inside.manifest.end_lsn

    # From there, a window that overlaps the lake's in part, and the changes written meanwhile.
    write(pg_cluster, pg_dbname, 9, 2)
    rest = drain(100_000)
    assert rest.manifest.start_lsn == inside.manifest.end_lsn < long.manifest.end_lsn < rest.manifest.end_lsn
    apply_manifest(spark, rest.manifest_uri, lake)
    acknowledge(dsn, SLOT, lake, rest.manifest)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == rest.manifest.end_lsn
    # Writes to an unpublished table: an empty batch, acknowledged, moves the slot past every
    # table's applied end.
    pg_cluster.execute("INSERT INTO noise SELECT generate_series(1, 50)", pg_dbname)
    empty = drain(100_000)
    assert not empty.manifest.tables and empty.manifest.end_lsn > rest.manifest.end_lsn
    acknowledge(dsn, SLOT, lake, empty.manifest)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == empty.manifest.end_lsn
    conn.close()

    results = compare_tables(dsn, ["again"], lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == {f"public.{t}" for t in TABLES}
    everything = {t: window[t] | staged_keys(staging, rest)[t] for t in TABLES}
    counts = logged(lake)
    assert {t: [k for k, n in c.items() if n > 1] for t, c in counts.items()} == {t: [] for t in TABLES}
    assert {t: set(c) for t, c in counts.items()} == everything
    assert all(everything[t] for t in TABLES)

    # The initial snapshot run again now: skipped, the pipeline runs from its slot; with its staged
    # snapshot gone, refused with the backfill to run (the lake holds changes from the slot).
    refusal = SlotExistsError(f"replication slot {SLOT!r} already exists")
    assert rerun_snapshot(dsn, SLOT, str(staging), refusal, lake=lake).action == "skip"
    for snapshot in staging.glob(f"{SLOT}/snapshot-*"):
        shutil.rmtree(snapshot)
    with pytest.raises(SlotExistsError, match=f"lake tables hold changes from it.*{BACKFILL_DAG}"):
        rerun_snapshot(dsn, SLOT, str(staging), refusal, lake=lake)

    # A slot nothing was loaded from: a snapshot of some tables refuses to drop it (the others'
    # changes would be lost); one of every table drops it and starts over.
    unused = f"{SLOT}_unused"
    pg_cluster.execute(f"SELECT pg_create_logical_replication_slot('{unused}', 'pgoutput')", pg_dbname)
    refusal = SlotExistsError(f"replication slot {unused!r} already exists")
    with pytest.raises(SlotExistsError, match="copies only some of the published tables"):
        rerun_snapshot(dsn, unused, str(staging), refusal, lake=lake, every_table=False)
    slots = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{unused}'"
    assert pg_cluster.execute(slots, pg_dbname)[0][0] == 1
    assert rerun_snapshot(dsn, unused, str(staging), refusal, lake=lake).action == "restart"
    assert pg_cluster.execute(slots, pg_dbname)[0][0] == 0

    # The slot created anew by a recovery that died during its copy (it recorded where): the lake's
    # tables hold changes only from before that point, so nothing was loaded from it and it is dropped.
    pg_cluster.execute(f"SELECT pg_drop_replication_slot('{SLOT}')", pg_dbname)
    ((created,),) = pg_cluster.execute(
        f"SELECT lsn::text FROM pg_create_logical_replication_slot('{SLOT}', 'pgoutput')", pg_dbname
    )
    StagingLocation.resolve(str(staging)).record_slot_created(SLOT, Lsn.parse(created))
    refusal = SlotExistsError(f"replication slot {SLOT!r} already exists")
    assert rerun_snapshot(dsn, SLOT, str(staging), refusal, lake=lake).action == "restart"
