"""The Spark Connect route of the Spark operators, without a server.

The client Python is a fake (a script standing in for ``connect_python``): it records what the
operator gave it (arguments, ``SPARK_REMOTE``, the session settings file and its mode) and ends as
a job would, with the exit status and stderr line of ``spark/job.py``. The server is a loopback
socket that listens and answers nothing, enough for the reachability check.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_postgres_cdc.engine import spark_connect
from airflow_provider_postgres_cdc.engine.spark_connect import (
    ClientProcess,
    check_reachable,
    check_server,
    check_staging,
    job_failure,
    session_settings,
)
from airflow_provider_postgres_cdc.errors import IcebergRuntimeError, SparkConnectError
from airflow_provider_postgres_cdc.formats.lake import SPARK_EXTENSIONS, LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.lake_job import check_spark_connect, spark_connect_url
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcLakeMaintenanceOperator
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from tests.unit.operators.test_lake_operators import TABLE, write_manifest

TOKEN = "tok-secret-7f3a"
LAKE_PASSWORD = "lake-s3cret"
STAGING_SECRET = "staging-secret-91"
REMOTE = "spark-connect.example.com"  # a name never resolved: the rules that refuse it do no I/O

# The fake client Python: run as ``<fake> <job script> <args>`` (or ``<fake> -c <check> <catalog>``).
FAKE_PYTHON = """\
import json, os, sys, time
if sys.argv[1] == "-c":  # the server check: the answer the test gave
    print(os.environ["FAKE_ANSWER"])
    sys.exit(0)
conf = os.environ.get("POSTGRES_CDC_SESSION_CONF")
info = {"argv": sys.argv[1:], "remote": os.environ.get("SPARK_REMOTE"), "conf_path": conf,
        "pythonpath": os.environ.get("PYTHONPATH")}
if conf:
    info["conf"] = json.load(open(conf))
    info["mode"] = os.stat(conf).st_mode & 0o777
    info["dir_mode"] = os.stat(os.path.dirname(conf)).st_mode & 0o777
with open(os.environ["FAKE_RECORD"], "w") as out:
    json.dump(info, out)
print("apply_batch.py: a line of the job", flush=True)
behaviour = os.environ.get("FAKE_BEHAVIOUR", "ok")
if behaviour == "user-error":
    print("apply_batch.py: error: LakeStorageError: bucket 'lake' does not exist: create it", file=sys.stderr)
    sys.exit(2)
if behaviour == "crash":
    print("Traceback (most recent call last):\\nRuntimeError: something broke", file=sys.stderr)
    sys.exit(1)
if behaviour == "hang":
    import signal
    def ended(*_):
        open(os.environ["FAKE_RECORD"] + ".term", "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, ended)
    open(os.environ["FAKE_RECORD"] + ".started", "w").close()
    time.sleep(300)
"""


class LogRecorder:
    """Stands in for an operator's logger: every line it would have logged, formatted."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args if args else message)

    warning = debug = error = info


@pytest.fixture
def server_port() -> Iterator[int]:
    """A loopback port something listens on (the reachability check connects; nothing answers)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.json"))
    return path


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server_port: int) -> dict[str, str]:
    """A lake (a SQLite JDBC catalog, with a password), a staging store, a Connect and a submit connection."""
    lake = LakeConfig("shop", {"type": "jdbc", "uri": f"jdbc:sqlite:{tmp_path}/catalog.db"}, "pg_")
    lake_conn = json.loads(connection_json(lake)) | {"login": "ice", "password": LAKE_PASSWORD}
    store = {"conn_type": "aws", "login": "AKIDSTAGING", "password": STAGING_SECRET,
             "extra": {"endpoint_url": "http://127.0.0.1:8333"}}  # fmt: skip
    connect = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server_port, "password": TOKEN}
    remote = {"conn_type": "spark_connect", "host": REMOTE, "port": 15002}
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_LAKE", json.dumps(lake_conn))
    monkeypatch.setenv("AIRFLOW_CONN_STAGING_STORE", json.dumps(store))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", json.dumps(connect))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_REMOTE", json.dumps(remote))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", "spark://local%5B2%5D")
    return {"url": f"sc://127.0.0.1:{server_port}/;token={TOKEN}"}


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The values the operators hand Airflow's secrets masker."""
    values: list[str] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", lambda value, *_: values.append(str(value)))
    return values


@pytest.fixture
def no_submit(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """spark-submit is never started by these tests; a call to it is recorded."""
    calls: list[str] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: calls.append(self._conn_id))
    return calls


def apply_operator(manifest: str, fake_python: Path, **kwargs: Any) -> PostgresCdcSparkApplyOperator:
    operator = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=manifest, lake_conn_id="shop_lake", spark_conn_id="spark_connect",
        connect_python=str(fake_python), **kwargs,
    )  # fmt: skip
    operator._cached_logger = LogRecorder()  # type: ignore[assignment]
    return operator


