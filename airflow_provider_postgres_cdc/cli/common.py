"""What every ``pgcdc`` subcommand shares: where to connect, and how to print results."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_provider_postgres_cdc.replication import connect


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dsn`` or ``--postgres-conn-id`` (an Airflow ``postgres`` connection), exactly one of them."""
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--dsn", help="libpq connection string or postgresql:// URI of the database")
    group.add_argument(
        "--postgres-conn-id",
        metavar="CONN_ID",
        help="id of an Airflow postgres connection to the database (read as the DAGs read it)",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def connection_params(args: argparse.Namespace) -> str | dict[str, Any]:
    """The libpq parameters named by ``--dsn`` or ``--postgres-conn-id``."""
    if args.dsn:
        return str(args.dsn)
    # Imported here: resolving an Airflow connection needs Airflow, a plain DSN does not.
    from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook

    return PostgresCdcHook(args.postgres_conn_id).connection_params()


@contextmanager
def open_connection(args: argparse.Namespace) -> Iterator[Any]:
    """A normal autocommit connection for the subcommand, closed afterwards."""
    conn = connect(connection_params(args))
    try:
        yield conn
    finally:
        conn.close()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "-"
    return str(value)


def print_rows(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, as_json: bool) -> None:
    """A readable aligned table, or a JSON array of objects with ``--json``."""
    if as_json:
        json.dump([dict(row) for row in rows], sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(line[i]) for line in cells]) for i, col in enumerate(columns)]
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)).rstrip())
    for line in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    if not rows:
        print("(none)")
