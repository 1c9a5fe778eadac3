"""Local Spark sessions with the Iceberg runtime, for the demo, the tests and the benchmarks.

Production jobs get their session from spark-submit with the lake's ``--conf``; a session made
here registers lakes at run time instead (Spark loads a catalog on first use, so a catalog
configured after the session started works as long as nothing has touched it yet).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats.lake import SPARK_EXTENSIONS, LakeConfig
from airflow_provider_postgres_cdc.spark import local_jars
from airflow_provider_postgres_cdc.spark.runtime import is_connect
from airflow_provider_postgres_cdc.spark.sqlite_catalog import create_catalog_tables


def local_session(app_name: str, *, cores: int = 2) -> SparkSession:
    """A small local session with the Iceberg SQL extensions and ``POSTGRES_CDC_SPARK_JARS`` loaded."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.jars", local_jars())
        .config("spark.sql.extensions", SPARK_EXTENSIONS)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", str(cores))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def register_lake(spark: SparkSession, config: LakeConfig) -> None:
    """Make ``config``'s catalog known to a running session (before anything uses that name).

    A Spark Connect session has no JVM here to make a SQLite catalog's tables: open the catalog
    with pyiceberg first (``engine/lake_catalog.open_catalog``), which makes them.
    """
    for key, value in config.spark_conf().items():
        if key != "spark.sql.extensions":
            spark.conf.set(key, value)
    if not is_connect(spark):
        create_catalog_tables(spark, config.catalog)
