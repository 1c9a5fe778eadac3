"""The Iceberg apply job against a reference model: table contents, changelog, state, crash and re-run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc import errors
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import APPLY_JOB_PATH, iceberg, job_py_files, local_jars
from airflow_provider_postgres_cdc.spark import apply_batch as job
from tests.integration.spark.iceberg_support import LakeReader
from tests.integration.spark.spark_staging import (
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

SNAP_LSN = 0x1000_0000


def _row(i: int, name: str = "n", payload: str | None = None) -> Row:
    return {"id": i, "name": f"{name}{i}", "payload": payload or f"big-{i}", "amount": Decimal(f"{i}.25")}


class Lake(LakeReader):
    """A staging root and an Iceberg lake, plus the model of what each of its tables must hold."""

    def __init__(self, spark: SparkSession, config: LakeConfig, tmp: Path) -> None:
        super().__init__(spark, config)
        self.stager = Stager(tmp / "staging")
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

    def apply(self, manifest: str, tables: list[str] | None = None) -> list[job.TableResult]:
        return job.apply_manifest(self.spark, manifest, self.config, tables)

    def expected(self, tdef: TableDef, names: list[str] | None = None) -> list[tuple[Any, ...]]:
        return rows_of(self.model[tdef.dirname], names or tdef.names)

    def logged(self, tdef: TableDef) -> list[tuple[int, int]]:
        return [(lsn, seq) for lsn, seq, _ in self.changelog(tdef)]


@pytest.fixture
def lake(spark: SparkSession, lake_config: LakeConfig, tmp_path: Path) -> Lake:
    return Lake(spark, lake_config, tmp_path)


def test_snapshot_load_is_readable_and_recorded(lake: Lake) -> None:
    results = lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(20)])])
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert [(r.table, r.status, r.rows) for r in results] == [("public.orders", "loaded", 20)]
    state = lake.state(ORDERS)
    assert (state.kind, state.batch_id, state.slot) == ("snapshot", f"snapshot-{SNAP_LSN:016X}", "slot1")
    assert (state.base_lsn, state.applied_end_lsn) == (Lsn(SNAP_LSN), Lsn(SNAP_LSN))
    # The snapshot's cut: the load's commit, tagged at the consistent point.
    assert lake.tags(ORDERS) == {tag_name(Lsn(SNAP_LSN)): state.snapshot_id}


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
    manifest = lake.stage(SNAP_LSN, lsn + 40, [(ORDERS, [changes[:100], changes[100:]])])
    lake.apply(manifest)
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    batch_id = Path(manifest).parent.name
    assert lake.changelog(ORDERS) == sorted((c.commit_lsn, c.seq, batch_id) for c in changes)
    state = lake.state(ORDERS)
    assert (state.kind, state.batch_id, state.applied_end_lsn) == ("batch", batch_id, Lsn(lsn + 40))
    assert state.base_lsn == Lsn(SNAP_LSN)


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
    assert lake.columns(ORDERS) == names


def test_incompatible_type_change_is_refused(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(3)])])
    before = lake.current(ORDERS)
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.int32())], ["id"])
    manifest = lake.stager.batch(
        SNAP_LSN, SNAP_LSN + 500, [(retyped, [[ins(SNAP_LSN + 100, 0, id=9, name=5)]])]
    )
    with pytest.raises(
        errors.SchemaConflictError, match=r"`public`\.`orders`.*'name'.*string cannot hold int.*re-snapshot"
    ):
        lake.apply(manifest)
    assert lake.current(ORDERS) == before  # nothing of the batch in the table or its state
    assert lake.state(ORDERS).applied_end_lsn == Lsn(SNAP_LSN)
    assert not lake.has_cut(ORDERS, SNAP_LSN + 500)


def test_type_change_within_a_batch_names_the_column(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(3)])])
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("amount", pa.float64())], ["id"])
    b = SNAP_LSN + 100
    parts: list[Part] = [[ins(b, 0, **_row(7))], (retyped, [ins(b + 100, 0, id=8, amount=1.5)])]
    manifest = lake.stager.batch(SNAP_LSN, b + 500, [(ORDERS, parts)])
    with pytest.raises(
        errors.SchemaConflictError, match=r"'amount' changed type from decimal\(10,2\).*to double"
    ):
        lake.apply(manifest)


def test_rerun_of_an_applied_batch_has_no_effect(lake: Lake) -> None:
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)])])
    b = SNAP_LSN + 1000
    changes = [ins(b, 0, **_row(30)), upd(b + 100, 0, **_row(1, "z")), dele(b + 200, 0, id=2)]
    manifest = lake.stage(SNAP_LSN, b + 300, [(ORDERS, [changes])])
    lake.apply(manifest)
    committed = lake.current(ORDERS)
    assert [r.status for r in lake.apply(manifest)] == ["skipped"]
    assert lake.current(ORDERS) == committed
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert len(lake.changelog(ORDERS)) == 3


def test_crash_after_some_tables_committed_converges_on_rerun(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that dies part-way leaves committed tables committed and tags no cut; a re-run finishes.

    The second crash hits items between its changelog append and its merge: the re-run must not
    log its changes twice.
    """
    items = TableDef("public", "items", [("id", pa.int64()), ("name", pa.string())], ["id"])
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(10)]), (items, [{"id": 1, "name": "a"}])])
    b = SNAP_LSN + 1000
    end = b + 300
    manifest = lake.stage(
        SNAP_LSN,
        end,
        [
            (ORDERS, [[ins(b, 0, **_row(30)), dele(b + 100, 0, id=4)]]),
            (items, [[upd(b, 1, id=1, name="b"), ins(b + 200, 0, id=2, name="c")]]),
        ],
    )
    real_apply, real_merge = job.ApplyJob.apply_batch_table, iceberg.IcebergTables.merge

    def crash_on_items(self: job.ApplyJob, spec: Any) -> job.TableResult:
        if spec.table == "items":
            raise RuntimeError("executor lost")
        return real_apply(self, spec)

    def crash_at_merge(self: iceberg.IcebergTables, sql: str, summary: Any) -> None:
        raise RuntimeError("driver killed before the merge committed")

    monkeypatch.setattr(job.ApplyJob, "apply_batch_table", crash_on_items)
    with pytest.raises(RuntimeError):
        lake.apply(manifest)  # orders committed, items not, no cut
    assert lake.state(ORDERS).applied_end_lsn == Lsn(end)
    monkeypatch.setattr(job.ApplyJob, "apply_batch_table", real_apply)
    orders_commit = lake.current(ORDERS)
    monkeypatch.setattr(iceberg.IcebergTables, "merge", crash_at_merge)
    with pytest.raises(RuntimeError):
        lake.apply(manifest)  # items' changelog appended, its merge not committed
    assert lake.rows(items) == [(1, "a")]  # the previous snapshot survived
    assert lake.state(items).applied_end_lsn == Lsn(SNAP_LSN)
    assert not lake.has_cut(ORDERS, end) and not lake.has_cut(items, end)
    monkeypatch.setattr(iceberg.IcebergTables, "merge", real_merge)
    statuses = [r.status for r in lake.apply(manifest)]
    assert statuses == ["skipped", "applied"]
    assert lake.current(ORDERS) == orders_commit
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert lake.rows(items) == lake.expected(items)
    assert len(lake.changelog(ORDERS)) == 2 and len(lake.changelog(items)) == 2
    tag = tag_name(Lsn(end))
    assert lake.rows(ORDERS, tag=tag) == lake.expected(ORDERS)
    assert lake.rows(items, tag=tag) == lake.expected(items)


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


