"""Markers by place: every test under tests/integration/ needs a real server, so none can forget to say so.

``-m "not integration"`` then selects exactly tests/unit/ (tests/unit/test_markers.py checks it).
Also the one in-process Spark session every integration directory shares.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.spark.session import local_session

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``integration`` on each test here, ``spark`` if it uses the Spark session, ``airflow`` in airflow/."""
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.integration)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        if item.path.is_relative_to(HERE / "airflow"):
            item.add_marker(pytest.mark.airflow)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Iceberg session for the whole run (2 cores: keep it small; its start costs ~10 s),
    or, with pyspark's ``SPARK_REMOTE`` set, a client session of that Spark Connect server.

    Each test registers its own lake under its own catalog name (``register_lake``), so sharing it
    shares no tables.
    """
    remote = os.environ.get("SPARK_REMOTE")
    session = (
        SparkSession.builder.remote(remote).getOrCreate() if remote else local_session("postgres-cdc-tests")
    )
    yield session
    session.stop()
