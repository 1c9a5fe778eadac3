"""``PostgresCdcSlotLagEventTrigger``: an ``AssetWatcher`` trigger that starts a CDC run when a slot lags.

Event-driven scheduling in Airflow 3: a DAG scheduled on an ``Asset`` whose ``AssetWatcher``
runs this trigger gets a run each time the trigger fires. The triggerer keeps a watcher's
``run()`` going for as long as an unpaused DAG is scheduled on the asset, and every event it
yields becomes an asset event (``extra = {"from_trigger": True, "payload": <the event>}``). A
watcher that returns or raises is created again by the triggerer within a second or so.

The measurement and the judgement are the lag trigger's own (:class:`PostgresCdcSlotLagTrigger`,
:func:`~airflow_provider_postgres_cdc.engine.health.assess_slot_async` and
:func:`~airflow_provider_postgres_cdc.engine.health.decide`); this class adds the rule that makes a
never-ending poll loop safe to schedule on: one acknowledged slot position fires at most once
(:func:`fires`). A CDC run only moves the slot's ``confirmed_flush_lsn`` when its ack succeeds, so
while a run is queued or running, or after it failed, the watcher stays quiet however far the lag
grows; the next event comes once an ack has moved the slot and the lag crosses the threshold again.

The last announced position is kept in memory only. A watcher created again (a triggerer
restart, a move to another triggerer) may announce that position once more: one extra run,
which finds the batch already applied or drains what came since. Persisting it (Airflow's
asset state store) would trade that for a worse failure: stored before the event reached the
database and the triggerer then dying, the event would be lost, and since only a run's ack moves
the slot, no run would ever come for that backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg2
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_postgres_cdc.engine.health import Outcome, SlotHealth, SlotLagDecision
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.triggers.slot_lag import PostgresCdcSlotLagTrigger, as_seconds

__all__ = ["PostgresCdcSlotLagEventTrigger", "fires"]

TRANSIENT_ERRORS = (psycopg2.OperationalError, OSError, TimeoutError)
"""A server restart or a network blip: the watcher logs it and checks again, it does not fail."""


def fires(outcome: Outcome, position: str | None, last_fired: str | None) -> bool:
    """Whether a check fires an event: the threshold is crossed at a position not yet announced.

    ``position`` is the slot's ``confirmed_flush_lsn`` at the check, ``last_fired`` the one of
    the last event this watcher fired (``None`` before the first). Only an ack moves the
    position, so this is what keeps a slow or failed run from being followed by more runs for
    the same backlog.
    """
    return outcome is Outcome.MET and position != last_fired


class PostgresCdcSlotLagEventTrigger(PostgresCdcSlotLagTrigger, BaseEventTrigger):
    """Fires an asset event each time a slot's lag crosses its thresholds, once per slot position.

    For an ``AssetWatcher``: ``Asset(..., watchers=[AssetWatcher(name=..., trigger=<this>)])``;
    a DAG scheduled on that asset then runs "when there is enough WAL" instead of on a cron
    (``dags_examples/postgres_cdc_on_lag.py``). Checks every ``poke_interval`` seconds and never
    returns on its own; fires when the thresholds are met, at most once per
    ``confirmed_flush_lsn`` (:func:`fires`). The event's payload is the lag check's event
    (``outcome``, ``message``, ``warnings``, ``health``: the slot's health summary) plus
    ``slot_name``, ``confirmed_flush_lsn``, ``lag_bytes`` and ``lag_age_seconds``.

    The thresholds have the same names and meaning as on the lag sensor and its trigger (one
    judgement, :func:`~airflow_provider_postgres_cdc.engine.health.decide`):

    * ``min_lag_bytes`` / ``min_lag_age``: fire once the lag is AT LEAST this many bytes / the
      oldest change not yet confirmed is AT LEAST this old; with both set, reaching EITHER fires.
      This is what a CDC run is scheduled on: "enough WAL has piled up, or a committed change has
      waited long enough" (``min_lag_bytes="64MB", min_lag_age=900``).
    * ``max_lag_bytes`` / ``max_lag_age``: fire once the lag is AT MOST this / the oldest
      unconfirmed change is AT MOST this old or none is pending; with both set, BOTH must hold.
      With the once-per-position rule this announces each acknowledged position at which the
      slot has caught up (e.g. to start a cut-over DAG).
    * ``min_*`` and ``max_*`` cannot be mixed; at least one is needed; the ages need
      ``publications``, to decode the oldest pending transaction.

    A slot that does not exist or was invalidated (``wal_status = lost``), or a check that
    cannot judge it (a physical slot), fails the watcher with the lag sensor's own message and
    error (naming the ``postgres_cdc_recover_slot`` DAG): logged at once, raised one
    ``poke_interval`` later, so the triggerer's log shows the error and its traceback and the
    triggerer, which creates a failed watcher again, retries at most once per ``poke_interval``.
    A slot at risk of losing WAL (unreserved, or ``safe_wal_size`` under ``min_safe_wal_bytes``)
    is warned about on every check and fires like any other crossing: a drain is the remedy.
    Connection errors are logged and retried. Nothing in ``run`` blocks the triggerer's loop.

    Arguments are checked when the DAG is parsed and kept as plain numbers (bytes, seconds), so
    the kwargs, and the hash Airflow matches a watcher's trigger row by, do not depend on the
    form a threshold was written in.

    :param slot_name: the replication slot.
    :param postgres_conn_id: Airflow ``postgres`` connection to the slot's database (looked up
        where the trigger runs; the kwargs never hold credentials).
    :param publications: the publications the slot is drained with (needed for the ages).
    :param min_lag_bytes: fire once at least this much WAL is pending; an int or a size ("64MB").
    :param max_lag_bytes: fire once at most this much WAL is pending.
    :param min_lag_age: fire once the oldest pending change is at least this old (timedelta or seconds).
    :param max_lag_age: fire once the oldest pending change is at most this old, or none is pending.
    :param min_safe_wal_bytes: warn when ``safe_wal_size`` falls under this floor.
    :param stale_after: warn when the slot is inactive and nobody has read it for this many seconds.
    :param poke_interval: seconds between checks.
    """

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        publications: Sequence[str] | str = (),
        min_lag_bytes: int | str | None = None,
        max_lag_bytes: int | str | None = None,
        min_lag_age: timedelta | float | str | None = None,
        max_lag_age: timedelta | float | str | None = None,
        min_safe_wal_bytes: int | str | None = None,
        stale_after: timedelta | float | None = None,
        poke_interval: float = 60.0,
    ) -> None:
        super().__init__(
            slot_name=slot_name,
            postgres_conn_id=postgres_conn_id,
            publications=publications,
            min_lag_bytes=min_lag_bytes,
            max_lag_bytes=max_lag_bytes,
            min_lag_age=min_lag_age,
            max_lag_age=max_lag_age,
            min_safe_wal_bytes=min_safe_wal_bytes,
            on_wal_risk="warn",
            stale_after=stale_after,
            poke_interval=poke_interval,
        )
        self._last_fired: str | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        del kwargs["on_wal_risk"]  # always "warn" here: a drain is the remedy of a slot at risk
        return "airflow_provider_postgres_cdc.triggers.slot_lag_event.PostgresCdcSlotLagEventTrigger", kwargs

    def payload(self, decision: SlotLagDecision, health: SlotHealth) -> dict[str, Any]:
        """The event: the lag check's event plus the numbers a run (or a person) looks at first."""
        return {
            **decision.to_event(),
            "slot_name": self.slot_name,
            "confirmed_flush_lsn": _position(health),
            "lag_bytes": health.lag_bytes,
            "lag_age_seconds": as_seconds(health.lag_age),
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        thresholds = self._thresholds()
        params = await PostgresCdcHook(self.postgres_conn_id).aconnection_params()
        health: SlotHealth | None = None
        while True:
            try:
                decision, health = await self._check(params, thresholds, health)
            except TRANSIENT_ERRORS as exc:
                # libpq messages name host, port and user, never the password.
                self.log.warning(
                    "slot %r not checked (%s: %s); next check in %ss",
                    self.slot_name, type(exc).__name__, exc, self.poke_interval,
                )  # fmt: skip
                await asyncio.sleep(self.poke_interval)
                continue
            for warning in decision.warnings:
                self.log.warning("%s", warning)
            if decision.outcome not in (Outcome.MET, Outcome.WAITING):
                # Logged now, raised one poke_interval later (see the class docstring).
                self.log.error("%s", decision.message)
                await asyncio.sleep(self.poke_interval)
                decision.raise_for_failure()
            assert health is not None  # a met or waiting check always carries its measurement
            position = _position(health)
            if fires(decision.outcome, position, self._last_fired):
                self._last_fired = position
                self.log.info("%s: firing for confirmed position %s", decision.message, position)
                yield TriggerEvent(self.payload(decision, health))  # type: ignore[no-untyped-call]
            elif decision.outcome is Outcome.MET:
                self.log.info(
                    "%s, but an event for confirmed position %s was fired already; waiting for an ack "
                    "to move the slot", decision.message, position,
                )  # fmt: skip
            else:
                self.log.info("%s; next check in %ss", decision.message, self.poke_interval)
            await asyncio.sleep(self.poke_interval)


def _position(health: SlotHealth) -> str | None:
    lsn = health.slot.confirmed_flush_lsn
    return None if lsn is None else str(lsn)
