"""Re-snapshots of a running pipeline: base LSN boundary, never backwards, catch-up, racing writers.

Every expectation comes from one source history (``Source``): the initial rows and every later
change, as the WAL holds them. A re-snapshot at S holds the source's rows at S, and whatever
order the loads and batches run in, the target must hold the source's rows at its applied end.
Batches are staged under the drain's ids (``batch-<start LSN hex16>``), which the catch-up's
changelog pruning parses. Crashes and races are made with real Iceberg commits.
"""

from __future__ import annotations

import copy
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc import errors
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark import iceberg, table_runs
from airflow_provider_postgres_cdc.spark.session import register_lake
from tests.integration.spark.iceberg_support import LakeReader, competing_writer
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


class Lake(LakeReader):
    """A staging root (batches named like the drain names them) and an Iceberg lake."""

    def __init__(self, spark: SparkSession, config: LakeConfig, tmp: Path) -> None:
        super().__init__(spark, config)
        self.stager = Stager(tmp / "staging")

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
        results = job.apply_manifest(self.spark, manifest, self.config)
        return [(r.status, r.changes) for r in results]

    def rows(
        self, tdef: TableDef = ORDERS, names: list[str] | None = None, *, tag: str | None = None
    ) -> list[tuple[Any, ...]]:
        return super().rows(tdef, names, tag=tag)

    def pipeline_commits(self, tdef: TableDef = ORDERS) -> list[tuple[str, str, str]]:
        """(batch id, base LSN, applied end LSN) of every pipeline commit of main, oldest first.

        A losing attempt's MERGE snapshot stays on its merge branch, never in main's history.
        """
        tables = iceberg.IcebergTables(self.spark, self.config)
        table = tables.table(self.config.identifier(tdef.schema, tdef.table))
        history = list(table.history()) if table is not None else []
        return [
            (summary["pgl.batch-id"], summary["pgl.base-lsn"], summary["pgl.applied-end-lsn"])
            for _, summary in reversed(history)
            if "pgl.applied-end-lsn" in summary
        ]


def expected(table: Table, tdef: TableDef = ORDERS) -> list[tuple[Any, ...]]:
    return rows_of(table, tdef.names)


def lsn(value: int) -> Lsn:
    return Lsn(value)


@pytest.fixture
def lake(spark: SparkSession, lake_config: LakeConfig, tmp_path: Path) -> Lake:
    return Lake(spark, lake_config, tmp_path)


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

    def crash_before_the_cut(self: job.ApplyJob) -> None:
        raise RuntimeError("driver lost after the commit, before the cut was tagged")

    monkeypatch.setattr(job.ApplyJob, "_tag_cut", crash_before_the_cut)
    with pytest.raises(RuntimeError):
        lake.apply(b2)  # orders committed at e2, no cut: its retry comes later
    monkeypatch.undo()
    assert lake.rows(NOTED) == expected(src.at(e2), NOTED)
    assert not lake.has_cut(ORDERS, e2)

    resnap = lake.snapshot(s, [(ORDERS, src.at(s))])
    replayed = len(at_and_above) + len(with_note)
    assert lake.apply(resnap) == [("loaded", replayed)]  # only b2's changes at or above s
    assert lake.rows(NOTED) == expected(src.at(e2), NOTED)
    state = lake.state(ORDERS)
    assert (state.base_lsn, state.batch_id, state.kind) == (lsn(s), f"snapshot-{s:016X}", "snapshot")
    assert state.applied_end_lsn == lsn(e2)
    assert (f"batch-{e1:016X}", str(lsn(S0)), str(lsn(e2))) in lake.pipeline_commits()  # b2's commit
    assert lake.columns(ORDERS) == NOTED.names  # nothing but the table's columns

    committed = lake.current(ORDERS)
    assert lake.apply(b2) == [("skipped", 0)]  # the retry: b2 ends at the applied end
    assert lake.current(ORDERS) == committed
    assert lake.rows(NOTED, tag=tag_name(lsn(e2))) == expected(src.at(e2), NOTED)  # the retry tagged it
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

    def crash_at_merge(self: iceberg.IcebergTables, sql: str, summary: Any) -> None:
        raise RuntimeError("driver killed before the merge committed")

    monkeypatch.setattr(iceberg.IcebergTables, "merge", crash_at_merge)
    with pytest.raises(RuntimeError):
        lake.apply(b3)  # b3's changelog is appended, its merge is not committed
    monkeypatch.undo()
    assert [c for c in lake.changelog(ORDERS) if c[2] == f"batch-{e2:016X}"] == [
        (e2 + 100, 0, f"batch-{e2:016X}"),
        (e2 + 200, 0, f"batch-{e2:016X}"),
    ]

    assert lake.apply(lake.snapshot(s, [(ORDERS, src.at(s))])) == [("loaded", 5)]
    assert lake.rows() == expected(at_e2)  # the TRUNCATE replayed, b3's logged changes not
    assert sorted(r[0] for r in lake.rows()) == [3, 31]
    assert lake.state(ORDERS).applied_end_lsn == lsn(e2)
    assert lake.apply(b3) == [("applied", 2)]
    assert lake.rows() == expected(src.at(e3))
    assert len(lake.changelog(ORDERS)) == 1 + len(b2_changes) + 2  # b3's changes logged once


