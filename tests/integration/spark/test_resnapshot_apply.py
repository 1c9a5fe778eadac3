"""Re-snapshots of a running pipeline: base LSN boundary, never backwards, catch-up, racing writers.

Every expectation comes from one source history (``Source``): the initial rows and every later
change, as the WAL holds them. A re-snapshot at S holds the source's rows at S, and whatever
order the loads and batches run in, the target must hold the source's rows at its applied end.
Batches are staged under the drain's ids (``batch-<start LSN hex16>``), which the catch-up's
changelog pruning parses.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from spark_staging import (
    ORDERS,
    Change,
    Part,
    Row,
    Stager,
    TableDef,
    changes_of,
    dele,
    ins,
    lsn_text,
    model_apply,
    rows_of,
    trunc,
    upd,
)

from airflow_provider_pglogical.spark import apply_batch as job

# ALTER TABLE orders ADD COLUMN note text
NOTED = TableDef("public", "orders", [*ORDERS.columns, ("note", pa.string())], ["id"])
ITEMS = TableDef("public", "items", [("id", pa.int64()), ("name", pa.string())], ["id"])
S0 = 0x1000_0000  # the initial snapshot's consistent point
Table = dict[tuple[Any, ...], Row]


def _row(i: int, name: str = "n", **extra: Any) -> Row:
    return {"id": i, "name": f"{name}{i}", "payload": f"big-{i}", "amount": Decimal(f"{i}.25"), **extra}


class Source:
    """One source table's history: its rows at the initial consistent point, then every change."""

    def __init__(self, tdef: TableDef, rows: list[Row]) -> None:
        self.initial: Table = {tdef.key_of(r): dict(r) for r in rows}
        self.log: list[tuple[TableDef, Change]] = []

    def parts(self, *parts: Part) -> list[Part]:
        """Record the changes of a batch's part files (each ``(relation version, changes)`` or changes)."""
        for part in parts:
            tdef = part[0] if isinstance(part, tuple) else ORDERS
            self.log += [(tdef, c) for c in changes_of(part)]
        return list(parts)

    def at(self, lsn: int) -> Table:
        """The rows as of ``lsn``: every transaction whose commit record starts below it applied."""
        table = copy.deepcopy(self.initial)
        for tdef, change in sorted(self.log, key=lambda tc: (tc[1].commit_lsn, tc[1].seq)):
            if change.commit_lsn < lsn:
                model_apply(tdef, table, [change], 0)
        return table


class Lake:
    """A staging root (batches named like the drain names them) and a target root."""

    def __init__(self, spark: SparkSession, tmp: Path) -> None:
        self.spark = spark
        self.stager = Stager(tmp / "staging")
        self.target = str(tmp / "lake")
        self.storage = job.Storage(spark)

    def snapshot(self, lsn: int, tables: list[tuple[TableDef, Table]]) -> str:
        return self.stager.snapshot(lsn, [(tdef, list(rows.values())) for tdef, rows in tables])

    def batch(self, start: int, end: int, parts: list[Part]) -> str:
        """Stage a batch of ``orders`` under the drain's id ``batch-<start LSN hex16>``."""
        staged = Path(self.stager.batch(start, end, [(ORDERS, parts)])).parent
        drained = staged.rename(staged.with_name(f"batch-{start:016X}"))
        manifest = json.loads((drained / "_manifest.json").read_text())
        manifest["batch_id"] = drained.name
        (drained / "_manifest.json").write_text(json.dumps(manifest))
        return str(drained / "_manifest.json")

    def apply(self, manifest: str) -> list[tuple[str, int]]:
        """Apply a manifest; returns (status, changes) per table."""
        results = job.apply_manifest(self.spark, manifest, self.target, rows_per_range=4)
        return [(r.status, r.changes) for r in results]

    def rows(self, tdef: TableDef = ORDERS) -> list[tuple[Any, ...]]:
        df = job.read_table(self.spark, self.target, tdef.schema, tdef.table)
        return sorted((tuple(r[n] for n in tdef.names) for r in df.collect()), key=repr)

    def state(self, tdef: TableDef = ORDERS) -> job.TableState:
        state = job.read_state(self.storage, f"{self.target}/{tdef.dirname}")
        assert state is not None
        return state

    def state_files(self, tdef: TableDef = ORDERS) -> list[str]:
        return self.storage.list_names(f"{self.target}/{tdef.dirname}/_state")

    def ledger(self, manifest: str) -> list[tuple[str, str]]:
        batch_id = Path(manifest).parent.name
        return sorted(
            (r["table"], r["kind"]) for r in job.read_ledger(self.storage, self.target, "slot1", batch_id)
        )


