"""``PgLogicalAckOperator``: advance the slot past a batch, only once every lake table holds it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_pglogical.engine.lake_catalog import unapplied_tables
from airflow_provider_pglogical.engine.staging import read_manifest
from airflow_provider_pglogical.errors import BatchNotAppliedError, ManifestSlotMismatchError
from airflow_provider_pglogical.hooks.lake import PgLogicalLakeHook
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook


class PgLogicalAckOperator(BaseOperator):
    """Advance ``slot`` to the batch's end LSN once every table of the batch has committed it.

    What each lake table holds is read from its Iceberg snapshot summaries with pyiceberg (no
    Spark). Acknowledging twice is harmless (a slot never moves backwards), and so is
    acknowledging a batch the slot is already past.

    :param slot_name: replication slot name (templated).
    :param manifest: URI or path of the batch's ``_manifest.json``, usually the drain's
        ``{{ ti.xcom_pull(task_ids='drain')['manifest'] }}`` (templated).
    :param lake_conn_id: the lake's ``pglogical_lake`` connection (templated).
    :param pglogical_conn_id: Airflow connection of the source database (templated).
    """

    template_fields: Sequence[str] = ("pglogical_conn_id", "slot_name", "manifest", "lake_conn_id")
    ui_color = "#d5f5d5"

    def __init__(
        self,
        *,
        slot_name: str,
        manifest: str,
        lake_conn_id: str = PgLogicalLakeHook.default_conn_name,
        pglogical_conn_id: str = PgLogicalHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.manifest = manifest
        self.lake_conn_id = lake_conn_id
        self.pglogical_conn_id = pglogical_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        manifest = read_manifest(self.manifest)
        if manifest.slot != self.slot_name:
            raise ManifestSlotMismatchError(
                f"manifest {self.manifest} belongs to slot {manifest.slot!r}, not {self.slot_name!r}: "
                "pass the manifest drained from this slot"
            )
        missing = unapplied_tables(self._get_lake_hook().get_conn(), manifest)
        if missing:
            raise BatchNotAppliedError(
                f"batch {manifest.batch_id} is not applied to the lake for {', '.join(missing)}: "
                "the slot stays where it is. Run (or re-run) the apply task for this manifest first."
            )
        position = self._get_hook().advance_slot(self.slot_name, manifest.end_lsn)
        self.log.info("slot %s acknowledged up to %s (batch %s)", self.slot_name, position, manifest.batch_id)
        return {"slot": self.slot_name, "batch_id": manifest.batch_id, "confirmed_flush_lsn": str(position)}

    def _get_hook(self) -> PgLogicalHook:
        return PgLogicalHook(self.pglogical_conn_id)

    def _get_lake_hook(self) -> PgLogicalLakeHook:
        return PgLogicalLakeHook(self.lake_conn_id)

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): the batch's lake tables in, the pipeline's cut out (lineage/tasks.py)."""
        from airflow_provider_pglogical.lineage.tasks import ack_lineage

        return ack_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: as at start (the cut and its LSN window are known from the manifest)."""
        from airflow_provider_pglogical.lineage.tasks import ack_lineage

        return ack_lineage(self)
