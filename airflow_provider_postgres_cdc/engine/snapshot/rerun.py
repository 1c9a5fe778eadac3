"""A re-run of an initial or recovery snapshot whose slot exists: resume the load, skip, or start over.

A snapshot run can die anywhere, SIGKILLed with its worker. Before its slot exists a re-run simply
runs. Once it exists, the re-run reads what the slot, the staging and the lake say:

* a complete staged snapshot the slot exported, ending where the slot stands: the slot has not
  moved since, so that snapshot goes to the load again (tables already loaded are skipped);
* a lake table of the slot holding changes at or past where the slot was created (staging records
  that point, ``StagingLocation.record_slot_created``; where nothing recorded it, at or past
  where the slot stands): the pipeline runs from this slot. The re-run is skipped when the slot
  moved past a staged snapshot of its own (batches went on from it, empty ones too), and
  refused, naming the backfill, otherwise;
* nothing of the kind: the run died during its copy (its exported snapshot died with it), or the
  slot was recreated by a recovery that died so (older tables hold changes only from before the
  new slot was created). Nothing was loaded from the slot and it has delivered nothing, so
  dropping it loses nothing: a new snapshot holds every change it held.
  The slot is dropped and the snapshot taken again. Only a snapshot of every published table
  may do so: one of some tables would leave the others without the changes the slot held for
  them, so it is refused instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog, owned_tables, table_state
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.snapshot.run import staged_snapshot
from airflow_provider_postgres_cdc.engine.snapshot.slot_modes import drop_created_slot
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.errors import BACKFILL, SlotExistsError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.replication.connection import ConnParams

log = logging.getLogger(__name__)

RerunAction = Literal["resume", "skip", "restart"]


@dataclass(frozen=True, slots=True)
class Rerun:
    """What a re-run does: ``resume`` hands ``staged`` (manifest URI, manifest) to the load again,
    ``skip`` leaves the running pipeline alone, ``restart`` takes the snapshot again (the slot is
    dropped already). ``reason`` says why, for the task's log."""

    action: RerunAction
    reason: str
    staged: tuple[str, Manifest] | None = None


def lake_tables_at(lake: LakeConfig, slot: str, position: Lsn) -> list[str]:
    """The slot's lake tables (its index) holding changes at or past ``position``."""
    holding = []
    for table in owned_tables(open_catalog(lake), lake, slot):
        state = table_state(table)
        if state is not None and state.applied_end_lsn >= position:
            holding.append(".".join(table.name()[-2:]))
    return holding


def rerun_snapshot(
    conn_params: ConnParams,
    slot: str,
    staging: str,
    refusal: SlotExistsError,
    *,
    lake: LakeConfig | None,
    staging_options: S3Options | None = None,
    every_table: bool = True,
) -> Rerun:
    """Decide (and for ``restart``, prepare) the re-run of a snapshot refused with ``refusal``
    because ``slot`` exists; see the module docstring. ``lake`` None: the lake cannot be asked,
    so a slot with no staged snapshot of its own is refused as before. ``every_table`` False (a
    snapshot of some published tables): the slot is never dropped, the run is refused instead."""
    conn = connect(conn_params)
    try:
        position = describe_slot(conn, slot).confirmed_flush_lsn
    finally:
        conn.close()
    # Resolved once: an s3:// store's bucket region is looked up.
    location = StagingLocation.resolve(staging, staging_options)
    staged = staged_snapshot(location, slot)
    if staged is not None and position is not None and staged[1].end_lsn >= position:
        return Rerun(
            "resume",
            f"slot {slot} exists and has not moved past its staged snapshot {staged[1].batch_id}: handing "
            "that snapshot to the load again (tables already loaded are skipped)",
            staged,
        )
    if lake is None:
        if staged is not None:
            return Rerun("skip", _moved_on(slot, position, staged[1]))
        raise SlotExistsError(
            f"{refusal} A re-run can tell whether anything was loaded from the slot only from the lake: "
            "pass lake_conn_id."
        ) from None
    created = location.slot_created(slot)
    holding = lake_tables_at(lake, slot, created if created is not None else position or Lsn(0))
    if holding and staged is not None:
        return Rerun("skip", _moved_on(slot, position, staged[1]))
    if holding:
        raise SlotExistsError(
            f"replication slot {slot!r} exists (confirmed up to {position}) and lake tables hold changes "
            f"from it ({', '.join(sorted(holding)[:5])}): the pipeline runs from this slot, and no "
            f"snapshot of it is staged. To reload tables, re-snapshot them with {BACKFILL}; to start "
            "over instead, pass recreate_slot=True (the slot's unconsumed changes are lost)."
        ) from None
    if not every_table:
        raise SlotExistsError(
            f"replication slot {slot!r} exists (confirmed up to {position}) and no snapshot of it is "
            "staged, but this run copies only some of the published tables: dropping the slot to start "
            "over would lose the changes it holds for the others. Run the initial snapshot of every "
            f"published table (an empty tables param), or reload these tables with {BACKFILL}."
        ) from None
    log.warning(
        "slot %s exists (confirmed up to %s) but no snapshot of it is staged and no lake table holds "
        "changes from it: the run that created it died before its manifest. Dropping it to start over "
        "(a new snapshot holds every change it held)",
        slot, position,
    )  # fmt: skip
    drop_created_slot(conn_params, slot)
    return Rerun("restart", f"slot {slot} was unused and dropped: taking the snapshot again")


def _moved_on(slot: str, position: Lsn | None, manifest: Manifest) -> str:
    return (
        f"slot {slot} exists and has consumed changes up to {position}, past its snapshot "
        f"{manifest.batch_id}: the pipeline runs from there, so this re-run has nothing to do (to "
        f"reload tables, re-snapshot them with {BACKFILL})"
    )
