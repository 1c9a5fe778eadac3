"""The pipeline on a Spark standalone cluster, under writes, with executors and a driver killed mid-apply.

Marked ``cluster`` and left out of ``make test`` (``make test-cluster`` runs it, about 4 minutes
here): every step is a spark-submit in client mode to two one-core workers, and the local-mode
end-to-end test already covers the pipeline's logic in ``make test``; what this adds is what only
a cluster shows (executors that are other processes: the JDBC copy's connections, shipped jars
and modules, tasks rerun after an executor dies), and that costs JVM start-ups.

The snapshot uses the Spark JDBC engine, whose executors read PostgreSQL themselves. The CDC
rounds run the real operators in this process with Airflow connections from the environment,
then the example CDC DAG once through ``airflow dags test``, pointed at the cluster by its
Spark connection alone. Faults: every executor SIGKILLed while an apply is running tasks (Spark
reruns them on replacement executors; the Iceberg commits stay atomic), the driver
(spark-submit) SIGKILLed mid-apply, then the apply re-run, and a worker lost for good mid-apply
(the job finishes on the other; the session's cluster keeps one worker afterwards). The lake
must equal the source and each staged change be in its changelog exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.spark.changes import CHECKPOINT_DIR_CONF
from airflow_provider_postgres_cdc.testing import AirflowSandbox, PostgresCluster, SparkStandaloneCluster
from tests.integration.cluster.cluster_workload import (
    PUBLICATION,
    SCHEMA,
    TABLES,
    Writer,
)
from tests.integration.e2e.e2e_support import assert_changelog_exactly_once, make_lake, spark_submit_command

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow, pytest.mark.cluster]
DAGS = Path(__file__).resolve().parents[3] / "dags_examples"
SLOT = "cluster_cdc"
# Small executors and few shuffle partitions: two one-core workers with 1 GiB each. Reliable
# checkpoints (spark/changes.materialize): with local ones, a lost executor fails the apply.
SPARK_CONF = {
    CHECKPOINT_DIR_CONF: os.path.join(tempfile.gettempdir(), "postgres-cdc-cluster-checkpoints"),
    "spark.ui.enabled": "false",
    "spark.executor.memory": "768m",
    "spark.sql.shuffle.partitions": "4",
    "spark.pyspark.python": sys.executable,
}


def _finished_tasks(cluster: SparkStandaloneCluster) -> int:
    """Tasks the cluster's executors have finished so far (their ``stderr`` logs, at INFO)."""
    assert cluster.root is not None
    count = 0
    for log in cluster.root.glob("worker-*/*/*/stderr"):
        count += log.read_text(errors="replace").count("Finished task")
    return count


class MidJob:
    """Calls ``act`` from a thread once ``more`` further tasks have finished on the cluster (mid-job).

    Use as a ``with`` block around the job: leaving it stops the watch, and :attr:`acted` tells
    whether the fault came while the job was running.
    """

    def __init__(self, cluster: SparkStandaloneCluster, more: int, act: Callable[[], Any]) -> None:
        self.cluster, self.act, self.acted = cluster, act, False
        self.target = _finished_tasks(cluster) + more
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MidJob:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._ended.wait(0.1):
            if _finished_tasks(self.cluster) >= self.target:
                self.act()
                self.acted = True
                return