def test_a_small_merge_on_read_batch_adds_delete_files_without_rewriting_data(lake: Lake) -> None:
    """The Iceberg form of "only touched ranges are rewritten": every data file stays, deletes are added."""
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(i) for i in range(40)])])
    data_before = _files(lake, ORDERS, content=0)
    b = SNAP_LSN + 1000
    lake.apply(
        lake.stage(SNAP_LSN, b + 100, [(ORDERS, [[upd(b, 0, **_row(39, "hot")), ins(b, 1, **_row(40))]])])
    )
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert data_before <= _files(lake, ORDERS, content=0)  # no data file was rewritten away
    assert _files(lake, ORDERS, content=1)  # the update is a position delete
    _, operation, summary = lake.snapshots(ORDERS)[-1]
    assert operation == "overwrite" and int(summary["added-delete-files"]) >= 1
    assert "removed-data-files" not in summary


def _files(lake: Lake, tdef: TableDef, content: int) -> set[str]:
    """Live files of the current snapshot: content 0 data, 1 position deletes, 2 equality deletes."""
    rows = lake.spark.sql(f"SELECT file_path FROM {lake.name(tdef)}.files WHERE content = {content}")
    return {r[0] for r in rows.collect()}


def test_tables_option_applies_only_the_named_tables(lake: Lake) -> None:
    items = TableDef("public", "items", [("id", pa.int64()), ("name", pa.string())], ["id"])
    lake.snapshot(SNAP_LSN, [(ORDERS, [_row(1)])])
    b = SNAP_LSN + 1000
    end = b + 100
    # items has no snapshot load (created after it): the batch creates it
    lake.model[items.dirname], lake.base[items.dirname] = {}, 0
    manifest = lake.stage(
        SNAP_LSN, end, [(ORDERS, [[ins(b, 0, **_row(2))]]), (items, [[ins(b, 1, id=1, name="a")]])]
    )
    with pytest.raises(errors.ApplyError, match=r"--tables names \['public.nope'\]"):
        lake.apply(manifest, ["public.nope"])
    lake.apply(manifest, ["public.items"])
    assert lake.state(items).applied_end_lsn == Lsn(end)
    assert lake.state(ORDERS).applied_end_lsn == Lsn(SNAP_LSN)
    assert not lake.has_cut(items, end)  # orders does not hold the batch yet: no cut
    assert lake.rows(items) == [(1, "a")]
    assert lake.rows(ORDERS) == [tuple(_row(1).values())]
    assert [r.status for r in lake.apply(manifest)] == ["applied", "skipped"]
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert lake.has_cut(ORDERS, end) and lake.has_cut(items, end)


