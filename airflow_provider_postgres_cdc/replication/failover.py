"""Is this pipeline's slot safe across a failover? What ``pgcdc check`` reports on either server.

A failover slot (PostgreSQL 17+) is copied to a physical standby that runs with
``sync_replication_slots``, ``hot_standby_feedback`` and a ``primary_slot_name``, and whose
``primary_conninfo`` names a database. The copy is usable after a promotion only once it is
*sync-ready*: synchronized and no longer temporary (a temporary copy is dropped at promotion). On
the primary, ``synchronized_standby_slots`` naming the standby's physical slot keeps logical
consumers from getting ahead of the standby. Each gap is reported as the error that names its
fix; on the primary, gaps that only matter once a standby exists are warnings.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_postgres_cdc.errors import (
    RECOVERY,
    FailoverNotReadyError,
    PrerequisiteError,
    ServerFeatureError,
    SlotNotFoundError,
    StandbyPromotedError,
)
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication.features import FAILOVER_SLOTS, FEATURES, STANDBY_DECODING
from airflow_provider_postgres_cdc.replication.slots import (
    SlotInfo,
    describe_slot,
    invalidation_message,
)

log = logging.getLogger(__name__)

_RELOAD = "SELECT pg_reload_conf();"
_NO_FEEDBACK = (
    "hot_standby_feedback is off on this standby: the primary may remove catalog rows a logical slot "
    'here still needs, which invalidates it (rows_removed). Run "ALTER SYSTEM SET hot_standby_feedback = '
    f'on;" {_RELOAD}'
)
# Read through pg_settings: a setting missing from this major, or hidden from this role
# (primary_conninfo is for superusers and pg_read_all_settings), reads as NULL instead of failing.
_SETTINGS_SQL = """
SELECT pg_is_in_recovery(),
       current_setting('server_version_num')::int,
       (SELECT setting FROM pg_settings WHERE name = 'hot_standby_feedback'),
       (SELECT setting FROM pg_settings WHERE name = 'primary_slot_name'),
       (SELECT setting FROM pg_settings WHERE name = 'sync_replication_slots'),
       (SELECT setting FROM pg_settings WHERE name = 'synchronized_standby_slots'),
       (SELECT setting FROM pg_settings WHERE name = 'primary_conninfo')
"""


@dataclass(frozen=True, slots=True)
class FailoverReport:
    """The settings failover slots depend on, and the pipeline slot's state, on one server."""

    in_recovery: bool
    server_version_num: int
    hot_standby_feedback: str | None
    primary_slot_name: str | None
    sync_replication_slots: str | None
    synchronized_standby_slots: str | None
    primary_conninfo_has_dbname: bool | None
    slot_name: str | None
    slot: SlotInfo | None

    @property
    def major(self) -> int:
        return self.server_version_num // 10000

    def problems(self) -> list[PrerequisiteError]:
        """On a standby: what keeps the slot from surviving a promotion, each with its fix."""
        if not self.in_recovery:
            return []
        if self.major < FEATURES[STANDBY_DECODING][0]:
            return [
                ServerFeatureError(
                    f"this standby runs PostgreSQL {self.major}: a logical slot can live on a standby from "
                    f"PostgreSQL {FEATURES[STANDBY_DECODING][0]}, and be synchronized to one from "
                    f"{FEATURES[FAILOVER_SLOTS][0]}. Read the slot on the primary, and plan a failover as a "
                    f"re-snapshot ({RECOVERY}), or upgrade."
                )
            ]
        found: list[PrerequisiteError] = []
        if self.hot_standby_feedback != "on":
            found.append(FailoverNotReadyError(_NO_FEEDBACK))
        if not self.primary_slot_name:
            found.append(
                FailoverNotReadyError(
                    "primary_slot_name is empty on this standby: without a physical slot on the primary, "
                    "neither its WAL nor its hot_standby_feedback is kept while it is disconnected. On the "
                    "primary run \"SELECT pg_create_physical_replication_slot('standby1');\", here "
                    f"\"ALTER SYSTEM SET primary_slot_name = 'standby1';\" {_RELOAD}"
                )
            )
        if self.major < FEATURES[FAILOVER_SLOTS][0]:
            found.append(
                ServerFeatureError(
                    f"this standby runs PostgreSQL {self.major}: failover slots need "
                    f"{FEATURES[FAILOVER_SLOTS][0]}, so a promotion loses the pipeline's slot and the lake "
                    f"must be re-snapshotted ({RECOVERY}). Upgrade to keep the slot."
                )
            )
            return found
        if self.sync_replication_slots != "on":
            found.append(
                FailoverNotReadyError(
                    "sync_replication_slots is off on this standby: the primary's failover slots are not "
                    f'copied here. Run "ALTER SYSTEM SET sync_replication_slots = on;" {_RELOAD}'
                )
            )
        if self.primary_conninfo_has_dbname is False:
            found.append(
                FailoverNotReadyError(
                    "primary_conninfo names no database: slot synchronization connects to one. Add "
                    "dbname=<any database> to primary_conninfo (ALTER SYSTEM SET primary_conninfo = "
                    f"'... dbname=postgres';) and {_RELOAD}"
                )
            )
        found.extend(self._slot_problems())
        return found

    def _slot_problems(self) -> list[PrerequisiteError]:
        slot = self.slot
        if slot is None:
            if self.slot_name is None:
                return []
            return [
                FailoverNotReadyError(
                    f"slot {self.slot_name!r} does not exist on this standby: it is not synchronized, and "
                    "a promotion now would lose it (the lake would have to be re-snapshotted). Create it on "
                    "the primary as a failover slot (the initial snapshot does so from PostgreSQL 17), and "
                    "check the standby's settings above."
                )
            ]
        if slot.invalidated:
            return [FailoverNotReadyError(f"on this standby: {invalidation_message(slot)}")]
        if not slot.synced:
            return [
                FailoverNotReadyError(
                    f"slot {slot.slot_name!r} on this standby is not a synchronized copy of the primary's "
                    "(synced = false): a slot created here is not carried over by a promotion's "
                    "continuation of the primary's pipeline. Create the pipeline's slot on the primary "
                    "with failover (the default from PostgreSQL 17)."
                )
            ]
        if slot.temporary:
            return [
                FailoverNotReadyError(
                    f"slot {slot.slot_name!r} is synchronized here but not yet sync-ready (temporary): a "
                    "promotion now would drop it, and the lake would have to be re-snapshotted. It becomes "
                    "sync-ready once the primary's slot has been acknowledged past a running_xacts record "
                    "(a checkpoint, or SELECT pg_log_standby_snapshot(); on the primary, then the next "
                    "acknowledged batch)."
                )
            ]
        return []

    def warnings(self) -> list[str]:
        """On a primary (17+): what makes a failover slot's copy on a standby unsafe or behind."""
        if self.in_recovery or self.major < FEATURES[FAILOVER_SLOTS][0] or self.slot is None:
            return []
        found: list[str] = []
        if not self.slot.failover:
            found.append(
                f"slot {self.slot.slot_name!r} is not a failover slot: a standby does not keep a copy, so a "
                "failover loses it. Recreate it with the initial snapshot (failover is on by default from "
                f'PostgreSQL 17), or run "ALTER_REPLICATION_SLOT {self.slot.slot_name} (FAILOVER true)" '
                "on a replication connection."
            )
        elif not self.synchronized_standby_slots:
            found.append(
                "synchronized_standby_slots is empty: the pipeline may read changes the standby has not "
                "received, and a standby's copy of the slot may be behind after a failover (the pipeline "
                "then reads again what it had applied; docs/FAILOVER.md). Name the standby's physical slot: "
                f"\"ALTER SYSTEM SET synchronized_standby_slots = 'standby1';\" {_RELOAD}"
            )
        return found

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["slot"] = None if self.slot is None else self.slot.as_dict()
        return data


