"""The ``pgcdc`` command: operate and debug logical replication from a terminal.

Each subcommand lives in ``airflow_provider_postgres_cdc.cli.<module>`` and registers itself;
every one connects with ``--dsn`` (a libpq connection string) or ``--postgres-conn-id`` (an
Airflow ``postgres`` connection), and exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import psycopg2

from airflow_provider_postgres_cdc.errors import PostgresCdcError

COMMAND_MODULES = ("inspect", "lag", "peek", "report")
DESCRIPTION = "pgcdc: operate and debug PostgreSQL logical replication (pgoutput) from a terminal."
EPILOG = (
    "Every command connects with --dsn (a libpq connection string or postgresql:// URI) or "
    "--postgres-conn-id (the id of an Airflow postgres connection, read as the DAGs read it), and "
    "exits non-zero on failure. 'pgcdc COMMAND --help' describes a command."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgcdc", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"airflow_provider_postgres_cdc.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    try:
        return int(args.func(args))
    except (PostgresCdcError, ValueError) as exc:
        print(f"pgcdc {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except psycopg2.Error as exc:
        print(f"pgcdc {args.command}: database error: {str(exc).strip()}", file=sys.stderr)
        return 1
