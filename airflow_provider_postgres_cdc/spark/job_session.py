"""The session a Spark job runs in: spark-submit's, or a Spark Connect server's for one run.

Under spark-submit the session exists already, configured by ``--conf`` and the properties file.
Run as a Spark Connect client (the operators do so when their Spark connection is a
``spark_connect`` one), the process has pyspark's ``SPARK_REMOTE`` set to the server's ``sc://``
URL, so ``getOrCreate()`` opens a new session on that server; the settings spark-submit would
have been given (the lake's catalog, the staging store's ``s3a`` settings, the job's own) are in a
private JSON file named by ``POSTGRES_CDC_SESSION_CONF``, which is set on the session before the
job reads anything. The file is the operator's: it deletes it when the job has ended.

Imports nothing of py4j, which Spark Connect's client (``pyspark-client``) does not have.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.spark.runtime import is_connect

SESSION_CONF_ENV = "POSTGRES_CDC_SESSION_CONF"
"""The environment variable naming the JSON file of the run's session settings (``{key: value}``)."""
# pyspark 4 logs every error that carries a query context at ERROR, with the JVM's stack trace, when
# the error is made: a table the job probes for and does not find would fill the task log. The job
# reports its own failures (spark/job.py).
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
# What the server answers for a setting only its start can set (a static SQL setting, a core one).
_SERVER_START_ONLY = ("CANNOT_MODIFY_STATIC_CONFIG", "CANNOT_MODIFY_CONFIG")
_exit = os._exit  # how the SIGTERM handler ends the process (a test replaces it)


def job_session(app_name: str) -> SparkSession:
    """The job's session, with the settings of ``POSTGRES_CDC_SESSION_CONF`` set on it when named.

    On a Spark Connect session, SIGTERM (the operator's ``on_kill``) interrupts every operation the
    session runs on the server before the process exits with status 143. pyspark 4's logging of
    each error as it is made (with the JVM's stack trace, even for a table the job only probes
    for) is silenced: the job reports its own failures.
    """
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    _quiet_query_context_logs()
    path = os.environ.get(SESSION_CONF_ENV)
    if path:
        with open(path, encoding="utf-8") as handle:
            settings: dict[str, str] = json.load(handle)
        for key, value in settings.items():
            _set(spark, app_name, key, str(value))
    if is_connect(spark):
        # The interpreter's last garbage collection finalizes gRPC objects whose finalizers can wait
        # forever for a lock (the process hung at exit after the job had ended): leave them to the OS.
        atexit.register(gc.disable)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupt_on_term(spark, app_name))
    return spark


def _quiet_query_context_logs() -> None:
    """Silence pyspark 4's logging of each error as it is made (pyspark 3.5 has none)."""
    with contextlib.suppress(ImportError):
        from pyspark.logger import PySparkLogger

        for name in _QUERY_CONTEXT_LOGGERS:
            PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def _set(spark: SparkSession, app_name: str, key: str, value: str) -> None:
    """Set one setting; one that only the server's start can set is left to the server, with a warning."""
    try:
        spark.conf.set(key, value)
    except Exception as exc:
        if not any(code in str(exc) for code in _SERVER_START_ONLY):
            raise
        print(
            f"{app_name}: warning: the Spark server keeps its own {key}: it is set when the server "
            "starts, not per session",
            file=sys.stderr,
        )


def _interrupt_on_term(spark: SparkSession, app_name: str) -> Callable[[int, FrameType | None], None]:
    """A SIGTERM handler that cancels the session's server-side operations, releases the session,
    and ends the process with 143 at once, without the interpreter's shutdown (which can hang in
    gRPC's finalizers)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        try:
            cancelled = spark.interruptAll()
            said = f"{len(cancelled)} operation(s) on the server interrupted"
        except Exception as exc:  # the server may be gone as well
            said = f"interrupting the server's operations failed: {exc}"
        with contextlib.suppress(Exception):
            spark.stop()
        print(f"{app_name}: terminated; {said}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        _exit(128 + signum)

    return interrupt
