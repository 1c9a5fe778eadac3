"""How the apply job runs one step per table: several tables at once, each redone on a lost race.

Each table's step makes its own Iceberg commits, so tables are independent: they run on a bounded
pool of threads, each thread in a session of its own (a commit's summary keys are session
settings: ``spark/iceberg.py``) and, in a spark-submit driver, its Spark jobs in a scheduler pool
of its own (under ``spark.scheduler.mode=FAIR`` a large table then does not hold up the small
ones). A step that loses a commit race to another writer is redone from the new state. A table
that fails lets the others finish theirs; the run then fails with the first error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import ApplyError, ConcurrentWriteError
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest
from airflow_provider_postgres_cdc.spark.iceberg import is_conflict
from airflow_provider_postgres_cdc.spark.runtime import SPARK_ERRORS, close_fork, fork_session, is_connect

log = logging.getLogger("postgres_cdc.apply")

# Times one table is redone when another writer commits it first.
CONFLICT_ATTEMPTS = 5
_Result = TypeVar("_Result")


def run_tables(
    spark: SparkSession,
    specs: Sequence[TableManifest],
    step: Callable[[SparkSession, TableManifest], _Result],
    parallelism: int,
) -> list[_Result]:
    """``step`` for every table in its thread's session, up to ``parallelism`` at once; the results
    in ``specs``' order."""
    if parallelism < 1:
        raise ApplyError(f"--table-parallelism must be a positive number, not {parallelism}")
    sessions = threading.local()
    forks: list[SparkSession] = []

    def one(spec: TableManifest) -> _Result:
        if not hasattr(sessions, "spark"):
            sessions.spark = fork_session(spark)
            forks.append(sessions.spark)
            if not is_connect(spark):
                pool = threading.current_thread().name
                sessions.spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
        return with_retries(lambda table: step(sessions.spark, table), spec)

    try:
        with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="pgl-table") as pool:
            futures = [pool.submit(one, spec) for spec in specs]
    finally:
        for fork in forks:
            close_fork(fork)
    failures = [(spec, f.exception()) for spec, f in zip(specs, futures, strict=True) if f.exception()]
    for spec, error in failures:
        log.error("%s: failed: %s", spec.qualified, error)
    if failures:
        raise failures[0][1]  # type: ignore[misc]
    return [f.result() for f in futures]


def with_retries(step: Callable[[TableManifest], _Result], spec: TableManifest) -> _Result:
    """Run one table's step; when another writer commits first, redo it from the new state."""
    for attempt in range(1, CONFLICT_ATTEMPTS):
        try:
            return step(spec)
        except SPARK_ERRORS as exc:
            if not is_conflict(exc):
                raise
            log.warning("%s: lost a commit race; redoing it from the new state (attempt %d)",
                        spec.qualified, attempt + 1)  # fmt: skip
    try:
        return step(spec)
    except SPARK_ERRORS as exc:
        if not is_conflict(exc):
            raise
        raise ConcurrentWriteError(
            f"{spec.qualified}: another writer committed the table first {CONFLICT_ATTEMPTS} times in a "
            "row; nothing of this batch is acknowledged. Run the CDC apply and the re-snapshot loads of "
            "one lake in one Airflow pool (the task groups' pool=), then re-run this task"
        ) from exc


@contextmanager
def interpreted_if_small(spark: SparkSession, manifest: Manifest) -> Iterator[None]:
    """Evaluate a small manifest's queries without generating code for them, for the block.

    In a fresh JVM, compiling each query's generated Java costs far more than running it on a few
    thousand rows: an OLTP batch of six tables spends about 10 of its 40 s there (docs/LAKE.md).
    Above :data:`~airflow_provider_postgres_cdc.formats.manifest.SHORT_JOB_ROWS` changes (a
    snapshot: rows) compiled code pays for itself. A setting the session has already (given to
    spark-submit) wins.
    """
    settings = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
    chosen = [key for key in settings if manifest.short_job and spark.conf.get(key, None) is None]
    for key in chosen:
        spark.conf.set(key, settings[key])
    try:
        yield
    finally:
        for key in chosen:
            spark.conf.unset(key)
