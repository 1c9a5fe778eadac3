"""Apply a staged snapshot or change batch (docs/FORMATS.md) to Iceberg tables: the PySpark apply job.

    spark-submit --py-files postgres_cdc_job.zip --conf spark.sql.catalog.lake=... apply_batch.py \
        --manifest <staging>/<slot>/<batch id>/_manifest.json --catalog lake [--namespace-prefix P] \
        [--tables public.orders,public.items] [--write-mode merge-on-read|copy-on-write] \
        [--partition-by '{"public.orders": ["days(placed_at)"]}'] [--deletes soft|'{"public.orders": "soft"}']
        [--history scd2|'{"public.orders": "scd2"}']

The catalog itself is configured the Spark way (``spark.sql.catalog.<name>.*``; the apply operator
passes them from its lake connection). Per table, one Iceberg commit applies the batch and records
it in the snapshot summary (docs/LAKE.md): a snapshot load creates or overwrites the table, a batch
is reduced to its net effect per key and merged with one ``MERGE INTO``. A table, its changelog and
its history table (``history="scd2"``, ``spark/history.py``) take each change once, whatever window
of the stream it was staged in (``formats/window.py``).
Before any of this, the run's tables are registered in the slot's index, through which the cut,
the ack and maintenance find the pipeline's tables.
Once every table of the batch has committed, every table of the pipeline is tagged
``pgl_<end LSN>``: a consistent cut across tables.

Exit status 0 on success (a JSON summary is printed on stdout), 2 on an error a user must act on
(message on stderr, e.g. an incompatible column type change), 1 on anything unexpected.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import StructType

from airflow_provider_postgres_cdc.errors import ApplyError, SchemaConflictError
from airflow_provider_postgres_cdc.formats import deletes as deletes_option
from airflow_provider_postgres_cdc.formats import history as history_option
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.column_transforms import check_recorded
from airflow_provider_postgres_cdc.formats.deletes import DELETES, DeletesOption
from airflow_provider_postgres_cdc.formats.history import HISTORY, HistoryOption
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import ZERO, Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest, is_sibling
from airflow_provider_postgres_cdc.formats.partitioning import (
    PartitionSpecs,
    check_manifest,
    parse_partition_by,
)
from airflow_provider_postgres_cdc.formats.schema_changes import SourceColumn, encode_columns
from airflow_provider_postgres_cdc.formats.window import Window, table_window
from airflow_provider_postgres_cdc.spark import TABLE_PARALLELISM, multiset
from airflow_provider_postgres_cdc.spark.change_logs import ChangeLogs, within
from airflow_provider_postgres_cdc.spark.changes import (
    ROW_KEY,
    UNFILLED,
    NetEffect,
    batch_facts,
    column,
    net_effect,
    table_columns,
)
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.job import job_parser, run_job
from airflow_provider_postgres_cdc.spark.merge_sql import key_bounds, merge_sql, row_key_range
from airflow_provider_postgres_cdc.spark.replay import replay_changelog
from airflow_provider_postgres_cdc.spark.schema_evolution import plan_schema_changes, resnapshot_needed
from airflow_provider_postgres_cdc.spark.soft_deletes import reloaded, unmarked
from airflow_provider_postgres_cdc.spark.sql_text import temp_view
from airflow_provider_postgres_cdc.spark.staged import (
    base_dir,
    declared_schema,
    files_reaching,
    key_columns,
    load_manifest,
    read_staged,
)
from airflow_provider_postgres_cdc.spark.table_runs import interpreted_if_small, run_tables

log = logging.getLogger("postgres_cdc.apply")


@dataclass
class TableResult:
    """What one table's load or apply did (the job's JSON summary)."""

    table: str
    status: str  # "applied", "loaded", or "skipped" (already in the table: a re-run)
    changes: int = 0
    rows: int = 0  # loads only: a merge-on-read table's summary does not net out its deletes
    seconds: float = 0.0


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` with exactly the table's columns and types (absent ones null): what a write must match."""
    present = set(df.columns)
    return df.select(
        *[
            (column(f.name) if f.name in present else sf.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ]
    )


class ApplyJob:
    """One manifest applied to the lake: the per-table steps and the cut that follows them."""

    def __init__(
        self,
        spark: SparkSession,
        tables: IcebergTables,
        manifest: Manifest,
        manifest_path: str,
        partitions: PartitionSpecs | None = None,
        deletes: DeletesOption = None,
        history: HistoryOption = None,
    ) -> None:
        self.spark = spark
        self.tables = tables
        self.manifest = manifest
        self.manifest_path = manifest_path
        self.base_dir = base_dir(manifest_path)
        self.partitions = partitions or {}  # a table it does not name keeps its spec
        self.deletes = deletes
        self.history = history
        self.logs = ChangeLogs(tables, manifest, self.summary, self._refuse_unfilled)

    def on(self, spark: SparkSession) -> ApplyJob:
        """The same job in another session: a table's thread's own (``spark/table_runs.py``)."""
        return ApplyJob(
            spark, self.tables.on(spark), self.manifest, self.manifest_path,
            self.partitions, self.deletes, self.history,
        )  # fmt: skip

    def summary(
        self,
        base_lsn: Lsn,
        applied_end_lsn: Lsn,
        source_columns: str | None = None,
        *,
        started: float,
        counts: Mapping[str, int] | None = None,
        logged_from: Lsn | None = None,
    ) -> dict[str, str]:
        """The commit's summary: the batch and LSNs, and what it applied (``counts`` by staged
        operation, from ``started``, an epoch time; a changelog's, from ``logged_from`` on)."""
        m = self.manifest
        summary = lake.commit_summary(
            slot=m.slot, kind=m.kind, batch_id=m.batch_id, start_lsn=m.start_lsn, end_lsn=m.end_lsn,
            base_lsn=base_lsn, applied_end_lsn=applied_end_lsn,
        )  # fmt: skip
        batch_counts = (counts or {}) if m.kind == "batch" else None  # a load's rows: Iceberg's added-records
        summary.update(lake.applied_summary(batch_counts, int(started * 1000), m.stats.newest_commit_time))
        if source_columns is not None:
            summary[lake.SOURCE_COLUMNS] = source_columns
        if logged_from is not None:
            summary[lake.LOGGED_FROM_LSN] = str(logged_from)
        return summary

    def _staged(self, spec: TableManifest) -> DataFrame | None:
        if not spec.files:
            return None
        return read_staged(self.spark, spec.qualified, [f"{self.base_dir}/{f}" for f in spec.files])

    # ------------------------------------------------------------------------------ snapshot

    def load_snapshot_table(self, spec: TableManifest) -> TableResult:
        """Load (or re-load) one snapshot table in one commit; its base LSN is the consistent point.

        A table never moves backwards: a snapshot at or below its base LSN (an old snapshot loaded
        again) is skipped. When batches were applied past the consistent point meanwhile (the copy
        ran while the CDC kept applying), their changes from the consistent point on are replayed
        from the changelog on top of the snapshot, so the table ends where it was.
        """
        started, begun = time.monotonic(), time.time()
        identifier = self.tables.config.identifier(spec.schema, spec.table)
        table = self.tables.table(identifier)
        previous = self.tables.state(table)
        point = self.manifest.end_lsn
        if previous is not None and point <= previous.base_lsn:
            if previous.batch_id != self.manifest.batch_id:
                log.warning(
                    "%s: snapshot %s is not newer than the table's base LSN %s: skipped (never backwards)",
                    spec.qualified, self.manifest.batch_id, previous.base_lsn,
                )  # fmt: skip
            return TableResult(spec.qualified, "skipped", rows=table.total_records if table else 0)
        rows = self._staged(spec)
        if rows is None:
            rows = self.spark.createDataFrame([], declared_schema(spec))
        properties = table.properties if table is not None else None
        mode = DELETES.for_load(self.deletes, spec.qualified, properties)
        history = HISTORY.for_load(self.history, spec.qualified, properties)
        keys, snapshot_rows = key_columns(spec, [c.name for c in table_columns(rows)]), rows
        if mode == "soft":  # the lake's rows the snapshot lacks stay, marked deleted
            lake_rows = None if table is None else self.spark.table(self.tables.name(identifier))
            at = datetime.fromisoformat(self.manifest.consistent_time.replace("Z", "+00:00"))
            rows = unmarked(rows) if lake_rows is None else reloaded(rows, lake_rows, keys, int(point), at)
        replayed, applied_end = 0, point
        source_columns: str | None = encode_columns(
            [SourceColumn(c.name, c.type_oid, c.typmod) for c in spec.columns if not is_sibling(c.name)]
        )
        if table is not None and previous is not None and previous.applied_end_lsn > point:  # as logged
            check_recorded(spec.qualified, table.properties, spec.column_transforms, _names(spec))
            window = (point, previous.applied_end_lsn)
            rows, replayed = replay_changelog(self.tables, spec, rows, window, mode == "soft")
            applied_end, source_columns = previous.applied_end_lsn, previous.source_columns
        # A load's rows are in Iceberg's own summary (added-records, deleted-records).
        summary = self.summary(point, applied_end, source_columns, started=begun)
        rows = rows.orderBy(column(keys[0])) if keys else rows  # key-ordered files: see MERGE's key range
        partition = self.partitions.get(spec.qualified)
        if table is None:
            if history == "scd2":
                self.logs.load_history(spec, table, snapshot_rows, keys, applied_end, ((), ""))
            transforms = spec.column_transforms
            slot = self.manifest.slot
            self.tables.create(identifier, rows, summary, slot, partition, mode, transforms, history)
        else:
            retired = f"__pgl_before_{int(point):016X}"
            retyped = self.tables.replace_column_types(identifier, table_columns(rows), retired)
            changelog = self.tables.config.changelog_identifier(spec.schema, spec.table)
            self.tables.retire_changelog_columns(changelog, retyped, retired)
            if history == "scd2":
                self.logs.load_history(spec, table, snapshot_rows, keys, applied_end, (retyped, retired))
            self.tables.evolve(identifier, table_columns(rows))
            self.tables.conform_spec(identifier, partition)
            self.tables.conform_recorded(identifier, mode, spec.column_transforms, history)
            # As read above: a commit since then makes this one fail.
            self.tables.overwrite(
                identifier, conform(rows, self.tables.schema(identifier)), summary, table.snapshot_id
            )
        loaded = self.tables.table(identifier)
        rows_loaded = loaded.total_records if loaded is not None else 0
        # "changes": the logged changes replayed on top of the snapshot (0 unless batches were ahead).
        return TableResult(spec.qualified, "loaded", replayed, rows_loaded, time.monotonic() - started)

    # --------------------------------------------------------------------------------- batch

    def apply_batch_table(self, spec: TableManifest) -> TableResult:
        """Merge one table's changes of a batch in one commit, after appending them to its changelog.

        The schema is evolved first (a refused type change leaves no trace), then the changelog is
        appended and the merge made. Each takes only the changes it does not hold yet, by commit
        LSN (``formats/window.py``): those below the table's base LSN are in its snapshot (a
        snapshot at consistent point S holds exactly the transactions whose commit record starts
        below S), those below its applied end are merged already, those below its changelog's
        logged end are logged already. So a re-run after a crash between them does neither twice,
        and a window read again with another end (lost staging, a lagging failover slot) applies
        exactly the rest. The merge goes to a branch opened at the snapshot the state was read
        from and main is fast-forwarded to it: a commit made since (a racing load) makes the step
        redo.
        """
        started, begun = time.monotonic(), time.time()
        identifier = self.tables.config.identifier(spec.schema, spec.table)
        table = self.tables.table(identifier)
        state = self.tables.state(table)
        end = self.manifest.end_lsn
        window = table_window(end, state)
        if window.empty:
            return TableResult(spec.qualified, "skipped")
        properties = table.properties if table is not None else None  # only a load may switch:
        mode = DELETES.for_batch(self.deletes, spec.qualified, properties)  # the delete mode,
        history = HISTORY.for_batch(self.history, spec.qualified, properties)  # the history mode,
        if properties is not None:  # and the column transforms
            check_recorded(spec.qualified, properties, spec.column_transforms, _names(spec))
        new_table = table is None
        base = state.base_lsn if state is not None else ZERO
        steps = plan_schema_changes(self.spark, self.base_dir, self.manifest, spec, state, window.start)
        staged, partition = self._live_changes(spec, window.start), self.partitions.get(spec.qualified)
        if staged is None:
            if table is not None:
                summary = self.summary(base, end, steps.source_columns, started=begun)
                self.tables.record(identifier, summary, table.snapshot_id)
            return TableResult(spec.qualified, "applied")
        staged = steps.fill_staged(staged, self.spark)
        logging_window = self.logs.changelog_window(spec, base)
        versions_window = self.logs.history_window(spec, base) if history == "scd2" else logging_window
        # Read again by each step (the files are the batch's): cheaper than caching a copy.
        start = min(window.start, logging_window.start, versions_window.start)
        candidates = within(staged, Window(start, end))
        changes = within(candidates, window)
        columns = table_columns(changes)
        counted = spec.counts_rows  # no key: a count per distinct row (spark/multiset.py)
        keys = [] if counted else key_columns(spec, [c.name for c in columns])
        facts = batch_facts(changes, keys[0] if keys else None)
        if table is None:
            log.warning(
                "table %s has no snapshot load in the lake: creating it empty from this batch", spec.qualified
            )
            empty = self.spark.createDataFrame([], StructType(columns))
            empty = unmarked(empty) if mode == "soft" else empty
            created = self.summary(ZERO, ZERO, started=begun)
            transforms = spec.column_transforms
            slot = self.manifest.slot
            self.tables.create(identifier, empty, created, slot, partition, mode, transforms, history)
            table = self.tables.table(identifier)
        read_snapshot = table.snapshot_id if table is not None else None  # the state above was read from
        lake_columns = self.tables.schema(identifier).fieldNames()
        self.tables.evolve(identifier, columns)
        self.tables.conform_spec(identifier, partition)
        self.logs.append_changelog(spec, candidates, logging_window)
        if history == "scd2":
            known = facts if versions_window == window else None  # the same changes: facts computed
            self.logs.merge_history(spec, candidates, columns, keys, versions_window, new_table, known)
        target = self.tables.name(identifier)
        if read_snapshot is not None:
            self.tables.open_branch(identifier, read_snapshot)
            target = self.tables.branch_name(identifier)
            steps.fill_lake(self.tables, target, lake_columns)  # published with the MERGE below
        schema = self.tables.schema(identifier)
        if counted:
            live = multiset.live_columns(columns, spec)
            effect = multiset.net_counts(changes, live, spec.qualified, facts.truncate)
            first = live[0].name
            bounds = key_bounds(
                row_key_range(multiset.removals(effect, [first]), first), schema[first].dataType
            )
            existing = self.spark.table(target)
            sql = multiset.merge_statement(effect, existing, target, schema, live, spec.qualified, bounds)
        else:
            net = net_effect(changes, columns, keys, self.spark.table(target), facts)
            self._refuse_unfilled(spec, net)
            bounds = None if net.truncated else key_bounds(facts.key_range, schema[keys[0]].dataType)
            view, soft = temp_view(net.rows), mode == "soft"
            sql = merge_sql(
                target, view, schema, columns, keys, net.truncated, bounds, soft, facts.truncate_mark
            )
        summary = self.summary(base, end, steps.source_columns, started=begun, counts=facts.counts)
        if sql is not None:
            self.tables.merge(sql, summary)
        if not self.tables.holds(identifier, end, on_branch=read_snapshot is not None):
            self.tables.record_on(target, summary)  # the merge changed no file: no snapshot
        if read_snapshot is not None:
            self.tables.publish_branch(identifier)
        seconds, count = time.monotonic() - started, facts.changes
        log.info("%s: %d change(s) merged (%.1f s)", spec.qualified, count, seconds)
        return TableResult(spec.qualified, "applied", count, seconds=seconds)

    def _refuse_unfilled(self, spec: TableManifest, net: NetEffect) -> None:
        """Stop before the MERGE when a row would get NULL for a value the source holds (see NetEffect)."""
        lost = [] if net.unfilled is None else net.unfilled.limit(5).collect()
        if lost:
            shown = "; ".join(f"{row[ROW_KEY]} ({', '.join(row[UNFILLED])})" for row in lost)
            raise resnapshot_needed(
                spec, self.manifest.slot, self.base_dir,
                "rows entered the publication's row filter through an UPDATE that left out-of-line "
                f"(TOAST) values untouched: {shown}. PostgreSQL sends such an UPDATE as an INSERT "
                "without those values, and the lake holds no earlier copy of the row",
            )  # fmt: skip

    def _live_changes(self, spec: TableManifest, held: Lsn) -> DataFrame | None:
        """The staged changes, leaving out files that hold only changes the table holds (below
        ``held``) when their columns conflict (a type change a later re-snapshot already covers)."""
        paths = [f"{self.base_dir}/{f}" for f in spec.files]
        if not paths:
            return None
        try:
            return read_staged(self.spark, spec.qualified, paths)
        except SchemaConflictError:
            live = files_reaching(self.spark, paths, int(held))
            if len(live) == len(paths):
                raise
            log.info(
                "%s: %d staged file(s) hold only changes the table holds already",
                spec.qualified,
                len(paths) - len(live),
            )
            return read_staged(self.spark, spec.qualified, live) if live else None

    # ----------------------------------------------------------------------------------- run

    def run(self, specs: Sequence[TableManifest], parallelism: int = TABLE_PARALLELISM) -> list[TableResult]:
        """Register the run's tables in the slot's index (docs/LAKE.md), then load or apply up to
        ``parallelism`` tables at once, then tag the cut. Registering first means a table exists
        only once the index names it.

        Each table keeps its own commits and its own redo on a lost race. When a table fails, the
        others still finish theirs; the run then fails with the first error, and no cut is tagged.
        """
        snapshot = self.manifest.kind == "snapshot"

        def step(spark: SparkSession, spec: TableManifest) -> TableResult:
            job = self.on(spark)
            return job.load_snapshot_table(spec) if snapshot else job.apply_batch_table(spec)

        config = self.tables.config
        identifiers = [config.identifier(spec.schema, spec.table) for spec in specs]
        added = self.tables.register(self.manifest.slot, identifiers)
        if added:
            log.info("%d table(s) registered in the index of slot %s", added, self.manifest.slot)
        # Before the tables run at once: two creating one namespace would race in the catalog.
        for namespace in sorted({namespace for namespace, _ in identifiers}):  # changelogs' too
            self.tables.ensure_namespace(namespace)
        results = run_tables(self.spark, specs, step, parallelism)
        for spec, result in zip(specs, results, strict=True):
            log.info("%s %s: %s", self.manifest.batch_id, spec.qualified, result)
        self._tag_cut()
        return results

    def _tag_cut(self) -> None:
        """Tag the cut once every table of the manifest holds the batch (a partial run does not).

        A cut is a position of the slot's stream: a batch's end, or the consistent point of a
        snapshot the slot itself exported (initial, recovery). A re-snapshot's point (a temporary
        slot's) falls inside some batch, where no table snapshot holds the source: no tag there.
        """
        m = self.manifest
        if m.kind == "snapshot" and m.snapshot_slot not in (None, m.slot):
            log.info(
                "re-snapshot %s from slot %s: no cut at its consistent point", m.batch_id, m.snapshot_slot
            )
            return
        for spec in m.tables:
            state = self.tables.state(
                self.tables.table(self.tables.config.identifier(spec.schema, spec.table))
            )
            if spec.files and (state is None or state.applied_end_lsn < m.end_lsn):
                log.info("%s not applied yet: no cut tagged for %s", spec.qualified, m.batch_id)
                return
        tagged = self.tables.tag_cut(m.slot, m.end_lsn)
        log.info("cut %s at %s: %d table(s) tagged", lake.tag_name(m.end_lsn), m.end_lsn, tagged)


def _names(spec: TableManifest) -> list[str]:
    return [c.name for c in spec.columns]


def apply_manifest(
    spark: SparkSession,
    manifest_path: str,
    config: LakeConfig,
    tables: Sequence[str] | None = None,
    write_mode: str = "merge-on-read",
    parallelism: int = TABLE_PARALLELISM,
    partition_by: str | None = None,
    deletes: str | None = None,
    history: str | None = None,
) -> list[TableResult]:
    """Apply a snapshot or batch manifest to the lake; the Python entry point of the job.

    ``tables`` (``schema.table`` names) restricts the run to some tables of the manifest; the cut
    is tagged only once every table of the manifest holds the batch. ``partition_by`` and
    ``deletes``: the options as text (``formats/partitioning.py``, ``formats/deletes.py``).
    """
    partitions, soft = parse_partition_by(partition_by), deletes_option.parse_deletes(deletes)
    spark.conf.set("spark.sql.caseSensitive", "true")  # PostgreSQL names "ID" and "id" differ
    lake_tables = IcebergTables(spark, config, write_mode)
    manifest = load_manifest(spark, manifest_path)
    config.check_names((s.schema, s.table) for s in manifest.tables)  # before any table is touched
    check_manifest(manifest, partitions)
    deletes_option.check_manifest(manifest, soft)
    versions = history_option.HISTORY.parse(history)
    history_option.HISTORY.check_manifest(manifest, versions)
    specs = list(manifest.tables)
    if tables:
        wanted = set(tables)
        unknown = wanted - {s.qualified for s in specs}
        if unknown:
            raise ApplyError(f"--tables names {sorted(unknown)} not in manifest {manifest_path}")
        specs = [s for s in specs if s.qualified in wanted]
    with interpreted_if_small(spark, manifest):
        job = ApplyJob(spark, lake_tables, manifest, manifest_path, partitions, soft, versions)
        return job.run(specs, parallelism)


def _run(spark: SparkSession, config: LakeConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    options = (args.write_mode, args.table_parallelism, args.partition_by, args.deletes, args.history)
    results = apply_manifest(spark, args.manifest, config, tables, *options)
    return [{"manifest": args.manifest, "tables": [asdict(r) for r in results]}]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; returns the process exit status (0 ok, 2 user-actionable error, 1 unexpected)."""
    parser = job_parser("apply_batch.py", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--manifest", required=True, help="path or URI of the batch's or snapshot's _manifest.json"
    )
    parser.add_argument("--tables", default="", help="comma-separated schema.table names (default: all)")
    parser.add_argument("--write-mode", default="merge-on-read", help="row-level write mode of new tables")
    parser.add_argument(
        "--table-parallelism", type=int, default=TABLE_PARALLELISM, help="tables applied at once"
    )
    parser.add_argument(
        "--partition-by", default="", help='JSON: {"schema.table": ["days(col)", ...]} (docs/LAKE.md)'
    )
    parser.add_argument("--deletes", default="", help='soft, hard, or JSON: {"schema.table": "soft"}')
    parser.add_argument("--history", default="", help='scd2, none, or JSON: {"schema.table": "scd2"}')
    return run_job(parser, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
