"""The task groups' wiring: what runs after what, and the pool both lake writers share."""

from __future__ import annotations

from datetime import datetime

import pytest
from airflow.sdk import DAG, Param
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError

from airflow_provider_postgres_cdc.task_groups import (
    cdc_microbatch_task_group,
    from_params,
    pipeline_params,
    snapshot_task_group,
)


def test_cdc_apply_and_resnapshot_load_share_one_pool() -> None:
    with DAG("shared_pool", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        cdc_microbatch_task_group(slot_name="s", publications="p", staging="/st", pool="pgl_lake")
        snapshot_task_group(
            slot_mode="temporary",
            group_id="postgres_cdc_resnapshot",
            slot_name="s",
            publications=["p", "q"],
            staging="/st",
            lake_conn_id="lake",
            publish=["public.x"],
            pool="pgl_lake",
        )
    apply, load = dag.get_task("postgres_cdc.apply"), dag.get_task("postgres_cdc_resnapshot.load")
    assert apply.pool == load.pool == "pgl_lake"
    snapshot = dag.get_task("postgres_cdc_resnapshot.snapshot")
    assert snapshot.upstream_task_ids == {"postgres_cdc_resnapshot.publish"}
    assert load.upstream_task_ids == {"postgres_cdc_resnapshot.snapshot"}
    assert snapshot.slot_mode == "temporary"
    assert dag.get_task("postgres_cdc_resnapshot.publish").publications == ["p", "q"]


def test_without_a_pool_the_default_pool_applies() -> None:
    with DAG("no_pool", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        snapshot_task_group(
            slot_mode="temporary",
            group_id="postgres_cdc_resnapshot",
            slot_name="s",
            publications="p",
            staging="/st",
            lake_conn_id="lake",
        )
    assert dag.get_task("postgres_cdc_resnapshot.load").pool == "default_pool"
    assert "postgres_cdc_resnapshot.publish" not in dag.task_dict


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"slot_mode": "new"}, "slot_mode must be one of 'create', 'temporary', 'recover', not 'new'"),
        (
            {"slot_mode": "create", "copy_engine": "duckdb"},
            "copy_engine must be one of 'local', 'spark', not 'duckdb'",
        ),
        ({"transport": "tcp"}, "transport must be one of 'peek', 'stream', not 'tcp'"),
    ],
)
def test_a_wrong_choice_fails_when_the_dag_is_parsed_naming_the_valid_ones(
    arguments: dict[str, str], message: str
) -> None:
    group = snapshot_task_group if "slot_mode" in arguments else cdc_microbatch_task_group
    with (
        DAG("bad_choice", schedule=None, start_date=datetime(2026, 1, 1)),
        pytest.raises(ValueError, match=message),
    ):
        group(slot_name="s", publications="p", staging="/st", **arguments)  # type: ignore[operator]


def test_the_groups_need_a_staging_root() -> None:
    no_staging = pytest.raises(ValueError, match="staging must name the staging root")
    with DAG("no_staging", schedule=None, start_date=datetime(2026, 1, 1)), no_staging:
        cdc_microbatch_task_group(slot_name="s", publications="p", staging="")


def test_pipeline_params_have_no_staging_default_unless_given() -> None:
    params = pipeline_params()
    assert set(params) == set(from_params())
    assert params["slot_name"].value == "postgres_cdc_slot"
    with pytest.raises(ParamValidationError, match="staging"):
        ParamsDict(params).validate()
    given = pipeline_params(staging="s3://bucket/staging", max_messages=Param(5, type="integer"))
    assert ParamsDict(given).validate()["staging"] == "s3://bucket/staging"
    assert given["max_messages"].value == 5
    assert from_params()["staging"] == "{{ params.staging }}"


def test_pipeline_params_take_only_params_beyond_the_shared_ones() -> None:
    with pytest.raises(TypeError, match="'tables' is not a shared param"):
        pipeline_params(tables="public.a")
