"""The tables beside a lake table that keep its changes: its changelog and its history table.

Both take each change once, whatever window of the stream it was staged in: a batch gives each the
changes its commits have not logged yet (``formats/window.py``), and both are written before the
table's own merge, so after a crash between them they are ahead of the table, never behind. The
changelog is appended as staged; the history (``spark/history.py``) is merged as versions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import StructField, StructType

from airflow_provider_postgres_cdc.errors import ApplyError
from airflow_provider_postgres_cdc.formats.column_transforms import TRANSFORMS_PROPERTY
from airflow_provider_postgres_cdc.formats.history import (
    HISTORY,
    IS_CURRENT,
    VERSION_COLUMNS,
)
from airflow_provider_postgres_cdc.formats.lsn import ZERO, Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest
from airflow_provider_postgres_cdc.formats.window import Window, changelog_window, logged_end
from airflow_provider_postgres_cdc.spark.changes import (
    BATCH_ID,
    COMMIT_LSN,
    BatchFacts,
    NetEffect,
    table_columns,
)
from airflow_provider_postgres_cdc.spark.history import merge_sql, opened, version_step
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.lake_table import LakeTable
from airflow_provider_postgres_cdc.spark.merge_sql import key_bounds
from airflow_provider_postgres_cdc.spark.sql_text import temp_view

log = logging.getLogger("postgres_cdc.apply")

Summary = Callable[..., dict[str, str]]
"""``ApplyJob.summary``: a commit's snapshot summary."""
Refusal = Callable[[TableManifest, NetEffect], None]
"""``ApplyJob._refuse_unfilled``: stops before a row would get NULL for a value the source holds."""


def within(changes: DataFrame, window: Window) -> DataFrame:
    """The changes whose commit LSN is in ``window``."""
    lsn = sf.col(COMMIT_LSN)
    return changes.where((lsn >= int(window.start)) & (lsn < int(window.end)))


