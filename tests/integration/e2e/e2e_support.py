"""Shared by the end-to-end tests: an Airflow home for the example DAGs and their run conf, the apply
job as the operator submits it, and the lake read back."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION
from airflow_provider_postgres_cdc.engine.lake_catalog import (
    load_table,
    open_catalog,
    owned_tables,
    table_state,
)
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, TableState, local_lake
from airflow_provider_postgres_cdc.formats.layout import table_dir_name
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.spark import APPLY_JOB_PATH, job_py_files, local_jars
from airflow_provider_postgres_cdc.testing import AirflowSandbox

DAGS = Path(__file__).resolve().parents[3] / "dags_examples"
# local[2] for the Spark provider: unencoded brackets in a connection URI make it fall back to yarn.
SPARK_LOCAL = "spark://local%5B2%5D"


def make_lake(root: Path) -> tuple[LakeConfig, str]:
    """A local lake under ``root`` and its Airflow connection (JSON form)."""
    root.mkdir(parents=True, exist_ok=True)
    lake = local_lake(str(root))
    return lake, connection_json(lake)


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
    manifest_uri: str, lake: LakeConfig, scratch: str, tables: str = ""
) -> tuple[list[str], dict[str, str]]:
    """(arguments, environment) of the apply job as the operator submits it; py-files go to ``scratch``."""
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
    for key, value in lake.spark_conf().items():
        args += ["--conf", f"{key}={value}"]
    args += [APPLY_JOB_PATH, "--manifest", manifest_uri, "--catalog", lake.catalog]
    if tables:
        args += ["--tables", tables]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return args, env


def spark_apply(manifest_uri: str, lake: LakeConfig, tables: str = "") -> None:
    """The apply job exactly as the operator submits it, optionally for some tables only."""
    with tempfile.TemporaryDirectory() as scratch:
        args, env = spark_submit_command(manifest_uri, lake, scratch, tables)
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
    catalog = open_catalog(lake)
    total = 0
    for qualified in tables:
        schema, table = qualified.split(".")
        staged = sum(
            pq.ParquetFile(part).metadata.num_rows
            for d in batch_dirs
            for part in (d / table_dir_name(schema, table)).glob("*.parquet")
        )
        changelog = (
            catalog.load_table(lake.changelog_identifier(schema, table))
            .scan(selected_fields=("_pgl_commit_lsn", "_pgl_seq"))
            .to_arrow()
        )
        assert changelog.num_rows == staged, qualified
        counts = Counter(zip(*changelog.to_pydict().values(), strict=True))
        assert max(counts.values(), default=1) == 1, qualified
        total += staged
    return total
