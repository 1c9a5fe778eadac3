"""``PostgresCdcSlotLagSensor``: gate drains on a slot's lag, and fail before the slot is lost."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException

from airflow_provider_postgres_cdc import metrics
from airflow_provider_postgres_cdc.engine.health import (
    LagThresholds,
    Outcome,
    SlotHealth,
    SlotLagDecision,
    decide,
)
from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.operators.arguments import is_template
from airflow_provider_postgres_cdc.triggers.slot_lag import (
    PostgresCdcSlotLagTrigger,
    age_argument,
    as_seconds,
    check_threshold_choice,
    lag_thresholds,
    size_argument,
)

if TYPE_CHECKING:
    from airflow.sdk import Context


class PostgresCdcSlotLagSensor(BaseSensorOperator):
    """Waits until a replication slot's lag crosses a threshold, checking its WAL safety on every poke.

    Lag in bytes is ``pg_current_wal_lsn() - confirmed_flush_lsn``: WAL the next drain has to read.
    Lag by time is the age of the oldest change not yet confirmed (the commit time of the first
    pending transaction of the ``publications``, read by peeking one transaction, never the backlog).

    The thresholds have the same names and meaning on :class:`PostgresCdcSlotLagTrigger` and on
    the AssetWatcher's ``PostgresCdcSlotLagEventTrigger`` (one judgement for all three,
    :func:`~airflow_provider_postgres_cdc.engine.health.decide`):

    * ``min_lag_bytes`` / ``min_lag_age``: fire once the lag is AT LEAST this many bytes / the
      oldest unconfirmed change is AT LEAST this old ("enough has piled up to be worth a drain");
      with both set, reaching EITHER fires.
    * ``max_lag_bytes`` / ``max_lag_age``: fire once the lag is AT MOST this / the oldest
      unconfirmed change is AT MOST this old or none is pending ("caught up", e.g. before a
      cut-over); with both set, BOTH must hold.
    * ``min_*`` and ``max_*`` cannot be mixed (use two sensors); at least one is needed.

    Arguments are checked when the DAG is parsed: a threshold that is not a template and cannot
    be parsed fails there, naming the forms it takes; a templated one (``"{{ params.lag }}"``) is
    checked once rendered, when the task runs.

    Every poke also judges WAL retention: a lost slot (``wal_status = lost``) fails with the
    recovery path; an ``unreserved`` slot, or one whose ``safe_wal_size`` is under
    ``min_safe_wal_bytes``, fails too (or only warns with ``on_wal_risk="warn"``). These failures
    are package errors, not Airflow sensor failures: ``soft_fail`` skips a sensor that timed out,
    never one whose slot is losing data. A missing slot fails; an inactive slot nobody has read
    for ``stale_after`` is logged as a warning on every poke.

    Works in ``poke`` and ``reschedule`` modes, and with ``deferrable=True`` (default: Airflow's
    ``[operators] default_deferrable``) hands the wait to :class:`PostgresCdcSlotLagTrigger`.
    ``timeout``, ``soft_fail`` and ``poke_interval`` are those of every sensor. The XCom value is
    the slot's health summary at the moment it fired (no credentials).

    :param slot_name: the replication slot. (templated)
    :param postgres_conn_id: Airflow ``postgres`` connection to the slot's database. (templated)
    :param min_lag_bytes: fire once the lag is at least this many bytes; an int or a size such as
        ``"64MB"``. (templated)
    :param max_lag_bytes: fire once the lag is at most this. (templated)
    :param min_lag_age: fire once the oldest unconfirmed change is at least this old; a timedelta
        or seconds. Needs ``publications``. (templated)
    :param max_lag_age: fire once the oldest unconfirmed change is at most this old (or none is
        pending). Needs ``publications``. (templated)
    :param publications: the publications the slot is drained with; needed for the age thresholds
        (pgoutput decodes nothing without them). (templated)
    :param min_safe_wal_bytes: floor under ``safe_wal_size`` (WAL the server can still write before
        the slot may be invalidated); ``None`` checks only ``wal_status``. (templated)
    :param on_wal_risk: ``"fail"`` (default) or ``"warn"`` when the slot is unreserved or under
        the floor. A lost slot always fails.
    :param stale_after: warn when the slot is inactive and nobody has read it for this long
        (timedelta or seconds; ``None`` turns it off).
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    template_fields: Sequence[str] = (
        "slot_name",
        "postgres_conn_id",
        "min_lag_bytes",
        "max_lag_bytes",
        "min_lag_age",
        "max_lag_age",
        "publications",
        "min_safe_wal_bytes",
    )
    ui_color = "#c9e4f2"

    def __init__(
        self,
        *,
        slot_name: str,
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        min_lag_bytes: int | str | None = None,
        max_lag_bytes: int | str | None = None,
        min_lag_age: timedelta | float | str | None = None,
        max_lag_age: timedelta | float | str | None = None,
        publications: Sequence[str] | str = (),
        min_safe_wal_bytes: int | str | None = None,
        on_wal_risk: str = "fail",
        stale_after: timedelta | float | None = timedelta(days=1),
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_threshold_choice(
            publications,
            min_lag_bytes=min_lag_bytes,
            max_lag_bytes=max_lag_bytes,
            min_lag_age=min_lag_age,
            max_lag_age=max_lag_age,
        )
        # Values are parsed now, templates once rendered (in execute).
        for name, size in (
            ("min_lag_bytes", min_lag_bytes),
            ("max_lag_bytes", max_lag_bytes),
            ("min_safe_wal_bytes", min_safe_wal_bytes),
        ):
            if not is_template(size):
                size_argument(name, size)
        for name, age in (("min_lag_age", min_lag_age), ("max_lag_age", max_lag_age)):
            if not is_template(age):
                age_argument(name, age)
        if on_wal_risk not in ("fail", "warn"):
            raise ValueError(f"on_wal_risk must be 'fail' or 'warn', not {on_wal_risk!r}")
        self.slot_name = slot_name
        self.postgres_conn_id = postgres_conn_id
        self.min_lag_bytes = min_lag_bytes
        self.max_lag_bytes = max_lag_bytes
        self.min_lag_age = min_lag_age
        self.max_lag_age = max_lag_age
        self.publications = publications
        self.min_safe_wal_bytes = min_safe_wal_bytes
        self.on_wal_risk = on_wal_risk
        self.stale_after = age_argument("stale_after", stale_after)
        self.deferrable = deferrable
        # The last measurement, so repeated pokes in one execute reuse the age of the lag.
        self._last_health: SlotHealth | None = None

    def _publications(self) -> list[str]:
        """The rendered publications; a single name (e.g. a rendered template) becomes a list of one."""
        if isinstance(self.publications, str):
            return [self.publications]
        return list(self.publications)

    def _thresholds(self) -> LagThresholds:
        """The rendered thresholds (a template that rendered to nonsense fails here, named)."""
        return lag_thresholds(
            min_lag_bytes=self.min_lag_bytes,
            max_lag_bytes=self.max_lag_bytes,
            min_lag_age=self.min_lag_age,
            max_lag_age=self.max_lag_age,
            publications=self.publications,
        )

    def _floor(self) -> int | None:
        return size_argument("min_safe_wal_bytes", self.min_safe_wal_bytes)

    def _conclude(self, decision: SlotLagDecision) -> PokeReturnValue:
        """Log the decision's warnings, raise for a failed outcome, else say whether it is met."""
        for warning in decision.warnings:
            self.log.warning("%s", warning)
        decision.raise_for_failure()
        self.log.info("%s", decision.message)
        return PokeReturnValue(decision.outcome is Outcome.MET, decision.health)

    def poke(self, context: Context) -> PokeReturnValue:
        hook = self._get_hook()
        try:
            health = hook.slot_health(self.slot_name, self._publications(), previous=self._last_health)
        except SlotNotFoundError as exc:
            decision = SlotLagDecision(Outcome.SLOT_MISSING, str(exc))
        else:
            self._last_health = health
            metrics.slot_lag(self.slot_name, health.lag_bytes, as_seconds(health.lag_age))
            decision = decide(
                health,
                self._thresholds(),
                min_safe_wal_bytes=self._floor(),
                on_wal_risk=self.on_wal_risk,
                stale_after=self.stale_after,
            )
        return self._conclude(decision)

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    def execute(self, context: Context) -> Any:
        # The rendered arguments are checked before the first poke, so a bad one fails at once.
        thresholds = self._thresholds()
        self._floor()
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first:
            return first.xcom_value
        self.defer(
            trigger=PostgresCdcSlotLagTrigger(
                slot_name=self.slot_name,
                postgres_conn_id=self.postgres_conn_id,
                publications=self._publications(),
                min_lag_bytes=thresholds.min_lag_bytes,
                max_lag_bytes=thresholds.max_lag_bytes,
                min_lag_age=as_seconds(thresholds.min_lag_age),
                max_lag_age=as_seconds(thresholds.max_lag_age),
                min_safe_wal_bytes=self._floor(),
                on_wal_risk=self.on_wal_risk,
                stale_after=as_seconds(self.stale_after),
                poke_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume from the trigger: its one event is either ``met`` or a failure to raise again."""
        decision = SlotLagDecision.from_event(event)
        if not self._conclude(decision):
            raise AirflowException(
                f"the slot lag trigger ended without meeting the threshold: {decision.message}"
            )
        return decision.health
