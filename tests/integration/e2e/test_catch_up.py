"""A backlog larger than a batch is caught up at once: each full batch's run starts the next.

One pipeline on the demo shop schema, real PostgreSQL, Airflow's scheduler and API server, and
real ``spark-submit`` in local mode for every CDC run. The initial snapshot is loaded in the shared
Spark session; then several rounds of changes pile up while no CDC runs, and one CDC run is
triggered with a ``max_messages`` of about 60 % of the backlog:

1. its batch is full, so its ``catch_up`` task triggers the next run with the same conf and the
   chain's start; that run's batch takes the rest, is not full, and its ``catch_up`` is skipped;
2. the second batch starts exactly where the first ack left the slot (each batch acknowledged
   before the next is drained);
3. the lake equals the source and the slot stands at the last batch's end.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, ShopWorkload
from airflow_provider_postgres_cdc.engine.catch_up import CATCH_UP_SINCE
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import AirflowServices, PostgresCluster
from tests.integration.e2e.e2e_support import pipeline_conf, pipeline_sandbox

SLOT = "shop_catch_up"
CDC = "postgres_cdc_microbatch"
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


def backlog_messages(pg: PostgresCluster, dbname: str) -> int:
    """pgoutput messages waiting in the slot (peeked: the slot does not move)."""
    ((count,),) = pg.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
        f"'{SLOT}', NULL, NULL, 'proto_version', '1', 'publication_names', '{PUBLICATION}')",
        dbname,
    )
    return int(count)


def task_xcom(services: AirflowServices, run_id: str, task_id: str) -> Any:
    path = f"/dags/{CDC}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    return services.api("GET", path, query={"deserialize": "true"})["value"]


def task_state(services: AirflowServices, run_id: str, task_id: str) -> str:
    return str(services.api("GET", f"/dags/{CDC}/dagRuns/{run_id}/taskInstances/{task_id}")["state"])


@pytest.mark.timeout(1200)
def test_a_backlog_of_two_batches_is_applied_by_a_chain_of_two_runs(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=31)
    shop.create_schema()
    shop.initial_load()
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"), catalog="lake_catch_up")  # its own name in the shared session
    sandbox = pipeline_sandbox(tmp_path / "airflow", pg_cluster.uri(pg_dbname), connection_json(lake))
    conf = pipeline_conf(SLOT, tmp_path / "staging")
    snapshot, _ = take_snapshot(dsn, SLOT, [PUBLICATION], conf["staging"])
    register_lake(spark, lake)
    apply_manifest(spark, snapshot, lake)
    for _ in range(4):
        shop.step()
    backlog = backlog_messages(pg_cluster, pg_dbname)
    conf = {**conf, "max_messages": backlog * 6 // 10}

    with sandbox.services() as services:
        first = services.trigger(CDC, conf).check().runs[0]
        chain = services.wait_for_runs(CDC, 2, timeout=300).check().runs
        drained = [task_xcom(services, run.run_id, "postgres_cdc.drain") for run in chain]
        catch_up = [task_state(services, run.run_id, "postgres_cdc.catch_up") for run in chain]

    # 1. The full batch's run started one more run, with its conf and the chain's start; that one stopped.
    assert len(chain) == 2 and chain[0].run_id == first.run_id, chain
    assert [d["full"] for d in drained] == [True, False], drained
    assert catch_up == ["success", "skipped"]
    follow = chain[1]
    assert follow.conf == {**conf, CATCH_UP_SINCE: follow.conf[CATCH_UP_SINCE]}
    assert first.start_date is not None
    since = datetime.fromisoformat(follow.conf[CATCH_UP_SINCE])
    assert abs((since - first.start_date).total_seconds()) < 1, (since, first.start_date)

    # 2. Contiguous windows: the second drain starts where the first ack left the slot.
    assert drained[1]["start_lsn"] == drained[0]["end_lsn"]
    ((confirmed,),) = pg_cluster.execute(
        f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'", pg_dbname
    )
    assert confirmed == drained[1]["end_lsn"]

    # 3. The lake equals the source.
    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