class ChangeLogs:
    """A manifest's changelogs and history tables, as the apply job writes them."""

    def __init__(
        self,
        tables: IcebergTables,
        manifest: Manifest,
        summary: Summary,
        refuse_unfilled: Refusal,
    ) -> None:
        self.tables = tables
        self.manifest = manifest
        self.summary = summary
        self.refuse_unfilled = refuse_unfilled

    # ------------------------------------------------------------------------------ changelog

    def changelog_window(self, spec: TableManifest, base: Lsn) -> Window:
        """The batch's changes the table's changelog has not logged."""
        return self._window(self.tables.config.changelog_identifier(spec.schema, spec.table), base)

    def _window(self, identifier: tuple[str, str], base: Lsn) -> Window:
        table = self.tables.table(identifier)
        return changelog_window(self.manifest.end_lsn, base, table.history() if table else ())

    def append_changelog(self, spec: TableManifest, candidates: DataFrame, window: Window) -> None:
        """Log the changes of ``window``, recording the range in the commit (none when it is empty)."""
        if window.empty:
            return
        m = self.manifest
        rows = within(candidates, window).withColumn(BATCH_ID, sf.lit(m.batch_id))
        summary = self.summary(ZERO, m.end_lsn, started=time.time(), logged_from=window.start)
        self.tables.append(self.tables.config.changelog_identifier(spec.schema, spec.table), rows, summary)

    # -------------------------------------------------------------------------------- history

    def history_window(self, spec: TableManifest, base: Lsn) -> Window:
        """The batch's changes the table's history has not taken."""
        return self._window(self.tables.config.history_identifier(spec.schema, spec.table), base)

    def merge_history(
        self,
        spec: TableManifest,
        candidates: DataFrame,
        columns: Sequence[StructField],
        keys: Sequence[str],
        window: Window,
        created: bool,
        facts: BatchFacts | None = None,
    ) -> None:
        """Take the changes of ``window`` into the history, in one commit recording the range.

        ``created``: the table was created empty by this batch, so its history starts empty too; a
        table loaded with history whose history table is gone must be loaded again to rebuild it.
        ``facts``: the window's changes' ``batch_facts`` when the table's merge computed them.
        """
        if window.empty:
            return
        identifier = self.tables.config.history_identifier(spec.schema, spec.table)
        if self.tables.table(identifier) is None:
            if not created:
                raise ApplyError(
                    f"{spec.qualified} keeps its history, but its history table {'.'.join(identifier)} "
                    "is gone: re-run the snapshot that loaded the table (or re-snapshot it with "
                    "history='scd2'), which rebuilds it. Nothing of this batch was applied to it"
                )
            empty = self.tables.spark.createDataFrame([], StructType(list(columns)))
            self._create(
                spec, opened(empty, 0, datetime.now()), self.summary(ZERO, ZERO, started=time.time())
            )
        self._merge(spec, identifier, within(candidates, window), columns, keys, window.start, facts=facts)

    def _create(self, spec: TableManifest, versions: DataFrame, summary: dict[str, str]) -> None:
        identifier = self.tables.config.history_identifier(spec.schema, spec.table)
        slot, transforms = self.manifest.slot, spec.column_transforms
        self.tables.create(identifier, versions, summary, slot, None, "hard", transforms, "scd2")

    def _merge(
        self,
        spec: TableManifest,
        identifier: tuple[str, str],
        changes: DataFrame,
        columns: Sequence[StructField],
        keys: Sequence[str],
        logged_from: Lsn,
        until: Lsn | None = None,
        facts: BatchFacts | None = None,
    ) -> None:
        self.tables.evolve(identifier, columns)
        name = self.tables.name(identifier)
        current = self.tables.spark.table(name).where(sf.col(IS_CURRENT))
        step = version_step(changes, columns, keys, current, facts)
        if not step.changes:
            return
        if step.unfilled is not None:
            self.refuse_unfilled(spec, NetEffect(step.rows.limit(0), False, step.unfilled))
        carried = [*(c.name for c in columns), *VERSION_COLUMNS]
        schema = self.tables.schema(identifier)
        bounds = key_bounds(step.key_range, schema[keys[0]].dataType)
        sql = merge_sql(name, temp_view(step.rows), schema.fields, carried, keys, bounds)
        end = self.manifest.end_lsn if until is None else until
        self.tables.merge(sql, self.summary(ZERO, end, started=time.time(), logged_from=logged_from))
        log.info("%s: %d change(s) taken into its history", spec.qualified, step.changes)

    def load_history(
        self,
        spec: TableManifest,
        table: LakeTable | None,
        rows: DataFrame,
        keys: Sequence[str],
        applied_end: Lsn,
        retyped: tuple[Sequence[str], str],
    ) -> None:
        """Before a load commits ``rows`` (its snapshot's, at the manifest's consistent point) to a
        table with history: keep the history when it holds every change below the point (a
        re-snapshot of a table that kept it, under the same column transforms), else build it anew
        from the snapshot's rows; then take the logged changes from its end to ``applied_end``.

        Done before the table's own commit: a load that crashed after it is not run again.
        ``retyped``: the columns whose type the load changes, and the suffix their old values keep.
        """
        identifier = self.tables.config.history_identifier(spec.schema, spec.table)
        point = self.manifest.end_lsn
        history = self.tables.table(identifier)
        kept = (
            history is not None
            and table is not None
            and HISTORY.recorded(table.properties) == "scd2"
            and (history.properties.get(TRANSFORMS_PROPERTY) or "") == spec.column_transforms
            and logged_end(history.history()) >= point
        )
        if kept and history is not None:
            self.tables.retire_changelog_columns(identifier, *retyped)
            start = logged_end(history.history())
        else:
            if history is not None:
                log.warning("%s: its history is rebuilt from this snapshot", spec.qualified)
                self.tables.drop(identifier)
            at = datetime.fromisoformat(self.manifest.consistent_time.replace("Z", "+00:00"))
            # Valid from the point minus one: the snapshot holds the commits below the point.
            versions = opened(rows, int(point) - 1, at, keys[0])
            self._create(spec, versions, self.summary(point, point, started=time.time(), logged_from=point))
            start = point
        changelog = self.tables.config.changelog_identifier(spec.schema, spec.table)
        if applied_end > start and self.tables.table(changelog) is not None:
            logged = self.tables.spark.table(self.tables.name(changelog)).drop(BATCH_ID)
            changes = within(logged, Window(start, applied_end))
            columns = table_columns(changes)
            self._merge(spec, identifier, changes, columns, keys, start, applied_end)
