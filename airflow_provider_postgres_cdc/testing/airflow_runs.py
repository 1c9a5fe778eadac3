"""DAG runs as the sandbox's REST API reports them, and what a scheduler's work on them came to.

:class:`DagRunRecord` is one run read from ``/api/v2``; :class:`SchedulerResult` the runs one call
of :class:`~.airflow_services.AirflowServices` waited for (a backfill, a re-run, a trigger), with
the logs a failing test needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["FINISHED_RUN_STATES", "DagRunRecord", "SchedulerResult", "parse_time"]

FINISHED_RUN_STATES = frozenset({"success", "failed"})


def parse_time(value: object) -> datetime | None:
    """An API timestamp (``...Z`` or ``+00:00``) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class DagRunRecord:
    """One DAG run as the REST API reports it."""

    dag_id: str
    run_id: str
    logical_date: datetime | None
    state: str
    run_type: str
    queued_at: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    conf: dict[str, Any]

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> DagRunRecord:
        return cls(
            dag_id=str(data["dag_id"]),
            run_id=str(data["dag_run_id"]),
            logical_date=parse_time(data.get("logical_date")),
            state=str(data["state"]),
            run_type=str(data["run_type"]),
            queued_at=parse_time(data.get("queued_at")),
            start_date=parse_time(data.get("start_date")),
            end_date=parse_time(data.get("end_date")),
            conf=dict(data.get("conf") or {}),
        )


@dataclass(frozen=True, slots=True)
class SchedulerResult:
    """The runs a scheduler finished for :meth:`AirflowServices.backfill` or ``rerun``.

    ``runs`` are in logical-date order; ``logs`` holds the tails of the components' logs and of
    the task logs of every run that did not succeed, so a failing test shows why.
    """

    dag_id: str
    runs: tuple[DagRunRecord, ...]
    seconds: float
    logs: str

    def check(self) -> SchedulerResult:
        """Raise with the logs when a run did not succeed."""
        bad = [f"{run.run_id}: {run.state}" for run in self.runs if run.state != "success"]
        if bad:
            raise RuntimeError(f"runs of {self.dag_id} did not succeed: {', '.join(bad)}\n{self.logs}")
        return self
