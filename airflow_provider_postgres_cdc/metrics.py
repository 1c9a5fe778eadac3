"""The pipeline's metrics through Airflow's own ``Stats`` (StatsD, DogStatsD or OpenTelemetry, as configured).

Every metric is named ``postgres_cdc.<name>`` and tagged with the slot (README "Metrics" lists them).
Plain StatsD drops tags, so each is also sent as ``postgres_cdc.<name>.<slot>``: PostgreSQL slot names
are lower-case letters, digits and underscores, always valid in a stat name, and two pipelines
stay apart whatever the backend. Table names are only ever tags: they may hold any character.

Sending a metric never fails a task: a StatsD host that cannot be reached, or any error of the
metrics backend, is logged and the task goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta

log = logging.getLogger(__name__)

PREFIX = "postgres_cdc"
SLOT_LAG_BYTES = "slot.lag_bytes"
SLOT_LAG_SECONDS = "slot.lag_seconds"
BATCH_CHANGES = "batch.changes"
DRAIN_SECONDS = "drain.seconds"
APPLY_SECONDS = "apply.seconds"
BATCH_LATENCY = "batch.latency"


def _send(kind: str, name: str, value: float | timedelta, slot: str, tags: Mapping[str, str]) -> None:
    try:
        from airflow.sdk.observability.stats import Stats

        send = getattr(Stats, kind)
        all_tags = {"slot": slot, **tags}
        send(f"{PREFIX}.{name}", value, tags=all_tags)
        send(f"{PREFIX}.{name}.{slot}", value, tags=all_tags)
    except Exception as exc:  # a metric is never worth a failed task
        log.warning("could not send metric %s.%s: %s: %s", PREFIX, name, type(exc).__name__, exc)


def gauge(name: str, value: float, *, slot: str, **tags: str) -> None:
    """Set gauge ``postgres_cdc.<name>`` of ``slot``."""
    _send("gauge", name, value, slot, tags)


def timing(name: str, seconds: float, *, slot: str, **tags: str) -> None:
    """Record a duration (sent in milliseconds, as StatsD timers are)."""
    _send("timing", name, timedelta(seconds=max(seconds, 0.0)), slot, tags)


def slot_lag(slot: str, lag_bytes: int | None, lag_seconds: float | None) -> None:
    """The slot's lag, as far as it was measured (the sensor on every check, the ack after advancing)."""
    if lag_bytes is not None:
        gauge(SLOT_LAG_BYTES, lag_bytes, slot=slot)
    if lag_seconds is not None:
        gauge(SLOT_LAG_SECONDS, lag_seconds, slot=slot)
