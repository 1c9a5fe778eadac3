"""Tables without a key (no replica identity, or REPLICA IDENTITY FULL) are multisets in the lake.

Two identical rows are two rows; a DELETE or UPDATE changes one of them; an UPDATE's unchanged
TOAST values come from its own old tuple. Checked against ``multiset_apply`` (a list, changed
one row at a time as the source was), for batches, the re-snapshot catch-up, and a real
PostgreSQL drained by the real drain and compared by ``verify.compare_tables``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import ApplyError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import advance_slot, connect
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark import iceberg, table_runs
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.spark.iceberg_support import LakeReader
from tests.integration.spark.spark_staging import (
    Change,
    Part,
    Row,
    Stager,
    TableDef,
    dele,
    ins,
    multiset_apply,
    trunc,
    upd,
)

S0 = 0x1000_0000
LOG = TableDef("public", "log", [("k", pa.string()), ("v", pa.int32())], [])  # DEFAULT, no key
QUIET = TableDef("public", "quiet", [("k", pa.string()), ("v", pa.int32())], [], replica_identity="n")
FULL = TableDef(
    "public", "full", [("k", pa.string()), ("v", pa.int32()), ("doc", pa.string())], [], replica_identity="f"
)
FULL_PK = TableDef(
    "public",
    "full_pk",
    [("id", pa.int64()), ("v", pa.int32()), ("doc", pa.string())],
    [],
    replica_identity="f",
)
BIG = "toast-" + "x" * 4000
Table = list[Row]


def _r(k: str, v: int | None, doc: str | None = BIG) -> Row:
    return {"k": k, "v": v, "doc": doc}


def _moved(lsn: int, seq: int, old: Row, **new: Any) -> Change:
    """A FULL-identity UPDATE of ``old`` that leaves ``doc`` unchanged (``u``, null in the new tuple)."""
    return upd(lsn, seq, old=old, unchanged=("doc",), **{**old, **new, "doc": None})


class Source:
    """One source history: each table's rows at the initial point, then every change."""

    def __init__(self, tables: list[tuple[TableDef, Table]]) -> None:
        self.initial = {t.dirname: rows for t, rows in tables}
        self.log: list[tuple[TableDef, Change]] = []

    def record(self, tdef: TableDef, changes: list[Change]) -> tuple[TableDef, list[Change]]:
        self.log += [(tdef, c) for c in changes]
        return tdef, changes

    def at(self, tdef: TableDef, lsn: int) -> Table:
        rows = copy.deepcopy(self.initial[tdef.dirname])
        changes = [c for t, c in self.log if t.dirname == tdef.dirname and c.commit_lsn < lsn]
        multiset_apply(tdef, rows, changes, 0)
        return rows

    def rows_at(self, lsn: int, *tdefs: TableDef) -> list[tuple[TableDef, Table]]:
        return [(t, self.at(t, lsn)) for t in tdefs]


class Lake(LakeReader):
    def __init__(self, spark: SparkSession, config: LakeConfig, tmp: Path) -> None:
        super().__init__(spark, config)
        self.stager = Stager(tmp / "staging")

    def snapshot(self, lsn: int, tables: list[tuple[TableDef, Table]]) -> list[tuple[str, int]]:
        return self.apply(self.stager.snapshot(lsn, tables))

    def batch(self, start: int, end: int, *tables: tuple[TableDef, Part]) -> str:
        """A batch under the drain's id ``batch-<start LSN hex16>`` (the catch-up parses it)."""
        staged = Path(self.stager.batch(start, end, [(t, [c]) for t, c in tables])).parent
        drained = staged.rename(staged.with_name(f"batch-{start:016X}"))
        manifest = json.loads((drained / "_manifest.json").read_text())
        manifest["batch_id"] = drained.name
        (drained / "_manifest.json").write_text(json.dumps(manifest))
        return str(drained / "_manifest.json")

    def apply(self, manifest: str) -> list[tuple[str, int]]:
        return [(r.status, r.changes) for r in job.apply_manifest(self.spark, manifest, self.config)]


def expected(tdef: TableDef, rows: Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[n] for n in tdef.names) for r in rows), key=repr)


@pytest.fixture
def lake(spark: SparkSession, lake_config: LakeConfig, tmp_path: Path) -> Lake:
    return Lake(spark, lake_config, tmp_path)


