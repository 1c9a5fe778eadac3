"""The snapshot run: a slot with an exported snapshot, the copy by either engine, and the manifest.

:class:`SnapshotRun` creates (or, for a re-snapshot, borrows a temporary) slot whose
``CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`` returns its consistent point and a snapshot of
the database exactly there (docs/DESIGN.md, invariant 2). The replication connection that created it
(the holder) stays open and idle for the whole copy, and is checked while the copy runs: the
snapshot dies with it. After the copy the manifest is written last, and a failure drops the slot
the run created and the files it staged, so a retry starts clean.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_postgres_cdc.engine.choices import SLOT_MODES, SlotMode
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.sequencing import DEFAULT_MAX_MEMORY_BYTES
from airflow_provider_postgres_cdc.engine.snapshot.exported import check_holder
from airflow_provider_postgres_cdc.engine.snapshot.local_engine import (
    DEFAULT_BATCH_BYTES,
    CopyCounters,
    LocalCopy,
)
from airflow_provider_postgres_cdc.engine.snapshot.plan import (
    DEFAULT_MIN_RANGE_BYTES,
    DEFAULT_PARALLELISM,
    DEFAULT_RANGE_BYTES,
    TableCopy,
    TablePlan,
    plan_tables,
    published_subset,
)
from airflow_provider_postgres_cdc.engine.snapshot.slot_modes import (
    await_temporary_slot_gone,
    drop_created_slot,
    prepare_slot,
    temporary_slot_name,
    wants_failover,
)
from airflow_provider_postgres_cdc.engine.snapshot.spark_engine import collect_staged, spark_job_spec
from airflow_provider_postgres_cdc.engine.staging import DEFAULT_MAX_FILE_BYTES, StagingLocation
from airflow_provider_postgres_cdc.formats.column_transforms import check_copy_engine
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.layout import MANIFEST_NAME, SNAPSHOT_PREFIX, snapshot_batch_id
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, ManifestStats, TableManifest, utc_now
from airflow_provider_postgres_cdc.replication import connect, connect_replication
from airflow_provider_postgres_cdc.replication.connection import ConnParams
from airflow_provider_postgres_cdc.replication.publications import published_tables
from airflow_provider_postgres_cdc.replication.slots import (
    SNAPSHOT_HOLDER_OPTIONS,
    CreatedSlot,
    create_slot_with_snapshot,
    validate_slot_name,
)

if TYPE_CHECKING:  # it imports the snapshot plan: at run time, the caller's import
    from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SnapshotProgress:
    """Counters passed to the progress callback.

    ``phase`` is ``planned`` (slot created, tables planned, nothing copied yet) or ``copying``.
    """

    phase: str
    slot: str
    tables_total: int
    tables_done: int = 0
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


ProgressCallback = Callable[[SnapshotProgress], None]


class SnapshotRun:
    """One initial (or re-)snapshot of a slot: create the slot, plan, copy, write the manifest.

    Use as a context manager: leaving it with an exception calls :meth:`abort`, which drops
    the slot it created and the staged files, so a retry starts clean.

    :param conn_params: libpq DSN or keyword mapping (contains the password: never logged).
    ``slot_mode`` says where the snapshot comes from:

    * ``"create"``: the initial snapshot; ``slot`` is created (it must not exist unless
      ``recreate_slot``, which drops it first, losing its position);
    * ``"temporary"``: a re-snapshot while the pipeline runs; ``slot`` is the pipeline's slot and
      must exist and be healthy; it is not touched. A temporary slot, which PostgreSQL drops with
      the connection, exports the snapshot. The manifest is staged under ``slot`` and the apply
      job skips each table's changes below the new consistent point;
    * ``"recover"``: the recovery of a lost slot; ``slot`` is created when it is missing or when
      its WAL is lost (``wal_status = 'lost'``), and a healthy slot is refused.

    :param slot: the pipeline's slot (see ``slot_mode``).
    :param publications: the publications whose tables are copied.
    :param staging: staging root (local path or URI).
    :param tables: a subset of the published tables (``schema.table``); all when None.
    :param slot_mode: ``"create"``, ``"temporary"`` or ``"recover"`` (see above).
    :param recreate_slot: ``"create"`` only: drop an existing slot of that name first.
    :param failover: create the slot as a failover slot, which a standby with
        ``sync_replication_slots`` keeps a copy of so that the pipeline survives a promotion
        (docs/FAILOVER.md). ``None`` (the default): on where the server has them (PostgreSQL 17+);
        ``True`` on an older server raises ``ServerFeatureError``. A re-snapshot's temporary slot
        is never one (the pipeline's own slot keeps its setting).
    :param progress_interval: seconds between progress log lines and holder checks.
    :param on_progress: called with :class:`SnapshotProgress` at each phase and interval.
    :param staging_options: endpoint and credentials of an ``s3://`` staging store.
    :param lake: the lake the copy is for: every published table's lake names are checked against
        its name rule (:meth:`LakeConfig.check_names`) before a slot exists; None checks nothing.
    :param transforms: columns hashed or dropped before anything of them is staged
        (``engine/column_hashing.py``; the local engine only); their names are checked against the
        publications before a slot exists.
    """

    def __init__(
        self,
        conn_params: ConnParams,
        slot: str,
        publications: Sequence[str],
        staging: str,
        *,
        tables: Sequence[str] | None = None,
        slot_mode: SlotMode = "create",
        recreate_slot: bool = False,
        failover: bool | None = None,
        parallelism: int = DEFAULT_PARALLELISM,
        range_bytes: int = DEFAULT_RANGE_BYTES,
        min_range_bytes: int = DEFAULT_MIN_RANGE_BYTES,
        progress_interval: float = 5.0,
        on_progress: ProgressCallback | None = None,
        staging_options: S3Options | None = None,
        lake: LakeConfig | None = None,
        transforms: ColumnTransformer | None = None,
    ) -> None:
        if not publications:
            raise ValueError("at least one publication is required")
        if slot_mode not in SLOT_MODES:
            raise ValueError(f"slot_mode must be one of {SLOT_MODES}, not {slot_mode!r}")
        self.conn_params = conn_params
        self.slot = validate_slot_name(slot)
        self.publications = tuple(publications)
        self.location = StagingLocation.resolve(staging, staging_options)
        self.tables = tuple(tables) if tables else None
        self.slot_mode = slot_mode
        self.recreate_slot = recreate_slot
        self.failover = failover
        self.parallelism = max(1, parallelism)
        self.range_bytes = range_bytes
        self.min_range_bytes = min_range_bytes
        self.progress_interval = progress_interval
        self.on_progress = on_progress
        self.lake = lake
        self.transforms = transforms
        self.created: CreatedSlot | None = None
        self.plan: list[TablePlan] = []
        self.database = ""
        self._holder: Any = None
        self._holder_pid = 0
        self._catalog: Any = None
        self._started = 0.0
        self._taken_at: str | None = None
        self._last_log = 0.0

    def __enter__(self) -> SnapshotRun:
        try:
            self.start()
        except BaseException:
            self.abort()
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    @property
    def snapshot_name(self) -> str:
        if self.created is None or self.created.snapshot_name is None:
            raise RuntimeError("the slot has not been created yet")
        return self.created.snapshot_name

    @property
    def consistent_point(self) -> Lsn:
        if self.created is None:
            raise RuntimeError("the slot has not been created yet")
        return self.created.consistent_point

    @property
    def batch_dir_name(self) -> str:
        return snapshot_batch_id(self.consistent_point)

    @property
    def batch_dir(self) -> str:
        return self.location.batch_dir(self.slot, self.batch_dir_name)

    def start(self) -> list[TablePlan]:
        """Check inputs, create the slot exporting its snapshot, and plan the tables inside it."""
        self._started = time.monotonic()
        self.location.check_access()  # a missing bucket or refused key stops before a slot exists
        self._catalog = connect(self.conn_params)
        self.database = self._catalog.get_dsn_parameters().get("dbname", "")
        # Fail on bad publications/tables before a slot exists; the snapshot re-reads them below.
        published_subset(self._catalog, self.publications, self.tables)
        if self.lake is not None or self.transforms is not None:
            published = published_tables(self._catalog, self.publications)
            if self.lake is not None:  # every published table, the ones not copied now too
                self.lake.check_names((table.schema, table.table) for table in published)
            if self.transforms is not None:
                self.transforms.check_published((table.qualified, table.columns) for table in published)
        prepare_slot(self._catalog, self.slot, self.slot_mode, recreate_slot=self.recreate_slot)
        self._holder = connect_replication(self.conn_params, options=SNAPSHOT_HOLDER_OPTIONS)
        self._holder_pid = self._holder.get_backend_pid()
        temporary = self.slot_mode == "temporary"
        exporter = temporary_slot_name(self.slot, self._holder_pid) if temporary else self.slot
        failover = not temporary and wants_failover(self._catalog, self.slot, self.failover)
        if not temporary:  # the record of an earlier slot of that name must not outlive it
            self.location.forget_slot_created(self.slot)
        self.created = create_slot_with_snapshot(
            self._holder, exporter, temporary=temporary, failover=failover
        )
        self._taken_at = utc_now()  # every transaction the snapshot holds committed before this
        log.info(
            "created %s%sslot %s at consistent point %s, exported snapshot %s",
            "temporary " if temporary else "", "failover " if failover else "", exporter,
            self.consistent_point, self.snapshot_name,
        )  # fmt: skip
        if not temporary:
            self.location.record_slot_created(self.slot, self.consistent_point)
            # A re-snapshot may run beside another one: it removes only what it staged itself.
            self._discard_incomplete()
        self.plan = plan_tables(
            self.conn_params,
            self.snapshot_name,
            self.publications,
            self.tables,
            parallelism=self.parallelism,
            range_bytes=self.range_bytes,
            min_range_bytes=self.min_range_bytes,
        )
        if self.transforms is not None:  # hashed columns copied as text, dropped ones not copied
            self.plan = [self.transforms.plan(plan) for plan in self.plan]
        for plan in self.plan:
            for warning in plan.warnings:
                log.warning("%s", warning)
        log.info(
            "snapshot plan: %d table(s), %d range(s): %s",
            len(self.plan), sum(len(plan.block_ranges) for plan in self.plan),
            ", ".join(f"{plan.qualified} ({plan.blocks} blocks)" for plan in self.plan),
        )  # fmt: skip
        self._report("planned", CopyCounters(), 0.0, force=True)
        return self.plan

    def _discard_incomplete(self) -> None:
        """Delete snapshot directories of this slot that have no manifest (failed earlier runs)."""
        for name, complete in self.location.list_batches(self.slot, prefix=SNAPSHOT_PREFIX):
            if not complete:
                log.info("deleting incomplete staged snapshot %s of slot %s", name, self.slot)
                self.location.delete_dir(self.location.batch_dir(self.slot, name))

    def _report(self, phase: str, counters: CopyCounters, seconds: float, *, force: bool = False) -> None:
        """Log progress (at most every ``progress_interval`` seconds unless forced) and call back."""
        progress = SnapshotProgress(
            phase, self.slot, len(self.plan), counters.tables_done, counters.rows, counters.bytes, seconds
        )
        now = time.monotonic()
        if force or now - self._last_log >= self.progress_interval:
            self._last_log = now
            log.info(
                "snapshot %s %s: %d/%d tables, %d rows, %.1f MB staged, %.0f rows/s",
                self.slot, phase, progress.tables_done, progress.tables_total, progress.rows,
                progress.bytes / 1e6, progress.rows_per_second,
            )  # fmt: skip
        if self.on_progress is not None:
            self.on_progress(progress)

    def check_holder(self) -> None:
        """Raise :class:`SnapshotLostError` unless the connection holding the snapshot is alive."""
        check_holder(self._catalog, self._holder, self._holder_pid, self.snapshot_name)

    def copy_local(
        self,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    ) -> list[TableCopy]:
        """Copy every planned table with ``parallelism`` worker connections into Parquet part files.

        ``max_memory_bytes`` is the drain's setting: a worker refuses a single row larger than a
        quarter of it (a row is held about four times over), the one case where a chunk grows
        past ``batch_bytes``."""
        copies = LocalCopy(
            self.conn_params,
            self.snapshot_name,
            self.plan,
            self.location,
            self.batch_dir,
            parallelism=self.parallelism,
            max_file_bytes=max_file_bytes,
            batch_bytes=batch_bytes,
            max_memory_bytes=max_memory_bytes,
            progress_interval=self.progress_interval,
            report=self._report,
            check_holder=self.check_holder,
            transform=None if self.transforms is None else self.transforms.snapshot_batch,
        ).execute()
        self.check_holder()
        return copies

    def spark_job_spec(self, jdbc_url: str, jdbc_properties: dict[str, str]) -> dict[str, Any]:
        """The description ``spark/snapshot_jdbc.py`` reads: where to read from, what, and where to write.

        ``jdbc_properties`` must not contain the password: the job takes it from the environment
        (see :func:`jdbc_connection`).
        """
        if self.transforms is not None:
            check_copy_engine(self.transforms.transforms, "spark")
        return spark_job_spec(
            self.plan,
            self._catalog,
            database=self.database,
            snapshot_name=self.snapshot_name,
            location=self.location,
            batch_dir=self.batch_dir,
            jdbc_url=jdbc_url,
            jdbc_properties=jdbc_properties,
        )

    def collect_staged(self) -> list[TableCopy]:
        """Inventory part files another engine (Spark) wrote into the table directories.

        Files other than ``part-*.parquet`` (Spark's ``_SUCCESS``, checksum files) are removed so the
        directory holds exactly what the manifest lists.
        """
        copies = collect_staged(self.location, self.batch_dir, self.plan)
        self.check_holder()
        return copies

    def finish(self, copies: Sequence[TableCopy]) -> tuple[str, Manifest]:
        """Write the manifest (last, atomically where possible), release the snapshot; return its path."""
        self.check_holder()
        seconds = time.monotonic() - self._started
        manifest = Manifest(
            kind="snapshot",
            slot=self.slot,
            database=self.database,
            batch_id=self.batch_dir_name,
            start_lsn=self.consistent_point,
            end_lsn=self.consistent_point,
            snapshot_name=self.snapshot_name,
            snapshot_slot=self.created.slot_name if self.created else None,
            snapshot_taken_at=self._taken_at,
            tables=tuple(
                self._recorded(copy.plan.manifest(copy.rows, copy.files, copy.fields)) for copy in copies
            ),
            stats=ManifestStats(bytes=sum(copy.bytes for copy in copies), seconds=round(seconds, 3)),
        )
        path = self.location.write_manifest(self.batch_dir, manifest)
        rows = manifest.total_rows
        log.info(
            "snapshot of slot %s complete: %d table(s), %d rows in %.1f s (%.0f rows/s); manifest %s",
            self.slot, len(copies), rows, seconds, rows / seconds if seconds else 0.0, path,
        )  # fmt: skip
        self.close()
        return path, manifest

    def _recorded(self, spec: TableManifest) -> TableManifest:
        return spec if self.transforms is None else self.transforms.recorded(spec)

    def close(self) -> None:
        """Release the exported snapshot and the catalog connection.

        The pipeline's slot stays; a re-snapshot's temporary slot goes with the holder, and is
        waited for, so that it is gone when the run returns.
        """
        holder, catalog = self._holder, self._catalog
        self._holder = self._catalog = None
        if holder is not None:
            with contextlib.suppress(Exception):
                holder.close()
            if catalog is not None and self.slot_mode == "temporary" and self.created is not None:
                with contextlib.suppress(Exception):
                    await_temporary_slot_gone(catalog, self.created.slot_name)
        if catalog is not None:
            with contextlib.suppress(Exception):
                catalog.close()

    def abort(self) -> None:
        """Undo a failed run: close the holder, drop the slot this run created, delete staged files."""
        created = self.created
        self.close()
        if created is None:
            return
        with contextlib.suppress(Exception):
            self.location.delete_dir(self.batch_dir)
        if self.slot_mode == "temporary":
            return  # PostgreSQL dropped the temporary slot with its connection
        try:
            drop_created_slot(self.conn_params, self.slot)
        except Exception as exc:
            log.error("could not drop slot %s after the failed snapshot: %s; drop it by hand", self.slot, exc)
            return
        with contextlib.suppress(Exception):
            self.location.forget_slot_created(self.slot)


def staged_snapshot(location: StagingLocation, slot: str) -> tuple[str, Manifest] | None:
    """The newest complete snapshot that ``slot`` itself exported (not a re-snapshot), if staged.

    Returns its manifest URI and manifest: what a re-run of an initial or recovery snapshot
    hands to its load again when the slot already exists.
    """
    for name, complete in sorted(location.list_batches(slot, prefix=SNAPSHOT_PREFIX), reverse=True):
        if not complete:
            continue
        batch_dir = location.batch_dir(slot, name)
        manifest = location.read_manifest(batch_dir)
        if manifest.snapshot_slot in (None, slot):
            return location.uri_of(posixpath.join(batch_dir, MANIFEST_NAME)), manifest
    return None


def take_snapshot(
    conn_params: ConnParams,
    slot: str,
    publications: Sequence[str],
    staging: str,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    **options: Any,
) -> tuple[str, Manifest]:
    """Create ``slot`` with an exported snapshot and copy the published tables with the local engine.

    Returns the manifest's path and the manifest. ``options`` are :class:`SnapshotRun` keywords.
    """
    with SnapshotRun(conn_params, slot, publications, staging, **options) as run:
        copies = run.copy_local(
            max_file_bytes=max_file_bytes, batch_bytes=batch_bytes, max_memory_bytes=max_memory_bytes
        )
        return run.finish(copies)
