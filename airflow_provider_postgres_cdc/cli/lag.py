"""``pgcdc lag``: every slot's lag, WAL safety and spill/stream counters, for an operator at 3 a.m.

Exits 1 when any slot shown is lost, unreserved, or under the ``--min-safe-wal`` floor (a missing
``--slot-name`` slot too), so it can back a cron check or a monitoring probe as it is.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from airflow_provider_postgres_cdc.cli.common import (
    add_connection_arguments,
    add_output_arguments,
    open_connection,
    print_rows,
)
from airflow_provider_postgres_cdc.engine.health import (
    SlotHealth,
    WalRisk,
    assess_slot,
    assess_slots,
    format_size,
    parse_duration,
    parse_size,
    stale_warning,
    wal_safety,
)

COLUMNS = (
    "slot", "database", "active", "wal_status", "lag", "retained", "safe_wal",
    "oldest_pending", "spill_txns", "spill_bytes", "stream_txns", "stream_bytes", "status",
)  # fmt: skip


def _age(health: SlotHealth) -> str:
    if health.lag_age is None:
        return "-"
    if health.oldest_unconfirmed_commit is None:
        return "none"
    return f"{int(health.lag_age.total_seconds())}s ago"


def _row(health: SlotHealth, status: str) -> dict[str, Any]:
    stats = health.stats
    return {
        "slot": health.slot_name,
        "database": health.slot.database,
        "active": "yes" if health.slot.active else "no",
        "wal_status": health.slot.wal_status,
        "lag": format_size(health.lag_bytes),
        "retained": format_size(health.retained_bytes),
        "safe_wal": format_size(health.slot.safe_wal_size),
        "oldest_pending": _age(health),
        "spill_txns": None if stats is None else stats.spill_txns,
        "spill_bytes": None if stats is None else format_size(stats.spill_bytes),
        "stream_txns": None if stats is None else stats.stream_txns,
        "stream_bytes": None if stats is None else format_size(stats.stream_bytes),
        "status": status,
    }


def _judge(
    health: SlotHealth, floor: int | None, stale_after: timedelta | None
) -> tuple[str, list[str], bool]:
    """Status word, messages to print, and whether this slot makes the command fail."""
    safety = wal_safety(health, floor)
    messages = [] if safety.risk is WalRisk.OK else [safety.message]
    stale = stale_warning(health, stale_after)
    if stale:
        messages.append(stale)
    if safety.risk is not WalRisk.OK:
        return safety.risk.value.upper(), messages, True
    return ("STALE" if stale else "ok"), messages, False


def run_lag(args: argparse.Namespace) -> int:
    floor = None if args.min_safe_wal is None else parse_size(args.min_safe_wal)
    stale_after = None if args.stale_after is None else parse_duration(args.stale_after)
    with open_connection(args) as conn:
        healths = (
            [assess_slot(conn, args.slot_name, args.publications)]
            if args.slot_name
            else assess_slots(conn, args.publications)
        )
    judged = [(health, *_judge(health, floor, stale_after)) for health in healths]
    failed = any(fails for *_, fails in judged)
    if args.json:
        output = [
            {**health.as_dict(), "status": status, "problems": messages}
            for health, status, messages, _ in judged
        ]
        print(json.dumps(output, indent=2, default=str))
        return 1 if failed else 0
    keep = healths[0].max_slot_wal_keep_size if healths else None
    print(
        "max_slot_wal_keep_size: "
        + (
            "unlimited (-1): a slot can retain WAL until the disk fills"
            if keep is None
            else format_size(keep)
        )
    )
    print_rows([_row(health, status) for health, status, _, _ in judged], COLUMNS, as_json=False)
    for _, _, messages, _ in judged:
        for message in messages:
            print(f"\n{message}")
    spilling = [health.slot_name for health in healths if health.stats and health.stats.spill_txns]
    if spilling:
        print(
            f"\nspilling to disk: {', '.join(spilling)} (transactions larger than logical_decoding_work_mem; "
            "raise it for the decoding session, or use protocol 2+ streaming, if this grows)"
        )
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lag = subparsers.add_parser(
        "lag",
        help="replication slots' lag, WAL safety (wal_status, safe_wal_size) and spill/stream counters",
        description="Print every replication slot's lag, WAL safety and spill/stream counters (or one "
        "slot's, with --slot-name). Exits 1 when a slot shown is lost, unreserved or under the "
        "--min-safe-wal floor, so it can back a cron check or a monitoring probe as it is.",
    )
    add_connection_arguments(lag)
    add_output_arguments(lag)
    lag.add_argument("--slot-name", help="only this replication slot (exit 1 if it does not exist)")
    lag.add_argument(
        "--publications",
        dest="publications",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME",
        help="measure the age of the oldest pending change by peeking with these publications "
        "(one or more, repeatable; only for inactive slots of the connected database; each peek "
        "takes the slot for a moment, so a drain starting at that instant would find it busy)",
    )
    lag.add_argument(
        "--min-safe-wal",
        metavar="SIZE",
        help="fail when a slot's safe_wal_size is under this floor (e.g. 1GB)",
    )
    lag.add_argument(
        "--stale-after",
        metavar="SECONDS",
        default="86400",
        help="flag inactive slots nobody has read for this long (default: one day)",
    )
    lag.set_defaults(func=run_lag)
