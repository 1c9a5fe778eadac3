"""Many tables in one apply job, applied at once: a racing re-snapshot, a failing table, one cut.

The job applies up to ``parallelism`` tables at once, each with its own commits and its own redo
on a lost race. Whatever happens to one table, the others land, the cut is tagged only once every
table holds the batch, and a re-run converges. Real Iceberg commits, a real race.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark import iceberg
from tests.integration.spark.iceberg_support import LakeReader
from tests.integration.spark.spark_staging import (
    Change,
    Row,
    Stager,
    TableDef,
    dele,
    ins,
    model_apply,
    upd,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLES = [
    TableDef("public", f"t{i:02d}", [("id", pa.int64()), ("v", pa.string())], ["id"]) for i in range(30)
]
RACED = TABLES[7]
S0 = 0x1000_0000
END = S0 + 0x10_0000
Table = dict[tuple[Any, ...], Row]


def _changes(i: int) -> list[Change]:
    """Table ``i``'s changes of the batch: an insert, an update, a delete, a key change."""
    at = S0 + 0x100 * (i + 1)
    return [
        ins(at, 0, id=100 + i, v="new"),
        upd(at + 0x10, 0, id=1, v=f"u{i}"),
        dele(at + 0x20, 0, id=2),
        upd(at + 0x30, 0, old={"id": 3}, id=300 + i, v="moved"),
    ]


def _initial() -> Table:
    return {(k,): {"id": k, "v": "a"} for k in range(10)}


def _at(changes: list[Change], lsn: int) -> Table:
    table = copy.deepcopy(_initial())
    model_apply(TABLES[0], table, [c for c in changes if c.commit_lsn < lsn], 0)
    return table


def _stage(spark: SparkSession, config: LakeConfig, root: Path, tables: list[TableDef]) -> tuple[Stager, str]:
    """``tables`` loaded at S0, and a batch changing each of them staged."""
    stager = Stager(root / "staging")
    job.apply_manifest(spark, stager.snapshot(S0, [(t, list(_initial().values())) for t in tables]), config)
    return stager, stager.batch(S0, END, [(t, [_changes(i)]) for i, t in enumerate(tables)])


def _union(
    reader: LakeReader, tables: list[TableDef], select: str, suffix: str = ""
) -> list[tuple[Any, ...]]:
    """``select`` from every table (``{name}``, ``{changelog}``, ``{table}`` filled in) in one query."""
    parts = [
        select.format(name=reader.name(t) + suffix, table=t.table, changelog=reader.changelog_name(t))
        for t in tables
    ]
    return sorted(tuple(row) for row in reader.spark.sql(" UNION ALL ".join(parts)).collect())


def _assert_equal(reader: LakeReader, tables: list[TableDef], tag: str | None = None) -> None:
    """Every table equals its source at the batch's end (as of ``tag`` when given)."""
    suffix = "" if tag is None else f" VERSION AS OF '{tag}'"
    expected = [
        (t.table, r["id"], r["v"]) for i, t in enumerate(tables) for r in _at(_changes(i), END).values()
    ]
    assert _union(reader, tables, "SELECT '{table}', id, v FROM {name}", suffix) == sorted(expected)


def test_thirty_tables_at_once_with_a_racing_resnapshot_end_equal_with_one_cut(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the batch's merge of one table is about to commit, a re-snapshot load of that table
    commits first (a temporary slot's snapshot inside the batch): the merge loses the race, is
    redone from the new state on its own thread, and every table ends equal to its source."""
    stager, batch = _stage(spark, lake_config, tmp_path, TABLES)
    point = S0 + 0x100 * 8 + 0x18  # inside the raced table's changes: its insert and update are below
    resnapshot = stager.snapshot(point, [(RACED, list(_at(_changes(7), point).values()))])
    reader = LakeReader(spark, lake_config)
    raced_name = reader.name(RACED)
    real_merge, real_tag = iceberg.IcebergTables.merge, iceberg.IcebergTables.tag_cut
    events: list[str] = []
    threads: set[str] = set()
    lock = threading.Lock()

    def racing(self: iceberg.IcebergTables, sql: str, summary: Any) -> None:
        with lock:
            threads.add(threading.current_thread().name)
            race = raced_name in sql and "raced" not in events
            events.extend(["raced"] if race else [])
        if race:  # a load of another job, a temporary slot's snapshot: no cut of its own
            loaded = job.apply_manifest(spark, _temporary(resnapshot), lake_config, parallelism=1)
            assert [r.status for r in loaded] == ["loaded"]
        real_merge(self, sql, summary)

    def tag_once(self: iceberg.IcebergTables, slot: str, end_lsn: Lsn) -> int:
        events.append(f"tag {end_lsn}")
        return real_tag(self, slot, end_lsn)

    monkeypatch.setattr(iceberg.IcebergTables, "merge", racing)
    monkeypatch.setattr(iceberg.IcebergTables, "tag_cut", tag_once)
    results = job.apply_manifest(spark, batch, lake_config, parallelism=4)
    monkeypatch.undo()

    assert [r.status for r in results] == ["applied"] * 30
    assert events == ["raced", f"tag {Lsn(END)}"]
    assert len(threads) > 1  # the tables did run at once
    _assert_equal(reader, TABLES)
    _assert_equal(reader, TABLES, tag_name(Lsn(END)))  # every table tagged at the batch's end
    state = reader.state(RACED)
    assert (state.base_lsn, state.applied_end_lsn) == (Lsn(point), Lsn(END))
    logged = _union(reader, TABLES, "SELECT '{table}', _pgl_commit_lsn, _pgl_seq FROM {changelog}")
    assert logged == sorted((t.table, c.commit_lsn, c.seq) for i, t in enumerate(TABLES) for c in _changes(i))


def test_one_failing_table_fails_the_run_after_the_others_commit_and_a_rerun_converges(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = TABLES[:8]
    _, batch = _stage(spark, lake_config, tmp_path, tables)
    reader = LakeReader(spark, lake_config)
    real = job.ApplyJob.apply_batch_table
    failing = tables[3].table

    def fail_one(self: job.ApplyJob, spec: Any) -> job.TableResult:
        if spec.table == failing:
            raise RuntimeError("disk full")
        return real(self, spec)

    monkeypatch.setattr(job.ApplyJob, "apply_batch_table", fail_one)
    with pytest.raises(RuntimeError, match="disk full"):
        job.apply_manifest(spark, batch, lake_config, parallelism=4)
    monkeypatch.undo()
    for tdef in tables:
        held = reader.state(tdef).applied_end_lsn
        assert held == (Lsn(S0) if tdef.table == failing else Lsn(END)), tdef.table
        assert not reader.has_cut(tdef, END), tdef.table

    results = job.apply_manifest(spark, batch, lake_config, parallelism=4)
    assert [r.table for r in results if r.status == "applied"] == [f"public.{failing}"]
    _assert_equal(reader, tables, tag_name(Lsn(END)))


def _temporary(manifest: str) -> str:
    """The snapshot manifest as a re-snapshot from a temporary slot (another slot exported it)."""
    path = Path(manifest)
    data = json.loads(path.read_text())
    data["snapshot_slot"] = "pgl_tmp_resnapshot"
    path.write_text(json.dumps(data))
    return manifest
