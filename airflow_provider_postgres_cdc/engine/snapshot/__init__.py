"""The initial snapshot: a slot with an exported snapshot, and a parallel copy of the published tables.

``CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`` returns the slot's consistent point and a
snapshot showing the database exactly there (docs/DESIGN.md, invariant 2). Worker connections import
it and stream ``COPY (SELECT <published columns> FROM t WHERE <row filter>) TO STDOUT`` into
Parquet files of bounded size; large tables are split into ``ctid`` ranges so several workers
share them. Nothing here imports Airflow. One job per module:

* ``run``: :class:`SnapshotRun`, the orchestration (slot modes, the holder connection, progress,
  the manifest, cleanup after a failure); :func:`take_snapshot` does a whole local run and
  :func:`staged_snapshot` finds one already staged.
* ``rerun``: what a re-run of an initial or recovery snapshot whose slot exists does
  (:func:`rerun_snapshot`: resume the staged snapshot's load, skip, or drop the unused slot).
* ``slot_modes``: where the snapshot's slot comes from (:data:`SLOT_MODES`: create, a temporary
  slot beside the pipeline's, recover) and undoing the slot of a failed run.
* ``exported``: how a connection joins the exported snapshot (:func:`import_snapshot`, the
  worker session options, :class:`SnapshotLostError`) and the check that its holder is alive.
* ``plan``: the catalog queries that turn published tables into :class:`TablePlan` s with
  ``ctid`` ranges, and :class:`TableCopy`, what an engine staged for one plan.
* ``copy_text``: COPY's text format into typed Arrow record batches (:func:`decode_copy_text`).
* ``local_engine``: the threaded local copy engine (:meth:`SnapshotRun.copy_local`).
* ``spark_engine``: the Spark engine's JDBC connection (:func:`jdbc_connection`), the job spec
  ``spark/snapshot_jdbc.py`` reads (:meth:`SnapshotRun.spark_job_spec`) and the inventory of what
  it staged.

The names below are the package's public ones; import them from here.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.engine.choices import SLOT_MODES, SlotMode
from airflow_provider_postgres_cdc.engine.snapshot.copy_text import decode_copy_text
from airflow_provider_postgres_cdc.engine.snapshot.exported import import_snapshot
from airflow_provider_postgres_cdc.engine.snapshot.local_engine import DEFAULT_BATCH_BYTES
from airflow_provider_postgres_cdc.engine.snapshot.plan import (
    DEFAULT_MIN_RANGE_BYTES,
    DEFAULT_PARALLELISM,
    DEFAULT_RANGE_BYTES,
    ColumnPlan,
    TableCopy,
    TablePlan,
)
from airflow_provider_postgres_cdc.engine.snapshot.rerun import Rerun, rerun_snapshot
from airflow_provider_postgres_cdc.engine.snapshot.run import (
    SnapshotProgress,
    SnapshotRun,
    staged_snapshot,
    take_snapshot,
)
from airflow_provider_postgres_cdc.engine.snapshot.slot_modes import temporary_slot_name
from airflow_provider_postgres_cdc.engine.snapshot.spark_engine import (
    SPARK_JOB_PATH,
    SPARK_PASSWORD_ENV,
    jdbc_connection,
)
from airflow_provider_postgres_cdc.errors import (
    RowSecurityError,
    RowTooLargeError,
    SnapshotLostError,
    TableDroppedError,
)

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_MIN_RANGE_BYTES",
    "DEFAULT_PARALLELISM",
    "DEFAULT_RANGE_BYTES",
    "SLOT_MODES",
    "SPARK_JOB_PATH",
    "SPARK_PASSWORD_ENV",
    "ColumnPlan",
    "Rerun",
    "RowSecurityError",
    "RowTooLargeError",
    "SlotMode",
    "SnapshotLostError",
    "SnapshotProgress",
    "SnapshotRun",
    "TableCopy",
    "TableDroppedError",
    "TablePlan",
    "decode_copy_text",
    "import_snapshot",
    "jdbc_connection",
    "rerun_snapshot",
    "staged_snapshot",
    "take_snapshot",
    "temporary_slot_name",
]
