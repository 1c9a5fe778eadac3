"""``PostgresCdcAckOperator``: advance the slot past a batch, only once every lake table holds it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_postgres_cdc import metrics
from airflow_provider_postgres_cdc.assets import CUTS_ALIAS, alias, cut_asset
from airflow_provider_postgres_cdc.errors import BatchNotAppliedError, ManifestSlotMismatchError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.hooks.staging import staging_options

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.lake_catalog import Cut


class PostgresCdcAckOperator(BaseOperator):
    """Advance ``slot`` to the batch's end LSN once every table of the batch has committed it.

    What each lake table holds is read from its Iceberg snapshot summaries with pyiceberg (no
    Spark). Acknowledging twice is harmless (a slot never moves backwards), and so is
    acknowledging a batch the slot is already past. A slot that would end short of the batch's
    end (the server's WAL ends before it: the batch came from another server) is refused with
    ``SlotShortOfBatchError`` and does not move.

    :param slot_name: replication slot name (templated).
    :param manifest: URI or path of the batch's ``_manifest.json``, usually the drain's
        ``{{ ti.xcom_pull(task_ids='drain')['manifest'] }}`` (templated).
    :param lake_conn_id: the lake's ``postgres_cdc_lake`` connection (templated).
    :param postgres_conn_id: Airflow connection of the source database (templated).
    :param staging_conn_id: the ``aws`` connection of an ``s3://`` staging store (as the drain's)
        (templated).
    :param asset_alias: the :class:`~airflow.sdk.AssetAlias` (added to ``outlets``) through which the
        pipeline's cut Asset (``assets.cut_asset(catalog, slot)``) gets one event per acknowledged
        batch that changed tables: its LSN, tag, and every table's snapshot at the cut.
    """

    template_fields: Sequence[str] = (
        "postgres_conn_id",
        "slot_name",
        "manifest",
        "lake_conn_id",
        "staging_conn_id",
    )
    ui_color = "#d5f5d5"

    def __init__(
        self,
        *,
        slot_name: str,
        manifest: str,
        lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        staging_conn_id: str | None = None,
        asset_alias: str = CUTS_ALIAS,
        **kwargs: Any,
    ) -> None:
        # The slot and the lake may be templates: the cut Asset is named at run time, through an alias.
        kwargs["outlets"] = [*(kwargs.get("outlets") or ()), alias(asset_alias)]
        super().__init__(**kwargs)
        self.slot_name = slot_name
        self.manifest = manifest
        self.lake_conn_id = lake_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.staging_conn_id = staging_conn_id
        self.asset_alias = asset_alias

    def execute(self, context: Context) -> dict[str, Any]:
        # The engine (pyarrow, pyiceberg) loads when the task runs, not when its DAG is parsed.
        from airflow_provider_postgres_cdc.engine.lake_catalog import cut_at, unapplied_tables
        from airflow_provider_postgres_cdc.engine.lake_events import latency_seconds
        from airflow_provider_postgres_cdc.engine.staging import read_manifest

        manifest = read_manifest(self.manifest, staging_options(self.staging_conn_id))
        if manifest.slot != self.slot_name:
            raise ManifestSlotMismatchError(
                f"manifest {self.manifest} belongs to slot {manifest.slot!r}, not {self.slot_name!r}: "
                "pass the manifest drained from this slot"
            )
        lake = self._get_lake_hook().get_conn()
        missing = unapplied_tables(lake, manifest)
        if missing:
            raise BatchNotAppliedError(
                f"batch {manifest.batch_id} is not applied to the lake for {', '.join(missing)}: "
                "the slot stays where it is. Run (or re-run) the apply task for this manifest first."
            )
        # Read before the slot moves: nothing after the advance may fail the ack.
        cut = cut_at(lake, manifest.slot, manifest.end_lsn) if manifest.tables else None
        hook = self._get_hook()
        position = hook.advance_slot(self.slot_name, manifest.end_lsn, whole=True)
        acked_at = datetime.now(UTC)
        self.log.info("slot %s acknowledged up to %s (batch %s)", self.slot_name, position, manifest.batch_id)
        lag_bytes = self._lag_bytes(hook)
        metrics.slot_lag(self.slot_name, lag_bytes, None)
        latency = latency_seconds(manifest.stats.newest_commit_time, acked_at)
        if latency is not None and manifest.tables:
            metrics.timing(metrics.BATCH_LATENCY, latency, slot=self.slot_name)
        if cut is not None and position == manifest.end_lsn:
            self._emit_cut(context, lake, manifest, cut, acked_at, lag_bytes)
        return {
            "slot": self.slot_name,
            "batch_id": manifest.batch_id,
            "confirmed_flush_lsn": str(position),
            "lag_bytes": lag_bytes,
        }

    def _emit_cut(
        self,
        context: Context,
        lake: LakeConfig,
        manifest: Manifest,
        cut: Cut,
        acked_at: datetime,
        lag: int | None,
    ) -> None:
        """The cut event, while the slot stands at this batch's end: a retry of an ack whose first
        attempt moved the slot and then died still tells the consumers; a batch already followed
        by a later ack does not (its cut is no longer the newest)."""
        from airflow_provider_postgres_cdc.engine.lake_events import cut_event_extra

        extra = cut_event_extra(manifest, cut, lake.catalog, acked_at=acked_at, lag_bytes=lag)
        context["outlet_events"][alias(self.asset_alias)].add(cut_asset(lake, self.slot_name), extra=extra)
        self.log.info(
            "cut %s at %s: Asset event on %s", cut.tag, cut.lsn, cut_asset(lake, self.slot_name).uri
        )

    def _lag_bytes(self, hook: PostgresCdcHook) -> int | None:
        """The slot's lag right after the ack, for the metric and the event (None if it cannot be read)."""
        try:
            return hook.slot_health(self.slot_name).lag_bytes
        except (
            Exception
        ) as exc:  # package, psycopg2 or network errors alike: the slot has moved, the ack stands
            self.log.warning("could not measure slot %s after the ack: %s", self.slot_name, exc)
            return None

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    def _get_lake_hook(self) -> PostgresCdcLakeHook:
        return PostgresCdcLakeHook(self.lake_conn_id)

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage (README): the batch's lake tables in, the pipeline's cut out (lineage/tasks.py)."""
        from airflow_provider_postgres_cdc.lineage.tasks import ack_lineage

        return ack_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: as at start (the cut and its LSN window are known from the manifest)."""
        from airflow_provider_postgres_cdc.lineage.tasks import ack_lineage

        return ack_lineage(self)
