"""The pipeline report against a real PostgreSQL slot and a real Iceberg lake (pyiceberg, no Spark).

The lake is written here the way the apply job writes it (pipeline commit summaries, the
changelog, cut tags), with the ack's summary keys on one table and without them on another, so the
report's arithmetic (changes, apply seconds, latency) and its degradation to "unknown" are both
checked. Every bad input ends as a sentence in the report, never an exception.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from airflow_provider_postgres_cdc.cli import main
from airflow_provider_postgres_cdc.engine.lake_catalog import pyiceberg_properties
from airflow_provider_postgres_cdc.engine.report import AckPoint, collect_report, read_lake, render_html
from airflow_provider_postgres_cdc.formats import lake as lk
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import connect, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.pipeline_lake import create_owned_table

SLOT = "report_slot"
SNAP_END, B1_END = Lsn(0x1000), Lsn(0x2000)
STARTED = datetime(2026, 1, 1, tzinfo=UTC)


def _commit(table: object, rows: pa.Table, summary: dict[str, str]) -> int:
    table.append(rows, snapshot_properties=summary)  # type: ignore[attr-defined]
    return int(table.current_snapshot().snapshot_id)  # type: ignore[attr-defined]


def _summary(kind: str, batch: str, start: Lsn, end: Lsn, base: Lsn, **extra: str) -> dict[str, str]:
    return {**lk.commit_summary(slot=SLOT, kind=kind, batch_id=batch, start_lsn=start, end_lsn=end,
                                base_lsn=base, applied_end_lsn=end), **extra}  # fmt: skip


def build_lake(root: Path) -> LakeConfig:
    """orders (with the summary keys) and items (older commits: changelog only), both tagged at B1_END."""
    config = local_lake(str(root))
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(config.catalog, **pyiceberg_properties(config))
    catalog.create_namespace("public")
    schema = pa.schema([("id", pa.int64())])
    orders = create_owned_table(catalog, config, SLOT, ("public", "orders"), schema)
    items = create_owned_table(catalog, config, SLOT, ("public", "items"), schema)
    changelog = catalog.create_table(("public", "items" + lk.CHANGELOG_SUFFIX), schema)
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    _commit(orders, rows, _summary("snapshot", "snap", SNAP_END, SNAP_END, SNAP_END))
    _commit(items, rows, _summary("snapshot", "snap", SNAP_END, SNAP_END, SNAP_END))
    started_ms = str(int(time.time() * 1000) - 4000)  # the job began this table 4 s before it commits
    newest = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    keys = {"pgl.inserted": "2", "pgl.updated": "1", "pgl.deleted": "1", "pgl.started-ms": started_ms,
            "pgl.newest-commit-time": newest}  # fmt: skip
    tags = [_commit(orders, rows.slice(0, 2), _summary("batch", "b1", SNAP_END, B1_END, SNAP_END, **keys))]
    tags.append(_commit(items, rows.slice(0, 1), _summary("batch", "b1", SNAP_END, B1_END, SNAP_END)))
    _commit(changelog, rows.slice(0, 2), _summary("batch", "b1", SNAP_END, B1_END, SNAP_END))
    for table, snapshot_id in zip((orders, items), tags, strict=True):
        table.manage_snapshots().create_tag(snapshot_id, lk.tag_name(B1_END)).commit()
    return config


def add_empty_table(config: LakeConfig) -> None:
    """A pipeline table created and never committed to (idempotent)."""
    from pyiceberg.exceptions import TableAlreadyExistsError

    catalog = load_catalog(config.catalog, **pyiceberg_properties(config))
    with contextlib.suppress(TableAlreadyExistsError):
        create_owned_table(catalog, config, SLOT, ("public", "empty"), pa.schema([("id", pa.int64())]))


@pytest.fixture(scope="module")
def pg_cluster(pg_default_cluster: PostgresCluster) -> PostgresCluster:
    """The session's default server, for this module's module-scoped pipeline (tests/conftest.py)."""
    return pg_default_cluster


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, pg_cluster: PostgresCluster) -> Iterator[
        tuple[str, LakeConfig]]:  # fmt: skip
    pg_cluster.execute("CREATE DATABASE report_model")
    dsn = pg_cluster.dsn("report_model")
    conn = connect(dsn)
    create_slot(conn, SLOT)
    conn.close()
    yield dsn, build_lake(tmp_path_factory.mktemp("lake"))
    conn = connect(dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
    conn.close()


def test_report_reads_slot_batches_tables_and_cut(pipeline: tuple[str, LakeConfig], tmp_path: Path) -> None:
    dsn, config = pipeline
    acked = datetime.now(UTC)
    report = collect_report(dsn, SLOT, config, acks=[AckPoint(str(B1_END), acked, lag_bytes=123)])
    assert report.source is not None and report.source.wal_status == "reserved"
    assert report.source.lag_bytes is not None and report.source.lag_bytes >= 0
    assert [b.batch_id for b in report.batches] == ["snap", "b1"]
    snap, b1 = report.batches
    assert (snap.kind, snap.changes, snap.tables, snap.end_lsn) == ("snapshot", 6, 2, str(SNAP_END))
    # orders: 2+1+1 from its keys; items: 2 from its changelog commit (no keys on its own commit)
    assert (b1.changes, b1.tables, b1.start_lsn, b1.end_lsn) == (6, 2, str(SNAP_END), str(B1_END))
    assert b1.apply_seconds is None  # items' commit has no pgl.started-ms: unknown, not a guess
    assert b1.newest_commit_time is not None and b1.latency_seconds is not None
    assert 29 <= b1.latency_seconds <= 60 and b1.acked_at == acked
    assert report.cut is not None and (report.cut.lsn, report.cut.tables) == (str(B1_END), 2)
    tables = {t.name: t for t in report.tables}
    assert (tables["public.orders"].applied_end_lsn, tables["public.orders"].rows) == (str(B1_END), 5)
    assert (tables["public.items"].last_batch, tables["public.items"].base_lsn) == ("b1", str(SNAP_END))
    assert report.problems == () and report.lag_history[0][1] == 123
    page = render_html([report])
    assert "https://" not in page.replace("https://github.com/leeoniya/uPlot", "")  # nothing fetched
    assert (
        str(B1_END) in page and 'id="p0-batch-count"><span>batches in the lake</span><b class="">2<' in page
    )

    # A table joins the pipeline and has no commit yet: said, and no cut covers every table now.
    add_empty_table(config)
    later = collect_report(dsn, SLOT, config)
    assert {t.name: t.note for t in later.tables}["public.empty"] == "no commits yet"
    assert later.cut is None and len(later.batches) == 2
    assert later.problems == (
        "table public.empty has no commits yet",
        "no consistent cut yet: no batch tag is on every pipeline table",
    )
    assert "no commits yet" in render_html([later])


def test_missing_slot_unreachable_lake_and_slow_source_are_messages(pipeline: tuple[str, LakeConfig]) -> None:
    dsn, config = pipeline
    missing = collect_report(dsn, "no_such_slot", config)
    assert missing.source is None and "replication slot 'no_such_slot' does not exist" in missing.problems[0]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    dead = LakeConfig("lake", {"type": "jdbc", "uri": f"jdbc:postgresql://127.0.0.1:{port}/x",
                               "jdbc.user": "u", "jdbc.password": "s3cret-pw"})  # fmt: skip
    unreachable = collect_report(dsn, SLOT, dead, timeout=5)
    assert unreachable.source is not None and unreachable.batches == ()
    assert any(p.startswith("the lake cannot be reached") for p in unreachable.problems), unreachable.problems
    assert "s3cret-pw" not in render_html([unreachable])
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        slow = collect_report(f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=x user=u", SLOT, config,
                              timeout=2)  # fmt: skip
        seconds = time.monotonic() - started
    assert slow.source is None and "timed out" in slow.problems[0], slow.problems
    assert seconds < 8 and len(slow.batches) == 2  # the lake is still read


def test_cli_writes_one_self_contained_page(pipeline: tuple[str, LakeConfig], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    dsn, config = pipeline
    add_empty_table(config)
    out = tmp_path / "report.html"
    code = main(
        ["report", "--dsn", dsn, "--slot-name", SLOT, "--lake-json", config.to_json(), "--html", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 1  # public.empty has no commit yet: said, and the exit status says so too
    assert "no commits yet" in printed and str(out) in printed and str(B1_END) in printed
    page = out.read_text()
    assert page.count("<script") >= 3 and "uPlot" in page
    assert re.search(r"<\w+[^>]*\s(src|href)=", page) is None  # everything inline, nothing fetched


def test_a_portable_lake_reports_its_tables_by_their_source_names(tmp_path: Path) -> None:
    config = replace(local_lake(str(tmp_path)), names="portable", namespace_prefix="cdc_")
    (tmp_path / "warehouse").mkdir()
    catalog = load_catalog(config.catalog, **pyiceberg_properties(config))
    namespace, name = config.identifier("My Schema", "Orders")
    catalog.create_namespace(namespace)
    table = create_owned_table(catalog, config, SLOT, (namespace, name), pa.schema([("id", pa.int64())]))
    _commit(table, pa.table({"id": pa.array([1], pa.int64())}),
            _summary("snapshot", "snap", SNAP_END, SNAP_END, SNAP_END))  # fmt: skip
    _, tables, _, _ = read_lake(config, SLOT)
    assert [(t.name, t.lake_name, t.rows) for t in tables] == [
        ("My Schema.Orders", "cdc_0_my_220_schema.0_orders", 1)
    ]
