"""The judgement of a slot measurement: has the lag crossed the thresholds, is the WAL safe.

Pure functions over a :class:`~.model.SlotHealth` (:func:`decide`, :func:`wal_safety`,
:func:`judge_lag`, :func:`stale_warning`), so the sensor, its trigger, the hook and the
``pgcdc lag`` CLI reach the same verdict with the same message. A slot nobody drains keeps WAL
on the server's disk until the disk fills, or, when ``max_slot_wal_keep_size`` caps it, until
PostgreSQL invalidates the slot (``wal_status = lost``) and every change not yet drained is gone:
the messages say what to do before and after that happens.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_postgres_cdc.engine.health.model import SlotHealth
from airflow_provider_postgres_cdc.engine.health.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)
from airflow_provider_postgres_cdc.errors import (
    RECOVERY,
    RECOVERY_DAG,
    PostgresCdcError,
    SlotLostError,
    SlotNotAcknowledgedError,
    SlotNotFoundError,
    WalRetentionError,
)
from airflow_provider_postgres_cdc.replication.slots import invalidation_message

__all__ = [
    "LagThresholds",
    "Outcome",
    "SlotLagDecision",
    "WalRetentionError",
    "WalRisk",
    "WalSafety",
    "check_threshold_kinds",
    "decide",
    "judge_lag",
    "stale_warning",
    "wal_safety",
]


@dataclass(frozen=True, slots=True)
class LagThresholds:
    """When a lag sensor fires: either once enough has piled up, or once the slot has caught up.

    ``min_*`` thresholds ("piled up", worth a drain) fire when ANY of them is reached; ``max_*``
    thresholds ("caught up", e.g. before a cut-over) fire when ALL of them hold. The two kinds do
    not mix: a window between them is not a lag condition anyone gates on, and mixing them would
    make the any/all reading ambiguous.
    """

    min_lag_bytes: int | None = None
    max_lag_bytes: int | None = None
    min_lag_age: timedelta | None = None
    max_lag_age: timedelta | None = None

    def __post_init__(self) -> None:
        check_threshold_kinds(
            min_lag_bytes=self.min_lag_bytes,
            max_lag_bytes=self.max_lag_bytes,
            min_lag_age=self.min_lag_age,
            max_lag_age=self.max_lag_age,
        )

    @classmethod
    def parse(
        cls,
        *,
        min_lag_bytes: int | str | None = None,
        max_lag_bytes: int | str | None = None,
        min_lag_age: timedelta | float | str | None = None,
        max_lag_age: timedelta | float | str | None = None,
    ) -> LagThresholds:
        """Thresholds from the loose forms operator fields take after templating."""
        return cls(
            None if min_lag_bytes is None else parse_size(min_lag_bytes),
            None if max_lag_bytes is None else parse_size(max_lag_bytes),
            None if min_lag_age is None else parse_duration(min_lag_age),
            None if max_lag_age is None else parse_duration(max_lag_age),
        )

    @property
    def fires_when_caught_up(self) -> bool:
        return self.max_lag_bytes is not None or self.max_lag_age is not None

    @property
    def needs_age(self) -> bool:
        return self.min_lag_age is not None or self.max_lag_age is not None


def check_threshold_kinds(**thresholds: object) -> None:
    """Raise ``ValueError`` unless at least one threshold is set and min/max kinds are not mixed.

    Works on unrendered values too (only ``None``-ness matters), so operators check at DAG parse.
    """
    given = {name for name, value in thresholds.items() if value is not None}
    if not given:
        raise ValueError("set at least one of min_lag_bytes, max_lag_bytes, min_lag_age, max_lag_age")
    if any(name.startswith("min_") for name in given) and any(name.startswith("max_") for name in given):
        raise ValueError(
            f"min_* and max_* thresholds cannot be combined (got {', '.join(sorted(given))}): min_* fire "
            "when enough lag has piled up, max_* when the slot has caught up; use two sensors for both"
        )


def judge_lag(health: SlotHealth, thresholds: LagThresholds) -> tuple[bool, str]:
    """Whether the lag has crossed the thresholds, and a sentence saying where it stands."""
    lag = health.lag_bytes
    if lag is None:
        raise SlotNotAcknowledgedError(
            f"slot {health.slot_name!r} has no confirmed position (a {health.slot.slot_type} slot): "
            "lag is only defined for logical slots"
        )
    age = health.lag_age
    age_text = "unknown" if age is None else format_duration(age)
    checks: list[tuple[bool, str]] = []
    if thresholds.min_lag_bytes is not None:
        checks.append(
            (
                lag >= thresholds.min_lag_bytes,
                f"lag {format_size(lag)} >= {format_size(thresholds.min_lag_bytes)}",
            )
        )
    if thresholds.max_lag_bytes is not None:
        checks.append(
            (
                lag <= thresholds.max_lag_bytes,
                f"lag {format_size(lag)} <= {format_size(thresholds.max_lag_bytes)}",
            )
        )
    if thresholds.min_lag_age is not None:
        met = age is not None and age >= thresholds.min_lag_age
        checks.append((met, f"age {age_text} >= {format_duration(thresholds.min_lag_age)}"))
    if thresholds.max_lag_age is not None:
        met = age is not None and age <= thresholds.max_lag_age
        checks.append((met, f"age {age_text} <= {format_duration(thresholds.max_lag_age)}"))
    met = (
        all(passed for passed, _ in checks)
        if thresholds.fires_when_caught_up
        else any(passed for passed, _ in checks)
    )
    parts = "; ".join(f"{text}: {'yes' if passed else 'no'}" for passed, text in checks)
    verdict = "threshold crossed" if met else "waiting"
    return met, f"slot {health.slot_name!r} {verdict} ({parts})"


class WalRisk(enum.StrEnum):
    """How close PostgreSQL is to removing WAL the slot still needs."""

    OK = "ok"
    AT_RISK = "at_risk"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class WalSafety:
    """How safe the slot's WAL is, and the message that says what to do about it."""

    risk: WalRisk
    message: str


