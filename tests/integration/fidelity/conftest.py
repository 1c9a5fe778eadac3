"""The fidelity test's Spark session: one local Iceberg session for every seed (2 cores: keep it small)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from airflow_provider_pglogical.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("pglogical-fidelity-tests")
    yield session
    session.stop()