def inspect_failover(conn: Any, slot_name: str | None = None) -> FailoverReport:
    """Read the failover settings of the server behind ``conn`` and, if named, its slot's state."""
    with conn.cursor() as cur:
        cur.execute(_SETTINGS_SQL)
        in_recovery, version, feedback, primary_slot, sync_slots, standby_slots, conninfo = cur.fetchone()
    has_dbname = None if conninfo is None else ("dbname=" in conninfo.replace(" =", "="))
    slot = None
    if slot_name is not None:
        with contextlib.suppress(SlotNotFoundError):
            slot = describe_slot(conn, slot_name)
    return FailoverReport(
        in_recovery, version, feedback, primary_slot or None, sync_slots, standby_slots or None,
        has_dbname if in_recovery else None, slot_name, slot,
    )  # fmt: skip


# ---------------------------------------------------------------------------- the drain's window


# The standbys a failover slot must not get ahead of: the physical slots named in
# synchronized_standby_slots (PostgreSQL 17+; NULL before), their flushed positions, and how many
# of them are missing or never connected.
_STANDBYS_SQL = """
SELECT count(*), min(s.restart_lsn)::text, count(*) FILTER (WHERE s.restart_lsn IS NULL)
FROM unnest(string_to_array(nullif(current_setting('synchronized_standby_slots', true), ''), ',')) AS n(name)
LEFT JOIN pg_replication_slots s ON s.slot_name = btrim(n.name) AND s.slot_type = 'physical'
"""


def standbys_flushed(conn: Any, start: Lsn) -> Lsn | None:
    """How far every standby of ``synchronized_standby_slots`` has flushed, or ``None`` if none is named.

    PostgreSQL holds a failover slot's own consumers back the same way; the peek reads a temporary
    copy of the slot, which it does not hold back, so the drain bounds itself. A standby that is
    named but missing or never connected holds the batch at ``start`` (an empty batch), as it holds
    PostgreSQL's own consumers back.
    """
    with conn.cursor() as cur:
        cur.execute(_STANDBYS_SQL)
        named, flushed, unknown = cur.fetchone()
    if not named:
        return None
    if unknown or flushed is None:
        log.warning(
            "a standby named in synchronized_standby_slots has no position (missing slot, or never "
            "connected): the batch waits at %s for it, as PostgreSQL's own failover-slot consumers do",
            start,
        )
        return start
    return Lsn.parse(flushed)


def require_standby_feedback(conn: Any, slot: str) -> None:
    """Refuse to decode on a standby without ``hot_standby_feedback``, before anything is read.

    Decoding works there, until the primary's vacuum removes catalog rows the slot still needs and
    PostgreSQL invalidates the slot (``rows_removed``): a re-snapshot of the whole lake. Stopping
    first, with the fix, costs one failed run instead.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('hot_standby_feedback')")
        (feedback,) = cur.fetchone()
    if feedback != "on":
        raise FailoverNotReadyError(f"slot {slot!r} was not read and did not move: {_NO_FEEDBACK}")


def check_not_promoted(conn: Any, slot: str, start: Lsn) -> None:
    """Refuse a batch read from a standby that was promoted meanwhile (its window crossed the switch)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_is_in_recovery()")
        still_standby = bool(cur.fetchone()[0])
    if not still_standby:
        raise StandbyPromotedError(
            f"the standby holding replication slot {slot!r} was promoted to primary while this drain read "
            f"it: nothing was staged and the slot did not move (still at {start}). Run the drain again: it "
            "reads the same position from the promoted server. If the pipeline should follow the old "
            "primary's own slot instead, point its connection there (docs/FAILOVER.md)."
        )
