"""Partitioned lake tables (``partition_by``): created with their spec, merged, logged, re-loaded,
moved to a new spec and maintained, always equal to the reference model; read back by pyiceberg."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import PartitionSpecError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.partitioning import PARTITION_PROPERTY
from airflow_provider_postgres_cdc.spark import apply_batch, maintain_lake
from tests.integration.spark.iceberg_support import LakeReader, pyiceberg_catalog
from tests.integration.spark.spark_staging import Row, Stager, TableDef, dele, ins, model_apply, upd

SNAP_LSN = 0x3000_0000
DAY = datetime(2026, 3, 1, 6, tzinfo=UTC)
EVENTS = TableDef(
    "public",
    "events",
    [
        ("id", pa.int64()),
        ("sku", pa.string()),
        ("placed_at", pa.timestamp("us", tz="UTC")),
        ("amount", pa.decimal128(10, 2)),
    ],
    ["id"],
)
PLAIN = TableDef("public", "plain", [("id", pa.int64()), ("label", pa.string())], ["id"])
DAILY = json.dumps({"public.events": ["days(placed_at)", "bucket(4, id)", "truncate(2, sku)"]})


def _event(i: int, day: int, tag: str = "s") -> Row:
    return {
        "id": i,
        "sku": f"{tag}{i % 7}",
        "placed_at": DAY + timedelta(days=day, minutes=i),
        "amount": Decimal(i),
    }


def _lake_rows(spark: SparkSession, reader: LakeReader) -> list[tuple[Any, ...]]:
    rows = spark.sql(f"SELECT id, sku, unix_micros(placed_at), amount FROM {reader.name(EVENTS)}").collect()
    return sorted(tuple(r) for r in rows)


def _model_rows(model: dict[tuple[Any, ...], Row]) -> list[tuple[Any, ...]]:
    micros = [
        (r["id"], r["sku"], int(r["placed_at"].timestamp() * 1_000_000), r["amount"]) for r in model.values()
    ]
    return sorted(micros)


def _spec(config: LakeConfig, table: str) -> tuple[list[str], dict[str, str]]:
    """(the table's partition fields as ``transform(column)``, its properties), read by pyiceberg."""
    loaded = pyiceberg_catalog(config).load_table(config.identifier("public", table))
    schema = loaded.schema()
    fields = [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in loaded.spec().fields]
    return fields, dict(loaded.properties)


def test_a_partitioned_table_takes_batches_reloads_a_new_spec_and_maintenance(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    reader = LakeReader(spark, lake_config)
    stager = Stager(tmp_path / "staging")
    model = {(i,): _event(i, i % 5) for i in range(40)}
    plain = [{"id": i, "label": f"p{i}"} for i in range(3)]
    snapshot = stager.snapshot(SNAP_LSN, [(EVENTS, list(model.values())), (PLAIN, plain)])
    apply_batch.apply_manifest(spark, snapshot, lake_config, partition_by=DAILY)

    fields, properties = _spec(lake_config, "events")
    assert fields == ["day(placed_at)", "bucket[4](id)", "truncate[2](sku)"]
    assert json.loads(properties[PARTITION_PROPERTY]) == [
        "days(placed_at)",
        "bucket(4, id)",
        "truncate(2, sku)",
    ]
    fields, properties = _spec(lake_config, "plain")  # not named: unpartitioned, nothing recorded
    assert fields == [] and PARTITION_PROPERTY not in properties
    partitions = spark.sql(f"SELECT count(*) FROM {reader.name(EVENTS)}.partitions").collect()[0][0]
    assert partitions > 5  # files are written per day, bucket and sku prefix
    assert _lake_rows(spark, reader) == _model_rows(model)

    # Batches: updates moving rows to another day (another partition), deletes, inserts.
    start = SNAP_LSN
    for n in range(3):
        end, lsn = start + 0x1000, start + 0x100
        changes = [
            upd(lsn, 0, **_event(n, 9, "moved")),
            dele(lsn, 1, id=10 + n),
            ins(lsn, 2, **_event(100 + n, n)),
            upd(lsn + 0x10, 0, **_event(100 + n, 20, "again")),  # the same key twice in one batch
        ]
        model_apply(EVENTS, model, changes, SNAP_LSN)
        apply_batch.apply_manifest(
            spark, stager.batch(start, end, [(EVENTS, [changes])]), lake_config, partition_by=DAILY
        )
        assert _lake_rows(spark, reader) == _model_rows(model)
        assert reader.has_cut(EVENTS, end)
        start = end
    assert len(reader.changelog(EVENTS)) == 12  # every change logged once

    # A new spec: the next batch moves the table to it; older files keep theirs.
    monthly = json.dumps({"public.events": ["months(placed_at)"]})
    end = start + 0x1000
    changes = [upd(start + 0x100, 0, **_event(5, 40, "monthly")), ins(start + 0x100, 1, **_event(200, 41))]
    model_apply(EVENTS, model, changes, SNAP_LSN)
    apply_batch.apply_manifest(
        spark, stager.batch(start, end, [(EVENTS, [changes])]), lake_config, partition_by=monthly
    )
    fields, properties = _spec(lake_config, "events")
    assert fields == ["month(placed_at)"] and json.loads(properties[PARTITION_PROPERTY]) == [
        "months(placed_at)"
    ]
    assert _lake_rows(spark, reader) == _model_rows(model)
    start = end

    # A run that does not name the table keeps its spec.
    end = start + 0x1000
    changes = [dele(start + 0x100, 0, id=20)]
    model_apply(EVENTS, model, changes, SNAP_LSN)
    apply_batch.apply_manifest(spark, stager.batch(start, end, [(EVENTS, [changes])]), lake_config)
    assert _spec(lake_config, "events")[0] == ["month(placed_at)"]
    assert _lake_rows(spark, reader) == _model_rows(model)
    start = end

    # Maintenance compacts into the current spec; rows and state stay.
    state = reader.state(EVENTS)
    results = maintain_lake.maintain(
        spark, lake_config, "slot1", keep_cuts=1, older_than=timedelta(hours=24),
        now=datetime.now(UTC) + timedelta(hours=25),
    )  # fmt: skip
    assert all(r.conflicts == [] for r in results)
    assert _lake_rows(spark, reader) == _model_rows(model)
    assert reader.state(EVENTS) == state
    specs = spark.sql(f"SELECT DISTINCT spec_id FROM {reader.name(EVENTS)}.files").collect()
    assert len(specs) == 1  # the rewritten files are under the monthly spec now

    # A re-snapshot (newer consistent point) replaces every row under the current spec.
    reloaded = {(i,): _event(i, i % 3, "r") for i in range(0, 60, 2)}
    apply_batch.apply_manifest(
        spark, stager.snapshot(start, [(EVENTS, list(reloaded.values()))]), lake_config, partition_by=monthly
    )
    assert _lake_rows(spark, reader) == _model_rows(reloaded)
    assert reader.state(EVENTS).base_lsn == start


def test_a_spec_on_a_column_the_table_does_not_publish_commits_nothing(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    reader = LakeReader(spark, lake_config)
    stager = Stager(tmp_path / "staging")
    apply_batch.apply_manifest(
        spark, stager.snapshot(SNAP_LSN, [(PLAIN, [{"id": 1, "label": "a"}])]), lake_config
    )
    before = reader.current(PLAIN)
    batch = stager.batch(SNAP_LSN, SNAP_LSN + 0x1000, [(PLAIN, [[ins(SNAP_LSN + 0x10, 0, id=2, label="b")]])])
    with pytest.raises(PartitionSpecError, match="'placed_at', which the table does not publish"):
        apply_batch.apply_manifest(
            spark, batch, lake_config, partition_by=json.dumps({"public.plain": ["days(placed_at)"]})
        )
    with pytest.raises(PartitionSpecError, match="cannot partition column 'label'"):
        apply_batch.apply_manifest(
            spark, batch, lake_config, partition_by='{"public.plain": ["hours(label)"]}'
        )
    assert reader.current(PLAIN) == before


@pytest.mark.parametrize("named", [True, False], ids=["named", "not-named"])
def test_a_reload_that_changes_a_partition_columns_type_keeps_the_spec_the_option_names(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, named: bool
) -> None:
    """The source changed a partition column's type beyond promotion (integer to text): the reload
    drops and re-adds the column, and with it the partition field, which the option sets again."""
    before = TableDef("public", "codes", [("id", pa.int64()), ("code", pa.int32())], ["id"])
    after = TableDef("public", "codes", [("id", pa.int64()), ("code", pa.string())], ["id"])
    option = json.dumps({"public.codes": ["bucket(4, code)"]})
    reader, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    rows = [{"id": i, "code": i} for i in range(9)]
    apply_batch.apply_manifest(
        spark, stager.snapshot(SNAP_LSN, [(before, rows)]), lake_config, partition_by=option
    )
    assert _spec(lake_config, "codes")[0] == ["bucket[4](code)"]
    retyped = [{"id": i, "code": f"c{i}"} for i in range(9)]
    reload = stager.snapshot(SNAP_LSN + 0x1000, [(after, retyped)])
    apply_batch.apply_manifest(spark, reload, lake_config, partition_by=option if named else None)
    assert _spec(lake_config, "codes")[0] == (["bucket[4](code)"] if named else [])
    batch = stager.batch(
        SNAP_LSN + 0x1000, SNAP_LSN + 0x2000, [(after, [[ins(SNAP_LSN + 0x1100, 0, id=100, code="x")]])]
    )
    apply_batch.apply_manifest(spark, batch, lake_config, partition_by=option)
    assert reader.rows(after) == sorted([(r["id"], r["code"]) for r in retyped] + [(100, "x")], key=repr)
    assert _spec(lake_config, "codes")[0] == ["bucket[4](code)"]
