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
    check_threshold_kinds,
    decide,
    parse_duration,
    parse_size,
)
from airflow_provider_postgres_cdc.errors import PostgresCdcError, SlotNotFoundError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook

SIZE_FORMS = "an int of bytes or a size such as '64MB' or '1.5 GB'"
AGE_FORMS = "a timedelta, a number of seconds, or a string of seconds such as '600'"


def size_argument(name: str, value: int | str | None) -> int | None:
    """Bytes from a size argument, or a ``ValueError`` naming the argument and the forms it takes."""
    try:
        return None if value is None else parse_size(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}={value!r} is not {SIZE_FORMS} ({exc})") from None


def age_argument(name: str, value: timedelta | float | str | None) -> timedelta | None:
    """A duration from an age argument, or a ``ValueError`` naming the argument and its forms."""
    try:
        return None if value is None else parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}={value!r} is not {AGE_FORMS} ({exc})") from None


def check_threshold_choice(publications: object, **thresholds: object) -> None:
    """Raise ``ValueError`` unless the set thresholds make one condition and the ages can be read.

    Only which thresholds are set matters here, so it holds for templates not rendered yet.
    """
    check_threshold_kinds(**thresholds)
    ages = thresholds.get("min_lag_age") is not None or thresholds.get("max_lag_age") is not None
    if ages and not publications:
        raise ValueError(
            "min_lag_age/max_lag_age need publications: the age of the lag is read by decoding the "
            "oldest pending transaction, and pgoutput decodes only for named publications"
        )


def lag_thresholds(
    *,
    min_lag_bytes: int | str | None,
    max_lag_bytes: int | str | None,
    min_lag_age: timedelta | float | str | None,
    max_lag_age: timedelta | float | str | None,
    publications: object,
) -> LagThresholds:
    """The thresholds of a lag sensor or trigger in bytes and durations, or a ``ValueError``."""
    check_threshold_choice(
        publications,
        min_lag_bytes=min_lag_bytes,
        max_lag_bytes=max_lag_bytes,
        min_lag_age=min_lag_age,
        max_lag_age=max_lag_age,
    )
    return LagThresholds(
        size_argument("min_lag_bytes", min_lag_bytes),
        size_argument("max_lag_bytes", max_lag_bytes),
        age_argument("min_lag_age", min_lag_age),
        age_argument("max_lag_age", max_lag_age),
    )


def as_seconds(value: timedelta | None) -> float | None:
    """A duration as JSON-friendly seconds (``None`` stays ``None``)."""
    return None if value is None else value.total_seconds()


class PostgresCdcSlotLagTrigger(BaseTrigger):
    """Checks a slot every ``poke_interval`` seconds until its lag crosses the thresholds.

    Fires exactly one event, a :meth:`SlotLagDecision.to_event` dict whose ``outcome`` is ``met``,
    or a failure (``lost``, ``wal_at_risk``, ``slot_missing``, ``error``) the sensor turns back
    into the matching exception. Every check runs on an asynchronous psycopg2 connection, so the
    triggerer's event loop never blocks; the connection is opened and closed per check, which
    makes ``run()`` restartable (a triggerer may run the same trigger again after a restart).

    The thresholds mean exactly what they mean on the sensor
    (:class:`~airflow_provider_postgres_cdc.sensors.slot_lag.PostgresCdcSlotLagSensor`) and on the
    AssetWatcher's trigger, judged by the same
    :func:`~airflow_provider_postgres_cdc.engine.health.decide`:

    * ``min_lag_bytes`` / ``min_lag_age``: met once the lag is AT LEAST this many bytes / the
      oldest change not yet confirmed is AT LEAST this old ("enough has piled up"); with both
      set, reaching EITHER is enough.
    * ``max_lag_bytes`` / ``max_lag_age``: met once the lag is AT MOST this / the oldest
      unconfirmed change is AT MOST this old or none is pending ("caught up"); with both set,
      BOTH must hold.
    * ``min_*`` and ``max_*`` do not mix; at least one is needed; the ages need ``publications``.

    Arguments are checked here and kept as plain JSON values (sizes in bytes, ages in seconds,
    whatever form they were given in), and name the Airflow connection rather than carry its
    credentials: the password is looked up where the trigger runs.

    :param slot_name: the replication slot.
    :param postgres_conn_id: Airflow ``postgres`` connection to the slot's database.
    :param publications: the publications the slot is drained with (needed for the ages).
    :param min_lag_bytes: fire once the lag is at least this.
    :param max_lag_bytes: fire once the lag is at most this.
    :param min_lag_age: fire once the oldest unconfirmed change is at least this old.
    :param max_lag_age: fire once the oldest unconfirmed change is at most this old (or none is pending).
    :param min_safe_wal_bytes: floor under ``safe_wal_size``.
    :param on_wal_risk: ``"fail"`` or ``"warn"`` when the slot is unreserved or under the floor.
    :param stale_after: warn about an inactive slot nobody has read for this many seconds.
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
        on_wal_risk: str = "fail",
        stale_after: timedelta | float | None = None,
        poke_interval: float = 60.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is untyped
        if on_wal_risk not in ("fail", "warn"):
            raise ValueError(f"on_wal_risk must be 'fail' or 'warn', not {on_wal_risk!r}")
        thresholds = lag_thresholds(
            min_lag_bytes=min_lag_bytes,
            max_lag_bytes=max_lag_bytes,
            min_lag_age=min_lag_age,
            max_lag_age=max_lag_age,
            publications=publications,
        )
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.publications = [publications] if isinstance(publications, str) else list(publications)
        # Normalised to plain numbers, so the kwargs (and the hash Airflow matches an AssetWatcher's
        # trigger row by) are the same whether a DAG wrote "64MB" or 67108864.
        self.min_lag_bytes = thresholds.min_lag_bytes
        self.max_lag_bytes = thresholds.max_lag_bytes
        self.min_lag_age = as_seconds(thresholds.min_lag_age)
        self.max_lag_age = as_seconds(thresholds.max_lag_age)
        self.min_safe_wal_bytes = size_argument("min_safe_wal_bytes", min_safe_wal_bytes)
        self.on_wal_risk = on_wal_risk
        self.stale_after = as_seconds(age_argument("stale_after", stale_after))
        self.poke_interval = float(poke_interval)

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
        metrics.slot_lag(self.slot_name, health.lag_bytes, as_seconds(health.lag_age))
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
