"""The command-line frame every Spark job of the package shares: arguments, session, exit status.

Exit status 0 on success (the job's JSON lines on stdout), 2 on an error a user must act on (a
:class:`PgLogicalError`: message on stderr), 1 on anything unexpected (traceback on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import SparkSession

from airflow_provider_pglogical.errors import PgLogicalError
from airflow_provider_pglogical.formats.lake import LakeConfig

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
    spark = SparkSession.builder.appName(parser.prog).getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        config = LakeConfig(catalog=args.catalog, namespace_prefix=args.namespace_prefix)
        for line in body(spark, config, args):
            print(json.dumps(line))
        return 0
    except PgLogicalError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        print(f"{parser.prog}: unexpected failure:\n{traceback.format_exc()}", file=sys.stderr)
        return 1
    finally:
        if started_here:
            spark.stop()
