"""The Spark Connect platform of the jobs: Spark 4.1 and Iceberg 1.12, client sessions of one server.

One :class:`SparkConnectServer` (with a token) for the module; each client is the 4.1 line's Python
(``.venv-spark4``, pyspark with its ``connect`` extra) in a process of its own, as an Airflow task
would be: the test virtualenv's pyspark is 3.5. What the jobs rely on, each client does in its own
session at run time: a Hadoop catalog set with ``spark.conf.set`` before its first use, a format-v2
merge-on-read table, a MERGE whose commit carries ``pgl.end-lsn`` from the session conf
(``spark.sql.iceberg.snapshot-property.*``), a commit without it once unset, a tag by SQL.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_postgres_cdc.testing.spark_connect import SparkConnectServer
from tests.spark_lines import SPARK_41, spark_line_named

pytestmark = pytest.mark.spark

END_LSN_KEY = "pgl.end-lsn"

# One client run: params as JSON in $CLIENT_PARAMS (the URL holds the token: not on a command line),
# its result as JSON on the last line of stdout. ``signal``/``wait``/``done`` are files that order two
# clients' steps: ``signal`` once the session conf is set, ``wait`` before the MERGE, ``done`` after.
CLIENT = r"""
import json, os, sys, time
from pyspark.sql import SparkSession

params = json.loads(os.environ["CLIENT_PARAMS"])
PROPERTY = "spark.sql.iceberg.snapshot-property.pgl.end-lsn"
began = time.monotonic()


def touch(path):
    if path:
        open(path, "w").close()


def wait_for(path):
    deadline = time.monotonic() + 120
    while path and not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {path}")
        time.sleep(0.05)


