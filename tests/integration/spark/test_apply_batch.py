"""The apply job against a reference model: target contents, changelog, ledger, crash and re-run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
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
    model_apply,
    rows_of,
    trunc,
    upd,
)

from airflow_provider_pglogical.spark import APPLY_JOB_PATH
from airflow_provider_pglogical.spark import apply_batch as job

SNAP_LSN = 0x1000_0000


def _row(i: int, name: str = "n", payload: str | None = None) -> Row:
    return {"id": i, "name": f"{name}{i}", "payload": payload or f"big-{i}", "amount": Decimal(f"{i}.25")}


class Lake:
    """A target root plus the model of what each of its tables must hold."""

    def __init__(self, spark: SparkSession, tmp: Path, rows_per_range: int = 4) -> None:
        self.spark = spark
        self.stager = Stager(tmp / "staging")
        self.target = str(tmp / "lake")
        self.rpr = rows_per_range
        self.model: dict[str, dict[tuple[Any, ...], Row]] = {}
        self.base: dict[str, int] = {}

    def snapshot(self, lsn: int, tables: list[tuple[TableDef, list[Row]]]) -> list[job.TableResult]:
        for tdef, rows in tables:
            self.model[tdef.dirname] = {tdef.key_of(r): dict(r) for r in rows}
            self.base[tdef.dirname] = lsn
        return self.apply(self.stager.snapshot(lsn, tables))

    def stage(self, start: int, end: int, tables: list[tuple[TableDef, list[Part]]]) -> str:
        for tdef, parts in tables:
            changes = [c for p in parts for c in changes_of(p)]
            model_apply(tdef, self.model[tdef.dirname], changes, self.base[tdef.dirname])
        return self.stager.batch(start, end, tables)

    def apply(self, manifest: str) -> list[job.TableResult]:
        return job.apply_manifest(self.spark, manifest, self.target, rows_per_range=self.rpr)

    def rows(self, tdef: TableDef, names: list[str] | None = None) -> list[tuple[Any, ...]]:
        df = job.read_table(self.spark, self.target, tdef.schema, tdef.table)
        names = names or tdef.names
        return sorted((tuple(r[n] for n in names) for r in df.collect()), key=repr)

    def expected(self, tdef: TableDef, names: list[str] | None = None) -> list[tuple[Any, ...]]:
        return rows_of(self.model[tdef.dirname], names or tdef.names)

    def changelog(self, tdef: TableDef) -> list[tuple[int, int]]:
        path = f"{self.target}/_changelog/{tdef.dirname}"
        df = self.spark.read.option("mergeSchema", "true").parquet(path)
        return sorted((r["_pgl_commit_lsn"], r["_pgl_seq"]) for r in df.collect())

    def state(self, tdef: TableDef) -> job.TableState:
        state = job.read_state(job.Storage(self.spark), f"{self.target}/{tdef.dirname}")
        assert state is not None
        return state


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    return Lake(spark, tmp_path)


def test_snapshot_load_is_readable_and_recorded(lake: Lake) -> None:
    results = lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(20)])])
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert results[0].status == "loaded" and results[0].ranges_total >= 4  # 20 rows, 4 per range
    state = lake.state(ORDERS)
    assert state.base_lsn == "0/10000000"
    ledger = job.read_ledger(job.Storage(lake.spark), lake.target, "slot1", f"snapshot-{SNAP_LSN:016X}")
    assert [(r["table"], r["kind"], r["end_lsn"]) for r in ledger] == [
        ("public.orders", "snapshot", "0/10000000")
    ]


def test_random_batch_matches_model(lake: Lake) -> None:
    rnd = random.Random(7)
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(40)])])
    live = set(range(40))
    next_id = 40
    changes: list[Change] = []
    lsn = SNAP_LSN + 100
    for _ in range(60):  # transactions of 1-4 changes
        lsn += 100
        for seq in range(rnd.randint(1, 4)):
            roll = rnd.random()
            if roll < 0.35 or not live:
                changes.append(ins(lsn, seq, **_row(next_id, "new")))
                live.add(next_id)
                next_id += 1
            elif roll < 0.65:
                k = rnd.choice(sorted(live))
                changes.append(upd(lsn, seq, **_row(k, f"u{lsn}")))
            elif roll < 0.75:
                k = rnd.choice(sorted(live))
                changes.append(upd(lsn, seq, old={"id": k}, **_row(next_id, "moved")))
                live.discard(k)
                live.add(next_id)
                next_id += 1
            else:
                k = rnd.choice(sorted(live))
                changes.append(dele(lsn, seq, id=k))
                live.discard(k)
    rnd.shuffle(changes)  # staged order is not apply order
    lake.apply(lake.stage(SNAP_LSN, lsn + 40, [(ORDERS, [changes[:100], changes[100:]])]))
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert lake.changelog(ORDERS) == sorted((c.commit_lsn, c.seq) for c in changes)
    state = lake.state(ORDERS)
    assert sum(r.rows for r in state.ranges) == len(lake.model[ORDERS.dirname])
    assert all(r.rows <= job.SPLIT_FACTOR * lake.rpr for r in state.ranges)  # growth was split


def test_truncate_in_the_middle_keeps_later_rows(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    changes = [
        ins(b, 0, **_row(100)),
        upd(b + 100, 0, **_row(3, "x")),
        trunc(b + 200, 0),
        ins(b + 200, 1, **_row(5, "after")),  # same transaction, after the truncate
        ins(b + 300, 0, **_row(101, "after")),
        upd(b + 300, 1, **_row(5, "after2")),
    ]
    lake.apply(lake.stage(SNAP_LSN, b + 400, [(ORDERS, [changes])]))
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert sorted(r[0] for r in lake.rows(ORDERS)) == [5, 101]
    assert len(lake.changelog(ORDERS)) == len(changes)


def test_key_change_deletes_old_key_and_keeps_toast(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    changes = [
        # UPDATE SET id = 50 on a row whose payload is unchanged TOAST: the value comes from id 2
        upd(b, 0, old={"id": 2}, unchanged=("payload",), **{**_row(50, "k"), "payload": None}),
        # then the new key changes again, still unchanged: a chain across two key changes
        upd(b + 100, 0, old={"id": 50}, unchanged=("payload",), **{**_row(51, "k"), "payload": None}),
        # a key change back onto a key that was deleted in the same batch
        dele(b + 200, 0, id=7),
        upd(b + 300, 0, old={"id": 8}, **_row(7, "re")),
    ]
    lake.apply(lake.stage(SNAP_LSN, b + 400, [(ORDERS, [changes])]))
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    got = {r[0]: r for r in lake.rows(ORDERS)}
    assert 2 not in got and 50 not in got and 8 not in got
    assert got[51][2] == "big-2"


def test_unchanged_toast_from_target_and_earlier_change(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    no_payload = {"payload": None}
    changes = [
        upd(b, 0, unchanged=("payload",), **{**_row(1, "a"), **no_payload}),  # from the target
        upd(b + 100, 0, **_row(2, "b", payload="fresh")),  # sets a value ...
        upd(b + 200, 0, unchanged=("payload",), **{**_row(2, "c"), **no_payload}),  # ... kept twice
        upd(b + 300, 0, unchanged=("payload",), **{**_row(2, "d"), **no_payload}),
        ins(b + 400, 0, **_row(60, "i", payload="ins")),  # new row, then unchanged updates
        upd(b + 500, 0, unchanged=("payload",), **{**_row(60, "j"), **no_payload}),
        upd(b + 600, 0, **{**_row(3, "null"), **no_payload}),  # a real NULL is written as NULL
        upd(b + 700, 0, unchanged=("payload",), **{**_row(3, "n2"), **no_payload}),
    ]
    lake.apply(lake.stage(SNAP_LSN, b + 800, [(ORDERS, [changes])]))
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    got = {r[0]: r[2] for r in lake.rows(ORDERS)}
    assert (got[1], got[2], got[60], got[3]) == ("big-1", "fresh", "ins", None)


def test_replica_identity_full_matches_old_row(lake: Lake) -> None:
    full = TableDef("public", "events", [("k", pa.string()), ("v", pa.int32())], [], replica_identity="f")
    lake.snapshot(SNAP_LSN, [(full, [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": None}])])
    b = SNAP_LSN + 1000
    changes = [
        upd(b, 0, old={"k": "a", "v": 1}, k="a", v=10),
        dele(b + 100, 0, k="b", v=None),  # matched on the whole old row, NULL included
        ins(b + 200, 0, k="c", v=3),
        upd(b + 300, 0, old={"k": "c", "v": 3}, k="c", v=3),  # no-op update: row stays
    ]
    lake.apply(lake.stage(SNAP_LSN, b + 400, [(full, [changes])]))
    assert lake.rows(full) == lake.expected(full)
    assert lake.rows(full) == [("a", 10), ("a", 2), ("c", 3)]


def test_schema_evolution_adds_and_keeps_dropped_columns(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(6)])])
    b = SNAP_LSN + 1000
    before = [upd(b, 0, **_row(1, "pre"))]
    # ALTER TABLE ADD COLUMN note, DROP COLUMN amount: later changes carry the new shape
    evolved = TableDef(
        "public",
        "orders",
        [("id", pa.int64()), ("name", pa.string()), ("payload", pa.string()), ("note", pa.string())],
        ["id"],
    )
    after = [
        ins(b + 100, 0, id=70, name="n70", payload="p", note="hello"),
        upd(b + 200, 0, id=2, name="x", payload="q", note="n"),
    ]
    model = lake.model[ORDERS.dirname]
    model_apply(ORDERS, model, before, SNAP_LSN)
    model_apply(evolved, model, after, SNAP_LSN)
    manifest = lake.stager.batch(SNAP_LSN, b + 300, [(ORDERS, [before, (evolved, after)])])
    lake.apply(manifest)
    names = ["id", "name", "payload", "amount", "note"]
    assert lake.rows(ORDERS, names) == rows_of(model, names)
    assert [f.name for f in lake.state(ORDERS).struct.fields] == names


def test_incompatible_type_change_is_refused(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(3)])])
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.int32())], ["id"])
    manifest = lake.stager.batch(
        SNAP_LSN, SNAP_LSN + 500, [(retyped, [[ins(SNAP_LSN + 100, 0, id=9, name=5)]])]
    )
    with pytest.raises(job.SchemaConflictError, match=r"public\.orders.*'name'.*string to int.*re-snapshot"):
        lake.apply(manifest)
    assert job.read_ledger(job.Storage(lake.spark), lake.target, "slot1", Path(manifest).parent.name) == []


def test_type_change_within_a_batch_names_the_column(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(3)])])
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("amount", pa.float64())], ["id"])
    b = SNAP_LSN + 100
    parts: list[Part] = [[ins(b, 0, **_row(7))], (retyped, [ins(b + 100, 0, id=8, amount=1.5)])]
    manifest = lake.stager.batch(SNAP_LSN, b + 500, [(ORDERS, parts)])
    with pytest.raises(
        job.SchemaConflictError, match=r"'amount' changed type from decimal\(10,2\).*to double"
    ):
        lake.apply(manifest)


def test_rerun_of_an_applied_batch_has_no_effect(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    changes = [ins(b, 0, **_row(30)), upd(b + 100, 0, **_row(1, "z")), dele(b + 200, 0, id=2)]
    manifest = lake.stage(SNAP_LSN, b + 300, [(ORDERS, [changes])])
    lake.apply(manifest)
    version = lake.state(ORDERS).version
    assert [r.status for r in lake.apply(manifest)] == ["skipped"]
    assert lake.state(ORDERS).version == version
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert len(lake.changelog(ORDERS)) == 3


def test_crash_before_the_ledger_converges_on_rerun(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    items = TableDef("public", "items", [("id", pa.int64()), ("name", pa.string())], ["id"])
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)]), (items, [{"id": 1, "name": "a"}])])
    b = SNAP_LSN + 1000
    manifest = lake.stage(
        SNAP_LSN,
        b + 300,
        [
            (ORDERS, [[ins(b, 0, **_row(30)), dele(b + 100, 0, id=4)]]),
            (items, [[upd(b, 1, id=1, name="b"), ins(b + 200, 0, id=2, name="c")]]),
        ],
    )
    real_apply, real_write_state = job.apply_batch_table, job.write_state

    def crash_on_items(*args: Any) -> job.TableResult:
        if args[3].table == "items":
            raise RuntimeError("executor lost")
        return real_apply(*args)

    def crash_at_switch(storage: job.Storage, root: str, state: job.TableState) -> None:
        raise RuntimeError("driver killed before the state switch")

    monkeypatch.setattr(job, "apply_batch_table", crash_on_items)
    with pytest.raises(RuntimeError):
        lake.apply(manifest)  # orders switched, items not, no ledger
    monkeypatch.setattr(job, "apply_batch_table", real_apply)
    monkeypatch.setattr(job, "write_state", crash_at_switch)
    with pytest.raises(RuntimeError):
        lake.apply(manifest)  # items' files and changelog written, state not switched
    assert job.read_ledger(job.Storage(lake.spark), lake.target, "slot1", Path(manifest).parent.name) == []
    assert lake.rows(items) == [(1, "a")]  # the previous state survived
    monkeypatch.setattr(job, "write_state", real_write_state)
    statuses = [r.status for r in lake.apply(manifest)]
    assert statuses == ["skipped", "applied"]
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert lake.rows(items) == lake.expected(items)
    assert len(lake.changelog(ORDERS)) == 2 and len(lake.changelog(items)) == 2
    assert (
        len(job.read_ledger(job.Storage(lake.spark), lake.target, "slot1", Path(manifest).parent.name)) == 2
    )


def test_resnapshot_skips_changes_at_or_below_its_base_lsn(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(5)])])
    lake.apply(lake.stage(SNAP_LSN, SNAP_LSN + 500, [(ORDERS, [[ins(SNAP_LSN + 100, 0, **_row(40))]])]))
    resnap = SNAP_LSN + 2000
    lake.snapshot(resnap, [(ORDERS, [_row(i, "re") for i in range(3)] + [_row(41, "re")])])
    assert lake.rows(ORDERS) == lake.expected(ORDERS)  # replaced, not merged
    straddling = [
        upd(resnap - 100, 0, **_row(1, "old")),  # already in the re-snapshot
        # A commit record starting exactly at the consistent point is decoded by PostgreSQL
        # (it skips only commits below the start point) and is not in the exported snapshot.
        ins(resnap, 0, **_row(42, "at")),
        upd(resnap + 100, 0, **_row(2, "new")),
    ]
    lake.apply(lake.stage(SNAP_LSN + 500, resnap + 200, [(ORDERS, [straddling])]))
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert {r[0]: r[1] for r in lake.rows(ORDERS)}[1] == "re1"
    assert {r[0]: r[1] for r in lake.rows(ORDERS)}[42] == "at42"
    assert len(lake.changelog(ORDERS)) == 3  # the first batch's change + the two applied changes


def test_only_touched_ranges_are_rewritten(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(40)])])
    before = lake.state(ORDERS).ranges
    b = SNAP_LSN + 1000
    lake.apply(
        lake.stage(SNAP_LSN, b + 100, [(ORDERS, [[upd(b, 0, **_row(39, "hot")), ins(b, 1, **_row(40))]])])
    )
    after = lake.state(ORDERS).ranges
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x.path != y.path]
    assert changed == [len(before) - 1]


def test_tables_option_applies_only_the_named_tables(lake: Lake) -> None:
    items = TableDef("public", "items", [("id", pa.int64()), ("name", pa.string())], ["id"])
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(1)])])
    b = SNAP_LSN + 1000
    # items has no snapshot load (created after it): the batch creates it
    lake.model[items.dirname], lake.base[items.dirname] = {}, 0
    manifest = lake.stage(
        SNAP_LSN, b + 100, [(ORDERS, [[ins(b, 0, **_row(2))]]), (items, [[ins(b, 1, id=1, name="a")]])]
    )
    with pytest.raises(job.ApplyError, match=r"--tables names \['public.nope'\]"):
        job.apply_manifest(lake.spark, manifest, lake.target, ["public.nope"])
    job.apply_manifest(lake.spark, manifest, lake.target, ["public.items"], rows_per_range=4)
    ledger = job.read_ledger(job.Storage(), lake.target, "slot1", Path(manifest).parent.name)
    assert [r["table"] for r in ledger] == ["public.items"]
    assert lake.rows(items) == [(1, "a")]
    assert lake.rows(ORDERS) == [tuple(_row(1).values())]
    assert [r.status for r in lake.apply(manifest)] == ["applied", "skipped"]
    assert lake.rows(ORDERS) == lake.expected(ORDERS)


def test_main_exits_2_with_a_clear_message(
    lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere" / "_manifest.json")
    assert job.main(["--manifest", missing, "--target", lake.target]) == 2
    err = capsys.readouterr().err
    assert f"apply_batch: error: manifest {missing} does not exist" in err


@pytest.mark.spark
def test_spark_submit_applies_a_batch_end_to_end(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    changes = [
        ins(b, 0, **_row(11)),
        upd(b + 100, 0, unchanged=("payload",), **{**_row(3, "e2e"), "payload": None}),
        dele(b + 200, 0, id=4),
    ]
    manifest = lake.stage(SNAP_LSN, b + 300, [(ORDERS, [changes])])
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYSPARK_PYTHON": sys.executable}
    command = [
        f"{bin_dir}/spark-submit",
        "--master", "local[2]",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.ui.enabled=false",
        APPLY_JOB_PATH,
        "--manifest", manifest,
        "--target", lake.target,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit folds the driver's stderr (logs) into stdout: pick the summary line
    summary = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"manifest"'))
    assert [(t["table"], t["status"], t["changes"]) for t in summary["tables"]] == [
        ("public.orders", "applied", 3)
    ]
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert (
        len(job.read_ledger(job.Storage(lake.spark), lake.target, "slot1", Path(manifest).parent.name)) == 1
    )