def test_keyless_tables_keep_identical_rows_through_batches_and_truncate(lake: Lake) -> None:
    a, b, c = {"k": "a", "v": 1}, {"k": "b", "v": None}, {"k": "c", "v": 3}
    src = Source([(LOG, [a, a, b]), (QUIET, [b, b])])
    lake.snapshot(S0, src.rows_at(S0, LOG, QUIET))
    e1, e2 = S0 + 1000, S0 + 2000
    log_b1 = [ins(S0 + 100, 0, **a), ins(S0 + 100, 1, **a), ins(S0 + 200, 0, **c)]
    lake.apply(lake.batch(S0, e1, src.record(LOG, log_b1), src.record(QUIET, [ins(S0 + 300, 0, **b)])))
    for tdef in (LOG, QUIET):
        assert lake.rows(tdef) == expected(tdef, src.at(tdef, e1))
    assert lake.rows(LOG).count(("a", 1)) == 4 and lake.rows(QUIET) == [("b", None)] * 3
    # A TRUNCATE removes what precedes it; identical rows inserted after it all stay.
    log_b2 = [ins(e1 + 100, 0, **a), trunc(e1 + 200, 0), ins(e1 + 200, 1, **a), ins(e1 + 300, 0, **a)]
    lake.apply(lake.batch(e1, e2, src.record(LOG, log_b2), src.record(QUIET, [trunc(e1 + 400, 0)])))
    assert lake.rows(LOG) == expected(LOG, src.at(LOG, e2)) == [("a", 1), ("a", 1)]
    assert lake.rows(QUIET) == []


def test_full_identity_changes_one_of_identical_rows(lake: Lake) -> None:
    x, y = _r("x", 1), _r("y", 2, None)
    src = Source([(FULL, [x, x, x, y])])
    lake.snapshot(S0, src.rows_at(S0, FULL))
    e1, e2 = S0 + 1000, S0 + 2000
    changes = [
        dele(S0 + 100, 0, **x),  # one of three: two stay
        _moved(S0 + 200, 0, x, v=5),  # one of the two left becomes v=5
        ins(S0 + 300, 0, **y),
        dele(S0 + 300, 1, **y),  # NULL doc matched null-safe
    ]
    lake.apply(lake.batch(S0, e1, src.record(FULL, changes)))
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e1))
    assert lake.rows(FULL) == expected(FULL, [x, {**x, "v": 5}, y])
    # The same value inserted and deleted again nets out: nothing to write, the state still moves.
    lake.apply(lake.batch(e1, e2, src.record(FULL, [ins(e1 + 100, 0, **x), dele(e1 + 200, 0, **x)])))
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e2))
    assert lake.state(FULL).applied_end_lsn == Lsn(e2)


def test_full_identity_chained_updates_keep_unchanged_toast(lake: Lake) -> None:
    r1, s7 = _r("r", 1), _r("s", 7, BIG + "s")
    pk = [{"id": i, "v": i, "doc": BIG} for i in range(1, 5)]
    src = Source([(FULL, [r1, r1, s7]), (FULL_PK, pk)])
    lake.snapshot(S0, src.rows_at(S0, FULL, FULL_PK))
    e1, e2 = S0 + 1000, S0 + 2000
    full_b1 = [
        _moved(S0 + 100, 0, r1, v=2),  # two UPDATEs of one of two identical rows, doc unchanged
        _moved(S0 + 200, 0, _r("r", 2), v=3),
        _moved(S0 + 300, 0, s7, v=8),  # UPDATE then DELETE in one batch
        dele(S0 + 300, 1, **_r("s", 8, BIG + "s")),
    ]
    pk_b1 = [
        _moved(S0 + 100, 1, pk[0], v=10),
        _moved(S0 + 200, 1, {**pk[0], "v": 10}, v=11),
        _moved(S0 + 400, 0, pk[1], v=20),
        dele(S0 + 500, 0, **{**pk[1], "v": 20}),
        ins(S0 + 600, 0, id=5, v=5, doc=BIG),
    ]
    lake.apply(lake.batch(S0, e1, src.record(FULL, full_b1), src.record(FULL_PK, pk_b1)))
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e1)) == [("r", 1, BIG), ("r", 3, BIG)]
    assert lake.rows(FULL_PK) == expected(FULL_PK, src.at(FULL_PK, e1))
    # A row updated again in the next batch: its doc still comes from its old tuple.
    full_b2 = [_moved(e1 + 100, 0, _r("r", 3), v=4)]
    pk_b2 = [_moved(e1 + 100, 1, {**pk[0], "v": 11}, v=12)]
    lake.apply(lake.batch(e1, e2, src.record(FULL, full_b2), src.record(FULL_PK, pk_b2)))
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e2)) == [("r", 1, BIG), ("r", 4, BIG)]
    assert lake.rows(FULL_PK) == expected(FULL_PK, src.at(FULL_PK, e2))


