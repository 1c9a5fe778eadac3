"""A backlog of several batches is caught up at once, through a crash: each full batch's run starts the next.

One pipeline on the demo shop schema, real PostgreSQL, Airflow's scheduler and API server, and
real ``spark-submit`` in local mode for every CDC run. The initial snapshot is loaded in the shared
Spark session; then several rounds of changes pile up while no CDC runs, and one CDC run is
triggered with a ``max_messages`` of about 35 % of the backlog:

1. the first two batches are full, so each run's ``catch_up`` task triggers the next run with the
   same conf and the chain's start; the third batch takes the rest, is not full, and its
   ``catch_up`` is skipped;
2. the second run's Spark driver is killed mid-apply; the task's retry finishes the batch and the
   chain goes on;
3. each batch starts exactly where the previous ack left the slot, every staged change is in its
   table's changelog once, and the lake equals the source.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
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
from tests.integration.e2e.e2e_support import (
    assert_changelog_holds,
    pipeline_conf,
    pipeline_sandbox,
    staged_changes,
)

SLOT = "shop_catch_up"
CDC = "postgres_cdc_microbatch"
# The example CDC DAG with a retry after 5 s instead of a minute: the killed apply's retry comes sooner.
CDC_DAG = """
from datetime import timedelta

from airflow_provider_postgres_cdc.dag_factories import cdc_microbatch_dag

retry_soon = {{"retries": 2, "retry_delay": timedelta(seconds=5)}}
dag = cdc_microbatch_dag(staging="{staging}", default_args=retry_soon)
"""
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


def kill_second_apply(services: AirflowServices, staging: Path) -> int:
    """Wait for the chain's second run to be applying, then SIGKILL its Spark driver; its pid."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        runs = services.dag_runs(CDC)
        if len(runs) >= 2 and task_state(services, runs[1].run_id, "postgres_cdc.apply") == "running":
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes()
                except OSError:  # the process ended meanwhile
                    continue
                if b"org.apache.spark.deploy.SparkSubmit" in text and str(staging).encode() in text:
                    pid = int(cmdline.parent.name)
                    os.kill(pid, signal.SIGKILL)
                    return pid
        time.sleep(0.2)
    raise AssertionError(f"the second run never applied:\n{services.logs()}")


@pytest.mark.timeout(1500)
def test_a_backlog_of_three_batches_is_caught_up_by_a_chain_of_runs_through_a_killed_apply(
    pg_cluster: PostgresCluster, pg_dbname: str, spark: SparkSession, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=31)
    shop.create_schema()
    shop.initial_load()
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"), catalog="lake_catch_up")  # its own name in the shared session
    staging = tmp_path / "staging"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "cdc.py").write_text(CDC_DAG.format(staging=staging))
    sandbox = pipeline_sandbox(
        tmp_path / "airflow", pg_cluster.uri(pg_dbname), connection_json(lake), dags=dags
    )
    conf = pipeline_conf(SLOT, staging)
    snapshot, _ = take_snapshot(dsn, SLOT, [PUBLICATION], conf["staging"])
    register_lake(spark, lake)
    apply_manifest(spark, snapshot, lake)
    for _ in range(6):
        shop.step()
    conf = {**conf, "max_messages": backlog_messages(pg_cluster, pg_dbname) * 35 // 100}

    with sandbox.services() as services:
        services.set_paused(CDC, False)
        first = services.api("POST", f"/dags/{CDC}/dagRuns", {"logical_date": None, "conf": conf})
        killed = kill_second_apply(services, staging)
        chain = services.wait_for_runs(CDC, 3, timeout=900).check().runs
        drained = [task_xcom(services, run.run_id, "postgres_cdc.drain") for run in chain]
        catch_up = [task_state(services, run.run_id, "postgres_cdc.catch_up") for run in chain]
        apply_tries = [
            services.api("GET", f"/dags/{CDC}/dagRuns/{run.run_id}/taskInstances/postgres_cdc.apply")[
                "try_number"
            ]
            for run in chain
        ]

    # 1. Each full batch's run started one more run, with its conf and the chain's start; the last stopped.
    assert len(chain) == 3 and chain[0].run_id == first["dag_run_id"], chain
    assert [d["full"] for d in drained] == [True, True, False], drained
    assert catch_up == ["success", "success", "skipped"]
    assert chain[0].start_date is not None
    for follow in chain[1:]:
        assert follow.conf == {**conf, CATCH_UP_SINCE: follow.conf[CATCH_UP_SINCE]}
        since = datetime.fromisoformat(follow.conf[CATCH_UP_SINCE])
        assert abs((since - chain[0].start_date).total_seconds()) < 1, (since, chain[0].start_date)

    # 2. The killed apply was retried (its driver really died: the pid is gone).
    assert apply_tries == [1, 2, 1] and not Path(f"/proc/{killed}").exists()

    # 3. Contiguous windows, each change logged once, and the lake equals the source.
    for earlier, later in itertools.pairwise(drained):
        assert later["start_lsn"] == earlier["end_lsn"]
    ((confirmed,),) = pg_cluster.execute(
        f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'", pg_dbname
    )
    assert confirmed == drained[-1]["end_lsn"]
    staged = staged_changes(pafs.LocalFileSystem(), str(staging / SLOT))
    assert assert_changelog_holds(lake, staged) == sum(d["changes"] for d in drained)
    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
