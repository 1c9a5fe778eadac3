"""``pgcdc check``, ``pgcdc slots`` and ``pgcdc publications``: look before you load."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_provider_postgres_cdc.cli.common import (
    add_connection_arguments,
    add_output_arguments,
    open_connection,
    print_rows,
)
from airflow_provider_postgres_cdc.replication import describe_publications, list_slots
from airflow_provider_postgres_cdc.replication.failover import inspect_failover
from airflow_provider_postgres_cdc.replication.preflight import inspect_prerequisites
from airflow_provider_postgres_cdc.replication.publications import published_tables


def run_check(args: argparse.Namespace) -> int:
    """Print the preflight facts and every unmet prerequisite; exit 1 when any is unmet.

    The failover part (``replication/failover.py``) says, on a standby, what keeps the
    ``--slot-name`` slot from surviving a promotion and, on a primary, what makes its standby copy
    unsafe.
    """
    with open_connection(args) as conn:
        report = inspect_prerequisites(conn)
        failover = inspect_failover(conn, args.slot_name)
    problems = [*report.problems(), *failover.problems()]
    warnings = [*report.warnings(), *failover.warnings()]
    facts = report.as_dict()
    facts.update(
        {key: value for key, value in failover.as_dict().items() if key not in ("slot", "slot_name")}
    )
    if failover.slot is not None:
        slot = failover.slot
        facts.update(
            slot=slot.slot_name, slot_failover=slot.failover, slot_synced=slot.synced,
            slot_temporary=slot.temporary, slot_invalidation_reason=slot.invalidation_reason,
        )  # fmt: skip
    if args.json:
        print(json.dumps({**facts, "problems": [str(p) for p in problems], "warnings": warnings}, indent=2))
    else:
        for key, value in facts.items():
            print(f"{key:28} {value}")
        for warning in warnings:
            print(f"WARN {warning}")
        for problem in problems:
            print(f"FAIL {type(problem).__name__}: {problem}")
        if not problems:
            print("OK: ready for logical replication")
    return 1 if problems else 0


def run_slots(args: argparse.Namespace) -> int:
    """List the server's replication slots with their positions, lag and WAL status."""
    with open_connection(args) as conn:
        slots = list_slots(conn, database=None if args.all_databases else conn.get_dsn_parameters()["dbname"])
    columns = [
        "slot_name", "plugin", "database", "active", "confirmed_flush_lsn",
        "restart_lsn", "lag_bytes", "wal_status", "safe_wal_size", "temporary",
    ]  # fmt: skip
    print_rows([slot.as_dict() for slot in slots], columns, as_json=args.json)
    return 0


def run_publications(args: argparse.Namespace) -> int:
    """List publications (all of the database, or the named ones) and what they publish."""
    with open_connection(args) as conn:
        if args.names:
            names = args.names
        else:
            with conn.cursor() as cur:
                cur.execute("SELECT pubname::text FROM pg_publication ORDER BY 1")
                names = [row[0] for row in cur.fetchall()]
        pubs = describe_publications(conn, names) if names else []
        combined = published_tables(conn, names) if names and args.combined else []
    if args.combined:
        combined_rows = [
            {
                "table": t.qualified,
                "columns": t.columns,
                "row_filter": t.row_filter,
                "publications": t.publications,
            }
            for t in combined
        ]
        print_rows(combined_rows, ["table", "columns", "row_filter", "publications"], as_json=args.json)
        return 0
    rows: list[dict[str, Any]] = []
    for pub in pubs:
        base: dict[str, Any] = {
            "publication": pub.name,
            "all_tables": pub.all_tables,
            "publish": pub.publish,
            "via_root": pub.publish_via_partition_root,
            "schemas": pub.schemas,
        }
        rows.extend(
            {**base, "table": t.qualified, "columns": t.columns, "row_filter": t.row_filter}
            for t in pub.tables
        )
        if not pub.tables:
            rows.append({**base, "table": None, "columns": None, "row_filter": None})
    print_rows(
        rows,
        ["publication", "all_tables", "publish", "via_root", "table", "columns", "row_filter"],
        as_json=args.json,
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = subparsers.add_parser(
        "check",
        help="preflight: is the server and role ready for logical replication?",
        description="Print the server's and the role's facts for logical replication (wal_level, free "
        "slots and WAL senders, privileges, failover readiness) and every unmet prerequisite; exit 1 "
        "when any is unmet.",
    )
    add_connection_arguments(check)
    add_output_arguments(check)
    check.add_argument(
        "--slot-name",
        help="the pipeline's replication slot: on a standby, is it synchronized and ready for a promotion?",
    )
    check.set_defaults(func=run_check)

    slots = subparsers.add_parser(
        "slots",
        help="list replication slots",
        description="List the replication slots of the connected database (or of the whole server) "
        "with their positions, lag and WAL status.",
    )
    add_connection_arguments(slots)
    add_output_arguments(slots)
    slots.add_argument(
        "--all-databases", action="store_true", help="include the slots of the server's other databases"
    )
    slots.set_defaults(func=run_slots)

    pubs = subparsers.add_parser(
        "publications",
        help="list publications and their tables",
        description="List the database's publications (all, or the named ones) and the tables, "
        "columns and row filters they publish.",
    )
    add_connection_arguments(pubs)
    add_output_arguments(pubs)
    pubs.add_argument("names", nargs="*", help="publication names (default: all)")
    pubs.add_argument(
        "--combined", action="store_true", help="one row per table, filters combined across the publications"
    )
    pubs.set_defaults(func=run_publications)
