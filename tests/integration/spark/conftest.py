"""One in-process local Spark session with Iceberg for the apply job's tests (2 cores: keep it small)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_pglogical.formats.lake import LakeConfig, local_lake
from airflow_provider_pglogical.spark.session import local_session, register_lake


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("pglogical-apply-tests")
    yield session
    session.stop()


@pytest.fixture
def lake_config(spark: SparkSession, tmp_path: Path) -> LakeConfig:
    """A fresh SQLite-catalog lake per test, under its own catalog name in the shared session."""
    root = tmp_path / "lake"
    root.mkdir()
    config = local_lake(str(root), catalog=f"lake_{uuid.uuid4().hex[:8]}")
    register_lake(spark, config)
    return config