def test_resnapshot_catch_up_replays_multisets(lake: Lake) -> None:
    x, y, a = _r("x", 1), _r("y", 2), {"k": "a", "v": 1}
    src = Source([(FULL, [x, x, y]), (LOG, [a, a])])
    lake.snapshot(S0, src.rows_at(S0, FULL, LOG))
    e1, s, e2 = S0 + 1000, S0 + 2000, S0 + 3000
    lake.apply(lake.batch(S0, e1, src.record(FULL, [dele(S0 + 100, 0, **x)])))
    full_b2 = [
        ins(s - 100, 0, **y),  # below the re-snapshot's point: in its rows
        _moved(s, 0, y, v=3),  # at and above: replayed onto them
        ins(s + 100, 0, **x),
        dele(s + 200, 0, **x),
    ]
    log_b2 = [
        ins(s - 100, 1, **a),
        ins(s + 100, 1, **a),
        trunc(s + 300, 0),
        ins(s + 400, 0, **a),
        ins(s + 400, 1, **a),
    ]
    lake.apply(lake.batch(e1, e2, src.record(FULL, full_b2), src.record(LOG, log_b2)))
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e2))
    assert lake.snapshot(s, src.rows_at(s, FULL, LOG)) == [("loaded", 3), ("loaded", 4)]
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e2)) == expected(FULL, [x, y, {**y, "v": 3}])
    assert lake.rows(LOG) == expected(LOG, src.at(LOG, e2)) == [("a", 1), ("a", 1)]


def test_catch_up_of_a_table_that_dropped_a_column(lake: Lake) -> None:
    """The changelog still has a column the re-snapshot lacks: its rows hold it as null."""
    with_extra = TableDef("public", "full", [*FULL.columns, ("extra", pa.string())], [], replica_identity="f")
    x, xe = _r("x", 1), {**_r("x", 1), "extra": "e"}
    lake.snapshot(S0, [(with_extra, [xe, xe])])
    e1, s, e2 = S0 + 1000, S0 + 2000, S0 + 3000
    lake.apply(lake.batch(S0, e1, (FULL, (with_extra, [dele(S0 + 100, 0, **xe)]))))
    # ALTER TABLE full DROP COLUMN extra, then:
    b2 = [ins(s - 100, 0, **x), ins(s + 100, 0, **x), _moved(s + 200, 0, x, v=5)]
    lake.apply(lake.batch(e1, e2, (FULL, b2)))
    at_e2 = expected(FULL, [x, x, {**x, "v": 5}])
    assert lake.rows(FULL) == at_e2
    assert lake.snapshot(s, [(FULL, [x, x])]) == [("loaded", 2)]
    assert lake.rows(FULL) == at_e2


@pytest.mark.parametrize("statement", ["merge", "insert"])
def test_a_multiset_batch_that_loses_a_race_is_redone_from_the_new_state(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, statement: str
) -> None:
    """A re-snapshot load commits between the batch's read and its commit (MERGE or INSERT)."""
    x, y = _r("x", 1), _r("y", 2)
    src = Source([(FULL, [x, x, y])])
    lake.snapshot(S0, src.rows_at(S0, FULL))
    e1, s, e2 = S0 + 1000, S0 + 2000, S0 + 3000
    lake.apply(lake.batch(S0, e1, src.record(FULL, [dele(S0 + 100, 0, **x)])))
    above = (
        [dele(s + 100, 0, **y), _moved(s + 200, 0, x, v=5)]
        if statement == "merge"
        else [ins(s + 100, 0, **x)]
    )
    b2 = lake.batch(e1, e2, src.record(FULL, [ins(s - 100, 0, **y), *above]))
    resnap = lake.stager.snapshot(s, src.rows_at(s, FULL))
    real = iceberg.IcebergTables.merge
    events: list[str] = []

    def racing(self: iceberg.IcebergTables, sql: str, summary: Any) -> None:
        if not events:
            events.append(sql.split(" ", 1)[0])
            lake.apply(resnap)
        real(self, sql, summary)

    def conflict_seen(exc: BaseException) -> bool:
        verdict = iceberg.is_conflict(exc)
        events.extend(["conflict"] if verdict else [])
        return verdict

    monkeypatch.setattr(iceberg.IcebergTables, "merge", racing)
    monkeypatch.setattr(table_runs, "is_conflict", conflict_seen)
    assert lake.apply(b2) == [("applied", len(above))]  # redone from the re-snapshot's base
    assert events == [statement.upper(), "conflict"]
    monkeypatch.undo()
    assert lake.rows(FULL) == expected(FULL, src.at(FULL, e2))


