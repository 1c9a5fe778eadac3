"""The check of a Spark Connect server before a run drains anything, against real servers.

One Spark 4.1 Connect server with Iceberg 1.12's runtime and a token serves the module; the client
is the 4.1 line's Python (``.venv-spark4``), as a worker's ``connect_python`` would be. A second,
bare server (no Iceberg runtime) is started for the one test that needs it.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.spark_connect import check_server
from airflow_provider_postgres_cdc.errors import IcebergRuntimeError, SparkConnectError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.testing.spark_connect import SparkConnectServer
from tests.spark_lines import SPARK_41, spark_line_named

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def server() -> Iterator[SparkConnectServer]:
    line = spark_line_named(SPARK_41)
    with SparkConnectServer(line.spark_home, jars=line.jars(), token=secrets.token_urlsafe(16)) as server:
        yield server


@pytest.fixture(scope="module")
def python() -> str:
    return str(spark_line_named(SPARK_41).python)


@pytest.fixture
def lake(tmp_path: Path) -> LakeConfig:
    """A Hadoop catalog: the server opens it without any table of a catalog database."""
    return LakeConfig("lake", {"type": "hadoop", "warehouse": str(tmp_path / "warehouse")})


def catalog_settings(lake: LakeConfig) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{lake.catalog}"
    return {key: value for key, value in lake.spark_conf().items() if key.startswith(prefix)}


def test_a_good_server_passes_and_says_what_it_runs(
    server: SparkConnectServer, python: str, lake: LakeConfig
) -> None:
    began = time.monotonic()
    facts = check_server(python, server.url, catalog_settings(lake), lake.catalog, "Spark connection 'c'")
    seconds = time.monotonic() - began

    assert facts.spark == "4.1.1" and facts.iceberg == "1.12.0" and facts.client == "4.1.1"
    print(f"check of a good server: {seconds:.1f} s")


def test_an_unreachable_server_is_refused_in_seconds(python: str, lake: LakeConfig) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"sc://127.0.0.1:{probe.getsockname()[1]}/;token=t"
        began = time.monotonic()
        with pytest.raises(SparkConnectError, match="cannot be reached"):
            check_server(python, url, catalog_settings(lake), lake.catalog, "Spark connection 'c'")
    assert time.monotonic() - began < 15


def test_a_wrong_or_missing_token_is_refused_naming_the_fix(
    server: SparkConnectServer, python: str, lake: LakeConfig
) -> None:
    assert server.token is not None
    wrong = server.url.replace(server.token, "not-" + server.token)
    with pytest.raises(SparkConnectError, match="refused the token of Spark connection 'c'") as refused:
        check_server(python, wrong, catalog_settings(lake), lake.catalog, "Spark connection 'c'")
    assert server.token not in str(refused.value)
    with pytest.raises(SparkConnectError, match="asks for a token and Spark connection 'c' has none"):
        check_server(python, f"sc://localhost:{server.port}", {}, lake.catalog, "Spark connection 'c'")


def test_the_operators_check_reads_the_airflow_connection_through_the_spark_provider(
    server: SparkConnectServer, python: str, lake: LakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_postgres_cdc.operators.lake_job import check_spark_connect

    monkeypatch.setenv("AIRFLOW_CONN_SHOP_LAKE", connection_json(lake))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", server.connection_uri())
    found = check_spark_connect("spark_connect", lake_conn_id="shop_lake", staging="/data/s", python=python)
    assert found is not None and "Spark 4.1.1, Iceberg 1.12.0" in found

    assert server.token is not None
    wrong = json.dumps(
        {"conn_type": "spark_connect", "host": "localhost", "port": server.port, "password": "x"}
    )
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", wrong)
    with pytest.raises(SparkConnectError, match="refused the token of Spark connection 'spark_connect'"):
        check_spark_connect("spark_connect", lake_conn_id="shop_lake", staging="/data/s", python=python)


def test_a_server_without_iceberg_s_runtime_is_refused(python: str, lake: LakeConfig) -> None:
    line = spark_line_named(SPARK_41)
    no_runtime = pytest.raises(IcebergRuntimeError, match="has no Iceberg runtime for catalog 'lake'")
    with SparkConnectServer(line.spark_home) as bare, no_runtime as refused:
        check_server(python, bare.url, catalog_settings(lake), lake.catalog, "Spark connection 'c'")
    assert "iceberg-spark-runtime-4.1_2.13:1.12.0" in str(refused.value)


# A job's first steps, as spark/job.py takes them: its session from job_session, then a query long
# enough to be running on the server when the operator's on_kill ends the client.
LONG_JOB = """\
from airflow_provider_postgres_cdc.spark.job_session import job_session

spark = job_session("long_job.py")
print("partitions", spark.conf.get("spark.sql.shuffle.partitions"), flush=True)
print("started", flush=True)
spark.sql("SELECT sum(hash(id)) FROM range(0, 100000000000)").collect()
print("finished", flush=True)
"""


def test_a_job_s_session_takes_its_settings_and_on_kill_interrupts_its_server_work(
    server: SparkConnectServer, python: str, tmp_path: Path
) -> None:
    from airflow_provider_postgres_cdc.engine.spark_connect import (
        ClientProcess,
        client_environment,
        session_settings,
        write_session_conf,
    )
    from airflow_provider_postgres_cdc.spark import job_py_files

    script = tmp_path / "long_job.py"
    script.write_text(LONG_JOB)
    settings, _ = session_settings({"spark.sql.shuffle.partitions": "3", "spark.log.level": "WARN"})
    settings["spark.sql.warehouse.dir"] = "/elsewhere"  # static: the server keeps its own, with a warning
    conf = write_session_conf(str(tmp_path), settings)
    env = client_environment({"PATH": "/usr/bin:/bin"}, server.url, conf, job_py_files(str(tmp_path)))
    client = ClientProcess([python, str(script)], env)
    statuses: list[int] = []
    worker = threading.Thread(target=lambda: statuses.append(client.run(lambda line: None)))
    worker.start()
    deadline = time.monotonic() + 120
    while "started" not in client.tail and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # the query is running on the server
    began = time.monotonic()
    client.terminate(grace=20)
    worker.join(60)
    output = "\n".join(client.tail)

    assert statuses == [143], output
    assert "partitions 3" in output and "keeps its own spark.sql.warehouse.dir" in output
    assert "1 operation(s) on the server interrupted" in output and "finished" not in output
    assert time.monotonic() - began < 20  # it ended on SIGTERM, not on the SIGKILL after the grace