def newest(spark):
    row = spark.sql(
        "SELECT snapshot_id, operation, summary FROM lake.ns.t.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).first()
    return {"snapshot_id": row.snapshot_id, "operation": row.operation, "summary": dict(row.summary)}


spark = SparkSession.builder.remote(params["url"]).getOrCreate()
spark.conf.set("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
spark.conf.set("spark.sql.catalog.lake.type", "hadoop")
spark.conf.set("spark.sql.catalog.lake.warehouse", params["warehouse"])
spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.ns")
spark.sql(
    "CREATE TABLE lake.ns.t (id BIGINT, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2', "
    "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
    "'write.merge.mode'='merge-on-read')"
)
spark.range(1000).selectExpr("id", "concat('v', id) AS v").writeTo("lake.ns.t").append()
# 120 changes: the ids divisible by 50 deleted, the others updated or (from 1000 on) inserted.
spark.range(0, 1200, 10).selectExpr(
    "id", "IF(id % 50 = 0, 'D', 'U') AS op", "concat('w', id) AS v"
).createOrReplaceTempView("changes")
if params["end_lsn"] is not None:
    spark.conf.set(PROPERTY, params["end_lsn"])
touch(params.get("signal"))
wait_for(params.get("wait"))
spark.sql(
    "MERGE INTO lake.ns.t t USING changes c ON t.id = c.id "
    "WHEN MATCHED AND c.op = 'D' THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET t.v = c.v "
    "WHEN NOT MATCHED AND c.op <> 'D' THEN INSERT (id, v) VALUES (c.id, c.v)"
)
merge = newest(spark)
touch(params.get("done"))
spark.conf.unset(PROPERTY)
spark.sql("INSERT INTO lake.ns.t VALUES (100000, 'later')")
later = newest(spark)
spark.sql(f"ALTER TABLE lake.ns.t CREATE TAG `{params['tag']}`")
refs = [row.asDict() for row in spark.sql("SELECT name, type, snapshot_id FROM lake.ns.t.refs").collect()]
rows = spark.table("lake.ns.t").count()
result = {"merge": merge, "later": later, "refs": refs, "rows": rows, "seconds": time.monotonic() - began}
print(json.dumps(result))
"""
# 1000 rows, less the 20 deleted, plus the 16 inserted by the MERGE and the one of the later commit.
ROWS_AFTER = 997

# Each URL in a new session: a count, or the error the server answered with.
PROBE = r"""
import json, os
from pyspark.sql import SparkSession

results = []
for url in json.loads(os.environ["CLIENT_PARAMS"])["urls"]:
    try:
        results.append({"count": SparkSession.builder.remote(url).create().range(3).count()})
    except Exception as error:
        results.append({"error": f"{type(error).__name__}: {error}"})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[SparkConnectServer]:
    """One Spark 4.1 Connect server with the 4.1 lake jars and a token, for the module's clients."""
    line = spark_line_named(SPARK_41)
    with SparkConnectServer(line.spark_home, jars=line.jars(), token=secrets.token_urlsafe(16)) as server:
        yield server


def start_client(script: str, params: dict[str, Any]) -> subprocess.Popen[str]:
    """``script`` in the 4.1 line's Python, given ``params``, in an environment without Spark's settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SPARK_", "PYSPARK_")) and key != "PYTHONPATH"
    }
    env["CLIENT_PARAMS"] = json.dumps(params)
    return subprocess.Popen(
        [str(spark_line_named(SPARK_41).python), "-c", script], env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def result_of(process: subprocess.Popen[str], server: SparkConnectServer) -> Any:
    """The client's JSON result; its output and the server's log if it failed."""
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    assert process.returncode == 0, f"{stdout[-3000:]}\n{stderr[-4000:]}\n{server.logs()}"
    return json.loads(stdout.strip().splitlines()[-1])


def run_client(server: SparkConnectServer, warehouse: Path, end_lsn: str | None, **order: str) -> Any:
    params = {"url": server.url, "warehouse": str(warehouse), "end_lsn": end_lsn, "tag": "pgl_0_16B3748"}
    return result_of(start_client(CLIENT, {**params, **order}), server)


def test_a_client_session_sets_its_catalog_commits_with_an_end_lsn_and_tags(
    server: SparkConnectServer, tmp_path: Path
) -> None:
    done = run_client(server, tmp_path / "lake", "0/16B3748")

    merge, later = done["merge"], done["later"]
    assert merge["operation"] == "overwrite", merge
    assert merge["summary"][END_LSN_KEY] == "0/16B3748"
    assert int(merge["summary"]["added-delete-files"]) > 0, merge  # merge-on-read: deletes, no rewrite
    assert later["operation"] == "append"
    assert END_LSN_KEY not in later["summary"], later  # unset: the next commit carries nothing
    assert {"name": "pgl_0_16B3748", "type": "TAG", "snapshot_id": later["snapshot_id"]} in done["refs"]
    assert done["rows"] == ROWS_AFTER
    assert (tmp_path / "lake" / "ns" / "t" / "metadata").is_dir()  # the session's own warehouse


def test_two_concurrent_sessions_keep_their_confs_apart(server: SparkConnectServer, tmp_path: Path) -> None:
    """A sets ``pgl.end-lsn``; B MERGEs while A's property is set, then A MERGEs: only A's commit has it."""
    a_set, b_done = str(tmp_path / "a-set"), str(tmp_path / "b-done")
    a = start_client(
        CLIENT,
        {"url": server.url, "warehouse": str(tmp_path / "a"), "end_lsn": "0/AAAA", "tag": "pgl_a",
         "signal": a_set, "wait": b_done},
    )  # fmt: skip
    b = start_client(
        CLIENT,
        {"url": server.url, "warehouse": str(tmp_path / "b"), "end_lsn": None, "tag": "pgl_b",
         "wait": a_set, "done": b_done},
    )  # fmt: skip
    done_b, done_a = result_of(b, server), result_of(a, server)

    assert done_a["merge"]["summary"][END_LSN_KEY] == "0/AAAA"
    assert END_LSN_KEY not in done_b["merge"]["summary"], done_b["merge"]
    assert END_LSN_KEY not in done_a["later"]["summary"]
    assert done_a["rows"] == done_b["rows"] == ROWS_AFTER  # each in its own session's catalog
    assert (tmp_path / "a" / "ns" / "t").is_dir() and (tmp_path / "b" / "ns" / "t").is_dir()


def test_a_wrong_or_missing_token_is_refused(server: SparkConnectServer) -> None:
    assert server.token is not None
    wrong = server.url.replace(server.token, "not-" + server.token)
    missing = f"sc://127.0.0.1:{server.port}"
    refused_wrong, refused_missing, accepted = result_of(
        start_client(PROBE, {"urls": [wrong, missing, server.url]}), server
    )

    assert "UNAUTHENTICATED" in refused_wrong["error"], refused_wrong
    assert "Invalid authentication token" in refused_wrong["error"], refused_wrong
    assert "No authentication token provided" in refused_missing["error"], refused_missing
    assert accepted == {"count": 3}


def test_a_restarted_server_serves_the_same_url(server: SparkConnectServer) -> None:
    """kill -9 and a start on the same port: a new client session with the old URL works."""
    url = server.url
    server.restart()

    assert server.url == url
    assert result_of(start_client(PROBE, {"urls": [url]}), server) == [{"count": 3}]