def logged(operator: Any) -> str:
    return "\n".join(operator._cached_logger.lines)


class _NoEvents(dict[Any, Any]):
    def __missing__(self, key: Any) -> Any:
        return self


def test_a_spark_connect_connection_runs_the_job_as_a_client_with_its_settings_in_a_private_file(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, no_submit: list[str], masked: list[str]
) -> None:
    manifest = write_manifest(tmp_path, (TABLE,))
    operator = apply_operator(manifest, fake_python, conf={"spark.jars.packages": "x:y:1"})
    operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]

    record = json.loads((tmp_path / "record.json").read_text())
    assert no_submit == []  # not spark-submitted
    application, *args = record["argv"]
    assert application.endswith("spark/apply_batch.py")
    assert args[:4] == ["--catalog", "shop", "--namespace-prefix", "pg_"]
    assert args[args.index("--manifest") + 1] == manifest
    # The connection by environment: the URL the Spark provider's hook builds, the token in it.
    assert record["remote"] == connections["url"]
    assert record["pythonpath"].endswith("postgres_cdc_job.zip")
    # The settings: a mode-0600 file in a private directory, deleted when the job ended.
    assert record["mode"] == 0o600 and record["dir_mode"] == 0o700
    assert not Path(record["conf_path"]).exists()
    conf = record["conf"]
    assert conf["spark.sql.catalog.shop"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.shop.jdbc.password"] == LAKE_PASSWORD
    # What only a server's start takes is left to it.
    for key in ("spark.sql.extensions", "spark.scheduler.mode", "spark.log.level", "spark.jars.packages"):
        assert key not in conf, key
    assert not any(key.startswith(("spark.driver.", "spark.executor.")) for key in conf)
    # No secret on the command line or in the operator's own log lines; each handed to the masker.
    command_line = " ".join(record["argv"])
    for secret in (TOKEN, LAKE_PASSWORD):
        assert secret not in command_line and secret not in logged(operator)
    assert TOKEN in masked and LAKE_PASSWORD in masked
    assert "apply_batch.py: a line of the job" in logged(operator)  # the client's output is the task log


def test_the_staging_store_s_s3a_settings_reach_the_session_without_their_spark_hadoop_prefix(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, no_submit: list[str], masked: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(
        "airflow_provider_postgres_cdc.engine.staging.read_manifest",
        lambda uri, options: __import__(
            "airflow_provider_postgres_cdc.formats.manifest", fromlist=["Manifest"]
        ).Manifest.from_json(Path(write_manifest(tmp_path, (TABLE,))).read_text()),
    )
    operator = apply_operator(
        "s3://stage-bucket/shop_cdc/batch-1/_manifest.json", fake_python, staging_conn_id="staging_store"
    )
    operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]

    conf = json.loads((tmp_path / "record.json").read_text())["conf"]
    # A session's SQL conf reaches Hadoop key for key: the bucket's settings go without spark.hadoop.
    assert conf["fs.s3a.bucket.stage-bucket.endpoint"] == "http://127.0.0.1:8333"
    assert conf["fs.s3a.bucket.stage-bucket.secret.key"] == STAGING_SECRET
    assert conf["fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert not any(key.startswith("spark.hadoop.") for key in conf)
    assert STAGING_SECRET in masked and STAGING_SECRET not in logged(operator)


def test_a_spark_connection_or_none_still_submits(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, no_submit: list[str]
) -> None:
    PostgresCdcLakeMaintenanceOperator(
        task_id="maintain", slot_name="shop_cdc", lake_conn_id="shop_lake", spark_conn_id="spark_local",
        connect_python=str(fake_python),
    ).execute({})  # type: ignore[arg-type]  # fmt: skip
    PostgresCdcLakeMaintenanceOperator(
        task_id="maintain", slot_name="shop_cdc", lake_conn_id="shop_lake", spark_conn_id="no_such_conn"
    ).execute({})  # type: ignore[arg-type]

    assert no_submit == ["spark_local", "no_such_conn"]  # spark-submit's own fallback for a missing one
    assert not (tmp_path / "record.json").exists()
    assert spark_connect_url("spark_local") is None and spark_connect_url("no_such_conn") is None
    assert spark_connect_url("spark_connect") == connections["url"]


def test_the_maintenance_job_runs_on_the_server_too_and_the_connection_is_templated(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, no_submit: list[str]
) -> None:
    operator = PostgresCdcLakeMaintenanceOperator(
        task_id="maintain", slot_name="shop_cdc", lake_conn_id="shop_lake",
        spark_conn_id="{{ params.spark_conn_id }}", connect_python="{{ params.python }}",
    )  # fmt: skip
    assert {"_conn_id", "connect_python"} <= set(operator.template_fields)
    operator._conn_id, operator.connect_python = "spark_connect", str(fake_python)  # as rendered
    operator._cached_logger = LogRecorder()  # type: ignore[assignment]
    operator.execute({})  # type: ignore[arg-type]

    record = json.loads((tmp_path / "record.json").read_text())
    assert record["argv"][0].endswith("spark/maintain_lake.py") and "--slot-name" in record["argv"]
    assert no_submit == []


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ("user-error", "LakeStorageError: bucket 'lake' does not exist: create it"),
        ("crash", "(exit status 1): RuntimeError: something broke"),
    ],
)
def test_a_failed_job_fails_the_task_with_what_the_job_said(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_submit: list[str], behaviour: str, said: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FAKE_BEHAVIOUR", behaviour)
    operator = apply_operator(write_manifest(tmp_path, (TABLE,)), fake_python)
    with pytest.raises(AirflowException) as raised:  # the class spark-submit's failures have
        operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]

    message = str(raised.value)
    assert said in message and "apply_batch.py" in message
    assert connections["url"].split("/;")[0] in message and TOKEN not in message