@pytest.mark.timeout(1500)
def test_cdc_on_the_cluster_survives_killed_executors_and_driver(
    spark_cluster: SparkStandaloneCluster,
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    pg_cluster.execute(SCHEMA, pg_dbname)
    staging = str(tmp_path / "staging")
    lake, lake_conn = make_lake(tmp_path / "lake")
    connections = {
        "cl_src": pg_cluster.uri(pg_dbname), "cl_lake": lake_conn, "cl_spark": spark_cluster.connection_uri(),
    }  # fmt: skip
    for conn_id, uri in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", uri)
    common = {"postgres_conn_id": "cl_src", "slot_name": SLOT}
    writer = Writer(dsn).start()
    request.addfinalizer(writer.stop)  # before the database is dropped, also when the test fails

    # Snapshot with the Spark JDBC engine on the cluster (its executors connect to PostgreSQL), then load.
    snapshot = PostgresCdcSnapshotOperator(
        task_id="snapshot", publications=PUBLICATION, staging=staging, copy_engine="spark",
        spark_conn_id="cl_spark", spark_conf=SPARK_CONF, parallelism=2, range_bytes=256 * 1024, **common,
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    assert snapshot["tables"] == 3 and snapshot["rows"] > 40000  # the writer races the consistent point
    _apply(snapshot["manifest"])

    # Round 1: every executor SIGKILLed while the apply is running its tasks.
    writer.burst(40)
    manifest = _drain(staging, common)
    killed: list[int] = []
    with MidJob(spark_cluster, 6, lambda: killed.extend(spark_cluster.kill_executors())) as fault:
        _apply(manifest)
    assert fault.acted and killed, "no executor was killed while the apply ran: it ended first"
    _ack(manifest, common)

    # Round 2: the driver (spark-submit and its JVM) SIGKILLed mid-apply; the re-run converges.
    writer.burst(40)
    manifest = _drain(staging, common)
    with tempfile.TemporaryDirectory() as scratch:
        args, env = spark_submit_command(manifest, lake, scratch)
        args = _on_cluster(args, spark_cluster.master_url)
        driver = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)  # fmt: skip
        with MidJob(spark_cluster, 6, lambda: os.killpg(driver.pid, signal.SIGKILL)) as fault:
            driver.wait(timeout=600)
        assert fault.acted and driver.returncode == -signal.SIGKILL, "the apply ended before the kill"
    conn = connect(dsn)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn is not None
    _apply(manifest)
    _ack(manifest, common)

    # Round 3: the example CDC DAG, pointed at the cluster by its Spark connection only.
    sandbox = AirflowSandbox(tmp_path / "airflow", DAGS, connections={**connections, "spark_local": ""})
    conf = {
        "postgres_conn_id": "cl_src", "publications": PUBLICATION, "slot_name": SLOT, "staging": staging,
        "lake_conn_id": "cl_lake", "spark_conn_id": "cl_spark",
    }  # fmt: skip
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()

    # Writes stop; one last round takes the rest, and a worker is lost for good mid-apply: the job
    # finishes on the remaining one. Then the lake must equal the source.
    writer.burst(20)
    transactions = writer.stop()
    manifest = _drain(staging, common)
    with MidJob(spark_cluster, 4, lambda: spark_cluster.kill_worker(1)) as fault:
        _apply(manifest)
    assert fault.acted and spark_cluster.executor_pids()[1] == []  # that worker and its executor are gone
    _ack(manifest, common)
    assert describe_slot(conn, SLOT).confirmed_flush_lsn == _end_of(manifest)
    conn.close()
    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == set(TABLES)
    batch_dirs = sorted(p for p in (Path(staging) / SLOT).iterdir() if p.name.startswith("batch-"))
    changes = assert_changelog_exactly_once(lake, batch_dirs, TABLES)
    assert transactions > 80 and changes > 80 * 200


def _on_cluster(args: list[str], master: str) -> list[str]:
    """The operator's spark-submit arguments with the cluster as master and the test's Spark settings."""
    args = list(args)
    args[args.index("--master") + 1] = master
    extra = [item for key, value in SPARK_CONF.items() for item in ("--conf", f"{key}={value}")]
    return [args[0], *extra, *args[1:]]


def _drain(staging: str, common: dict[str, str]) -> str:
    summary = PostgresCdcDrainOperator(
        task_id="drain", publications=PUBLICATION, staging=staging, **common
    ).execute({})  # type: ignore[arg-type]
    return str(summary["manifest"])


def _outlets() -> Any:
    """What the task runner gives the apply and the ack to record their Asset events in."""
    return {"outlet_events": OutletEventAccessors()}


def _apply(manifest: str) -> None:
    PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=manifest, lake_conn_id="cl_lake", spark_conn_id="cl_spark", conf=SPARK_CONF
    ).execute(_outlets())


def _ack(manifest: str, common: dict[str, str]) -> None:
    ack = PostgresCdcAckOperator(task_id="ack", manifest=manifest, lake_conn_id="cl_lake", **common)
    ack.execute(_outlets())


def _end_of(manifest: str) -> object:
    from airflow_provider_postgres_cdc.engine.staging import read_manifest

    return read_manifest(manifest).end_lsn
