"""Maintain the Iceberg tables of one slot's pipeline: the PySpark lake maintenance job.

    spark-submit --py-files postgres_cdc_job.zip --conf spark.sql.catalog.lake=... maintain_lake.py \
        --catalog lake [--namespace-prefix P] --slot-name S [--keep-cuts 48] [--older-than-hours 24] \
        [--skip rewrite,tags,expire,orphans]

For every table the slot owns, its changelog and its history table, in this order:

1. ``rewrite_data_files`` compacts small files and folds position deletes into the data
   (``rewrite_position_delete_files`` follows on merge-on-read tables, for the delete files left);
2. the consistent cuts (``pgl_<LSN>`` tags) beyond the newest ``--keep-cuts`` are dropped, the
   same cuts from every table, so each kept cut still reads every table at one source LSN;
3. ``expire_snapshots`` drops snapshots older than ``--older-than-hours`` (the kept cuts keep
   theirs: Iceberg never expires a tagged snapshot);
4. ``remove_orphan_files`` deletes files no snapshot references and older than the same age, but
   never younger than 24 hours (Iceberg's procedure refuses a shorter interval).

The pipeline's state survives: a table's state is its newest *pipeline* snapshot along the main
branch (``lake.state_of``), reached by walking parents from the current snapshot past maintenance
commits (which carry no ``pgl.*`` keys). Expiring any snapshot of that walk would cut it short
and leave the table stateless, so ``retain_last`` is the length of the walk (at least 1).

Why the age must be at least the longest apply: ``remove_orphan_files`` cannot tell the files a
running apply has written but not committed yet from garbage; only their age protects them. A
file younger than ``--older-than-hours`` is never deleted, so that age must exceed the longest
apply or load the lake can run (24 hours, the default, leaves a wide margin; Iceberg's own
default is 3 days).

Exit status 0 on success (a JSON summary per table on stdout), 2 on an error a user must act on
(message on stderr, e.g. the catalog is not configured), 1 on anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import Row, SparkSession

from airflow_provider_postgres_cdc.errors import MaintenanceError
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables, is_conflict
from airflow_provider_postgres_cdc.spark.job import job_parser, run_job
from airflow_provider_postgres_cdc.spark.runtime import SPARK_ERRORS
from airflow_provider_postgres_cdc.spark.sql_text import literal

log = logging.getLogger("postgres_cdc.maintain")

STEPS = lake.MAINTENANCE_STEPS
DEFAULT_KEEP_CUTS = 48
DEFAULT_OLDER_THAN_HOURS = 24.0
# Iceberg's remove_orphan_files refuses a younger cutoff (only its Action API would take one).
ORPHAN_MIN_AGE = timedelta(hours=24)
# Data files carrying any delete are rewritten: every delete file costs each read a join, and a
# merge-on-read apply adds one per touched file per batch. Delete files of rewritten data files
# are dropped with them rather than left dangling until the next position-delete rewrite.
REWRITE_OPTIONS = {"delete-file-threshold": "1", "remove-dangling-deletes": "true"}
# The rewrite keeps its starting sequence number (fewer conflicts with a racing apply), so the
# newest delete files still look live to it; rewriting every position delete file (small, and few
# once the data rewrite folded them in) drops those whose data files are gone.
DELETE_REWRITE_OPTIONS = {"rewrite-all": "true"}
_MERGE_ON_READ = "merge-on-read"


@dataclass
class TableMaintenance:
    """What maintenance did to one table (the job's JSON summary)."""

    table: str
    data_files_rewritten: int = 0
    data_files_added: int = 0
    delete_files_rewritten: int = 0
    tags_dropped: list[str] = field(default_factory=list)
    snapshots_expired: int = 0
    snapshots_retained_for_state: int = 0
    files_deleted_by_expiry: int = 0
    orphans_removed: int = 0
    conflicts: list[str] = field(default_factory=list)  # steps skipped: another writer committed first


def _timestamp(moment: datetime) -> str:
    return f"TIMESTAMP {literal(moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S.%f'))}"


def _options(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{literal(k)}, {literal(v)}" for k, v in options.items()) + ")"


class LakeMaintenance:
    """One slot's lake tables maintained through Iceberg's Spark procedures."""

    def __init__(self, tables: IcebergTables, slot: str) -> None:
        self.tables = tables
        self.spark = tables.spark
        self.slot = slot

    def _call(self, procedure: str, identifier: tuple[str, str], **args: str) -> list[Row]:
        return self.tables.procedure(procedure, identifier, **args)

    def targets(self) -> list[tuple[str, str]]:
        """The slot's data tables and, after each, its changelog and history tables when it has them."""
        found = []
        for identifier in self.tables.owned_tables(self.slot):
            found.append(identifier)
            found += [c for c in lake.companions_of(identifier) if self.tables.table(c) is not None]
        return found

    # ---------------------------------------------------------------------------- compaction

    def rewrite(self, identifier: tuple[str, str], result: TableMaintenance) -> None:
        """Compact data files (folding deletes in), then position delete files on merge-on-read tables."""
        (row,) = self._call("rewrite_data_files", identifier, options=_options(REWRITE_OPTIONS))
        result.data_files_rewritten += int(row["rewritten_data_files_count"])
        result.data_files_added += int(row["added_data_files_count"])
        table = self.tables.table(identifier)
        properties = table.properties if table is not None else {}
        if any(properties.get(f"write.{op}.mode") == _MERGE_ON_READ for op in ("merge", "update", "delete")):
            (row,) = self._call(
                "rewrite_position_delete_files", identifier, options=_options(DELETE_REWRITE_OPTIONS)
            )
            result.delete_files_rewritten += int(row["rewritten_delete_files_count"])

    # ---------------------------------------------------------------------------------- cuts

    def drop_old_cuts(self, identifiers: Sequence[tuple[str, str]], keep: int) -> dict[str, list[str]]:
        """Drop the cut tags beyond the newest ``keep`` cuts of the pipeline, from every table.

        The cuts are counted across tables, not per table: a table added to the pipeline later
        has fewer tags, and counting its own would keep there a cut the other tables dropped.
        """
        tags: dict[tuple[str, str], list[str]] = {}
        cuts: set[Lsn] = set()
        for identifier in identifiers:
            table = self.tables.table(identifier)
            names = list(table.refs) if table is not None else []
            tags[identifier] = [n for n in names if lake.tag_lsn(n) is not None]
            cuts.update(lsn for n in tags[identifier] if (lsn := lake.tag_lsn(n)) is not None)
        kept = set(sorted(cuts, reverse=True)[:keep])
        dropped: dict[str, list[str]] = {}
        for identifier, names in tags.items():
            stale = sorted(n for n in names if lake.tag_lsn(n) not in kept)
            for name in stale:
                self.tables.drop_tag(identifier, name)
            dropped[self.tables.name(identifier)] = stale
        return dropped

    # --------------------------------------------------------------------------------- expiry

    def expire(self, identifier: tuple[str, str], older_than: datetime, result: TableMaintenance) -> None:
        """Expire snapshots older than ``older_than``, keeping the walk to the table's state.

        ``retain_last`` keeps the current snapshot's ancestors up to and including the newest
        pipeline commit (the rewrite commits just made sit on top of it). A commit racing this
        one only lengthens the history above a pipeline commit, so the count stays safe.
        """
        table = self.tables.table(identifier)
        if table is None:
            return
        history = table.history()
        walk = next((i + 1 for i, (_, s) in enumerate(history) if lake.is_pipeline_commit(s)), 1)
        before = len(table.snapshots)
        (row,) = self._call(
            "expire_snapshots", identifier, older_than=_timestamp(older_than), retain_last=str(walk)
        )
        expired = self.tables.table(identifier)
        after = len(expired.snapshots) if expired is not None else 0
        result.snapshots_expired += before - after
        result.snapshots_retained_for_state = walk
        result.files_deleted_by_expiry += sum(
            int(row[name] or 0) for name in row.asDict() if name.endswith("_files_count")
        )

    def remove_orphans(
        self, identifier: tuple[str, str], older_than: datetime, result: TableMaintenance
    ) -> None:
        """Delete files under the table's location that no snapshot references, older than ``older_than``."""
        rows = self._call("remove_orphan_files", identifier, older_than=_timestamp(older_than))
        result.orphans_removed += len(rows)

    # ------------------------------------------------------------------------------------ run

    def _step(self, step: str, identifier: tuple[str, str], result: TableMaintenance, run: Any) -> None:
        """Run one step; losing a commit race to the pipeline skips it (the next run redoes it)."""
        try:
            run()
        except SPARK_ERRORS as exc:
            if not is_conflict(exc):
                raise
            log.warning("%s: %s lost a commit race to another writer; skipped until the next run",
                        self.tables.name(identifier), step)  # fmt: skip
            result.conflicts.append(step)

    def run(self, keep_cuts: int, older_than: datetime, skip: Collection[str] = ()) -> list[TableMaintenance]:
        """Every step over every table; orphans older than ``older_than`` and :data:`ORPHAN_MIN_AGE`."""
        orphans_before = min(older_than, datetime.now(UTC) - ORPHAN_MIN_AGE)
        identifiers = self.targets()
        results = {i: TableMaintenance(self.tables.name(i)) for i in identifiers}
        if "rewrite" not in skip:
            for i in identifiers:
                self._step("rewrite", i, results[i], lambda i=i: self.rewrite(i, results[i]))
        if "tags" not in skip:
            for name, dropped in self.drop_old_cuts(identifiers, keep_cuts).items():
                next(r for r in results.values() if r.table == name).tags_dropped = dropped
        for i in identifiers:
            if "expire" not in skip:
                self._step("expire", i, results[i], lambda i=i: self.expire(i, older_than, results[i]))
            if "orphans" not in skip:
                self._step(
                    "orphans", i, results[i], lambda i=i: self.remove_orphans(i, orphans_before, results[i])
                )
            log.info("%s", json.dumps(asdict(results[i])))
        return [results[i] for i in identifiers]


def maintain(
    spark: SparkSession,
    config: LakeConfig,
    slot: str,
    *,
    keep_cuts: int = DEFAULT_KEEP_CUTS,
    older_than: timedelta = timedelta(hours=DEFAULT_OLDER_THAN_HOURS),
    skip: Collection[str] = (),
    now: datetime | None = None,
) -> list[TableMaintenance]:
    """Maintain every lake table ``slot`` owns and their changelogs; the Python entry of the job.

    ``now`` (default: the current time) is what ``older_than`` counts back from.
    """
    unknown = set(skip) - set(STEPS)
    if unknown:
        raise MaintenanceError(
            f"--skip names unknown step(s) {sorted(unknown)}: choose from {', '.join(STEPS)}"
        )
    if keep_cuts < 1:
        raise MaintenanceError(
            f"--keep-cuts must be at least 1 (got {keep_cuts}): the newest cut is what readers of "
            "a consistent lake use"
        )
    if older_than < timedelta(0):
        raise MaintenanceError(f"--older-than-hours must not be negative (got {older_than})")
    spark.conf.set("spark.sql.caseSensitive", "true")  # PostgreSQL names "ID" and "id" differ
    tables = IcebergTables(spark, config)
    cutoff = (now or datetime.now(UTC)) - older_than
    log.info(
        "maintaining the tables of slot %s in catalog %s; expiring before %s", slot, config.catalog, cutoff
    )
    return LakeMaintenance(tables, slot).run(keep_cuts, cutoff, skip)


def _run(spark: SparkSession, config: LakeConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    results = maintain(
        spark, config, args.slot_name, keep_cuts=args.keep_cuts,
        older_than=timedelta(hours=args.older_than_hours), skip=skip,
    )  # fmt: skip
    return [asdict(result) for result in results]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; returns the process exit status (0 ok, 2 user-actionable error, 1 unexpected)."""
    parser = job_parser("maintain_lake.py", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--slot-name", required=True, help="the slot whose pipeline owns the tables")
    parser.add_argument("--keep-cuts", type=int, default=DEFAULT_KEEP_CUTS, help="newest cut tags kept")
    parser.add_argument(
        "--older-than-hours",
        type=float,
        default=DEFAULT_OLDER_THAN_HOURS,
        help="age of snapshots to expire and orphan files to delete; at least the longest apply",
    )
    parser.add_argument("--skip", default="", help=f"comma-separated steps to skip: {', '.join(STEPS)}")
    return run_job(parser, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
