"""The task groups' wiring: what runs after what, and the pool both lake writers share."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_postgres_cdc.task_groups import cdc_microbatch_task_group, snapshot_task_group


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
    assert dag.get_task("postgres_cdc_resnapshot.publish").publication == "p"


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
