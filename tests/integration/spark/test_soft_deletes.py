"""Soft deletes (``deletes="soft"``): deleted rows stay marked, re-inserts unmark, a TRUNCATE marks
every row, re-snapshots keep and mark what they no longer hold, and only a load switches the mode.
The live rows (no mark) always equal the reference model, and every mark is the deleting commit's."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import DeletesOptionError
from airflow_provider_postgres_cdc.formats.deletes import DELETED_AT, DELETED_LSN, DELETES_PROPERTY
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.spark import apply_batch
from tests.integration.spark.iceberg_support import LakeReader, pyiceberg_catalog
from tests.integration.spark.spark_staging import (
    COMMIT_TIME,
    ORDERS,
    Row,
    Stager,
    TableDef,
    dele,
    ins,
    model_apply,
    rows_of,
    trunc,
    upd,
)

S0 = 0x4000_0000
SNAPSHOT_TIME = datetime(2026, 11, 21, 6, 0, tzinfo=UTC)  # the Stager's manifests' created_at


def _row(i: int, tag: str = "n") -> Row:
    return {"id": i, "name": f"{tag}{i}", "payload": f"p{i}", "amount": Decimal(f"{i}.50")}


def _split(
    spark: SparkSession, reader: LakeReader
) -> tuple[list[tuple[Any, ...]], dict[int, tuple[int, Any]]]:
    """(the live rows as sorted tuples, {id: (deleted LSN, deleted at)} of the marked ones)."""
    live, marked = [], {}
    for row in spark.sql(f"SELECT * FROM {reader.name(ORDERS)}").collect():
        if row[DELETED_LSN] is None:
            assert row[DELETED_AT] is None
            live.append(tuple(row[n] for n in ORDERS.names))
        else:
            marked[row["id"]] = (
                row[DELETED_LSN],
                row[DELETED_AT].replace(tzinfo=UTC) if row[DELETED_AT] else None,
            )
    return sorted(live, key=repr), marked


def _utc(moment: datetime) -> datetime:
    """``moment`` as the driver's collect() returns a timestamp: naive, in the process's zone."""
    return moment.astimezone().replace(tzinfo=None).replace(tzinfo=UTC)


def test_deleted_rows_stay_marked_through_batches_truncate_and_reloads(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    reader, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    model = {(i,): _row(i) for i in range(10)}
    apply_batch.apply_manifest(
        spark, stager.snapshot(S0, [(ORDERS, list(model.values()))]), lake_config, deletes="soft"
    )
    properties = (
        pyiceberg_catalog(lake_config).load_table(lake_config.identifier("public", "orders")).properties
    )
    assert properties[DELETES_PROPERTY] == "soft"
    assert _split(spark, reader) == (rows_of(model, ORDERS.names), {})
    committed = _utc(COMMIT_TIME)

    # Deletes, a key change (3 -> 300), updates and an insert; the marks are the deleting commit's.
    e1 = S0 + 0x1000
    b1 = [dele(S0 + 0x100, 0, id=1), upd(S0 + 0x200, 0, old={"id": 3}, **_row(300, "moved"))]
    b1 += [upd(S0 + 0x300, 0, **_row(2, "u")), ins(S0 + 0x300, 1, **_row(100)), dele(S0 + 0x400, 0, id=4)]
    model_apply(ORDERS, model, b1, S0)
    apply_batch.apply_manifest(spark, stager.batch(S0, e1, [(ORDERS, [b1])]), lake_config, deletes="soft")
    live, marked = _split(spark, reader)
    assert live == rows_of(model, ORDERS.names)
    assert marked == {1: (S0 + 0x100, committed), 3: (S0 + 0x200, committed), 4: (S0 + 0x400, committed)}
    kept = spark.sql(f"SELECT name FROM {reader.name(ORDERS)} WHERE id = 1").collect()
    assert [r[0] for r in kept] == ["n1"]  # a deleted row keeps the values it last had

    # A run that does not name the table keeps it soft; re-inserting a key unmarks it.
    e2 = e1 + 0x1000
    b2 = [ins(e1 + 0x100, 0, **_row(1, "again"))]
    model_apply(ORDERS, model, b2, S0)
    apply_batch.apply_manifest(spark, stager.batch(e1, e2, [(ORDERS, [b2])]), lake_config)
    live, marked = _split(spark, reader)
    assert live == rows_of(model, ORDERS.names) and set(marked) == {3, 4}

    # A TRUNCATE marks every live row; rows marked before keep their marks; a later insert is live.
    e3 = e2 + 0x1000
    b3 = [upd(e2 + 0x100, 0, **_row(5, "gone")), trunc(e2 + 0x200, 0), ins(e2 + 0x300, 0, **_row(500))]
    model_apply(ORDERS, model, b3, S0)
    apply_batch.apply_manifest(spark, stager.batch(e2, e3, [(ORDERS, [b3])]), lake_config, deletes="soft")
    live, marked = _split(spark, reader)
    assert live == rows_of(model, ORDERS.names) == [tuple(_row(500).values())]
    assert marked[3] == (S0 + 0x200, committed) and marked[4] == (S0 + 0x400, committed)
    assert {i for i, mark in marked.items() if mark == (e2 + 0x200, committed)} == {
        0,
        1,
        2,
        5,
        6,
        7,
        8,
        9,
        100,
        300,
    }

    # A batch cannot switch the mode; nothing of it is committed.
    before = reader.current(ORDERS)
    e4 = e3 + 0x1000
    b4 = [dele(e3 + 0x100, 0, id=500)]
    with pytest.raises(
        DeletesOptionError, match=r"a batch cannot switch it to 'hard'\. Re-snapshot the table"
    ):
        apply_batch.apply_manifest(spark, stager.batch(e3, e4, [(ORDERS, [b4])]), lake_config, deletes="hard")
    assert reader.current(ORDERS) == before

    # A re-snapshot past b4 that no longer has 500 keeps it, marked at its consistent point; the
    # rows marked before keep their marks.
    model_apply(ORDERS, model, b4, S0)
    reloaded = {(i,): _row(i, "r") for i in (600, 601)}
    apply_batch.apply_manifest(spark, stager.snapshot(e4, [(ORDERS, list(reloaded.values()))]), lake_config)
    live, marked = _split(spark, reader)
    assert live == rows_of(reloaded, ORDERS.names)
    assert marked[500] == (e4, _utc(SNAPSHOT_TIME)) and marked[4] == (S0 + 0x400, committed)
    assert len(marked) == 13

    # A load may switch the mode: hard drops the marked rows and the marks.
    apply_batch.apply_manifest(
        spark, stager.snapshot(e4 + 0x1000, [(ORDERS, list(reloaded.values()))]), lake_config, deletes="hard"
    )
    assert reader.rows(ORDERS) == rows_of(reloaded, ORDERS.names)
    assert DELETED_LSN not in reader.columns(ORDERS)


@pytest.mark.parametrize("truncate", [False, True], ids=["delete", "truncate"])
def test_a_reload_behind_the_lake_replays_deletes_as_marks(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, truncate: bool
) -> None:
    """The copy ran while the CDC applied past its consistent point: the load replays the changelog
    from there, and a delete or TRUNCATE it replays marks rows instead of removing them, as the
    batch did. (A row deleted before a TRUNCATE of the same batch carries the TRUNCATE's mark.)"""
    reader, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    model = {(i,): _row(i) for i in range(6)}
    apply_batch.apply_manifest(
        spark, stager.snapshot(S0, [(ORDERS, list(model.values()))]), lake_config, deletes="soft"
    )
    point, end = S0 + 0x500, S0 + 0x1000
    below = [upd(S0 + 0x100, 0, **_row(1, "below"))]
    above = [
        dele(point + 0x100, 0, id=2),
        ins(point + 0x200, 0, **_row(20)),
        upd(point + 0x300, 0, **_row(3, "a")),
    ]
    above += [trunc(point + 0x400, 0), ins(point + 0x500, 0, **_row(30))] if truncate else []
    model_apply(ORDERS, model, below, S0)
    at_point = dict(model)
    model_apply(ORDERS, model, above, S0)
    apply_batch.apply_manifest(
        spark, stager.batch(S0, end, [(ORDERS, [below + above])]), lake_config, deletes="soft"
    )
    expected = _split(spark, reader)
    snapshot = stager.snapshot(point, [(ORDERS, list(at_point.values()))])
    apply_batch.apply_manifest(spark, snapshot, lake_config, deletes="soft")
    assert reader.state(ORDERS).base_lsn == point
    live, marked = _split(spark, reader)
    assert live == rows_of(model, ORDERS.names) == expected[0]
    assert marked[2] == (point + (0x400 if truncate else 0x100), _utc(COMMIT_TIME))
    assert marked == expected[1]


def test_soft_deletes_of_a_table_without_a_key_are_refused(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    keyless = TableDef("public", "events", [("id", pa.int64()), ("label", pa.string())], [], "f")
    manifest = Stager(tmp_path / "staging").snapshot(S0, [(keyless, [{"id": 1, "label": "a"}])])
    with pytest.raises(
        DeletesOptionError, match=r"public\.events: its changes carry no key \(REPLICA IDENTITY FULL"
    ):
        apply_batch.apply_manifest(spark, manifest, lake_config, deletes='{"public.events": "soft"}')
    apply_batch.apply_manifest(
        spark, manifest, lake_config, deletes='{"public.other": "soft"}'
    )  # not named: hard
