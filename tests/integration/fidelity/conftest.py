"""The fidelity test's Spark session: one local Iceberg session for every seed (2 cores: keep it small)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_pglogical.spark.session import local_session

# --import-mode=importlib keeps test directories off sys.path; the test imports its helpers by name.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("pglogical-fidelity-tests")
    yield session
    session.stop()