def wal_safety(health: SlotHealth, min_safe_wal_bytes: int | None = None) -> WalSafety:
    """Judge ``wal_status`` and ``safe_wal_size`` against ``max_slot_wal_keep_size`` and a floor.

    ``unreserved`` means the slot holds more WAL than ``max_slot_wal_keep_size`` allows and the
    next checkpoint may remove some of it; ``safe_wal_size`` is how much more WAL the server can
    write before that happens. ``lost`` means it has happened.
    """
    slot, name = health.slot, health.slot_name
    keep = (
        "unlimited" if health.max_slot_wal_keep_size is None else format_size(health.max_slot_wal_keep_size)
    )
    pending = format_size(health.lag_bytes)
    if slot.invalidated and slot.invalidation_reason not in (None, "wal_removed"):
        return WalSafety(WalRisk.LOST, invalidation_message(slot))
    if slot.wal_status == "lost":
        return WalSafety(
            WalRisk.LOST,
            f"replication slot {name!r} was invalidated (wal_status = lost): PostgreSQL removed WAL it still "
            f"needed (max_slot_wal_keep_size = {keep}), so the changes not yet drained (about {pending} "
            f"of WAL after its confirmed position {slot.confirmed_flush_lsn}) can no longer be read from it "
            f"and no drain from it can succeed. Recovery: trigger {RECOVERY} with this "
            f"pipeline's params (airflow dags trigger {RECOVERY_DAG} --conf '{{\"slot_name\": "
            f'"{name}", ...}}\'): it recreates the slot with an exported snapshot and reloads every '
            "published table, so the targets are equal again. Then drain more often or raise "
            "max_slot_wal_keep_size so it does not happen again.",
        )
    advice = (
        "Drain the slot now; to buy time, raise the cap if the disk has room "
        f"(ALTER SYSTEM SET max_slot_wal_keep_size = '{_suggested_keep(health)}'; "
        "SELECT pg_reload_conf();)."
    )
    if slot.wal_status == "unreserved":
        return WalSafety(
            WalRisk.AT_RISK,
            f"replication slot {name!r} is unreserved: it holds {format_size(health.retained_bytes)} of WAL, "
            f"more than max_slot_wal_keep_size = {keep} allows, and the next checkpoint may remove WAL it "
            f"needs and invalidate it, losing {pending} of changes not yet drained. {advice}",
        )
    safe = slot.safe_wal_size
    if min_safe_wal_bytes is not None and safe is not None and safe < min_safe_wal_bytes:
        return WalSafety(
            WalRisk.AT_RISK,
            f"replication slot {name!r} is close to being invalidated: only {format_size(safe)} more WAL can "
            f"be written before PostgreSQL may remove WAL it needs (safe_wal_size, floor "
            f"{format_size(min_safe_wal_bytes)}; max_slot_wal_keep_size = {keep}); {pending} of changes "
            f"not yet drained are at risk. {advice}",
        )
    note = f"wal_status {slot.wal_status}, safe_wal_size {format_size(safe)}, max_slot_wal_keep_size {keep}"
    return WalSafety(WalRisk.OK, note)


