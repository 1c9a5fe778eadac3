"""Shared by the end-to-end tests: the apply job as the operator submits it, a Spark session for checks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_pglogical.spark import APPLY_JOB_PATH


@contextmanager
def local_spark() -> Iterator[SparkSession]:
    """A SparkSession for checking the lake, started only once the pipeline has run (JVMs are heavy)."""
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pglogical-e2e-verify")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()


def spark_apply(manifest_uri: str, target: Path, tables: str = "") -> None:
    """The apply job exactly as the operator submits it, optionally for some tables only."""
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))
    args = [
        spark_submit,
        "--master",
        "local[2]",
        APPLY_JOB_PATH,
        "--manifest",
        manifest_uri,
        "--target",
        str(target),
    ]
    if tables:
        args += ["--tables", tables]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
