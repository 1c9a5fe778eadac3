"""Shared by the end-to-end tests: an Airflow home for the example DAGs and their run conf, the apply
job as the operator submits it, and the lake read back."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION
from airflow_provider_postgres_cdc.engine.lake_catalog import (
    load_table,
    open_catalog,
    owned_tables,
    table_state,
)
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.spark_conf import submit_settings
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, TableState, local_lake
from airflow_provider_postgres_cdc.formats.layout import is_part_file, parse_table_dir_name, table_dir_name
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.spark import APPLY_JOB_PATH, job_py_files, local_jars
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import AirflowSandbox

DAGS = Path(__file__).resolve().parents[3] / "dags_examples"
# local[2] for the Spark provider: unencoded brackets in a connection URI make it fall back to yarn.
SPARK_LOCAL = "spark://local%5B2%5D"


def make_lake(root: Path) -> tuple[LakeConfig, str]:
    """A local lake under ``root`` and its Airflow connection (JSON form)."""
    root.mkdir(parents=True, exist_ok=True)
    lake = local_lake(str(root))
    return lake, connection_json(lake)


def session_lake(spark: SparkSession, root: Path, catalog: str) -> LakeConfig:
    """A local lake under ``root``, registered in the shared Spark session under a catalog name of
    its own (Spark keeps a catalog per name: two tests' lakes must not share one)."""
    root.mkdir(parents=True, exist_ok=True)
    lake = local_lake(str(root), catalog=catalog)
    register_lake(spark, lake)
    return lake


def load_initial_snapshot(spark: SparkSession, lake: LakeConfig, dsn: str, slot: str, staging: str) -> None:
    """The initial snapshot of ``slot`` taken and loaded in the shared Spark session, for tests that
    start from a loaded pipeline (the snapshot DAG is the end-to-end tests' that are about it)."""
    snapshot, _ = take_snapshot(dsn, slot, [PUBLICATION], staging)
    apply_manifest(spark, snapshot, lake)


def pipeline_sandbox(
    home: Path,
    source_uri: str,
    lake_conn: str,
    *,
    source_conn_id: str = "shop",
    dags: Path = DAGS,
    connections: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> AirflowSandbox:
    """An Airflow home for the example DAGs with one pipeline's connections: the source (as
    ``source_conn_id``), local Spark (``spark_local``) and the lake (``lake``), plus ``connections``."""
    pipeline = {source_conn_id: source_uri, "spark_local": SPARK_LOCAL, "lake": lake_conn}
    return AirflowSandbox(home, dags, connections={**pipeline, **(connections or {})}, env=env)


def pipeline_conf(
    slot: str, staging: Path | str, *, conn_id: str = "shop", publication: str = PUBLICATION
) -> dict[str, Any]:
    """The example DAGs' run conf for one pipeline, naming :func:`pipeline_sandbox`'s connections."""
    return {
        "postgres_conn_id": conn_id, "publications": publication, "slot_name": slot, "staging": str(staging),
        "lake_conn_id": "lake", "spark_conn_id": "spark_local",
    }  # fmt: skip


def spark_submit_command(
    manifest_uri: str, lake: LakeConfig, scratch: str, tables: str = "", staging: S3Options | None = None
) -> tuple[list[str], dict[str, str]]:
    """(arguments, environment) of the apply job as the operator submits it; py-files and the secrets'
    properties file go to ``scratch``; ``staging`` is an ``s3://`` staging store's connection."""
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))
    args = [
        spark_submit,
        "--master",
        "local[2]",
        "--py-files",
        job_py_files(scratch),
        "--jars",
        local_jars(),
    ]
    bucket = manifest_uri.split("://", 1)[1].split("/", 1)[0] if "://" in manifest_uri else ""
    hadoop = staging.spark_hadoop_conf(bucket) if staging is not None else {}
    conf, properties_file = submit_settings({**lake.spark_conf(), **hadoop}, scratch)
    if properties_file:
        args += ["--properties-file", properties_file]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args += [APPLY_JOB_PATH, "--manifest", manifest_uri, "--catalog", lake.catalog]
    if tables:
        args += ["--tables", tables]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return args, env


def spark_apply(
    manifest_uri: str, lake: LakeConfig, tables: str = "", staging: S3Options | None = None
) -> None:
    """The apply job exactly as the operator submits it, optionally for some tables only."""
    with tempfile.TemporaryDirectory() as scratch:
        args, env = spark_submit_command(manifest_uri, lake, scratch, tables, staging)
        result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def lake_state(lake: LakeConfig, qualified: str) -> TableState:
    """A lake table's pipeline state, read with pyiceberg from its snapshot summaries."""
    schema, table = qualified.split(".", 1)
    loaded = load_table(open_catalog(lake), lake, schema, table)
    state = table_state(loaded) if loaded is not None else None
    assert state is not None, f"{qualified} has no pipeline commit"
    return state


def lake_snapshots(lake: LakeConfig, slot: str) -> dict[str, int | None]:
    """The current snapshot of every pipeline table: equal before and after means nothing was written."""
    snapshots: dict[str, int | None] = {}
    for table in owned_tables(open_catalog(lake), lake, slot):
        current = table.current_snapshot()
        snapshots[".".join(table.name()[-2:])] = current.snapshot_id if current is not None else None
    return snapshots


def assert_changelog_exactly_once(lake: LakeConfig, batch_dirs: Sequence[Path], tables: Sequence[str]) -> int:
    """Every change staged in ``batch_dirs`` is in its table's changelog exactly once; returns the count.

    Whatever the crashes repeated (an apply re-run, a retried drain), the changelog holds each
    staged change once: as many rows as were staged, no ``(commit LSN, sequence)`` twice.
    """
    staged = {}
    for qualified in tables:
        schema, table = qualified.split(".")
        staged[qualified] = sum(
            pq.ParquetFile(part).metadata.num_rows
            for d in batch_dirs
            for part in (d / table_dir_name(schema, table)).glob("*.parquet")
        )
    return assert_changelog_holds(lake, staged)


