"""``pgcdc report``: one pipeline's lag, WAL safety, batch history, lake tables and latest cut.

Prints a short summary; with ``--html FILE`` writes the same report as one self-contained HTML
page (charts included, nothing fetched when it is opened), with ``--json`` prints it as JSON.
Exits 1 when a part of the report could not be read (the page still says which, and why).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from airflow_provider_postgres_cdc.cli.common import add_connection_arguments, connection_params, print_rows
from airflow_provider_postgres_cdc.engine.health import format_size
from airflow_provider_postgres_cdc.engine.report import AckPoint, collect_report, render_html
from airflow_provider_postgres_cdc.engine.report.collect import DEFAULT_TIMEOUT
from airflow_provider_postgres_cdc.formats.lake import LakeConfig


def lake_config(args: argparse.Namespace) -> LakeConfig:
    """The lake named by ``--lake-conn-id`` (an Airflow connection) or ``--lake-json`` (text or file)."""
    if args.lake_json:
        text = args.lake_json
        if not text.lstrip().startswith("{"):
            text = Path(text).read_text()
        return LakeConfig.from_json(text)
    # Imported here: an Airflow connection needs Airflow, a JSON lake description does not.
    from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook

    return PostgresCdcLakeHook(args.lake_conn_id).get_conn()


def airflow_acks(lake: LakeConfig, slot: str) -> tuple[list[AckPoint], list[str]]:
    """The pipeline's acks from the Airflow metadata database (its cut Asset's events), or a note."""
    try:
        # Imported here: only --airflow-acks needs Airflow's metadata database.
        from airflow_provider_postgres_cdc.plugins.pipelines import ack_points

        return ack_points(lake.catalog, slot), []
    except Exception as exc:
        return [], [f"the Airflow metadata of acks could not be read ({type(exc).__name__})"]


def run_report(args: argparse.Namespace) -> int:
    lake = lake_config(args)
    acks, notes = airflow_acks(lake, args.slot_name) if args.airflow_acks else ([], [])
    report = collect_report(
        connection_params(args),
        args.slot_name,
        lake,
        publications=args.publications,
        acks=acks,
        timeout=args.timeout,
        notes=notes,
    )
    if args.html:
        path = Path(args.html)
        path.write_text(render_html([report], title=f"pgcdc report: {args.slot_name}"))
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return 1 if report.problems else 0
    source = report.source
    if source is not None:
        print(f"slot {report.slot}: lag {format_size(source.lag_bytes)}, wal_status {source.wal_status}, "
              f"safe_wal_size {format_size(source.safe_wal_size)}")  # fmt: skip
    if report.cut is not None:
        print(f"latest consistent cut: {report.cut.lsn} ({report.cut.tag})")
    print_rows(
        [{"batch": b.batch_id, "kind": b.kind, "end_lsn": b.end_lsn, "tables": b.tables, "changes": b.changes,
          "apply_s": b.apply_seconds, "latency_s": b.latency_seconds} for b in report.batches],
        ("batch", "kind", "end_lsn", "tables", "changes", "apply_s", "latency_s"),
        as_json=False,
    )  # fmt: skip
    for problem in report.problems:
        print(f"\n{problem}")
    if args.html:
        print(f"\nreport written to {Path(args.html).resolve()}")
    return 1 if report.problems else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = subparsers.add_parser(
        "report",
        help="a pipeline's lag, batch history, lake tables and latest cut (--html for a page)",
        description="Print one pipeline's lag, WAL safety, batch history, lake tables and latest "
        "consistent cut; --html writes the same report as one self-contained page, --json prints it "
        "as JSON. Exits 1 when a part of the report could not be read.",
    )
    add_connection_arguments(report)
    report.add_argument("--slot-name", required=True, help="the pipeline's replication slot")
    lake = report.add_mutually_exclusive_group(required=True)
    lake.add_argument(
        "--lake-conn-id",
        metavar="CONN_ID",
        help="id of the lake's Airflow connection (type postgres_cdc_lake)",
    )
    lake.add_argument(
        "--lake-json",
        metavar="JSON",
        help="the lake as JSON ({catalog, properties, namespace_prefix}) or the path of a file holding it",
    )
    report.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument(
        "--publications", dest="publications", action="extend", nargs="+", default=[], metavar="NAME",
        help="also measure the age of the oldest pending change by peeking with these publications "
        "(one or more, repeatable; the peek takes the slot for a moment)",
    )  # fmt: skip
    report.add_argument(
        "--airflow-acks", action="store_true",
        help="read ack times, end-to-end latency and the lag after each ack from the Airflow metadata "
        "database (the pipeline's cut Asset events); needs Airflow configured as for the scheduler",
    )  # fmt: skip
    report.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"seconds to wait for the source and for the lake (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    report.set_defaults(func=run_report)