def expected(table: Table, tdef: TableDef = ORDERS) -> list[tuple[Any, ...]]:
    return rows_of(table, tdef.names)


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    return Lake(spark, tmp_path)


def test_resnapshot_loaded_after_later_batches_replays_their_changes(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = Source(ORDERS, [_row(i) for i in range(16)])
    lake.apply(lake.snapshot(S0, [(ORDERS, src.at(S0))]))
    e1, s, e2, e3 = S0 + 1000, S0 + 2000, S0 + 3000, S0 + 4000
    b1 = lake.batch(
        S0,
        e1,
        src.parts([upd(S0 + 100, 0, **_row(1, "b1")), ins(S0 + 200, 0, **_row(20)), dele(S0 + 300, 0, id=3)]),
    )
    lake.apply(b1)
    # b2 straddles the re-snapshot's consistent point s: commits below s are in the re-snapshot
    below = [
        upd(s - 300, 0, old={"id": 4}, **_row(40, "moved")),  # key change 4 -> 40
        dele(s - 200, 0, id=5),
        upd(s - 100, 0, **_row(6, "below")),
        upd(s - 1, 0, **_row(7, "just-below")),
    ]
    at_and_above = [
        ins(s, 0, **_row(21, "at")),  # a commit record starting exactly at s: not in the re-snapshot
        upd(s, 1, **_row(8, "at")),
        upd(s + 100, 0, **_row(6, "above")),
    ]
    with_note = [  # ALTER TABLE ... ADD COLUMN note, above s: the re-snapshot does not have it
        # key change 40 -> 41 keeping the unchanged TOAST payload: found under 40 in the re-snapshot
        upd(
            s + 300, 0, old={"id": 40}, unchanged=("payload",), **{**_row(41, "k", note="x"), "payload": None}
        ),
        dele(s + 400, 0, id=7),
        upd(s + 500, 0, unchanged=("payload",), **{**_row(9, "toast", note="y"), "payload": None}),
        ins(s + 600, 0, **_row(5, "again", note="z")),  # re-insert of a key deleted below s
    ]
    b2 = lake.batch(e1, e2, src.parts(below + at_and_above, (NOTED, with_note)))
    real_write_ledger = job.write_ledger

    def crash_before_ledger(*args: Any) -> None:
        raise RuntimeError("driver lost after the switch, before the ledger")

    monkeypatch.setattr(job, "write_ledger", crash_before_ledger)
    with pytest.raises(RuntimeError):
        lake.apply(b2)  # orders switched to e2, b2 not in the ledger: its retry comes later
    monkeypatch.setattr(job, "write_ledger", real_write_ledger)
    assert lake.rows(NOTED) == expected(src.at(e2), NOTED)

    resnap = lake.snapshot(s, [(ORDERS, src.at(s))])
    replayed = len(at_and_above) + len(with_note)
    assert lake.apply(resnap) == [("loaded", replayed)]  # only b2's changes at or above s
    assert lake.rows(NOTED) == expected(src.at(e2), NOTED)
    state = lake.state()
    assert (state.base_lsn, state.snapshot_id) == (lsn_text(s), f"snapshot-{s:016X}")
    assert (state.applied_end_lsn, state.applied_batch_id) == (lsn_text(e2), f"batch-{e1:016X}")
    assert [f.name for f in state.struct.fields] == NOTED.names  # nothing but the table's columns
    assert lake.ledger(resnap) == [("public.orders", "snapshot")]

    version = state.version
    assert lake.apply(b2) == [("skipped", 0)]  # the retry: b2 ends at the applied end
    assert lake.state().version == version
    assert lake.ledger(b2) == [("public.orders", "batch")]
    b3 = lake.batch(
        e2,
        e3,
        src.parts((NOTED, [upd(e2 + 100, 0, **_row(41, "b3", note="w")), dele(e2 + 200, 0, id=21)])),
    )
    assert lake.apply(b3) == [("applied", 2)]
    assert lake.rows(NOTED) == expected(src.at(e3), NOTED)


def test_catch_up_replays_a_truncate_and_ignores_a_crashed_batch(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = Source(ORDERS, [_row(i) for i in range(10)])
    lake.apply(lake.snapshot(S0, [(ORDERS, src.at(S0))]))
    e1, s, e2, e3 = S0 + 1000, S0 + 2000, S0 + 3000, S0 + 4000
    lake.apply(lake.batch(S0, e1, src.parts([upd(S0 + 100, 0, **_row(1, "b1"))])))
    b2_changes = [
        upd(s - 100, 0, **_row(2, "below")),
        ins(s, 0, **_row(30, "at")),
        trunc(s + 100, 0),
        ins(s + 100, 1, **_row(3, "after")),  # same transaction as the TRUNCATE
        ins(s + 200, 0, **_row(31, "after")),
        upd(s + 300, 0, unchanged=("payload",), **{**_row(3, "kept"), "payload": None}),
    ]
    lake.apply(lake.batch(e1, e2, src.parts(b2_changes)))
    at_e2 = src.at(e2)
    b3 = lake.batch(e2, e3, src.parts([dele(e2 + 100, 0, id=31), ins(e2 + 200, 0, **_row(32, "b3"))]))
    real_write_state = job.write_state

    def crash_at_switch(*args: Any) -> None:
        raise RuntimeError("driver killed before the state switch")

    monkeypatch.setattr(job, "write_state", crash_at_switch)
    with pytest.raises(RuntimeError):
        lake.apply(b3)  # b3's changelog and range files are written, its state is not
    monkeypatch.setattr(job, "write_state", real_write_state)
    assert (
        lake.spark.read.parquet(f"{lake.target}/_changelog/public.orders/batch_id=batch-{e2:016X}").count()
        == 2
    )

    assert lake.apply(lake.snapshot(s, [(ORDERS, src.at(s))])) == [("loaded", 5)]
    assert lake.rows() == expected(at_e2)  # the TRUNCATE replayed, b3's logged changes not
    assert sorted(r[0] for r in lake.rows()) == [3, 31]
    assert lake.state().applied_end_lsn == lsn_text(e2)
    assert lake.apply(b3) == [("applied", 2)]
    assert lake.rows() == expected(src.at(e3))


def test_a_snapshot_not_newer_than_the_base_lsn_is_skipped(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = {(1,): {"id": 1, "name": "a"}}
    initial = lake.snapshot(S0, [(ORDERS, {(i,): _row(i) for i in range(8)}), (ITEMS, items)])
    real_load = job.load_snapshot_table

    def crash_on_items(*args: Any) -> job.TableResult:
        if args[3].table == "items":
            raise RuntimeError("executor lost")
        return real_load(*args)

    monkeypatch.setattr(job, "load_snapshot_table", crash_on_items)
    with pytest.raises(RuntimeError):
        lake.apply(initial)  # orders loaded at S0, items not, no ledger
    monkeypatch.setattr(job, "load_snapshot_table", real_load)
    s1, s2 = S0 + 1000, S0 + 2000
    newer = {(i,): _row(i, "s2") for i in range(3, 12)}
    older = lake.snapshot(s1, [(ORDERS, {(i,): _row(i, "s1") for i in range(5)})])  # its load runs late
    assert lake.apply(lake.snapshot(s2, [(ORDERS, newer)])) == [("loaded", 0)]
    version = lake.state().version

    assert lake.apply(older) == [("skipped", 0)]
    assert lake.ledger(older) == [("public.orders", "snapshot")]
    assert lake.apply(initial) == [("skipped", 0), ("loaded", 0)]  # the retried initial load
    assert lake.ledger(initial) == [("public.items", "snapshot"), ("public.orders", "snapshot")]
    assert lake.rows() == expected(newer)
    state = lake.state()
    assert (state.version, state.base_lsn, state.applied_end_lsn) == (version, lsn_text(s2), lsn_text(s2))
    assert lake.rows(ITEMS) == [(1, "a")]


@pytest.mark.parametrize("loser", ["batch", "snapshot"])
def test_racing_batch_and_resnapshot_load_both_land(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, loser: str
) -> None:
    """The loser publishes last: its state version was taken, so it redoes the table from the winner's."""
    src = Source(ORDERS, [_row(i) for i in range(12)])
    lake.apply(lake.snapshot(S0, [(ORDERS, src.at(S0))]))
    e1, s, e2 = S0 + 1000, S0 + 2000, S0 + 3000
    lake.apply(lake.batch(S0, e1, src.parts([upd(S0 + 100, 0, **_row(1, "b1")), dele(S0 + 200, 0, id=2)])))
    b2_changes = [
        upd(s - 100, 0, **_row(3, "below")),
        dele(s - 50, 0, id=4),
        ins(s, 0, **_row(30, "at")),  # applied by the batch after the re-snapshot, replayed before it
        upd(s + 100, 0, old={"id": 5}, **_row(50, "moved")),
        dele(s + 200, 0, id=6),
        upd(s + 300, 0, unchanged=("payload",), **{**_row(7, "toast"), "payload": None}),
    ]
    b2 = lake.batch(e1, e2, src.parts(b2_changes))
    resnap = lake.snapshot(s, [(ORDERS, src.at(s))])
    first, other = (b2, resnap) if loser == "batch" else (resnap, b2)
    real_write_state = job.write_state
    events: list[str] = []

    def racing(storage: job.Storage, root: str, state: job.TableState) -> None:
        if not events:  # the loser is about to publish: the other job runs and publishes first
            events.append("raced")
            lake.apply(other)
        try:
            real_write_state(storage, root, state)
        except job.ConcurrentWriteError:
            events.append("conflict")
            raise

    monkeypatch.setattr(job, "write_state", racing)
    assert lake.apply(first) == [("applied" if loser == "batch" else "loaded", 4)]  # the changes >= s
    assert events == ["raced", "conflict"]
    assert lake.rows() == expected(src.at(e2))
    assert lake.ledger(b2) == [("public.orders", "batch")]
    assert lake.ledger(resnap) == [("public.orders", "snapshot")]
    state = lake.state()
    assert (state.base_lsn, state.applied_end_lsn) == (lsn_text(s), lsn_text(e2))
    assert lake.state_files() == [f"{v:020d}.json" for v in (1, 2, 3, 4)]  # no gap, no leftover


def test_a_table_lost_on_every_attempt_names_the_pool_advice(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = {(i,): _row(i) for i in range(6)}
    lake.apply(lake.snapshot(S0, [(ORDERS, rows)]))
    b1 = lake.batch(S0, S0 + 500, [[ins(S0 + 100, 0, **_row(9))]])
    real_write_state = job.write_state
    attempts: list[int] = []

    def always_second(storage: job.Storage, root: str, state: job.TableState) -> None:
        attempts.append(state.version)
        winner = job.read_state(storage, root)  # another job publishes the same version first
        assert winner is not None
        real_write_state(storage, root, winner)
        real_write_state(storage, root, state)

    monkeypatch.setattr(job, "write_state", always_second)
    n = job.CONFLICT_ATTEMPTS
    with pytest.raises(
        job.ConcurrentWriteError,
        match=rf"public\.orders: lost the race for its state {n} times .*one Airflow pool",
    ):
        lake.apply(b1)
    assert attempts == list(range(1, n + 1))  # each attempt started from the newest state
    assert lake.ledger(b1) == []
    assert lake.rows() == expected(rows)
    assert lake.state().applied_end_lsn == lsn_text(S0)


def test_resnapshot_keeps_the_applied_end_of_a_table_without_changelog(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch listing orders without files advances its applied end but logs nothing for it."""
    simple = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.string())], ["id"])
    stager, target = Stager(tmp_path / "staging"), str(tmp_path / "lake")
    rows = [{"id": i, "name": f"n{i}"} for i in range(3)]
    job.apply_manifest(spark, stager.snapshot(S0, [(simple, rows), (ITEMS, rows)]), target)
    e1 = S0 + 1000
    b1 = stager.batch(S0, e1, [(simple, []), (ITEMS, [[ins(S0 + 100, 0, id=9, name="x")]])])
    job.apply_manifest(spark, b1, target)
    s = S0 + 500
    job.apply_manifest(spark, stager.snapshot(s, [(simple, rows)]), target)
    state = job.read_state(job.Storage(spark), f"{target}/public.orders")
    assert state is not None
    assert (state.base_lsn, state.applied_end_lsn) == (lsn_text(s), lsn_text(e1))  # not moved back to s


def test_a_type_change_below_the_base_does_not_block_the_batch(spark: SparkSession, tmp_path: Path) -> None:
    """ALTER TYPE, then a re-snapshot, inside one batch: the old-typed part holds only skipped changes.

    The job's own advice for a type change is to re-snapshot the table; the batch spanning both
    must then apply, not fail on the old-typed file.
    """
    named = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.string())], ["id"])
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.int32())], ["id"])
    stager, target = Stager(tmp_path / "staging"), str(tmp_path / "lake")
    job.apply_manifest(spark, stager.snapshot(S0, [(named, [{"id": 1, "name": "a"}])]), target)
    s = S0 + 2000
    job.apply_manifest(spark, stager.snapshot(s, [(retyped, [{"id": 1, "name": 7}])]), target)
    parts = [(named, [upd(S0 + 100, 0, id=1, name="b")]), (retyped, [upd(s + 100, 0, id=1, name=8)])]
    job.apply_manifest(spark, stager.batch(S0, s + 1000, [(retyped, parts)]), target)
    assert [tuple(r) for r in job.read_table(spark, target, "public", "orders").collect()] == [(1, 8)]
    # Without the re-snapshot the same conflict is the user's to resolve, with the advice.
    fresh = str(tmp_path / "lake2")
    job.apply_manifest(spark, stager.snapshot(S0, [(named, [{"id": 1, "name": "a"}])]), fresh)
    with pytest.raises(job.SchemaConflictError, match="re-snapshot the table"):
        job.apply_manifest(spark, stager.batch(S0, s + 2000, [(retyped, parts)]), fresh)