def staged_changes(filesystem: pafs.FileSystem, slot_root: str) -> Counter[str]:
    """The changes staged in every batch under ``slot_root`` (``bucket/prefix/<slot>``) of any store,
    by ``schema.table``."""
    counts: Counter[str] = Counter()
    for info in filesystem.get_file_info(pafs.FileSelector(slot_root, recursive=True)):
        parts = info.path[len(slot_root) :].strip("/").split("/")
        if len(parts) == 3 and parts[0].startswith("batch-") and is_part_file(parts[2]):
            with filesystem.open_input_file(info.path) as handle:
                counts[".".join(parse_table_dir_name(parts[1]))] += pq.ParquetFile(handle).metadata.num_rows
    return counts


def assert_changelog_holds(lake: LakeConfig, staged: Mapping[str, int]) -> int:
    """Each table's changelog holds exactly its ``staged`` count of changes, none twice; returns the total."""
    catalog = open_catalog(lake)
    total = 0
    for qualified, count in staged.items():
        schema, table = qualified.split(".", 1)
        changelog = (
            catalog.load_table(lake.changelog_identifier(schema, table))
            .scan(selected_fields=("_pgl_commit_lsn", "_pgl_seq"))
            .to_arrow()
        )
        assert changelog.num_rows == count, qualified
        counts = Counter(zip(*changelog.to_pydict().values(), strict=True))
        assert max(counts.values(), default=1) == 1, qualified
        total += count
    return total


class CommandLineWatch:
    """Samples every process's command line (``/proc/<pid>/cmdline``) while the ``with`` block runs.

    ``leaks`` are the command lines that held one of ``secrets``; ``spark_submits`` and
    ``executors`` count the samples of a running spark-submit and of a standalone executor, so a
    test can tell it watched while the jobs ran, and where they ran.
    """

    def __init__(self, secrets: Sequence[str], interval: float = 0.05) -> None:
        self.secrets = [secret.encode() for secret in secrets if secret]
        self.interval = interval
        self.leaks: list[str] = []
        self.spark_submits = 0
        self.executors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes()
                except OSError:  # the process ended meanwhile
                    continue
                if b"org.apache.spark.deploy.SparkSubmit" in text:
                    self.spark_submits += 1
                if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in text:
                    self.executors += 1
                if any(secret in text for secret in self.secrets):
                    self.leaks.append(text.replace(b"\0", b" ").decode(errors="replace")[:300])


def objects_containing(filesystem: pafs.FileSystem, bucket: str, secret: bytes) -> list[str]:
    """Every object of ``bucket`` holding ``secret`` (staged Parquet, manifests, Iceberg metadata)."""
    found = []
    for info in filesystem.get_file_info(pafs.FileSelector(bucket, recursive=True)):
        if info.type == pafs.FileType.File:
            with filesystem.open_input_stream(info.path) as handle:
                if secret in handle.read():
                    found.append(info.path)
    return found


def assert_acked_end_is_the_latest_cut(dsn: str, lake: LakeConfig, slot: str, tables: Sequence[str]) -> None:
    """The slot's acknowledged position is the lake's latest consistent cut, tagged on every table."""
    from airflow_provider_postgres_cdc.engine.lake_catalog import latest_cut
    from airflow_provider_postgres_cdc.replication import connect, describe_slot

    conn = connect(dsn)
    try:
        acked = describe_slot(conn, slot).confirmed_flush_lsn
    finally:
        conn.close()
    cut = latest_cut(lake, slot)
    assert cut is not None and cut.lsn == acked
    assert set(cut.snapshots) == {lake.identifier(*t.split(".", 1)) for t in tables}


def assert_history_at_every_cut(lake: LakeConfig, tables: Sequence[str]) -> int:
    """Each table's history, read "valid at" each of its cut tags (docs/LAKE.md "History tables"),
    holds exactly the table's live rows at that tag; returns the cuts compared."""
    from airflow_provider_postgres_cdc.formats.deletes import DELETED_LSN
    from airflow_provider_postgres_cdc.formats.lake import tag_lsn

    catalog, compared = open_catalog(lake), 0

    def rows(arrow: Any, names: Sequence[str]) -> list[tuple[str, ...]]:
        """Rows as comparable tuples (``repr``: NaN equals NaN)."""
        return sorted(tuple(repr(row[n]) for n in names) for row in arrow.select(names).to_pylist())

    for qualified in tables:
        schema, name = qualified.split(".", 1)
        table = catalog.load_table(lake.identifier(schema, name))
        history = catalog.load_table(lake.history_identifier(schema, name)).scan().to_arrow()
        names = [f.name for f in table.schema().fields if not f.name.startswith("_pgl_")]
        for tag, ref in table.metadata.refs.items():
            end = tag_lsn(tag)
            if end is None:
                continue
            at_cut = table.scan(snapshot_id=ref.snapshot_id).to_arrow()
            if DELETED_LSN in at_cut.column_names:  # the live rows of a soft-deletes table
                at_cut = at_cut.filter(pc.is_null(at_cut.column(DELETED_LSN)))
            start, stop = history.column("_pgl_valid_from_lsn"), history.column("_pgl_valid_to_lsn")
            valid = pc.and_(
                pc.less(start, int(end)), pc.or_kleene(pc.is_null(stop), pc.greater_equal(stop, int(end)))
            )
            assert rows(history.filter(valid), names) == rows(at_cut, names), f"{qualified} at {tag}"
            compared += 1
    return compared
