"""The apply job, submitted as the operator submits it, writes a "portable" lake on SeaweedFS's REST catalog.

The job learns the lake's name rule from the Spark properties the lake's ``spark_conf`` gives
(``spark.postgres_cdc.lakeNames``); under "preserve" SeaweedFS would refuse every table here at
its first CREATE. pyiceberg then reads the job's tables back to their source names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.spark import APPLY_JOB_PATH, job_py_files, local_jars
from airflow_provider_postgres_cdc.testing import S3Server
from tests.integration.spark.spark_staging import Stager, TableDef, ins

COLUMNS = [("id", pa.int64()), ("Name", pa.string())]
TABLES = [
    TableDef("My Schema", "Orders", COLUMNS, ["id"]),
    TableDef("Sales", "orders", COLUMNS, ["id"]),
    TableDef("sales", "orders", COLUMNS, ["id"]),
    TableDef("public", "Prix €", COLUMNS, ["id"]),
]
SNAP = 0x1000_0000


def _submit(lake: LakeConfig, manifest: str) -> list[tuple[str, str]]:
    """Run the apply job with spark-submit; (table, status) of each table it reports."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYSPARK_PYTHON": sys.executable}
    confs = [arg for key, value in lake.spark_conf().items() for arg in ("--conf", f"{key}={value}")]
    with tempfile.TemporaryDirectory() as zipdir:
        command = [
            f"{bin_dir}/spark-submit", "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.ui.enabled=false", "--py-files", job_py_files(zipdir), "--jars", local_jars(),
            *confs, APPLY_JOB_PATH, "--manifest", manifest, "--catalog", lake.catalog,
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"manifest"'))
    return [(t["table"], t["status"]) for t in summary["tables"]]


@pytest.mark.spark
def test_the_apply_job_names_tables_portably_and_pyiceberg_reads_them_back(tmp_path: Path) -> None:
    assert "iceberg-aws-bundle" in local_jars(), "POSTGRES_CDC_SPARK_JARS must hold the Iceberg AWS bundle"
    stager = Stager(tmp_path / "staging")
    snapshot = stager.snapshot(SNAP, [(t, [{"id": 1, "Name": "a"}, {"id": 2, "Name": "b"}]) for t in TABLES])
    batch = stager.batch(SNAP, SNAP + 300, [(t, [[ins(SNAP + 100, 0, id=3, Name="c")]]) for t in TABLES])
    with S3Server(buckets=["staging"], iceberg_rest=True, table_buckets=["lake"]) as s3:
        lake = LakeConfig(properties=s3.rest_catalog_properties("lake"), names="portable")
        assert {status for _, status in _submit(lake, snapshot)} == {"loaded"}
        assert {status for _, status in _submit(lake, batch)} == {"applied"}  # and each changelog

        catalog = open_catalog(lake)
        listed = [ident for (ns,) in catalog.list_namespaces() for ident in catalog.list_tables(ns)]
        index = lake_index.index_identifier(lake, stager.slot)
        assert index in listed  # the pipeline's index of its tables, named by the same rule
        sources = [lake.source_of(*identifier) for identifier in listed if identifier != index]
        assert sorted(s for s in sources if s is not None) == sorted((t.schema, t.table) for t in TABLES)
        assert sources.count(None) == len(TABLES)  # the changelogs
        for tdef in TABLES:
            rows = catalog.load_table(lake.identifier(tdef.schema, tdef.table)).scan().to_arrow()
            assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
                {"id": 1, "Name": "a"}, {"id": 2, "Name": "b"}, {"id": 3, "Name": "c"},
            ], tdef  # fmt: skip
