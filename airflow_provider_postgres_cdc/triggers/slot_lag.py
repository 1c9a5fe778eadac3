"""``PostgresCdcSlotLagTrigger``: the deferred half of ``PostgresCdcSlotLagSensor``, run by the triggerer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg2
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_postgres_cdc import metrics
from airflow_provider_postgres_cdc.engine.health import (
    LagThresholds,
    Outcome,
    SlotHealth,
    SlotLagDecision,
    assess_slot_async,
    decide,
)
from airflow_provider_postgres_cdc.errors import PostgresCdcError, SlotNotFoundError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook


class PostgresCdcSlotLagTrigger(BaseTrigger):
    """Checks a slot every ``poke_interval`` seconds until its lag crosses the thresholds.

    Fires exactly one event, a :meth:`SlotLagDecision.to_event` dict whose ``outcome`` is ``met``,
    or a failure (``lost``, ``wal_at_risk``, ``slot_missing``, ``error``) the sensor turns back
    into the matching exception. Every check runs on an asynchronous psycopg2 connection, so the
    triggerer's event loop never blocks; the connection is opened and closed per check, which
    makes ``run()`` restartable (a triggerer may run the same trigger again after a restart).

    Arguments are plain JSON values and name the Airflow connection rather than carry its
    credentials: the password is looked up where the trigger runs. Sizes are bytes, ages seconds;
    their meaning is the sensor's
    (:class:`~airflow_provider_postgres_cdc.sensors.slot_lag.PostgresCdcSlotLagSensor`).
    """

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        publications: Sequence[str] = (),
        min_lag_bytes: int | None = None,
        max_lag_bytes: int | None = None,
        min_lag_age: float | None = None,
        max_lag_age: float | None = None,
        min_safe_wal_bytes: int | None = None,
        on_wal_risk: str = "fail",
        stale_after: float | None = None,
        poke_interval: float = 60.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is untyped
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.publications = list(publications)
        self.min_lag_bytes = min_lag_bytes
        self.max_lag_bytes = max_lag_bytes
        self.min_lag_age = min_lag_age
        self.max_lag_age = max_lag_age
        self.min_safe_wal_bytes = min_safe_wal_bytes
        self.on_wal_risk = on_wal_risk
        self.stale_after = stale_after
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_postgres_cdc.triggers.slot_lag.PostgresCdcSlotLagTrigger",
            {
                "slot_name": self.slot_name,
                "postgres_conn_id": self.postgres_conn_id,
                "publications": list(self.publications),
                "min_lag_bytes": self.min_lag_bytes,
                "max_lag_bytes": self.max_lag_bytes,
                "min_lag_age": self.min_lag_age,
                "max_lag_age": self.max_lag_age,
                "min_safe_wal_bytes": self.min_safe_wal_bytes,
                "on_wal_risk": self.on_wal_risk,
                "stale_after": self.stale_after,
                "poke_interval": self.poke_interval,
            },
        )

    def _thresholds(self) -> LagThresholds:
        return LagThresholds.parse(
            min_lag_bytes=self.min_lag_bytes,
            max_lag_bytes=self.max_lag_bytes,
            min_lag_age=self.min_lag_age,
            max_lag_age=self.max_lag_age,
        )

    async def _check(
        self, params: dict[str, Any], thresholds: LagThresholds, previous: SlotHealth | None
    ) -> tuple[SlotLagDecision, SlotHealth | None]:
        try:
            health = await assess_slot_async(params, self.slot_name, self.publications, previous=previous)
        except SlotNotFoundError as exc:
            return SlotLagDecision(Outcome.SLOT_MISSING, str(exc)), None
        lag_age = None if health.lag_age is None else health.lag_age.total_seconds()
        metrics.slot_lag(self.slot_name, health.lag_bytes, lag_age)
        return decide(
            health,
            thresholds,
            min_safe_wal_bytes=self.min_safe_wal_bytes,
            on_wal_risk=self.on_wal_risk,
            stale_after=None if self.stale_after is None else timedelta(seconds=self.stale_after),
        ), health

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            thresholds = self._thresholds()
            params = await PostgresCdcHook(self.postgres_conn_id).aconnection_params()
            health = None
            while True:
                decision, health = await self._check(params, thresholds, health)
                for warning in decision.warnings:
                    self.log.warning("%s", warning)
                if decision.done:
                    self.log.info("%s", decision.message)
                    break
                self.log.info("%s; next check in %ss", decision.message, self.poke_interval)
                await asyncio.sleep(self.poke_interval)
        except (PostgresCdcError, ValueError, psycopg2.Error, OSError, TimeoutError) as exc:
            # psycopg2 and libpq messages name host, port and user, never the password.
            decision = SlotLagDecision(Outcome.ERROR, f"{type(exc).__name__}: {exc}")
        yield TriggerEvent(decision.to_event())  # type: ignore[no-untyped-call]