def test_a_snapshot_not_newer_than_the_base_lsn_is_skipped(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = {(1,): {"id": 1, "name": "a"}}
    initial = lake.snapshot(S0, [(ORDERS, {(i,): _row(i) for i in range(8)}), (ITEMS, items)])
    real_load = job.ApplyJob.load_snapshot_table

    def crash_on_items(self: job.ApplyJob, spec: Any) -> job.TableResult:
        if spec.table == "items":
            raise RuntimeError("executor lost")
        return real_load(self, spec)

    monkeypatch.setattr(job.ApplyJob, "load_snapshot_table", crash_on_items)
    with pytest.raises(RuntimeError):
        lake.apply(initial)  # orders loaded at S0, items not, no cut
    monkeypatch.undo()
    assert not lake.has_cut(ORDERS, S0)
    s1, s2 = S0 + 1000, S0 + 2000
    newer = {(i,): _row(i, "s2") for i in range(3, 12)}
    older = lake.snapshot(s1, [(ORDERS, {(i,): _row(i, "s1") for i in range(5)})])  # its load runs late
    assert lake.apply(lake.snapshot(s2, [(ORDERS, newer)])) == [("loaded", 0)]
    committed = lake.current(ORDERS)

    assert lake.apply(older) == [("skipped", 0)]
    assert lake.current(ORDERS) == committed
    assert lake.state(ORDERS).applied_end_lsn >= lsn(s1)  # done as far as the ack is concerned
    assert lake.apply(initial) == [("skipped", 0), ("loaded", 0)]  # the retried initial load
    assert lake.state(ITEMS).applied_end_lsn == lsn(S0)
    assert lake.rows() == expected(newer)
    state = lake.state(ORDERS)
    assert lake.current(ORDERS) == committed
    assert (state.base_lsn, state.applied_end_lsn) == (lsn(s2), lsn(s2))
    assert lake.rows(ITEMS) == [(1, "a")]


@pytest.mark.parametrize(
    "loser",
    [
        "batch",
        "snapshot",
    ],
)
def test_racing_batch_and_resnapshot_load_both_land(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, loser: str
) -> None:
    """A real race: the other job commits between the loser's read of the table and its commit.

    The loser's commit must fail Iceberg's optimistic-concurrency check and be redone from the
    winner's state by the job's retry loop.
    """
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
    method = "merge" if loser == "batch" else "overwrite"
    real = getattr(iceberg.IcebergTables, method)
    events: list[str] = []

    def racing(self: iceberg.IcebergTables, *args: Any) -> None:
        if not events:  # the loser is about to commit: the other job runs and commits first
            events.append("raced")
            lake.apply(other)
        real(self, *args)

    def conflict_seen(exc: BaseException) -> bool:
        """The job's own verdict on a failed step (the loser's MERGE fails when it is published)."""
        verdict = iceberg.is_conflict(exc)
        events.extend(["conflict"] if verdict else [])
        return verdict

    monkeypatch.setattr(iceberg.IcebergTables, method, racing)
    monkeypatch.setattr(table_runs, "is_conflict", conflict_seen)
    assert lake.apply(first) == [("applied" if loser == "batch" else "loaded", 4)]  # the changes >= s
    assert events == ["raced", "conflict"]
    monkeypatch.undo()
    assert lake.rows() == expected(src.at(e2))
    state = lake.state(ORDERS)
    assert (state.base_lsn, state.applied_end_lsn) == (lsn(s), lsn(e2))  # both jobs' work is in
    # S0 load, b1, the winner, the redone loser: no lost commit left behind, nothing twice.
    assert len(lake.pipeline_commits()) == 4
    assert lake.rows(tag=tag_name(lsn(e2))) == expected(src.at(e2))


def test_a_table_lost_on_every_attempt_names_the_pool_advice(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits to the table during every attempt's MERGE: the job gives up cleanly.

    The competitor must commit between the MERGE's planning (which pins the snapshot it validates
    from) and its commit, so it runs inside the MERGE: a filter on the merge source, evaluated by a
    Python worker, commits through pyiceberg (a row under the batch's key in, then out again).
    """
    rows = {(i,): _row(i) for i in range(6)}
    lake.apply(lake.snapshot(S0, [(ORDERS, rows)]))
    before = lake.state(ORDERS)
    b1 = lake.batch(S0, S0 + 500, [[ins(S0 + 100, 0, **_row(9))]])
    real_merge, real_view = iceberg.IcebergTables.merge, job.temp_view
    attempts: list[int] = []
    competitor = competing_writer(lake.config, lake.config.identifier(ORDERS.schema, ORDERS.table), key=9)

    def counted(self: iceberg.IcebergTables, sql: str, summary: Any) -> None:
        attempts.append(lake.current(ORDERS)[1])
        real_merge(self, sql, summary)

    monkeypatch.setattr(iceberg.IcebergTables, "merge", counted)
    monkeypatch.setattr(job, "temp_view", lambda df: real_view(df.where(competitor)))
    n = table_runs.CONFLICT_ATTEMPTS
    with pytest.raises(
        errors.ConcurrentWriteError,
        match=rf"public\.orders: another writer committed the table first {n} times .*one Airflow pool",
    ):
        lake.apply(b1)
    monkeypatch.undo()
    # each attempt started from the newest table: the competitor's two commits of the previous one,
    # and the previous attempt's MERGE snapshot, left unpublished on its merge branch
    assert attempts == [attempts[0] + 3 * i for i in range(n)]
    assert lake.state(ORDERS) == before  # nothing of the batch recorded
    assert lake.rows() == expected(rows)
    assert not lake.has_cut(ORDERS, S0 + 500)


def test_resnapshot_keeps_the_applied_end_of_a_table_without_changelog(lake: Lake) -> None:
    """A batch listing orders without files advances its applied end but logs nothing for it."""
    simple = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.string())], ["id"])
    rows = [{"id": i, "name": f"n{i}"} for i in range(3)]
    job.apply_manifest(lake.spark, lake.stager.snapshot(S0, [(simple, rows), (ITEMS, rows)]), lake.config)
    e1 = S0 + 1000
    b1 = lake.stager.batch(S0, e1, [(simple, []), (ITEMS, [[ins(S0 + 100, 0, id=9, name="x")]])])
    job.apply_manifest(lake.spark, b1, lake.config)
    assert lake.state(simple).applied_end_lsn == lsn(e1)
    s = S0 + 500
    job.apply_manifest(lake.spark, lake.stager.snapshot(s, [(simple, rows)]), lake.config)
    state = lake.state(simple)
    assert (state.base_lsn, state.applied_end_lsn) == (lsn(s), lsn(e1))  # not moved back to s


def test_a_type_change_below_the_base_does_not_block_the_batch(
    lake: Lake, spark: SparkSession, tmp_path: Path
) -> None:
    """ALTER TYPE, then a re-snapshot, inside one batch: the old-typed part holds only skipped changes.

    The job's own advice for a type change is to re-snapshot the table; the batch spanning both
    must then apply, not fail on the old-typed file.
    """
    named = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.string())], ["id"])
    retyped = TableDef("public", "orders", [("id", pa.int64()), ("name", pa.int32())], ["id"])
    stager = lake.stager
    job.apply_manifest(spark, stager.snapshot(S0, [(named, [{"id": 1, "name": "a"}])]), lake.config)
    s = S0 + 2000
    job.apply_manifest(spark, stager.snapshot(s, [(retyped, [{"id": 1, "name": 7}])]), lake.config)
    parts = [(named, [upd(S0 + 100, 0, id=1, name="b")]), (retyped, [upd(s + 100, 0, id=1, name=8)])]
    job.apply_manifest(spark, stager.batch(S0, s + 1000, [(retyped, parts)]), lake.config)
    assert lake.rows(retyped) == [(1, 8)]
    # Without the re-snapshot the same conflict is the user's to resolve, with the advice.
    (tmp_path / "lake2").mkdir()
    fresh = local_lake(str(tmp_path / "lake2"), catalog=f"lake_{uuid.uuid4().hex[:8]}")
    register_lake(spark, fresh)
    job.apply_manifest(spark, stager.snapshot(S0, [(named, [{"id": 1, "name": "a"}])]), fresh)
    with pytest.raises(errors.SchemaConflictError, match="re-snapshot the table"):
        job.apply_manifest(spark, stager.batch(S0, s + 2000, [(retyped, parts)]), fresh)
