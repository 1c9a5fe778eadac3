"""The example DAG ``postgres_cdc_on_lag`` run by its AssetWatcher: no run under the threshold, then one.

Real PostgreSQL, real ``spark-submit``, a real scheduler and triggerer. After the initial snapshot
the watcher checks the slot every second; the CDC DAG must not start while the lag is under
``min_lag_bytes``, must start by itself once writes push it past, drain, apply and ack, after
which the lake equals the source and the watcher is quiet again (the slot is caught up).
The watcher's one-event-per-position rule and the missing-slot failure are covered more cheaply
in ``tests/integration/airflow/test_asset_watcher.py``, which ``make test`` runs; this one costs
about 100 s (a snapshot load and a CDC apply in ``spark-submit``, a scheduler and a triggerer)
and runs only with ``POSTGRES_CDC_ON_LAG_E2E=1`` (``make e2e-on-lag``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, ShopWorkload
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.e2e.e2e_support import make_lake, pipeline_conf, pipeline_sandbox

DAG_ID = "postgres_cdc_on_lag"
SLOT = "shop_on_lag"
THRESHOLD = 4 << 20  # several shop rounds: one round stays under it
pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.airflow,
    pytest.mark.skipif(
        os.environ.get("POSTGRES_CDC_ON_LAG_E2E") != "1",
        reason="about 100 s; run with POSTGRES_CDC_ON_LAG_E2E=1 (make e2e-on-lag)",
    ),
]


def lag_and_position(pg: PostgresCluster, dbname: str) -> tuple[int, str]:
    ((lag, position),) = pg.execute(
        sql.SQL(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text "
            "FROM pg_replication_slots WHERE slot_name = {}"
        ).format(sql.Literal(SLOT)),
        dbname,
    )
    return int(lag), str(position)


@pytest.mark.timeout(900)
def test_cdc_dag_starts_by_itself_once_the_lag_crosses_the_threshold(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=31)
    shop.create_schema()
    shop.initial_load()
    staging = tmp_path / "staging"
    lake, lake_conn = make_lake(tmp_path / "lake")
    conf = pipeline_conf(SLOT, staging)
    watcher_env = {
        "POSTGRES_CDC_ON_LAG_SLOT_NAME": SLOT, "POSTGRES_CDC_ON_LAG_PUBLICATIONS": PUBLICATION,
        "POSTGRES_CDC_ON_LAG_POSTGRES_CONN_ID": "shop", "POSTGRES_CDC_ON_LAG_STAGING": str(staging),
        "POSTGRES_CDC_ON_LAG_LAKE_CONN_ID": "lake", "POSTGRES_CDC_ON_LAG_SPARK_CONN_ID": "spark_local",
        "POSTGRES_CDC_ON_LAG_MIN_LAG_BYTES": str(THRESHOLD), "POSTGRES_CDC_ON_LAG_MIN_LAG_AGE": "",
        "POSTGRES_CDC_ON_LAG_POKE_INTERVAL": "1",
    }  # fmt: skip
    sandbox = pipeline_sandbox(tmp_path / "airflow", pg_cluster.uri(pg_dbname), lake_conn, env=watcher_env)
    sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()

    with sandbox.services(triggerer=True, job_schedule=True) as services:
        services.watch(DAG_ID)
        # Under the threshold: changes are pending, the watcher checks, nothing runs.
        shop.step()
        lag, position = lag_and_position(pg_cluster, pg_dbname)
        assert 0 < lag < THRESHOLD
        assert services.log_dir is not None
        log = services.log_dir / "triggerer.log"
        deadline = time.monotonic() + 60
        while log.read_text(errors="replace").count(f"slot '{SLOT}' waiting") < 3:
            assert time.monotonic() < deadline, services.logs(12000)
            time.sleep(0.5)
        assert services.dag_runs(DAG_ID) == []

        # Past it: the scheduler starts the CDC DAG because of the watcher's asset event.
        while lag_and_position(pg_cluster, pg_dbname)[0] < THRESHOLD:
            shop.step()
        deadline = time.monotonic() + 300
        while not [run for run in services.dag_runs(DAG_ID) if run.state in ("success", "failed")]:
            assert time.monotonic() < deadline, services.logs(12000)
            time.sleep(1)
        (run,) = services.dag_runs(DAG_ID)
        assert run.state == "success", services.task_logs(DAG_ID, run.run_id) + services.logs()
        assert run.run_type == "asset_triggered"

        # The run acked: the slot moved, the lake equals the source, and no second run follows.
        lag, acked = lag_and_position(pg_cluster, pg_dbname)
        assert acked != position and lag < THRESHOLD
        time.sleep(3)
        assert len(services.dag_runs(DAG_ID)) == 1

    results = compare_tables(dsn, [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)
