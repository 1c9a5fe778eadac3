"""The DAGs the package builds: ids, tasks, params and the settings a slot's single consumer needs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from airflow.sdk import DAG
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError

from airflow_provider_postgres_cdc import dag_factories, errors
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.task_groups import from_params

STAGING = "s3://bucket/staging"
FACTORIES: list[tuple[Callable[..., DAG], str, set[str]]] = [
    (dag_factories.initial_snapshot_dag, errors.INITIAL_SNAPSHOT_DAG, {"postgres_cdc_snapshot.snapshot"}),
    (dag_factories.backfill_tables_dag, errors.BACKFILL_DAG, {"postgres_cdc_resnapshot.publish"}),
    (dag_factories.recover_slot_dag, errors.RECOVERY_DAG, {"postgres_cdc_snapshot.load"}),
    (
        dag_factories.cdc_microbatch_dag,
        "postgres_cdc_microbatch",
        {"postgres_cdc.wait_for_lag", "postgres_cdc.catch_up"},
    ),
    (dag_factories.lake_maintenance_dag, "postgres_cdc_lake_maintenance", {"lake_maintenance"}),
]


@pytest.mark.parametrize(("factory", "dag_id", "tasks"), FACTORIES)
def test_each_factory_builds_its_dag_under_the_id_errors_point_to(
    factory: Callable[..., DAG], dag_id: str, tasks: set[str]
) -> None:
    dag = factory(staging=STAGING, slot_name="shop_cdc", postgres_conn_id="shop_db")
    assert dag.dag_id == dag_id
    assert tasks <= set(dag.task_dict)
    assert dag.max_active_runs == 1
    assert dag.doc_md == factory.__doc__.strip().replace("\n    ", "\n")  # type: ignore[union-attr]
    defaults = ParamsDict(dag.params).validate()
    assert (defaults["staging"], defaults["slot_name"], defaults["postgres_conn_id"]) == (
        STAGING, "shop_cdc", "shop_db",
    )  # fmt: skip
    assert set(from_params()) <= set(defaults)


@pytest.mark.parametrize(("factory", "dag_id", "tasks"), FACTORIES[:3])
def test_a_triggered_dag_without_staging_asks_each_run_for_it(
    factory: Callable[..., DAG], dag_id: str, tasks: set[str]
) -> None:
    dag = factory()
    assert dag.timetable.can_be_scheduled is False
    with pytest.raises(ParamValidationError, match="staging"):
        ParamsDict(dag.params).validate()
    assert dag.render_template_as_native_obj is True


@pytest.mark.parametrize("factory", [dag_factories.cdc_microbatch_dag, dag_factories.lake_maintenance_dag])
def test_a_scheduled_dag_needs_its_staging_root_in_the_dag_file(factory: Callable[..., DAG]) -> None:
    with pytest.raises(
        ValueError, match=rf"{factory.__name__}\(staging=\.\.\.\) is required for a scheduled DAG"
    ):
        factory()
    assert factory(schedule=None).dag_id  # a DAG only triggered by hand takes it from each run


def test_dag_kwargs_and_names_are_the_callers() -> None:
    dag = dag_factories.cdc_microbatch_dag(
        dag_id="shop_cdc",
        staging=STAGING,
        schedule=timedelta(minutes=5),
        tags=["shop"],
        pool="lake",
        max_messages=10,
    )
    assert (dag.dag_id, dag.tags) == ("shop_cdc", {"shop"})
    assert dag.get_task("postgres_cdc.apply").pool == "lake"
    assert dag.params["max_messages"] == 10
    assert dag.default_args["retries"] == 2


def test_the_backfill_publishes_added_tables_then_reloads_them_too() -> None:
    dag = dag_factories.backfill_tables_dag(staging=STAGING, copy_engine="spark", staging_conn_id="store")
    publish, snapshot = (
        dag.get_task("postgres_cdc_resnapshot.publish"),
        dag.get_task("postgres_cdc_resnapshot.snapshot"),
    )
    assert publish.publications == "{{ params.publications }}"
    assert snapshot.tables == "{{ params.tables + params.add_tables }}"
    assert (snapshot.copy_engine, snapshot.slot_mode, snapshot.staging_conn_id) == (
        "spark",
        "temporary",
        "{{ params.staging_conn_id }}",
    )
    assert ParamsDict(dag.params).validate()["staging_conn_id"] == "store"
    assert snapshot.upstream_task_ids == {publish.task_id}
    # The Spark copy submits to the pipeline's Spark, as the load does (not spark_default's yarn).
    load = dag.get_task("postgres_cdc_resnapshot.load")
    assert snapshot.spark_conn_id == load._conn_id == "{{ params.spark_conn_id }}"


def test_a_wrong_choice_fails_in_the_factory() -> None:
    with pytest.raises(ValueError, match="copy_engine must be one of 'local', 'spark'"):
        dag_factories.initial_snapshot_dag(copy_engine="duckdb")  # type: ignore[arg-type]


def test_the_maintenance_dag_runs_retention_then_the_lake_job() -> None:
    dag = dag_factories.lake_maintenance_dag(
        staging=STAGING, keep_cuts=7, pool="lake", staging_conn_id="store"
    )
    retention, maintenance = dag.get_task("staging_retention"), dag.get_task("lake_maintenance")
    assert maintenance.upstream_task_ids == {retention.task_id}
    assert (retention.staging, retention.staging_conn_id) == (
        "{{ params.staging }}",
        "{{ params.staging_conn_id }}",
    )
    assert ParamsDict(dag.params).validate()["staging_conn_id"] == "store"
    assert maintenance.pool == "lake"
    assert dag.params["keep_cuts"] == 7


def test_each_snapshot_dag_is_tagged_for_what_it_does() -> None:
    tags = {
        factory: factory(staging=STAGING).tags
        for factory in (
            dag_factories.initial_snapshot_dag,
            dag_factories.backfill_tables_dag,
            dag_factories.recover_slot_dag,
        )
    }
    assert tags[dag_factories.initial_snapshot_dag] == {"postgres-cdc", "cdc", "snapshot"}
    assert tags[dag_factories.backfill_tables_dag] == {"postgres-cdc", "cdc", "snapshot", "backfill"}
    assert tags[dag_factories.recover_slot_dag] == {"postgres-cdc", "cdc", "snapshot", "recovery"}


@pytest.mark.parametrize("seconds", [0, -60, 1.5, "soon"])
def test_a_catch_up_budget_that_is_not_a_positive_number_fails_at_parse_time(seconds: object) -> None:
    with pytest.raises(ValueError, match="catch_up_seconds must be a positive whole number"):
        dag_factories.cdc_microbatch_dag(staging=STAGING, catch_up_seconds=seconds)  # type: ignore[arg-type]


def test_catch_up_is_a_param_of_the_cdc_dag_and_can_be_left_out() -> None:
    dag = dag_factories.cdc_microbatch_dag(staging=STAGING, catch_up_seconds=600)
    assert dag.params["catch_up_seconds"] == 600
    assert dag.get_task("postgres_cdc.catch_up").upstream_task_ids == {"postgres_cdc.ack"}
    without = dag_factories.cdc_microbatch_dag(staging=STAGING, catch_up_seconds=None)
    assert "catch_up_seconds" not in without.params and "postgres_cdc.catch_up" not in without.task_dict


@pytest.mark.parametrize(
    ("factory", "task_id"),
    [
        (dag_factories.cdc_microbatch_dag, "postgres_cdc.apply"),
        (dag_factories.initial_snapshot_dag, "postgres_cdc_snapshot.load"),
        (dag_factories.backfill_tables_dag, "postgres_cdc_resnapshot.load"),
        (dag_factories.recover_slot_dag, "postgres_cdc_snapshot.load"),
    ],
)
def test_every_dag_creating_lake_tables_takes_the_partition_param(
    factory: Callable[..., DAG], task_id: str
) -> None:
    from airflow_provider_postgres_cdc.formats.column_transforms import parse_column_transforms
    from airflow_provider_postgres_cdc.formats.deletes import parse_deletes
    from airflow_provider_postgres_cdc.formats.history import HISTORY
    from airflow_provider_postgres_cdc.formats.partitioning import parse_partition_by

    dag = factory(staging=STAGING, partition_by={"public.orders": ["days(placed_at)"]})
    params = ParamsDict(dag.params).validate()
    assert params["partition_by"] == {"public.orders": ["days(placed_at)"]}
    task = dag.get_task(task_id)
    run_conf = {"public.items": ['bucket(4, "Item Id")']}  # a run's conf overrides the default
    rendered = task.render_template(
        task.partition_by, {"params": {**params, "partition_by": run_conf}}, dag.get_template_env()
    )
    assert parse_partition_by(rendered) == parse_partition_by(run_conf)
    assert params["deletes"] == {}  # no table named: each keeps its mode
    for deletes in ("soft", {"public.orders": "soft"}):
        context = {"params": {**params, "deletes": deletes}}
        rendered = task.render_template(task.deletes, context, dag.get_template_env())
        assert parse_deletes(rendered) == deletes
    assert params["history"] == {}
    for history in ("scd2", {"public.orders": "scd2"}):
        context = {"params": {**params, "history": history}}
        rendered = task.render_template(task.history, context, dag.get_template_env())
        assert HISTORY.parse(rendered) == history
    # The drain (or the snapshot) takes the column transforms, as a run's conf gives them.
    staging_task = dag.get_task(task_id.rsplit(".", 1)[0] + (".drain" if "apply" in task_id else ".snapshot"))
    assert params["column_transforms"] == {}
    transforms = {"public.customers": {"email": "hash", "ssn": "drop"}}
    context = {"params": {**params, "column_transforms": transforms}}
    rendered = task.render_template(staging_task.column_transforms, context, dag.get_template_env())
    assert parse_column_transforms(rendered) == transforms
    assert staging_task.hash_key_conn_id == "postgres_cdc_hash_key"
    assert (
        "partition_by"
        not in ParamsDict(dag_factories.lake_maintenance_dag(staging=STAGING).params).validate()
    )
    with pytest.raises(ColumnTransformsError, match=r"must be 'hash' or 'drop', not 'mask'"):
        factory(staging=STAGING, column_transforms={"public.customers": {"email": "mask"}})


def test_a_bad_partition_option_fails_in_the_factory() -> None:
    with pytest.raises(ValueError, match="'weeks' is not an Iceberg partition transform"):
        dag_factories.cdc_microbatch_dag(
            staging=STAGING, partition_by={"public.orders": ["weeks(placed_at)"]}
        )
