"""The whole product: snapshot, CDC runs, crashes at the worst moments, and a lake equal to its source.

Real PostgreSQL, real ``airflow dags test`` on the example DAGs, real ``spark-submit`` in local
mode, two lake tables partitioned and two keeping deleted rows (read as documented: the marked
rows left out), three keeping every version of their rows (read "valid at" each cut, they are the
table at that cut), and customers' personal columns hashed or dropped before staging. The initial
snapshot's DAG run is SIGKILLed with its worker during its copy, then during its load, and simply
run again. The CDC crash is produced by running the pipeline's own steps partway, exactly as a
killed worker leaves them: a batch applied but not acknowledged. The next run must converge, with
every change in the changelog once. (A batch applied to some tables only is the crash of
test_rest_lake.py, the same pipeline on a REST catalog and S3.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.testing import AirflowSandbox, PostgresCluster
from tests.integration.e2e.e2e_support import (
    assert_acked_end_is_the_latest_cut,
    assert_history_at_every_cut,
    lake_snapshots,
    lake_state,
    make_lake,
    pipeline_conf,
    pipeline_sandbox,
    spark_apply,
)
from tests.integration.e2e.e2e_support import assert_changelog_exactly_once as changelog_exactly_once

SLOT = "shop_cdc"
# Two lake tables partitioned and two keeping deleted rows, through the DAGs' params (docs/LAKE.md).
PARTITION_BY = {"public.orders": ["days(placed_at)"], "public.order_items": ["bucket(4, order_id)"]}
SOFT = {"public.orders": "soft", "public.carts": "soft"}  # the shop deletes orders and truncates carts
# Customers' personal data hashed or dropped before staging, under the key of a connection.
TRANSFORMS = {"public.customers": {"email": "hash", "tags": "hash", "name": "drop"}}
HASH_KEY = "e2e-hash-key-of-the-shop-0123456789"
# Every version of three tables kept (key changes, unchanged TOAST values, a TRUNCATE each batch).
HISTORY = {"public.orders": "scd2", "public.products": "scd2", "public.carts": "scd2"}
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


@pytest.mark.timeout(1800)
def test_snapshot_batches_and_crashes_end_equal(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=11)
    shop.create_schema()
    shop.initial_load()
    staging = tmp_path / "staging"
    lake, lake_conn = make_lake(tmp_path / "lake")
    key_conn = json.dumps({"conn_type": "generic", "password": HASH_KEY})
    sandbox = pipeline_sandbox(
        tmp_path / "airflow",
        pg_cluster.uri(pg_dbname),
        lake_conn,
        connections={"postgres_cdc_hash_key": key_conn},
    )
    conf = {**pipeline_conf(SLOT, staging), "partition_by": PARTITION_BY, "deletes": SOFT}
    conf["column_transforms"], conf["history"] = TRANSFORMS, HISTORY
    transforms = ColumnTransformer(TRANSFORMS, HASH_KEY.encode())
    kill_the_initial_snapshot_twice(pg_cluster, sandbox, conf, lake, staging)
    sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()  # the user's re-run: no other step

    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()

    # The crash: applied everywhere, killed before the ack; more changes arrive meanwhile.
    shop.step()
    batch = drain_batch(dsn, DrainSettings(SLOT, (PUBLICATION,), str(staging), transforms=transforms))
    spark_apply(batch.manifest_uri, lake)
    conn = connect(dsn)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == batch.manifest.start_lsn  # not acked
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()  # applies nothing twice, acks
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == batch.manifest.end_lsn
    conn.close()

    # The lake as the options shape it, every staged change logged once, every cut's history.
    assert_changelog_exactly_once(lake, staging)
    catalog = open_catalog(lake)
    for table, fields in {**PARTITION_BY, "public.customers": []}.items():
        loaded = catalog.load_table(lake.identifier(*table.split(".", 1)))
        schema = loaded.schema()
        spec = [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in loaded.spec().fields]
        assert spec == [f.replace("days", "day").replace("bucket(4, ", "bucket[4](") for f in fields]
    customers = catalog.load_table(lake.identifier("public", "customers")).scan().to_arrow()
    assert "name" not in customers.column_names  # dropped; hashed: 64 hex digits (compare_tables: the HMAC)
    assert {len(email) for email in customers.column("email").to_pylist()} == {64}
    for table in SOFT:  # compare_tables reads the live rows; the deleted ones are there, marked
        marked = catalog.load_table(lake.identifier(*table.split(".", 1))).scan(
            row_filter="_pgl_deleted_lsn IS NOT NULL"
        )
        assert marked.to_arrow().num_rows > 0, table
    assert assert_history_at_every_cut(lake, list(HISTORY)) >= 3 * len(HISTORY)  # snapshot, 2 batches

    # Maintenance: compaction, one cut kept, acknowledged staging removed; the pipeline goes on and
    # takes the changes that came during the crash, and more.
    states = {t: lake_state(lake, t) for t in TABLES}
    sandbox.dags_test(
        "postgres_cdc_lake_maintenance",
        {**conf, "keep_cuts": 1, "older_than_hours": 1, "staging_retention_hours": 0},
    ).check()
    assert {t: lake_state(lake, t) for t in TABLES} == states
    assert not [p for p in (staging / SLOT).iterdir() if p.name.startswith("batch-")]
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()
    results = compare_tables(dsn, [PUBLICATION], lake, transforms=transforms)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == set(TABLES)
    # The last run applied changes to every table: its end is the lake's latest consistent cut.
    assert_acked_end_is_the_latest_cut(dsn, lake, SLOT, TABLES)


def kill_the_initial_snapshot_twice(
    pg: PostgresCluster,
    sandbox: AirflowSandbox,
    conf: dict[str, Any],
    lake: LakeConfig,
    staging: Path,
) -> None:
    """SIGKILL the initial snapshot's DAG run during its copy, re-run it, and SIGKILL that during its load.

    The copy is killed as soon as its slot is created (persistent, at its consistent point): its
    exported snapshot is held and nothing is staged complete. The load is killed once its first
    table committed.
    """
    slots = sql.SQL(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = {} AND confirmed_flush_lsn IS NOT NULL"
    ).format(sql.Literal(SLOT))
    manifests = staging / SLOT

    def copying() -> bool:
        return bool(pg.execute(slots)[0][0])

    def loading() -> bool:
        return bool(lake_snapshots(lake, SLOT))

    for _ in range(5):  # the shop's copy takes about 0.1 s, the poll as long: it may end first
        assert sandbox.dags_test_killed("postgres_cdc_initial_snapshot", conf, copying) is None
        assert pg.execute(slots)[0][0] == 1  # left behind by the dead run
        if not list(manifests.glob("snapshot-*/_manifest.json")):
            break  # killed during its copy: nothing staged complete
        # Killed after its copy: start again from nothing (no slot, nothing staged, no lake table).
        assert not lake_snapshots(lake, SLOT)
        pg.wait_for(f"SELECT NOT active FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
        pg.execute(sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(SLOT)))
        shutil.rmtree(manifests)
    else:
        raise AssertionError("five runs of the initial snapshot all finished their copy before the kill")
    open_catalog(lake)  # the catalog's tables exist before the load's are polled
    assert sandbox.dags_test_killed("postgres_cdc_initial_snapshot", conf, loading) is None
    assert len(list(manifests.glob("snapshot-*/_manifest.json"))) == 1


def assert_changelog_exactly_once(lake: LakeConfig, staging: Path) -> None:
    """Every staged change is in the changelog exactly once, whatever the crashes repeated."""
    batch_dirs = sorted(p for p in (staging / SLOT).iterdir() if p.name.startswith("batch-"))
    assert len(batch_dirs) == 2
    changelog_exactly_once(lake, batch_dirs, TABLES)
