"""Lake and staging maintenance: the only tasks of this package that delete data.

``PostgresCdcLakeMaintenanceOperator`` submits the Spark maintenance job (compaction, cut tag
retention, snapshot expiry, orphan files); it needs the ``spark`` extra.
``PostgresCdcStagingRetentionOperator`` deletes staged batches and snapshots the slot is
acknowledged past (``retention.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_postgres_cdc.errors import SlotNotAcknowledgedError
from airflow_provider_postgres_cdc.formats.lake import MAINTENANCE_STEPS, LakeConfig, MaintenanceStep
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.hooks.staging import staging_options
from airflow_provider_postgres_cdc.operators.arguments import check_choice, check_staging, is_template
from airflow_provider_postgres_cdc.operators.lake_job import LakeSparkJobOperator
from airflow_provider_postgres_cdc.spark import MAINTAIN_JOB_PATH


class PostgresCdcLakeMaintenanceOperator(LakeSparkJobOperator):
    """Compact, expire and clean the Iceberg tables of one slot's pipeline with ``spark-submit`` or on a
    Spark Connect server.

    Runs ``rewrite_data_files`` (and ``rewrite_position_delete_files`` on merge-on-read tables),
    drops consistent-cut tags beyond the newest ``keep_cuts``, ``expire_snapshots`` and
    ``remove_orphan_files`` for every table the slot owns and its changelog. The tables' pipeline
    state is kept (spark/maintain_lake.py says how). See :class:`LakeSparkJobOperator` for the
    Spark and lake settings. Share the apply's Airflow ``pool``: a compaction racing an apply
    makes one of them redo its commit.

    :param slot_name: the slot whose pipeline owns the tables (templated).
    :param lake_conn_id: the lake's ``postgres_cdc_lake`` connection (templated).
    :param keep_cuts: newest ``pgl_<LSN>`` cut tags kept (templated).
    :param older_than_hours: age of snapshots to expire and orphan files to delete; it must exceed
        the longest apply or load, whose uncommitted files would otherwise look orphaned (templated).
    :param skip: steps left out, a list or a comma-separated string of ``rewrite``, ``tags``,
        ``expire``, ``orphans`` (templated).
    :param spark_conn_id: the Spark connection (``spark://local%5B2%5D`` for local mode), or a
        ``spark_connect`` one: the job then runs on that Spark Connect server, as a client started
        with ``connect_python`` (:class:`LakeSparkJobOperator`; docs/LAKE.md, "Spark Connect") (templated).
    :param connect_python: the Spark Connect client's Python (templated).
    """

    template_fields: Sequence[str] = (
        *LakeSparkJobOperator.template_fields, "slot_name", "keep_cuts", "older_than_hours", "skip",
    )  # fmt: skip

    def __init__(
        self,
        *,
        slot_name: str,
        keep_cuts: int | str = 48,
        older_than_hours: float | str = 24,
        skip: str | Sequence[MaintenanceStep] = (),
        name: str = "postgres-cdc-maintain",
        **kwargs: Any,
    ) -> None:
        super().__init__(application=MAINTAIN_JOB_PATH, name=name, **kwargs)
        if not is_template(skip):
            _skipped_steps(skip)
        self.slot_name = slot_name
        self.keep_cuts = keep_cuts
        self.older_than_hours = older_than_hours
        self.skip = skip

    def job_arguments(self, lake: LakeConfig) -> list[str]:
        args = ["--slot-name", str(self.slot_name), "--keep-cuts", str(int(self.keep_cuts))]
        args += ["--older-than-hours", str(float(self.older_than_hours))]
        skip = _skipped_steps(self.skip)
        return args + (["--skip", ",".join(skip)] if skip else [])

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): the slot's lake tables, read and rewritten (lineage/tasks.py)."""
        from airflow_provider_postgres_cdc.lineage.tasks import maintenance_lineage

        return maintenance_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: as at start."""
        from airflow_provider_postgres_cdc.lineage.tasks import maintenance_lineage

        return maintenance_lineage(self)


def _skipped_steps(skip: str | Sequence[str]) -> list[str]:
    """The maintenance steps to leave out (a comma-separated string or a list), each a valid one."""
    steps = [s.strip() for s in skip.split(",") if s.strip()] if isinstance(skip, str) else list(skip)
    for step in steps:
        check_choice("skip", step, MAINTENANCE_STEPS)
    return steps


class PostgresCdcStagingRetentionOperator(BaseOperator):
    """Delete the slot's staged batches and snapshots that are acknowledged and older than the retention.

    The slot's ``confirmed_flush_lsn`` is read from the source database: a batch at or below it
    is in every lake table (the ack moves the slot only then). Incomplete directories and the
    newest snapshot of each table are kept (retention.py lists every rule). Returns the number of
    directories deleted (the paths are logged, not pushed to XCom).

    :param slot_name: replication slot name (templated).
    :param staging: staging root URI or path (templated).
    :param retention_hours: age, by the manifest's ``created_at``, below which nothing is deleted
        (templated).
    :param postgres_conn_id: Airflow connection of the source database (templated).
    :param staging_conn_id: an ``aws`` connection with the ``s3://`` staging store's endpoint and
        credentials (:class:`PostgresCdcStagingHook`); ``None``: pyarrow's environment chain (templated).
    """

    template_fields: Sequence[str] = (
        "slot_name", "staging", "retention_hours", "postgres_conn_id", "staging_conn_id",
    )  # fmt: skip
    ui_color = "#f5e6d5"

    def __init__(
        self,
        *,
        slot_name: str,
        staging: str,
        retention_hours: float | str = 72,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        staging_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_staging(staging)
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.staging = staging
        self.retention_hours = retention_hours
        self.postgres_conn_id = postgres_conn_id
        self.staging_conn_id = staging_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_postgres_cdc.engine.retention import prune_staging  # loads pyarrow: at run time

        check_staging(self.staging)
        slot = self._get_hook().describe_slot(self.slot_name)
        if slot.confirmed_flush_lsn is None:
            raise SlotNotAcknowledgedError(
                f"slot {self.slot_name!r} has no confirmed_flush_lsn (a physical slot?): name the "
                "pipeline's logical slot; nothing was deleted"
            )
        deleted = prune_staging(
            self.staging,
            self.slot_name,
            slot.confirmed_flush_lsn,
            timedelta(hours=float(self.retention_hours)),
            staging_options=staging_options(self.staging_conn_id),
        )
        return {
            "slot": self.slot_name,
            "confirmed_flush_lsn": str(slot.confirmed_flush_lsn),
            "deleted": len(deleted),
        }

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)
