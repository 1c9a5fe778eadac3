"""The command-line frame every Spark job of the package shares: arguments, session, exit status.

Exit status 0 on success (the job's JSON lines on stdout), 2 on an error a user must act on (a
:class:`PostgresCdcError`, or a failure of the lake's catalog or object store that
``lake_failures`` recognises: its class and message on stderr), 1 on anything unexpected
(traceback on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, cast

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.errors import IcebergRuntimeError, PostgresCdcError
from airflow_provider_postgres_cdc.formats.lake import (
    NAMES_CONF,
    LakeConfig,
    NameRule,
    iceberg_runtime_problem,
)
from airflow_provider_postgres_cdc.spark.changes import CHECKPOINT_DIR_CONF
from airflow_provider_postgres_cdc.spark.job_session import job_session
from airflow_provider_postgres_cdc.spark.lake_failures import JobLake, java_text, lake_failure
from airflow_provider_postgres_cdc.spark.runtime import SPARK_ERRORS, iceberg_version, is_connect
from airflow_provider_postgres_cdc.spark.sqlite_catalog import create_catalog_tables
from airflow_provider_postgres_cdc.spark.staged import base_dir

JobBody = Callable[[SparkSession, LakeConfig, argparse.Namespace], list[dict[str, Any]]]


def job_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the lake's arguments, which every job takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--catalog", required=True, help="the Spark catalog name of the Iceberg lake")
    parser.add_argument("--namespace-prefix", default="", help="prefix of the lake namespaces (default none)")
    return parser


def run_job(parser: argparse.ArgumentParser, body: JobBody, argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run ``body`` in the session spark-submit made, print its JSON lines."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started_here = SparkSession.getActiveSession() is None  # a caller's session is the caller's to stop
    spark = job_session(parser.prog)  # spark-submit's session, or a Spark Connect server's (job_session.py)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    checkpoints = _use_checkpoint_dir(spark)
    try:
        check_iceberg_runtime(spark, args.catalog)
        if not is_connect(spark):  # a Connect server's catalog tables are its operator's to create
            create_catalog_tables(spark, args.catalog)
        names = cast(NameRule, spark.conf.get(NAMES_CONF, None) or "preserve")  # LakeConfig checks it
        config = LakeConfig(catalog=args.catalog, namespace_prefix=args.namespace_prefix, names=names)
        for line in body(spark, config, args):
            print(json.dumps(line))
        return 0
    except PostgresCdcError as exc:
        return _user_error(parser.prog, exc)
    except Exception as exc:
        failure = lake_failure(java_text(exc), job_lake(spark, args))
        if failure is not None:
            return _user_error(parser.prog, failure)
        print(f"{parser.prog}: unexpected failure:\n{traceback.format_exc()}", file=sys.stderr)
        return 1
    finally:
        if checkpoints is not None:
            _delete(spark, checkpoints)
        if started_here:
            spark.stop()


def _user_error(prog: str, exc: PostgresCdcError) -> int:
    """Print an error the user must act on, named by its class (README "Troubleshooting"): status 2."""
    print(f"{prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2


def job_lake(spark: SparkSession, args: argparse.Namespace) -> JobLake:
    """Where the job writes and reads, as its messages name it: the catalog's uri and warehouse,
    and the directory of the manifest it applies (for the jobs that take one)."""
    prefix = f"spark.sql.catalog.{args.catalog}"
    manifest = str(getattr(args, "manifest", "") or "")
    return JobLake(
        catalog=args.catalog,
        catalog_uri=spark.conf.get(f"{prefix}.uri", "") or "",
        warehouse=spark.conf.get(f"{prefix}.warehouse", "") or "",
        staging=base_dir(manifest) if manifest else "",
    )


def check_iceberg_runtime(spark: SparkSession, catalog: str) -> None:
    """Stop with :class:`IcebergRuntimeError`, naming the artifact to pass, unless the job's classpath
    holds Iceberg's Spark runtime built for this Spark and Scala (a wrong one fails deep inside a
    MERGE, with an ``AbstractMethodError`` or ``NoSuchMethodError``). A Connect server is asked
    for its Iceberg runtime's version instead (``spark/commit_summaries.py`` says which it needs)."""
    if is_connect(spark):
        try:
            iceberg_version(spark, catalog)
        except SPARK_ERRORS as exc:
            raise IcebergRuntimeError(
                f"the Spark Connect server (Spark {spark.version}) answers no Iceberg runtime for catalog "
                f"{catalog!r} ({java_text(exc).splitlines()[0][:300]}): start it with the Iceberg Spark "
                "runtime on --jars and spark.sql.extensions="
                "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions (docs/LAKE.md)"
            ) from exc
        return
    from py4j.protocol import Py4JJavaError

    jvm: Any = spark._jvm
    scala = str(jvm.scala.util.Properties.versionNumberString())
    try:
        runtime = jvm.org.apache.spark.util.Utils.classForName(
            "org.apache.iceberg.spark.SparkCatalog", False, False
        )
        source = runtime.getProtectionDomain().getCodeSource()
        location: str | None = str(source.getLocation()) if source is not None else ""
    except Py4JJavaError:  # ClassNotFoundException
        location = None
    problem = iceberg_runtime_problem(spark.version, scala, location)
    if problem is not None:
        raise IcebergRuntimeError(problem)


def _use_checkpoint_dir(spark: SparkSession) -> str | None:
    """Reliable checkpoints under ``spark.postgres_cdc.checkpointDir`` when set (``changes.materialize``).

    Spark makes a directory of its own under it for this application; that one is returned, to be
    deleted when the job ends (the checkpoints only serve the job's own stages).
    """
    root = spark.conf.get(CHECKPOINT_DIR_CONF, "") or ""
    if not root or is_connect(spark):  # a Connect server's checkpoints are its own settings'
        return None
    context = spark.sparkContext
    context.setCheckpointDir(root)
    return context.getCheckpointDir()


def _delete(spark: SparkSession, directory: str) -> None:
    """Delete ``directory`` on whatever Hadoop file system it is (best effort: it holds only scratch)."""
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(directory)
    try:
        path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(path, True)  # type: ignore[union-attr]
    except Exception as exc:  # the job's outcome does not depend on its scratch space
        logging.getLogger(__name__).warning("could not delete checkpoint directory %s: %s", directory, exc)
