"""The lake maintenance job on a merge-on-read lake built by the apply job: data, cuts and state survive."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch, maintain_lake
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from tests.integration.spark.iceberg_support import LakeReader
from tests.integration.spark.spark_staging import (
    ORDERS,
    Row,
    Stager,
    TableDef,
    dele,
    ins,
    model_apply,
    rows_of,
    upd,
)

SNAP_LSN = 0x2000_0000
ITEMS = TableDef("public", "items", [("id", pa.int64()), ("label", pa.string())], ["id"])


def _row(i: int, tag: str = "n") -> Row:
    return {"id": i, "name": f"{tag}{i}", "payload": f"big-{i}", "amount": Decimal(f"{i}.25")}


def _count(spark: SparkSession, sql: str) -> int:
    return int(spark.sql(sql).collect()[0][0])


def test_maintenance_keeps_rows_cuts_and_state(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    reader = LakeReader(spark, lake_config)
    stager = Stager(tmp_path / "staging")
    orders: dict[tuple[Any, ...], Row] = {(i,): _row(i) for i in range(30)}
    items = [{"id": i, "label": f"item{i}"} for i in range(5)]
    snapshot = stager.snapshot(SNAP_LSN, [(ORDERS, list(orders.values())), (ITEMS, items)])
    apply_batch.apply_manifest(spark, snapshot, lake_config)

    # Four merge-on-read batches: updates and deletes of existing rows leave position delete files.
    at_cut: dict[int, list[tuple[Any, ...]]] = {}
    start = SNAP_LSN
    for n in range(4):
        end = start + 0x1000
        lsn = start + 0x100
        changes = [
            upd(lsn, 0, **_row(n * 5, f"u{n}")),
            dele(lsn, 1, id=n * 5 + 1),
            ins(lsn, 2, **_row(100 + n)),
        ]
        model_apply(ORDERS, orders, changes, SNAP_LSN)
        apply_batch.apply_manifest(spark, stager.batch(start, end, [(ORDERS, [changes])]), lake_config)
        at_cut[end] = rows_of(orders, ORDERS.names)
        start = end

    name = reader.name(ORDERS)
    state_before = reader.state(ORDERS)
    items_state_before = reader.state(ITEMS)
    snapshots_before = len(reader.snapshots(ORDERS))
    assert _count(spark, f"SELECT count(*) FROM {name}.delete_files") > 0
    assert len([t for t in reader.tags(ORDERS)]) == 5  # the snapshot's cut and four batches'
    tables = IcebergTables(spark, lake_config)
    lake_orders = tables.table(lake_config.identifier("public", "orders"))
    assert lake_orders is not None
    location = lake_orders.location
    orphan = Path(location.removeprefix("file:")) / "data" / "left-by-a-crashed-writer.parquet"
    orphan.write_bytes(b"not referenced by any snapshot")
    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).timestamp()
    os.utime(orphan, (two_days_ago, two_days_ago))  # orphans younger than a day are never touched

    # Run as if a day and more had passed: everything the build made is older than the retention.
    results = maintain_lake.maintain(
        spark, lake_config, "slot1", keep_cuts=2, older_than=timedelta(hours=24),
        now=datetime.now(UTC) + timedelta(hours=25),
    )  # fmt: skip

    by_table = {r.table: r for r in results}
    changelog = tables.name(lake_config.changelog_identifier("public", "orders"))
    assert set(by_table) == {name, reader.name(ITEMS), changelog}
    summary = by_table[name]
    assert summary.data_files_rewritten > 0 and summary.conflicts == []
    assert summary.orphans_removed >= 1 and not orphan.exists()
    # Rows unchanged; the delete files are folded into the data.
    assert reader.rows(ORDERS) == rows_of(orders, ORDERS.names)
    assert _count(spark, f"SELECT count(*) FROM {name}.delete_files") == 0
    # Only the newest two cuts remain, in every table, and they still read the table at their batch.
    newest = sorted(at_cut)[-2:]
    assert sorted(reader.tags(ORDERS)) == [tag_name(Lsn(lsn)) for lsn in newest]
    assert sorted(reader.tags(ITEMS)) == [tag_name(Lsn(lsn)) for lsn in newest]
    assert len(summary.tags_dropped) == 3
    for lsn in newest:
        assert reader.rows(ORDERS, tag=tag_name(Lsn(lsn))) == at_cut[lsn]
    # Old snapshots are gone; what remains is the kept cuts plus the walk to the pipeline state.
    remaining = {s for s, _, _ in reader.snapshots(ORDERS)}
    assert summary.snapshots_expired > 0 and len(remaining) < snapshots_before
    table = tables.table(lake_config.identifier("public", "orders"))
    assert table is not None
    walk = [s for s, _ in table.history()]
    assert remaining == set(walk) | set(reader.tags(ORDERS).values())
    # The pipeline state reads exactly as before: same snapshot, batch and LSNs. (With retain_last=1
    # the rewrite commits' ancestors are expired and the table reads as having no state at all.)
    assert reader.state(ORDERS) == state_before
    assert reader.state(ITEMS) == items_state_before

    # The pipeline goes on: a further batch applies on the maintained table.
    end = start + 0x1000
    changes = [
        upd(start + 0x100, 0, **_row(10, "after")),
        dele(start + 0x100, 1, id=12),
        ins(start + 0x100, 2, **_row(200)),
    ]
    model_apply(ORDERS, orders, changes, SNAP_LSN)
    result = apply_batch.apply_manifest(spark, stager.batch(start, end, [(ORDERS, [changes])]), lake_config)
    assert [r.status for r in result] == ["applied"]
    assert reader.rows(ORDERS) == rows_of(orders, ORDERS.names)
    assert reader.state(ORDERS).applied_end_lsn == Lsn(end)
    assert reader.has_cut(ORDERS, end) and reader.has_cut(ITEMS, end)


def test_unknown_catalog_exits_2(spark: SparkSession, capsys: Any) -> None:
    assert maintain_lake.main(["--catalog", "no_such_lake", "--slot-name", "slot1"]) == 2
    assert "Spark has no catalog 'no_such_lake'" in capsys.readouterr().err
