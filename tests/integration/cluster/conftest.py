"""One Spark standalone cluster (master + two one-core workers) for every cluster test of the session.

Each cluster test submits its jobs in client mode with ``spark-submit``, exactly as the operators
do, so the JVM start-ups are the jobs' own; the daemons start once (about 15 s here).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_postgres_cdc.testing import SparkStandaloneCluster


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkStandaloneCluster]:
    with SparkStandaloneCluster(workers=2, cores_per_worker=1, memory_per_worker="1g") as cluster:
        yield cluster