def test_deleting_a_row_the_lake_lacks_names_the_table_and_the_resnapshot(lake: Lake) -> None:
    x = _r("x", 1)
    lake.snapshot(S0, [(FULL, [x])])
    before = lake.current(FULL)
    batch = lake.batch(S0, S0 + 1000, (FULL, [dele(S0 + 100, 0, **x), dele(S0 + 200, 0, **x)]))
    with pytest.raises(ApplyError, match=r"public\.full: .*re-snapshot"):
        lake.apply(batch)
    assert lake.current(FULL) == before  # nothing committed


SCHEMA = """
CREATE TABLE log (k text, v int);
CREATE TABLE full_nokey (k text, v int, doc text);
ALTER TABLE full_nokey REPLICA IDENTITY FULL;
ALTER TABLE full_nokey ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE full_pk (id int PRIMARY KEY, v int, doc text);
ALTER TABLE full_pk REPLICA IDENTITY FULL;
ALTER TABLE full_pk ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE PUBLICATION ms_pub FOR TABLE log, full_nokey, full_pk;
INSERT INTO log SELECT 'a', 1 FROM generate_series(1, 3);
INSERT INTO log VALUES ('b', NULL);
INSERT INTO full_nokey SELECT 'x', 1, repeat(md5('x'), 200) FROM generate_series(1, 2);
INSERT INTO full_nokey VALUES ('y', 2, repeat(md5('y'), 200));
INSERT INTO full_pk SELECT g, g, repeat(md5(g::text), 200) FROM generate_series(1, 3) g;
"""
# Each batch is one transaction (one simple-query string); ``min(ctid)`` picks one of identical rows.
BATCH_1 = """
INSERT INTO log SELECT 'a', 1 FROM generate_series(1, 2);
DELETE FROM full_nokey WHERE ctid = (SELECT min(ctid) FROM full_nokey WHERE k = 'x');
INSERT INTO full_nokey VALUES ('y', 2, repeat(md5('y'), 200));
UPDATE full_nokey SET v = 3 WHERE ctid = (SELECT min(ctid) FROM full_nokey WHERE k = 'y');
UPDATE full_nokey SET v = 4 WHERE k = 'y' AND v = 3;
UPDATE full_nokey SET v = 9 WHERE k = 'x';
DELETE FROM full_nokey WHERE k = 'x';
UPDATE full_pk SET v = v + 10 WHERE id = 1;
UPDATE full_pk SET v = v + 10 WHERE id = 1;
UPDATE full_pk SET v = 0 WHERE id = 2;
DELETE FROM full_pk WHERE id = 2;
INSERT INTO full_pk VALUES (4, 4, repeat(md5('4'), 200));
"""
BATCH_2 = """
INSERT INTO log VALUES ('a', 1);
TRUNCATE log;
INSERT INTO log SELECT 'a', 1 FROM generate_series(1, 2);
UPDATE full_nokey SET v = 5 WHERE k = 'y' AND v = 4;
UPDATE full_pk SET v = v + 1 WHERE id = 1;
"""


@pytest.mark.integration
def test_a_real_server_drained_and_applied_equals_its_source(
    spark: SparkSession, lake_config: LakeConfig, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    pg_cluster.execute(SCHEMA, pg_dbname)
    staging = str(tmp_path / "staging")
    path, manifest = take_snapshot(dsn, "ms", ["ms_pub"], staging)
    assert {t.table: t.replica_identity for t in manifest.tables} == {
        "log": "d",
        "full_nokey": "f",
        "full_pk": "f",
    }
    job.apply_manifest(spark, path, lake_config)
    for statements in (BATCH_1, BATCH_2):
        pg_cluster.execute(statements, pg_dbname)
        batch = drain_batch(dsn, DrainSettings("ms", ("ms_pub",), staging))
        results = job.apply_manifest(spark, batch.manifest_uri, lake_config)
        assert {r.status for r in results} == {"applied"}
        conn = connect(dsn)
        advance_slot(conn, "ms", batch.manifest.end_lsn)
        conn.close()
        compared = compare_tables(dsn, ["ms_pub"], lake_config)
        assert all(r.equal for r in compared), format_report(compared)
    rows = pg_cluster.execute("SELECT count(*) FROM log", pg_dbname)
    assert rows == [(2,)]
