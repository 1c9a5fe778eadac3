"""Operator arguments are checked when the DAG is parsed, and a templated one once it is rendered."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import BaseOperator

from airflow_provider_postgres_cdc.operators.arguments import check_choice, check_staging
from airflow_provider_postgres_cdc.operators.catch_up import PostgresCdcCatchUpOperator
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.maintenance import (
    PostgresCdcLakeMaintenanceOperator,
    PostgresCdcStagingRetentionOperator,
)
from airflow_provider_postgres_cdc.operators.publication import first_publication
from airflow_provider_postgres_cdc.operators.snapshot import (
    PostgresCdcSnapshotOperator,
    spark_jars_and_packages,
)
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from airflow_provider_postgres_cdc.spark import JARS_ENV

SLOT = {"slot_name": "s", "publications": "p", "staging": "/st"}
Drain, Snapshot, Retention = (
    PostgresCdcDrainOperator,
    PostgresCdcSnapshotOperator,
    PostgresCdcStagingRetentionOperator,
)
NO_STAGING = "staging must name the staging root"
CASES = [
    (Drain, {**SLOT, "transport": "tcp"}, "transport must be one of 'peek', 'stream', not 'tcp'"),
    (
        Snapshot,
        {**SLOT, "copy_engine": "duckdb"},
        "copy_engine must be one of 'local', 'spark', not 'duckdb'",
    ),
    (Snapshot, {**SLOT, "slot_mode": "new"}, "slot_mode must be one of 'create', 'temporary', 'recover'"),
    (
        PostgresCdcSparkApplyOperator,
        {"manifest": "/m.json", "write_mode": "append"},
        "write_mode must be one of 'merge-on-read', 'copy-on-write', not 'append'",
    ),
    (
        PostgresCdcSparkApplyOperator,
        {"manifest": "/m.json", "table_parallelism": 0},
        "table_parallelism must be a positive whole number, not 0",
    ),
    (
        PostgresCdcSparkApplyOperator,
        {"manifest": "/m.json", "table_parallelism": "four"},
        "table_parallelism must be a positive whole number, not 'four'",
    ),
    (
        PostgresCdcCatchUpOperator,
        {"drain_task_id": "d", "ack_task_id": "a", "catch_up_seconds": 0},
        "catch_up_seconds must be a positive whole number, not 0",
    ),
    (
        PostgresCdcCatchUpOperator,
        {"drain_task_id": "d", "ack_task_id": "a", "catch_up_seconds": "an hour"},
        "catch_up_seconds must be a positive whole number, not 'an hour'",
    ),
    (
        PostgresCdcLakeMaintenanceOperator,
        {"slot_name": "s", "skip": ["rewrite", "vacuum"]},
        "skip must be one of 'rewrite', 'tags', 'expire', 'orphans', not 'vacuum'",
    ),
    (Drain, {**SLOT, "column_transforms": {"public.c": {"e": "mask"}}}, r"\['e'\] must be 'hash' or 'drop'"),
    (
        Snapshot,
        {**SLOT, "copy_engine": "spark", "column_transforms": {"public.c": {"e": "hash"}}},
        "hashes columns in the local copy engine only: the Spark engine would stage their clear values",
    ),
    (Drain, {**SLOT, "staging": ""}, NO_STAGING),
    (Snapshot, {**SLOT, "staging": None}, NO_STAGING),
    (Retention, {"slot_name": "s", "staging": " "}, NO_STAGING),
]


@pytest.mark.parametrize(("operator", "arguments", "message"), CASES)
def test_a_wrong_argument_fails_at_parse_time_naming_what_to_pass(
    operator: type[BaseOperator], arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        operator(task_id="t", **arguments)


@pytest.mark.parametrize(
    ("operator", "arguments", "field", "rendered"),
    [
        (PostgresCdcDrainOperator, {**SLOT, "transport": "{{ params.transport }}"}, "transport", "tcp"),
        (PostgresCdcDrainOperator, {**SLOT, "staging": "{{ params.staging }}"}, "staging", ""),
        (PostgresCdcSnapshotOperator, {**SLOT, "slot_mode": "{{ params.mode }}"}, "slot_mode", "new"),
        (
            PostgresCdcSnapshotOperator,
            {**SLOT, "copy_engine": "{{ params.engine }}"},
            "copy_engine",
            "duckdb",
        ),
        (PostgresCdcStagingRetentionOperator, {"slot_name": "s", "staging": "{{ params.s }}"}, "staging", ""),
    ],
)
def test_a_template_is_checked_once_rendered_before_anything_runs(
    operator: type[BaseOperator], arguments: dict[str, Any], field: str, rendered: str
) -> None:
    task = operator(task_id="t", **arguments)  # parses: the value is not known yet
    assert field in task.template_fields
    setattr(task, field, rendered)  # what Airflow's rendering leaves
    with pytest.raises(ValueError, match=f"{field} must"):
        task.execute({})  # type: ignore[arg-type]


def test_maintenance_steps_to_skip_are_checked_once_rendered() -> None:
    task = PostgresCdcLakeMaintenanceOperator(task_id="t", slot_name="s", skip="{{ params.skip }}")
    task.skip = "rewrite,vacuum"
    with pytest.raises(ValueError, match=r"skip must be one of .*not 'vacuum'"):
        task.job_arguments(None)  # type: ignore[arg-type]


def test_check_choice_and_staging_accept_good_values_and_templates() -> None:
    check_choice("transport", "stream", ("peek", "stream"))
    check_choice("transport", "{{ params.transport }}", ("peek", "stream"))
    check_staging("s3://bucket/staging")
    check_staging("{{ params.staging }}")


def test_tables_are_published_in_the_first_publication() -> None:
    assert first_publication("shop") == "shop"
    assert first_publication(["shop", "audit"]) == "shop"
    with pytest.raises(ValueError, match="publications must name a publication"):
        first_publication([])


def test_the_spark_copy_finds_its_jdbc_driver_on_any_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JARS_ENV, raising=False)
    assert spark_jars_and_packages(None, None) == (None, "org.postgresql:postgresql:42.7.8")
    monkeypatch.setenv(JARS_ENV, "/opt/jars/postgresql.jar")
    assert spark_jars_and_packages(None, None) == ("/opt/jars/postgresql.jar", None)
    assert spark_jars_and_packages("/my/driver.jar", None) == ("/my/driver.jar", None)
    older = "org.postgresql:postgresql:42.7.4"
    assert spark_jars_and_packages(None, older) == (None, older)
