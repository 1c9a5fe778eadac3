"""``PostgresCdcCatchUpOperator``: start the next CDC run at once while the slot holds more than a batch."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_postgres_cdc.operators.arguments import check_positive, rendered_positive


class PostgresCdcCatchUpOperator(TriggerDagRunOperator):
    """After the ack, trigger this run's DAG again, with this run's conf, while a backlog remains.

    It goes on when the batch just acknowledged was full (the drain stopped at its bound with
    more WAL behind it), the slot's lag after the ack is at least ``min_lag_bytes``, and less than
    ``catch_up_seconds`` have passed since the chain of catch-up runs began; otherwise the task is
    skipped, saying why, and the next run waits for the schedule. The new run queues behind this
    one (the pipeline DAGs run with ``max_active_runs=1``) and drains from where this ack left the
    slot, so each batch is in the lake and acknowledged before the next one is read.

    :param drain_task_id: the drain task of the run (its XCom says whether the batch was full).
    :param ack_task_id: the ack task of the run (its XCom holds the slot's lag after the ack).
    :param catch_up_seconds: how long a chain of catch-up runs may go on, from its first run's
        start: a positive number of seconds (templated). Leave the task out to turn catch-up off.
    :param min_lag_bytes: a lag under this waits for the schedule: bytes or a size such as
        ``"16MB"``, as the lag sensor takes it (templated).
    """

    template_fields: Sequence[str] = (
        *TriggerDagRunOperator.template_fields,
        "catch_up_seconds",
        "min_lag_bytes",
    )
    ui_color = "#e8dff5"

    def __init__(
        self,
        *,
        drain_task_id: str,
        ack_task_id: str,
        catch_up_seconds: int | str = 3600,
        min_lag_bytes: int | str = 0,
        **kwargs: Any,
    ) -> None:
        check_positive("catch_up_seconds", catch_up_seconds)
        kwargs.setdefault("trigger_dag_id", "{{ dag.dag_id }}")
        super().__init__(**kwargs)
        self.drain_task_id = drain_task_id
        self.ack_task_id = ack_task_id
        self.catch_up_seconds = catch_up_seconds
        self.min_lag_bytes = min_lag_bytes

    def execute(self, context: Context) -> None:
        from airflow_provider_postgres_cdc.engine.catch_up import CATCH_UP_SINCE, catch_up
        from airflow_provider_postgres_cdc.engine.health.units import parse_size

        self.catch_up_seconds = rendered_positive("catch_up_seconds", self.catch_up_seconds)
        ti = context["ti"]
        drained = ti.xcom_pull(task_ids=self.drain_task_id) or {}
        acked = ti.xcom_pull(task_ids=self.ack_task_id) or {}
        dag_run = context["dag_run"]
        run_conf = dict(dag_run.conf or {})
        now = datetime.now(UTC)
        since = _chain_start(run_conf.get(CATCH_UP_SINCE), dag_run.start_date, now)
        decision = catch_up(
            full=bool(drained.get("full")),
            lag_bytes=acked.get("lag_bytes"),
            min_lag_bytes=parse_size(self.min_lag_bytes or 0),
            since=since,
            now=now,
            budget_seconds=float(self.catch_up_seconds),
        )
        if not decision.go:
            raise AirflowSkipException(decision.reason)
        self.log.info("%s", decision.reason)
        # The run's own choices (slot, staging, connections, bounds) carry over; the chain's start too.
        params = context["params"]
        self.conf = {key: value for key, value in run_conf.items() if key in params}
        self.conf[CATCH_UP_SINCE] = since.isoformat()
        super().execute(context)


def _chain_start(recorded: Any, run_start: datetime | None, now: datetime) -> datetime:
    """When the chain began: as the run that started this one recorded it, else this run's start."""
    if recorded:
        try:
            since = datetime.fromisoformat(str(recorded))
        except ValueError:
            since = None
        if since is not None:
            return since if since.tzinfo else since.replace(tzinfo=UTC)
    return run_start or now
