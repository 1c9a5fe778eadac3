"""What Spark the job runs in: a spark-submit driver (classic) or a Spark Connect client session.

The jobs' code is the same on both; the few things that differ are decided here, once: the
errors Spark raises, how a table's thread gets a session of its own, and which Iceberg runtime
the lake's catalog runs (read by SQL, so a Connect server answers it too).
"""

from __future__ import annotations

import re
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

try:  # classic pyspark; the Connect client (pyspark-client) has no py4j
    from py4j.protocol import Py4JJavaError

    SPARK_ERRORS: tuple[type[BaseException], ...] = (PySparkException, Py4JJavaError)
except ImportError:  # pragma: no cover - depends on the installation
    SPARK_ERRORS = (PySparkException,)
"""What a failed Spark call raises: pyspark's errors, and py4j's where a classic driver lets one through."""


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def fork_session(spark: SparkSession) -> SparkSession:
    """A session of its own for the calling thread, with ``spark``'s settings and catalogs.

    Session settings are shared by every thread of a session; a table's commit sets its summary
    keys in its own session's configuration (``spark/iceberg.py``), so each table's thread gets a
    clone. A Connect clone is also made the thread's active session: pyspark binds the DataFrame a
    checkpoint returns to the active session, not to the one that made it. Stop it with
    :func:`close_fork` once the thread's work is done.
    """
    if is_connect(spark):
        clone: Any = spark.cloneSession()  # type: ignore[attr-defined]
        type(clone)._active_session.session = clone  # thread-local; the pool's threads end with the run
        return clone  # type: ignore[no-any-return]
    jsession: Any = spark._jsparkSession
    return SparkSession(spark.sparkContext, jsession.cloneSession())


def close_fork(fork: SparkSession) -> None:
    """Release a session :func:`fork_session` made: a Connect clone's server-side session and
    channel (a classic clone shares its driver, which is not this one's to stop)."""
    if is_connect(fork):  # a clone's ``stop()`` fails in pyspark 4.1: release it through its client
        client: Any = fork.client  # type: ignore[attr-defined]
        try:
            client.release_session()
        finally:
            client.close()


def iceberg_version(spark: SparkSession, catalog: str) -> tuple[int, ...]:
    """The Iceberg runtime's version, as Iceberg's own SQL function ``system.iceberg_version`` says."""
    (row,) = spark.sql(f"SELECT `{catalog.replace('`', '``')}`.system.iceberg_version()").collect()
    return tuple(int(part) for part in re.findall(r"\d+", str(row[0]))[:3])
