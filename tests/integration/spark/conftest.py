"""A fresh lake per apply-job test in the shared Spark session (``spark``: tests/integration/conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.spark.runtime import is_connect
from airflow_provider_postgres_cdc.spark.session import register_lake


@pytest.fixture
def lake_config(spark: SparkSession, tmp_path: Path) -> LakeConfig:
    """A fresh SQLite-catalog lake per test, under its own catalog name in the shared session."""
    root = tmp_path / "lake"
    root.mkdir()
    config = local_lake(str(root), catalog=f"lake_{uuid.uuid4().hex[:8]}")
    if is_connect(spark):  # no JVM here to make the SQLite catalog's tables: pyiceberg makes them
        open_catalog(config)
    register_lake(spark, config)
    return config
