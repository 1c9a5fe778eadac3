"""How a SQL commit of the jobs carries its summary keys: chosen once per job by the Iceberg runtime.

Iceberg 1.11 and later take a commit's summary keys from the session's
``spark.sql.iceberg.snapshot-property.<key>`` settings, which a Spark Connect client can set;
earlier runtimes (Spark 3.5's) take them only through ``CommitMetadata`` in the driver's JVM, so
only in a spark-submit driver. ``DataFrameWriterV2`` writes take them as write options on both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import IcebergRuntimeError
from airflow_provider_postgres_cdc.formats.lake import SESSION_PROPERTIES_SINCE
from airflow_provider_postgres_cdc.spark.runtime import iceberg_version, is_connect

SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."


class SummaryWriter(Protocol):
    """Runs a SQL statement whose commit carries a summary (``MERGE INTO``, ``CREATE TABLE AS``)."""

    def __call__(self, spark: SparkSession, summary: Mapping[str, str], statement: str) -> None: ...


def _session_properties(spark: SparkSession, summary: Mapping[str, str], statement: str) -> None:
    """Set the summary as the session's snapshot properties for the statement, then clear them.

    Session settings are seen by every commit of the session while set: the job gives each
    table's thread a session of its own (``spark/table_runs.py``), and clears them at once.
    """
    keys = [SNAPSHOT_PROPERTY + key for key in summary]
    for key, value in summary.items():
        spark.conf.set(SNAPSHOT_PROPERTY + key, value)
    try:
        spark.sql(statement)
    finally:
        for key in keys:
            spark.conf.unset(key)


class _Call:
    """A ``java.util.concurrent.Callable`` running a Python function (py4j callback)."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.error: BaseException | None = None

    def call(self) -> int:
        try:
            self.fn()
        except BaseException as exc:  # re-raised on the Python side with its own type
            self.error = exc
        return 0

    class Java:
        implements = ["java.util.concurrent.Callable"]


def _commit_metadata(spark: SparkSession, summary: Mapping[str, str], statement: str) -> None:
    """Run the statement inside Iceberg's ``CommitMetadata.withCommitProperties`` (a thread-local
    in the driver's JVM): how runtimes before 1.11 take summary keys on a SQL commit."""
    from pyspark.java_gateway import ensure_callback_server_started

    jvm: Any = spark._jvm
    props = jvm.java.util.HashMap()
    for key, value in summary.items():
        props.put(key, value)
    ensure_callback_server_started(spark.sparkContext._gateway)  # type: ignore[no-untyped-call]
    call = _Call(lambda: spark.sql(statement))
    error_class = jvm.java.lang.Class.forName("java.lang.RuntimeException")
    jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(props, call, error_class)
    if call.error is not None:
        raise call.error


def summary_writer(spark: SparkSession, catalog: str) -> SummaryWriter:
    """How this job's SQL commits carry their summary, by the catalog's Iceberg runtime."""
    version = iceberg_version(spark, catalog)
    if version >= SESSION_PROPERTIES_SINCE:
        return _session_properties
    if is_connect(spark):
        wanted = ".".join(map(str, SESSION_PROPERTIES_SINCE))
        raise IcebergRuntimeError(
            f"the Spark Connect server runs Iceberg {'.'.join(map(str, version))}; the jobs need Iceberg "
            f"{wanted} or later on a Connect server (Spark 4.1: org.apache.iceberg:iceberg-spark-runtime-"
            "4.1_2.13:1.12.0), or a spark connection that spark-submits"
        )
    return _commit_metadata