def test_main_exits_2_with_a_clear_message(
    lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere" / "_manifest.json")
    assert job.main(["--manifest", missing, "--catalog", lake.config.catalog]) == 2
    err = capsys.readouterr().err
    assert f"apply_batch.py: error: ApplyError: manifest {missing} does not exist" in err


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
    confs = [arg for key, value in lake.config.spark_conf().items() for arg in ("--conf", f"{key}={value}")]
    with tempfile.TemporaryDirectory() as zipdir:
        command = [
            f"{bin_dir}/spark-submit",
            "--master", "local[2]",
            "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.ui.enabled=false",
            "--py-files", job_py_files(zipdir),
            "--jars", local_jars(),
            *confs,
            APPLY_JOB_PATH,
            "--manifest", manifest,
            "--catalog", lake.config.catalog,
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit folds the driver's stderr (logs) into stdout: pick the summary line
    summary = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"manifest"'))
    assert [(t["table"], t["status"], t["changes"]) for t in summary["tables"]] == [
        ("public.orders", "applied", 3)
    ]
    assert lake.rows(ORDERS) == lake.expected(ORDERS)
    assert lake.state(ORDERS).applied_end_lsn == Lsn(b + 300)
    assert lake.rows(ORDERS, tag=tag_name(Lsn(b + 300))) == lake.expected(ORDERS)


def test_a_job_without_iceberg_s_runtime_names_the_artifact_to_pass(lake: Lake) -> None:
    manifest = lake.stager.batch(SNAP_LSN, SNAP_LSN + 100, [(ORDERS, [[ins(SNAP_LSN + 10, 0, **_row(1))]])])
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYSPARK_PYTHON": sys.executable}
    drivers = ",".join(jar for jar in local_jars().split(",") if "iceberg" not in Path(jar).name)
    with tempfile.TemporaryDirectory() as zipdir:
        command = [
            f"{bin_dir}/spark-submit", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
            "--py-files", job_py_files(zipdir), "--jars", drivers,
            APPLY_JOB_PATH, "--manifest", manifest, "--catalog", lake.config.catalog,
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert "Iceberg's Spark runtime is not on the job's classpath" in output
    assert "packages='org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:<version>'" in output