def test_on_kill_terminates_the_client_process_group(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_submit: list[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("FAKE_BEHAVIOUR", "hang")
    operator = apply_operator(write_manifest(tmp_path, (TABLE,)), fake_python)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "record.json.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    operator.on_kill()
    worker.join(30)

    assert not worker.is_alive() and time.monotonic() - began < 10
    assert (tmp_path / "record.json.term").exists()  # SIGTERM first: the job interrupts its server work
    assert len(failures) == 1 and "exit status 143" in str(failures[0])


def test_a_client_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    client = ClientProcess(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('up', flush=True); time.sleep(300)"],
        os.environ,
    )  # fmt: skip
    statuses: list[int] = []
    worker = threading.Thread(target=lambda: statuses.append(client.run(lambda line: None)))
    worker.start()
    while not client.tail:
        time.sleep(0.05)
    began = time.monotonic()
    client.terminate(grace=1.0)
    worker.join(30)
    assert statuses == [-signal.SIGKILL] and 0.9 < time.monotonic() - began < 10


def test_session_settings_keep_the_session_s_and_leave_the_server_s() -> None:
    kept, left = session_settings({
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.uri": "http://127.0.0.1:8181",
        "spark.sql.shuffle.partitions": "4",
        "spark.postgres_cdc.lakeNames": "portable",
        "spark.hadoop.fs.s3a.bucket.b.endpoint": "http://127.0.0.1:8333",
        "spark.sql.extensions": SPARK_EXTENSIONS,
        "spark.sql.warehouse.dir": "/tmp/w",
        "spark.jars": "/j.jar", "spark.jars.packages": "g:a:1",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", "spark.executor.memory": "2g",
        "spark.scheduler.mode": "FAIR", "spark.log.level": "WARN", "spark.redaction.regex": "x",
    })  # fmt: skip
    assert kept == {
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.uri": "http://127.0.0.1:8181",
        "spark.sql.shuffle.partitions": "4",
        "spark.postgres_cdc.lakeNames": "portable",
        "fs.s3a.bucket.b.endpoint": "http://127.0.0.1:8333",
    }
    assert set(left) == {
        "spark.sql.extensions", "spark.sql.warehouse.dir", "spark.jars", "spark.jars.packages",
        "spark.driver.extraJavaOptions", "spark.executor.memory", "spark.scheduler.mode",
        "spark.log.level", "spark.redaction.regex",
    }  # fmt: skip


def test_the_job_and_the_operator_name_the_settings_file_alike() -> None:
    from airflow_provider_postgres_cdc.spark.job_session import SESSION_CONF_ENV

    assert spark_connect.SESSION_CONF_ENV == SESSION_CONF_ENV


@pytest.mark.parametrize(
    ("status", "tail", "expected"),
    [
        (0, ["apply_batch.py: error: ignored"], None),
        (2, ["x", "apply_batch.py: error: ConcurrentWriteError: redo it"], ": ConcurrentWriteError: redo it"),
        (2, ["apply_batch.py: error: argument --manifest: expected one argument"], "argument --manifest"),
        (
            1,
            ["Traceback (most recent call last):", "ValueError: bad", ""],
            "(exit status 1): ValueError: bad",
        ),
        (-9, ["a line"], "was ended by signal 9"),
    ],
)
def test_the_exit_status_means_what_the_job_says(status: int, tail: list[str], expected: str | None) -> None:
    found = job_failure("apply_batch.py", status, tail, "sc://127.0.0.1:15002")
    assert found == expected if expected is None else (found is not None and expected in found)


@pytest.mark.parametrize(
    ("staging", "url", "refused"),
    [
        ("/data/staging", f"sc://{REMOTE}:15002", True),
        ("file:///data/staging", f"sc://{REMOTE}:15002/;token=t", True),
        ("/data/staging", "sc://127.0.0.1:15002", False),
        ("/data/staging", "sc://localhost:15002/;token=t", False),
        ("/data/staging", "sc://[::1]:15002", False),
        ("s3://bucket/staging", f"sc://{REMOTE}:15002", False),
        ("hdfs://namenode:8020/staging", f"sc://{REMOTE}:15002", False),
    ],
)
def test_a_local_staging_path_is_refused_for_a_server_on_another_machine(
    staging: str, url: str, refused: bool
) -> None:
    if refused:
        with pytest.raises(SparkConnectError, match="use object storage or a path the server shares"):
            check_staging(staging, url)
    else:
        check_staging(staging, url)


def test_the_apply_refuses_local_staging_for_a_remote_server_before_connecting(
    connections: dict[str, str], fake_python: Path, tmp_path: Path, no_submit: list[str]
) -> None:
    operator = apply_operator(write_manifest(tmp_path, (TABLE,)), fake_python)
    operator._conn_id = "spark_remote"
    with pytest.raises(SparkConnectError, match=f"sc://{REMOTE}:15002"):
        operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    assert not (tmp_path / "record.json").exists() and no_submit == []


def test_an_unreachable_server_is_refused_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(SparkConnectError, match=f"sc://127.0.0.1:{port} of Spark connection 'x' cannot"):
            check_reachable(f"sc://127.0.0.1:{port}/;token=t", "Spark connection 'x'", timeout=5)


def answer(**fields: Any) -> str:
    return json.dumps({"client": "4.1.1", **fields})


GOOD = {"spark": "4.1.1", "extensions": SPARK_EXTENSIONS, "iceberg": "1.12.0"}


@pytest.mark.parametrize(
    ("fields", "error", "says"),
    [
        (
            {**GOOD, "iceberg": "1.10.1"},
            IcebergRuntimeError,
            "Iceberg 1.10.1's Spark runtime, older than 1.11",
        ),
        ({**GOOD, "spark": "3.5.9"}, SparkConnectError, "runs Spark 3.5.9"),
        ({**GOOD, "extensions": ""}, SparkConnectError, "--conf spark.sql.extensions="),
        (
            {**GOOD, "iceberg": None, "iceberg_error": "Cannot find catalog plugin class for catalog 'shop'"},
            IcebergRuntimeError,
            "no Iceberg runtime for catalog 'shop': restart it with packages "
            "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0",
        ),
        (
            {**GOOD, "iceberg": None, "iceberg_error": "[UNRESOLVED_ROUTINE] Cannot resolve routine"},
            IcebergRuntimeError,
            "older than 1.11",
        ),
        (
            {**GOOD, "iceberg": None, "iceberg_error": "RESTException: Error occurred while processing GET"},
            SparkConnectError,
            "could not open the lake's catalog 'shop' (RESTException",
        ),
        (
            {"error": 'status = StatusCode.UNAUTHENTICATED\n\tdetails = "Invalid authentication token"'},
            SparkConnectError,
            "refused the token of Spark connection 'c'",
        ),
        (
            {"error": 'details = "No authentication token provided"'},
            SparkConnectError,
            "asks for a token and Spark connection 'c' has none",
        ),
        ({"client_error": "No module named 'grpc'"}, SparkConnectError, "install pyspark-client"),
    ],
)
def test_the_server_check_refuses_what_the_jobs_cannot_use(
    server_port: int, fake_python: Path, monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, Any], error: type[Exception], says: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FAKE_ANSWER", answer(**fields))
    url = f"sc://127.0.0.1:{server_port}/;token={TOKEN}"
    with pytest.raises(error) as raised:
        check_server(str(fake_python), url, {}, "shop", "Spark connection 'c'")
    assert says in str(raised.value) and f"sc://127.0.0.1:{server_port}" in str(raised.value)
    assert TOKEN not in str(raised.value)


def test_the_server_check_passes_a_good_server_and_names_a_missing_client(
    server_port: int, fake_python: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_ANSWER", answer(**GOOD))
    url = f"sc://127.0.0.1:{server_port}"
    facts = check_server(str(fake_python), url, {}, "shop", "c")
    assert (facts.spark, facts.iceberg, facts.client) == ("4.1.1", "1.12.0", "4.1.1")
    with pytest.raises(SparkConnectError, match="does not exist: install pyspark-client"):
        check_server(str(tmp_path / "no-python"), url, {}, "shop", "c")


def test_the_drain_checks_a_spark_connect_server_before_draining_anything(
    connections: dict[str, str], fake_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drained: list[Any] = []
    monkeypatch.setattr(
        "airflow_provider_postgres_cdc.engine.drain.drain_batch", lambda *args: drained.append(args)
    )
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", "postgresql://u:p@127.0.0.1:1/shop")
    monkeypatch.setenv("FAKE_ANSWER", answer(**{**GOOD, "iceberg": "1.10.0"}))

    def drain(spark_conn_id: str | None, staging: str = "/data/staging") -> PostgresCdcDrainOperator:
        return PostgresCdcDrainOperator(
            task_id="drain", slot_name="s", publications="p", staging=staging, postgres_conn_id="shop_db",
            lake_conn_id="shop_lake", spark_conn_id=spark_conn_id, connect_python=str(fake_python),
        )  # fmt: skip

    with pytest.raises(IcebergRuntimeError, match=r"older than 1\.11"):
        drain("spark_connect").execute({})  # type: ignore[arg-type]
    with pytest.raises(SparkConnectError, match="is a path on this worker"):
        drain("spark_remote").execute({})  # type: ignore[arg-type]
    assert drained == []
    assert check_spark_connect("spark_local", lake_conn_id="shop_lake", staging="/d", python=None) is None
    monkeypatch.setenv("FAKE_ANSWER", answer(**GOOD))
    found = check_spark_connect(
        "spark_connect", lake_conn_id="shop_lake", staging="/d", python=str(fake_python)
    )
    assert found is not None and "Spark 4.1.1, Iceberg 1.12.0" in found and TOKEN not in found


def test_the_cdc_group_has_its_drain_check_the_apply_s_spark_connection() -> None:
    from airflow.sdk import DAG

    from airflow_provider_postgres_cdc.task_groups import cdc_microbatch_task_group

    with DAG("g", schedule=None):
        group = cdc_microbatch_task_group(
            slot_name="s", publications="p", staging="s3://b/s", spark_conn_id="{{ params.spark }}",
            connect_python="/opt/spark4/bin/python",
        )  # fmt: skip
    drain, apply = group.children["postgres_cdc.drain"], group.children["postgres_cdc.apply"]
    assert drain.spark_conn_id == apply._conn_id == "{{ params.spark }}"  # type: ignore[union-attr]
    assert drain.connect_python == apply.connect_python == "/opt/spark4/bin/python"  # type: ignore[union-attr]
