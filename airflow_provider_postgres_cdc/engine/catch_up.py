"""Whether a CDC run that just acknowledged its batch should start the next run at once.

A run drains at most one bounded batch. After an outage the slot holds many batches' worth, and
waiting for the schedule between them would stretch a backlog over hours. So a run whose batch
was *full* (the drain stopped at its ``max_messages`` or ``max_bytes`` bound with more WAL behind
it) starts the next run as soon as its ack has moved the slot, until the backlog is down to less
than a batch, the slot's lag is under the run's threshold, or the chain's time budget is spent.
Each run acknowledges its batch before the next one drains, so a crash anywhere loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# The run conf key that carries the time the chain of catch-up runs began, from run to run.
CATCH_UP_SINCE = "catch_up_since"


@dataclass(frozen=True, slots=True)
class CatchUp:
    """The decision: ``go`` or not, and why (for the task log and the skip message)."""

    go: bool
    reason: str


def catch_up(
    *,
    full: bool,
    lag_bytes: int | None,
    min_lag_bytes: int,
    since: datetime,
    now: datetime,
    budget_seconds: float,
) -> CatchUp:
    """Decide from the batch just acknowledged, the slot's lag after the ack and the chain's budget.

    :param full: the batch stopped at its bound with more WAL behind it (``stats.full``).
    :param lag_bytes: the slot's lag right after the ack; ``None`` when it could not be read (the
        full batch alone then decides).
    :param min_lag_bytes: the run's threshold: a smaller lag waits for the schedule.
    :param since: when the chain of catch-up runs began (the first run's start).
    :param budget_seconds: how long a chain may go on.
    """
    if not full:
        return CatchUp(False, "the batch took everything the slot held: the next run waits for the schedule")
    if lag_bytes is not None and lag_bytes < max(min_lag_bytes, 1):
        return CatchUp(False, f"the slot's lag ({lag_bytes} bytes) is under the threshold ({min_lag_bytes})")
    spent = (now - since).total_seconds()
    if spent >= budget_seconds:
        return CatchUp(
            False,
            f"the catch-up began {spent:.0f} s ago, past its budget of {budget_seconds:g} s: "
            "the next run waits for the schedule",
        )
    lag = "an unknown amount" if lag_bytes is None else f"{lag_bytes} bytes"
    return CatchUp(
        True,
        f"the batch was full and the slot lags by {lag}; {budget_seconds - spent:.0f} s of the "
        "catch-up budget left: starting the next run now",
    )
