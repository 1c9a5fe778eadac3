"""SCD type 2 history (``history="scd2"``): under a random workload (updates, deletes, key changes,
TRUNCATEs, several changes of one key per batch and per transaction, unchanged TOAST values), the
history table filtered to "valid at X" equals the source as it was at X, for X every batch's cut
(and the main table at that cut's tag) and every transaction's commit time; a window read again
with another end changes nothing twice; a load switches history on (and a reload behind the lake
takes the replayed changes into it); a batch cannot switch it; a keyless table is refused."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import HistoryOptionError
from airflow_provider_postgres_cdc.formats.history import (
    ENDED_BY,
    HISTORY_PROPERTY,
    IS_CURRENT,
    VALID_FROM,
    VALID_FROM_LSN,
    VALID_TO,
    VALID_TO_LSN,
)
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch
from tests.integration.spark.iceberg_support import LakeReader, pyiceberg_catalog, table_name
from tests.integration.spark.spark_staging import (
    COMMIT_TIME,
    ORDERS,
    Change,
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

S0 = 0x5000_0000
State = dict[tuple[Any, ...], Row]


def _row(i: int, tag: str = "n", payload: str | None = None) -> Row:
    return {"id": i, "name": f"{tag}{i}", "payload": payload or f"p{i}", "amount": Decimal(f"{i % 997}.25")}


def _micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


class Workload:
    """Random transactions against a model of the source; every transaction's state is kept."""

    def __init__(self, seed: int, model: State, lsn: int) -> None:
        self.rng, self.model, self.lsn = random.Random(seed), model, lsn
        self.next_id = 1000
        self.states: list[tuple[int, datetime, State]] = []  # (commit LSN, commit time, state after)

    def _fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def _change(self, lsn: int, seq: int, recent: list[int]) -> Change:
        rng, keys = self.rng, [k[0] for k in self.model]
        pick = rng.choice(recent) if recent and rng.random() < 0.6 else (rng.choice(keys) if keys else None)
        roll = rng.random()
        if pick is None or pick not in keys or roll < 0.25:
            i = self._fresh()
            change = ins(lsn, seq, **_row(i, "i"))
        elif roll < 0.55:
            row = _row(pick, f"u{lsn:x}.{seq}")
            if rng.random() < 0.4:  # an UPDATE that left the out-of-line payload untouched
                change = upd(lsn, seq, unchanged=("payload",), **{**row, "payload": None})
            else:
                change = upd(lsn, seq, **{**row, "payload": f"P{lsn:x}.{seq}"})
        elif roll < 0.7:  # a key change, which may keep the payload untouched
            i = self._fresh()
            unchanged = ("payload",) if rng.random() < 0.5 else ()
            row = {**_row(i, "k"), **({"payload": None} if unchanged else {})}
            change = upd(lsn, seq, old={"id": pick}, unchanged=unchanged, **row)
        elif roll < 0.97:
            change = dele(lsn, seq, id=pick)
        else:
            change = trunc(lsn, seq)
        return change

    def batch(self, transactions: int) -> list[Change]:
        """``transactions`` transactions of one to four changes, often on the keys just touched."""
        changes: list[Change] = []
        recent: list[int] = []
        for _ in range(transactions):
            self.lsn += 0x100
            at = COMMIT_TIME + timedelta(seconds=(self.lsn - S0) // 0x100)
            for seq in range(self.rng.randint(1, 4)):
                change = self._change(self.lsn, seq, recent)
                change.time = at
                model_apply(ORDERS, self.model, [change], 0)
                changes.append(change)
                row = change.row if change.row is not None else change.old
                recent = [*recent[-5:], *([row["id"]] if row else [])]
            self.states.append((self.lsn, at, dict(self.model)))
        return changes


def _valid_at_cut(spark: SparkSession, history: str, end: int) -> list[tuple[Any, ...]]:
    rows = spark.sql(
        f"SELECT * FROM {history} WHERE {VALID_FROM_LSN} < {end} "
        f"AND ({VALID_TO_LSN} IS NULL OR {VALID_TO_LSN} >= {end})"
    ).collect()
    return sorted((tuple(r[n] for n in ORDERS.names) for r in rows), key=repr)


def _valid_at_times(
    spark: SparkSession, history: str, moments: list[datetime]
) -> list[list[tuple[Any, ...]]]:
    """The history "valid at" each moment (the documented filter, applied to one read of it)."""
    versions = spark.sql(
        f"SELECT *, unix_micros({VALID_FROM}) AS from_us, unix_micros({VALID_TO}) AS to_us FROM {history}"
    ).collect()
    found = []
    for moment in moments:
        at = _micros(moment)
        valid = [r for r in versions if r["from_us"] <= at and (r["to_us"] is None or r["to_us"] > at)]
        found.append(sorted((tuple(r[n] for n in ORDERS.names) for r in valid), key=repr))
    return found


def _history_name(reader: LakeReader, config: LakeConfig) -> str:
    return table_name(config, config.history_identifier(ORDERS.schema, ORDERS.table))


@pytest.mark.parametrize("seed", [7])
def test_the_history_valid_at_any_cut_or_time_is_the_source_then(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, seed: int
) -> None:
    reader, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    history = _history_name(reader, lake_config)
    model: State = {(i,): _row(i) for i in range(30)}
    initial = rows_of(model, ORDERS.names)
    apply_batch.apply_manifest(
        spark, stager.snapshot(S0, [(ORDERS, list(model.values()))]), lake_config, history="scd2"
    )
    catalog = pyiceberg_catalog(lake_config)
    assert (
        catalog.load_table(lake_config.identifier("public", "orders")).properties[HISTORY_PROPERTY] == "scd2"
    )
    assert _valid_at_cut(spark, history, S0) == initial

    workload, start, cuts = Workload(seed, model, S0), S0, []
    for number in range(4):
        changes = workload.batch(15)
        end = workload.lsn + 0x100
        if number == 2:  # a shorter window first, then the whole one read again from the same start
            middle = changes[len(changes) // 2].commit_lsn
            early = [c for c in changes if c.commit_lsn < middle]
            apply_batch.apply_manifest(spark, stager.batch(start, middle, [(ORDERS, [early])]), lake_config)
        manifest = stager.batch(start, end, [(ORDERS, [changes])])
        apply_batch.apply_manifest(spark, manifest, lake_config)  # a table it does not name keeps scd2
        if number == 3:  # a re-run takes nothing twice
            before = spark.table(history).count()
            apply_batch.apply_manifest(spark, manifest, lake_config)
            assert spark.table(history).count() == before
        cuts.append((end, rows_of(model, ORDERS.names)))
        start = end

    for end, expected in cuts:
        assert _valid_at_cut(spark, history, end) == expected, f"cut {end:X}"
        at_tag = spark.sql(f"SELECT * FROM {reader.name(ORDERS)} VERSION AS OF '{tag_name(Lsn(end))}'")
        assert sorted((tuple(r[n] for n in ORDERS.names) for r in at_tag.collect()), key=repr) == expected
    at_times = _valid_at_times(spark, history, [moment for _, moment, _ in workload.states])
    for (lsn, _, state), valid in zip(workload.states, at_times, strict=True):
        assert valid == rows_of(state, ORDERS.names), f"after {lsn:X}"
    # One current version per key, exactly the source's; every ended version says how it ended.
    current = spark.sql(f"SELECT * FROM {history} WHERE {IS_CURRENT}").collect()
    assert sorted((tuple(r[n] for n in ORDERS.names) for r in current), key=repr) == rows_of(
        model, ORDERS.names
    )
    endings = {
        r[0] for r in spark.sql(f"SELECT DISTINCT {ENDED_BY} FROM {history} WHERE NOT {IS_CURRENT}").collect()
    }
    assert endings == {"update", "delete", "truncate"}


def test_a_load_switches_history_on_and_a_reload_behind_the_lake_takes_the_replayed_changes(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    reader, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    history = _history_name(reader, lake_config)
    model: State = {(i,): _row(i) for i in range(6)}
    apply_batch.apply_manifest(spark, stager.snapshot(S0, [(ORDERS, list(model.values()))]), lake_config)
    e1 = S0 + 0x1000
    b1 = [upd(S0 + 0x100, 0, **_row(1, "a"))]
    model_apply(ORDERS, model, b1, S0)
    apply_batch.apply_manifest(spark, stager.batch(S0, e1, [(ORDERS, [b1])]), lake_config)

    # A batch cannot switch history on: only a load may; nothing of the batch is committed.
    before = reader.current(ORDERS)
    e2 = e1 + 0x1000
    with pytest.raises(
        HistoryOptionError, match=r"a batch cannot switch it to 'scd2'\. Re-snapshot the table"
    ):
        apply_batch.apply_manifest(spark, stager.batch(e1, e2, [(ORDERS, [[]])]), lake_config, history="scd2")
    assert reader.current(ORDERS) == before

    # A re-snapshot at `point`, loaded after batches went past it, switches it on: the history
    # starts from the snapshot's rows and takes the changes replayed from the changelog.
    point = e1 + 0x400
    at_point = dict(model)
    b2 = [dele(point + 0x100, 0, id=2), upd(point + 0x200, 0, old={"id": 3}, **_row(30, "k"))]
    b2 += [upd(point + 0x300, 0, unchanged=("payload",), **{**_row(30, "t"), "payload": None})]
    model_apply(ORDERS, model, b2, S0)
    apply_batch.apply_manifest(spark, stager.batch(e1, e2, [(ORDERS, [b2])]), lake_config)
    snapshot = stager.snapshot(point, [(ORDERS, list(at_point.values()))])
    apply_batch.apply_manifest(spark, snapshot, lake_config, history='{"public.orders": "scd2"}')
    assert _valid_at_cut(spark, history, point) == rows_of(at_point, ORDERS.names)
    assert _valid_at_cut(spark, history, e2) == rows_of(model, ORDERS.names)
    moved = spark.sql(
        f"SELECT payload, {ENDED_BY} FROM {history} WHERE id IN (3, 30) ORDER BY {VALID_FROM_LSN}"
    )
    assert [tuple(r) for r in moved.collect()] == [("p3", "update"), ("p30", "update"), ("p30", None)]

    # The next batch needs no option: the table keeps history; a load that does not name it too.
    e3 = e2 + 0x1000
    b3 = [ins(e2 + 0x100, 0, **_row(40))]
    model_apply(ORDERS, model, b3, S0)
    apply_batch.apply_manifest(spark, stager.batch(e2, e3, [(ORDERS, [b3])]), lake_config)
    assert _valid_at_cut(spark, history, e3) == rows_of(model, ORDERS.names)
    versions = spark.table(history).count()
    apply_batch.apply_manifest(spark, stager.snapshot(e3, [(ORDERS, list(model.values()))]), lake_config)
    assert spark.table(history).count() == versions  # kept: it held every change below the point


def test_history_of_a_table_without_a_key_is_refused(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    keyless = TableDef("public", "events", [("id", pa.int64()), ("label", pa.string())], [], "f")
    manifest = Stager(tmp_path / "staging").snapshot(S0, [(keyless, [{"id": 1, "label": "a"}])])
    with pytest.raises(
        HistoryOptionError, match=r"public\.events: its changes carry no key \(REPLICA IDENTITY FULL"
    ):
        apply_batch.apply_manifest(spark, manifest, lake_config, history="scd2")