def _suggested_keep(health: SlotHealth) -> str:
    """A cap to suggest: double what the slot holds (or the current cap), in whole GB (GUC syntax)."""
    base = max(health.retained_bytes or 0, health.max_slot_wal_keep_size or 0, 1)
    return f"{-(-2 * base // (1 << 30))}GB"


def stale_warning(health: SlotHealth, stale_after: timedelta | None) -> str | None:
    """A warning when nobody has read an inactive slot for ``stale_after`` or longer."""
    idle = health.idle_for
    if stale_after is None or health.slot.active or idle is None or idle < stale_after:
        return None
    return (
        f"replication slot {health.slot_name!r} is inactive and stale: nobody has drained it for at least "
        f"{format_duration(idle)} (stale after {format_duration(stale_after)}), and it keeps "
        f"{format_size(health.retained_bytes)} of WAL on the server. Drain it, or drop it if nothing will "
        "ever read it again."
    )


class Outcome(enum.StrEnum):
    """What a lag check concluded; every outcome but ``waiting`` ends a sensor."""

    MET = "met"
    WAITING = "waiting"
    WAL_AT_RISK = "wal_at_risk"
    LOST = "lost"
    SLOT_MISSING = "slot_missing"
    ERROR = "error"


_FAILURES: dict[Outcome, type[PostgresCdcError]] = {
    Outcome.WAL_AT_RISK: WalRetentionError,
    Outcome.LOST: SlotLostError,
    Outcome.SLOT_MISSING: SlotNotFoundError,
    Outcome.ERROR: PostgresCdcError,
}


@dataclass(frozen=True, slots=True)
class SlotLagDecision:
    """The verdict of one check: outcome, the main message, and warnings to log on the way."""

    outcome: Outcome
    message: str
    warnings: tuple[str, ...] = ()
    health: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def done(self) -> bool:
        return self.outcome is not Outcome.WAITING

    def raise_for_failure(self) -> None:
        """Raise the package error matching a failed outcome (they are not Airflow exceptions, so
        ``soft_fail`` does not turn a lost slot into a skipped task)."""
        error = _FAILURES.get(self.outcome)
        if error is not None:
            raise error(self.message)

    def to_event(self) -> dict[str, Any]:
        """The JSON payload a trigger fires."""
        return {
            "outcome": self.outcome.value,
            "message": self.message,
            "warnings": list(self.warnings),
            "health": self.health,
        }

    @classmethod
    def from_event(cls, event: Mapping[str, Any] | None) -> SlotLagDecision:
        if not event or "outcome" not in event:
            return cls(Outcome.ERROR, f"the slot lag trigger fired an unexpected event: {event!r}")
        return cls(
            Outcome(event["outcome"]),
            str(event["message"]),
            tuple(event.get("warnings") or ()),
            event.get("health"),
        )


def decide(
    health: SlotHealth,
    thresholds: LagThresholds,
    *,
    min_safe_wal_bytes: int | None = None,
    on_wal_risk: str = "fail",
    stale_after: timedelta | None = None,
) -> SlotLagDecision:
    """One check of a lag sensor: WAL safety first (a lost slot always fails), then the thresholds.

    :param on_wal_risk: ``"fail"`` ends the check with ``wal_at_risk``; ``"warn"`` only warns.
    """
    if on_wal_risk not in ("fail", "warn"):
        raise ValueError(f"on_wal_risk must be 'fail' or 'warn', not {on_wal_risk!r}")
    summary = health.as_dict()
    safety = wal_safety(health, min_safe_wal_bytes)
    if safety.risk is WalRisk.LOST:
        return SlotLagDecision(Outcome.LOST, safety.message, health=summary)
    if safety.risk is WalRisk.AT_RISK and on_wal_risk == "fail":
        return SlotLagDecision(Outcome.WAL_AT_RISK, safety.message, health=summary)
    warnings = [safety.message] if safety.risk is WalRisk.AT_RISK else []
    stale = stale_warning(health, stale_after)
    if stale:
        warnings.append(stale)
    if thresholds.needs_age and health.lag_age is None:
        warnings.append(
            f"slot {health.slot_name!r}: the age of its lag is unknown: {health.age_unknown_reason}"
        )
    try:
        met, message = judge_lag(health, thresholds)
    except PostgresCdcError as exc:
        return SlotLagDecision(Outcome.ERROR, str(exc), tuple(warnings), summary)
    return SlotLagDecision(Outcome.MET if met else Outcome.WAITING, message, tuple(warnings), summary)
