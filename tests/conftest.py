"""Shared fixtures: one throwaway PostgreSQL cluster per test session, a fresh database per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_pglogical.testing import PostgresCluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """The session's logical-replication-ready cluster (wal_level=logical)."""
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
def pg_dbname(pg_cluster: PostgresCluster) -> Iterator[str]:
    """A fresh database for one test, dropped afterwards together with its slots."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    pg_cluster.create_database(name)
    yield name
    pg_cluster.drop_database(name)


@pytest.fixture
def pg_dsn(pg_cluster: PostgresCluster, pg_dbname: str) -> str:
    """libpq DSN of the test's fresh database."""
    return pg_cluster.dsn(pg_dbname)
