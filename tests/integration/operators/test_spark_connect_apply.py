"""The apply operator with a ``spark_connect`` connection, against a real Spark 4.1 Connect server.

A snapshot and a batch of one table, staged as the drain and snapshot would stage them, are applied
by ``PostgresCdcSparkApplyOperator`` as Spark Connect client runs (the 4.1 line's Python as
``connect_python``), each in a session of its own on one warm server, and the lake is read back in
another client session. The lake is a SQLite JDBC catalog, whose tables the operator's catalog
check creates before the job runs. A batch the job refuses fails the task with the job's own error
class and message.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from airflow_provider_postgres_cdc.testing.spark_connect import SparkConnectServer
from tests.integration.spark.spark_staging import Stager, TableDef, dele, ins, upd
from tests.spark_lines import SPARK_41, spark_line_named

pytestmark = pytest.mark.spark

ORDERS = TableDef("public", "orders", [("id", pa.int64()), ("item", pa.string())], key=["id"])

READ = r"""
import json, os
from pyspark.sql import SparkSession

params = json.loads(os.environ["CLIENT_PARAMS"])
spark = SparkSession.builder.remote(params["url"]).getOrCreate()
for key, value in params["conf"].items():
    spark.conf.set(key, value)
rows = sorted(tuple(row) for row in spark.sql("SELECT id, item FROM lake.public.orders").collect())
summary = spark.sql(
    "SELECT summary FROM lake.public.orders.snapshots ORDER BY committed_at DESC LIMIT 1"
).first()[0]
print(json.dumps({"rows": rows, "summary": dict(summary)}))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[SparkConnectServer]:
    line = spark_line_named(SPARK_41)
    with SparkConnectServer(line.spark_home, jars=line.jars(), token=secrets.token_urlsafe(16)) as server:
        yield server


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: SparkConnectServer) -> LakeConfig:
    (tmp_path / "lake").mkdir()
    lake = local_lake(str(tmp_path / "lake"))  # its catalog tables made by the operator's check (pyiceberg)
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_LAKE", connection_json(lake))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", server.connection_uri())
    return lake


class _Events(dict[Any, Any]):
    """``outlet_events``: the Asset events the apply adds for the lake tables it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[Any] = []

    def __missing__(self, key: Any) -> Any:
        return self

    def add(self, asset: Any, extra: Any = None) -> None:
        self.added.append(asset)


def apply(manifest: str) -> float:
    """Apply ``manifest`` through the operator's Spark Connect route; its seconds."""
    operator = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=manifest, lake_conn_id="shop_lake", spark_conn_id="spark_connect",
        connect_python=str(spark_line_named(SPARK_41).python),
    )  # fmt: skip
    began = time.monotonic()
    operator.execute({"outlet_events": _Events()})  # type: ignore[arg-type]
    return time.monotonic() - began


def read_lake(server: SparkConnectServer, lake: LakeConfig) -> Any:
    conf = {key: value for key, value in lake.spark_conf().items() if key.startswith("spark.sql.catalog.")}
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SPARK_", "PYSPARK_"))}
    env["CLIENT_PARAMS"] = json.dumps({"url": server.url, "conf": conf})
    done = subprocess.run(
        [str(spark_line_named(SPARK_41).python), "-c", READ], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{server.logs()}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_snapshot_and_a_batch_are_applied_over_spark_connect(
    server: SparkConnectServer, lake: LakeConfig, tmp_path: Path
) -> None:
    stager = Stager(tmp_path / "staging")
    rows = [{"id": i, "item": f"item {i}"} for i in range(1, 101)]
    load_seconds = apply(stager.snapshot(0x1000, [(ORDERS, rows)]))
    changes = [
        upd(0x2000, 1, id=1, item="changed"),
        dele(0x2000, 2, id=2),
        ins(0x2100, 1, id=101, item="new"),
    ]
    batch_seconds = apply(stager.batch(0x1000, 0x3000, [(ORDERS, [changes])]))

    found = read_lake(server, lake)
    expected = {(r["id"], r["item"]) for r in rows if r["id"] != 2} - {(1, "item 1")} | {
        (1, "changed"),
        (101, "new"),
    }
    assert {tuple(row) for row in found["rows"]} == expected
    assert found["summary"]["pgl.end-lsn"] == "0/3000", found["summary"]
    print(f"over Spark Connect: load {load_seconds:.1f} s, batch {batch_seconds:.1f} s")


def test_a_job_s_user_error_fails_the_task_with_its_class_and_message(
    server: SparkConnectServer, lake: LakeConfig, tmp_path: Path
) -> None:
    stager = Stager(tmp_path / "staging")
    apply(stager.snapshot(0x1000, [(ORDERS, [{"id": 1, "item": "a"}])]))
    # The same table staged again with its key column now text: a type the lake table cannot take.
    text_key = TableDef("public", "orders", [("id", pa.string()), ("item", pa.string())], key=["id"])
    manifest = stager.batch(0x1000, 0x2000, [(text_key, [[ins(0x1800, 1, id="x", item="b")]])])
    with pytest.raises(
        AirflowException, match=r"apply_batch\.py on the Spark Connect server sc://localhost:\d+: \w+Error: "
    ):
        apply(manifest)
