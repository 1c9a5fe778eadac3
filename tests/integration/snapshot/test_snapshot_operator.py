"""PostgresCdcSnapshotOperator with both copy engines: same manifest, same staged data."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import urlparse

import pytest

from airflow_provider_postgres_cdc.formats.manifest import is_sibling
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.snapshot.snapshot_helpers import load_manifest, sorted_rows, staged_table
from tests.spark_lines import ALSO_ON_SPARK_41, SparkLine

pytestmark = pytest.mark.integration

PASSWORD = "n0t-in-any-log"


@pytest.fixture
def source(pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database with filtered, column-listed, partitioned and keyless tables; its connection id."""
    pg_cluster.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10, 2), region text, note text, "
        "  placed timestamptz, local_ts timestamp, day date, ok bool, ratio float8, small int2, big int8, "
        "  raw bytea, doc jsonb, exact numeric, r real, code char(5), addr inet);"
        "INSERT INTO orders SELECT g, g * 1.25, (ARRAY['eu', 'us'])[g % 2 + 1], "
        "  CASE WHEN g % 7 = 0 THEN NULL WHEN g % 7 = 1 THEN '' ELSE 'n,\"' || g || E'\\n' END, "
        "  timestamptz '2024-03-01 12:00:00.123456+02' + g * interval '1 hour', "
        "  timestamp '2024-03-01 00:00:00' + g * interval '1 second', date '2024-01-01' + g, g % 3 = 0, "
        "  CASE WHEN g % 50 = 0 THEN 'Infinity'::float8 WHEN g % 51 = 0 THEN 'NaN' "
        "    WHEN g % 52 = 0 THEN '-Infinity' ELSE g / 3.0 END, g % 1000, g * 1000000000::int8, "
        "  decode(md5(g::text), 'hex'), jsonb_build_object('g', g), g / 7.0, g / 9.0, 'c' || g % 10, "
        "  ('10.0.0.' || g % 250)::inet "
        "FROM generate_series(1, 3000) g;"
        "CREATE TABLE m (id int, v text) PARTITION BY RANGE (id);"
        "CREATE TABLE m_1 PARTITION OF m FOR VALUES FROM (0) TO (500);"
        "CREATE TABLE m_2 PARTITION OF m FOR VALUES FROM (500) TO (5000);"
        "INSERT INTO m SELECT g, 'v' || g FROM generate_series(1, 2000) g;"
        "CREATE TABLE nothing (id int PRIMARY KEY, at timestamptz);"
        "CREATE PUBLICATION pub FOR TABLE orders (id, amount, region, note, placed, local_ts, day, ok, "
        "  ratio, small, big, raw, doc, exact, r, code, addr) WHERE (region = 'eu' OR amount < 100), "
        "  m, nothing "
        "  WITH (publish = 'insert', publish_via_partition_root = true);",
        pg_dbname,
    )
    pg_cluster.execute(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
    uri = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{pg_cluster.port}/{pg_dbname}"
    monkeypatch.setenv("AIRFLOW_CONN_PGL_SNAPSHOT", uri)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", "spark://local%5B2%5D")
    return "pgl_snapshot"


def _operator(conn_id: str, slot: str, staging: Path, **kwargs: object) -> PostgresCdcSnapshotOperator:
    return PostgresCdcSnapshotOperator(
        task_id=f"snapshot_{slot}",
        slot_name=slot,
        publications="pub",
        staging=str(staging),
        postgres_conn_id=conn_id,
        spark_conn_id="spark_local",
        spark_conf={"spark.ui.enabled": "false", "spark.driver.memory": "1g"},
        **kwargs,  # type: ignore[arg-type]
    )


def test_operator_stages_the_snapshot_and_returns_a_small_summary(
    source: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    summary = _operator(source, "op_local", tmp_path).execute({})  # type: ignore[arg-type]
    manifest_path = urlparse(summary["manifest"]).path
    manifest = load_manifest(manifest_path)
    assert summary["consistent_point"] == str(manifest.start_lsn)
    assert summary["rows"] == manifest.total_rows and summary["tables"] == 3
    assert summary["tables_without_key"] == ["public.m"]
    assert PASSWORD not in repr(summary) and PASSWORD not in caplog.text
    assert PASSWORD not in Path(manifest_path).read_text(encoding="utf-8")


def test_operator_refuses_an_unknown_engine_without_touching_the_server(source: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="copy_engine"):
        _operator(source, "op_bad", tmp_path, copy_engine="duckdb").execute({})  # type: ignore[arg-type]


@pytest.mark.spark
@ALSO_ON_SPARK_41
def test_spark_engine_stages_the_same_manifest_and_data_as_the_local_engine(
    source: str,
    spark_line: SparkLine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    # As a worker deploys another Spark: its spark-submit named, its Python (pyspark alone) for the
    # job, which sees nothing of this checkout but what the operator ships.
    for key, value in spark_line.submit_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    local = _operator(source, "eng_local", tmp_path, min_range_bytes=16 * 1024).execute({})  # type: ignore[arg-type]
    engine = {"copy_engine": "spark", "spark_binary": str(spark_line.spark_submit)}
    spark = _operator(source, "eng_spark", tmp_path, min_range_bytes=16 * 1024, **engine).execute({})  # type: ignore[arg-type]
    local_path, spark_path = urlparse(local["manifest"]).path, urlparse(spark["manifest"]).path
    local_manifest, spark_manifest = load_manifest(local_path), load_manifest(spark_path)
    assert PASSWORD not in caplog.text
    assert f"Running Spark version {spark_line.name}." in capsys.readouterr().out  # the hook's log of the job
    for mine in local_manifest.tables:
        theirs = spark_manifest.table(mine.schema, mine.table)
        # The Spark engine writes a sibling for every date/timestamp/decimal column; where nothing
        # overflows it is all NULL, which is what its absence means (docs/TYPES.md).
        extra = [c.name for c in theirs.columns if is_sibling(c.name) and c not in mine.columns]
        assert tuple(c for c in theirs.columns if c.name not in extra) == mine.columns
        assert (theirs.key_columns, theirs.row_filter, theirs.column_list, theirs.rows) == (
            mine.key_columns, mine.row_filter, mine.column_list, mine.rows,
        )  # fmt: skip
        if mine.table != "nothing":
            assert len(theirs.files) > 1, "tables are read in several ctid ranges"
        assert all(os.path.basename(f).startswith("part-") for f in theirs.files)
        local_rows, spark_rows = staged_table(local_path, mine), staged_table(spark_path, theirs)
        assert all(spark_rows.column(name).null_count == spark_rows.num_rows for name in extra)
        spark_rows = spark_rows.drop_columns(extra)
        assert spark_rows.schema.remove_metadata() == local_rows.schema
        assert sorted_rows(spark_rows) == sorted_rows(local_rows)
    orders = staged_table(spark_path, spark_manifest.table("public", "orders"))
    assert orders.column("code")[0].as_py() in {f"c{i}   " for i in range(10)}  # bpchar keeps its padding
    assert "/" not in orders.column("addr")[0].as_py()
    assert spark_manifest.table("public", "nothing").rows == 0
    assert {t.qualified for t in spark_manifest.tables} == {"public.orders", "public.m", "public.nothing"}
    assert sorted(os.listdir(os.path.dirname(spark_path))) == [
        "_manifest.json", "public.m", "public.nothing", "public.orders",
    ]  # fmt: skip
    assert sorted(os.listdir(os.path.join(os.path.dirname(spark_path), "public.m"))) == sorted(
        os.path.basename(f) for f in spark_manifest.table("public", "m").files
    )
