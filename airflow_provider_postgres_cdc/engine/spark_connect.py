"""The package's Spark jobs as Spark Connect client processes, and the check of a server before a run.

A Spark job runs on a Spark Connect server as ``<client python> <job script> <arguments>``: pyspark's
``SPARK_REMOTE`` holds the server's ``sc://`` URL (with its token), so the job's
``getOrCreate()`` opens a session of its own on the server, and the settings spark-submit would
have been given as ``--conf`` (the lake's catalog, the staging store's ``s3a`` settings, the job's
own) go in a mode-0600 JSON file named by ``POSTGRES_CDC_SESSION_CONF``, which the job sets on its
session (``spark/job_session.py``). Both travel by environment, which only the worker's user
reads, never by command line. Settings a running server cannot take for one session (static SQL
settings such as ``spark.sql.extensions``, the JVM's and the scheduler's) are left to the server's
start.

:func:`check_server` refuses, before anything is drained, a server that is unreachable, refuses the
token, lacks Iceberg's SQL extensions, or runs a Spark or Iceberg runtime older than the jobs need
(Iceberg 1.11 on Spark 4 takes a commit's summary keys from the session conf
``spark.sql.iceberg.snapshot-property.<key>``, which the jobs set over Connect); and a staging
location on this machine's disk when the server is elsewhere.

Standard library only (no pyspark, no Airflow): the operators call it from the worker.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from airflow_provider_postgres_cdc.errors import IcebergRuntimeError, SparkConnectError
from airflow_provider_postgres_cdc.formats.lake import (
    ICEBERG_RUNTIME_ARTIFACT,
    SESSION_PROPERTIES_SINCE,
    SPARK_EXTENSIONS,
)

REMOTE_ENV = "SPARK_REMOTE"
"""pyspark's own variable: with it set, ``SparkSession.builder.getOrCreate()`` opens a Connect session."""
SESSION_CONF_ENV = "POSTGRES_CDC_SESSION_CONF"
"""Names the JSON file of the run's session settings (``spark/job_session.py`` reads it)."""
PYTHON_ENV = "POSTGRES_CDC_CONNECT_PYTHON"
"""The worker's default client Python, when an operator is not given ``connect_python``."""
SESSION_CONF_NAME = "postgres-cdc-session.json"
DEFAULT_PORT = 15002
MIN_SPARK = (4, 0)
TESTED_ICEBERG = "1.12.0"
CHECK_TIMEOUT = 120.0
# Session settings by prefix: SQL settings, Hadoop settings (a session's SQL conf reaches Hadoop
# under its own key, so ``spark.hadoop.`` is taken off), and the package's own.
_HADOOP = "spark.hadoop."
_SESSION_PREFIXES = ("spark.sql.", "spark.postgres_cdc.")
# SQL settings that are static: read when the server starts, refused by a session.
_STATIC_SQL = frozenset({
    "spark.sql.extensions", "spark.sql.catalogImplementation", "spark.sql.warehouse.dir",
    "spark.sql.globalTempDatabase", "spark.sql.queryExecutionListeners", "spark.sql.cache.serializer",
    "spark.sql.streaming.streamingQueryListeners", "spark.sql.ui.retainedExecutions",
    "spark.sql.event.truncate.length", "spark.sql.hive.metastore.version", "spark.sql.hive.metastore.jars",
    "spark.sql.hive.metastore.sharedPrefixes", "spark.sql.hive.metastore.barrierPrefixes",
    "spark.sql.sources.disabledJdbcConnProviderList", "spark.sql.legacy.sessionInitWithConfigDefaults",
})  # fmt: skip
_ERROR_LINE = "{prog}: error: "
_CLIENT_MISSING = ("ModuleNotFoundError", "No module named")


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What :func:`check_server` read from a server: its Spark, its Iceberg runtime, the client's pyspark."""

    spark: str
    iceberg: str
    client: str


def server_address(url: str) -> tuple[str, int]:
    """The host and port of an ``sc://host:port/;...`` URL (pyspark's default port when none)."""
    parsed = urlparse("http" + url[2:] if url.startswith("sc://") else url)
    return parsed.hostname or "", parsed.port or DEFAULT_PORT


def shown(url: str) -> str:
    """``sc://host:port``: the URL as messages name it, without its token."""
    host, port = server_address(url)
    return f"sc://{host}:{port}"


def _url_params(url: str) -> dict[str, str]:
    """The ``;key=value`` parameters of an ``sc://`` URL (values as written, still quoted)."""
    params = urlparse("http" + url[2:] if url.startswith("sc://") else url).params
    pairs = (part.partition("=") for part in params.split(";") if part)
    return {key: value for key, _, value in pairs}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    return False


def session_settings(conf: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``conf`` (spark-submit's settings) as (settings for one session, keys left to the server's start).

    SQL settings but the static ones, and the package's own, are kept as they are; Hadoop's
    (``spark.hadoop.fs.s3a...``) lose their prefix, since a session's SQL conf reaches Hadoop key
    for key; everything else (``spark.jars*``, ``spark.driver.*``, ``spark.executor.*``,
    ``spark.scheduler.mode``, ``spark.log.level``, ...) is the server's.
    """
    kept: dict[str, str] = {}
    left: list[str] = []
    for key, value in conf.items():
        if key.startswith(_HADOOP):
            kept[key[len(_HADOOP) :]] = str(value)
        elif key.startswith(_SESSION_PREFIXES) and key not in _STATIC_SQL:
            kept[key] = str(value)
        else:
            left.append(key)
    return kept, left


def write_session_conf(directory: str, settings: Mapping[str, str]) -> str:
    """Write ``settings`` as JSON to a new mode-0600 file in ``directory``; return its path."""
    path = os.path.join(directory, SESSION_CONF_NAME)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        json.dump(dict(settings), out)
    return path


def client_environment(
    base: Mapping[str, str],
    url: str,
    session_conf: str,
    job_zip: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The client process's environment: ``base`` and ``extra``, the server's URL, the settings
    file, and the job's modules (``job_zip``) as its only ``PYTHONPATH`` besides one ``extra`` gives:
    the worker's own path may hold another pyspark."""
    env = {key: value for key, value in base.items() if key != "PYTHONPATH"}
    env.update({key: str(value) for key, value in (extra or {}).items()})
    given = (extra or {}).get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([job_zip, *([str(given)] if given else [])])
    env[REMOTE_ENV] = url
    env[SESSION_CONF_ENV] = session_conf
    env["PYTHONUNBUFFERED"] = "1"  # each line reaches the task log when the job writes it
    return env


class ClientProcess:
    """A job's client process: its output read line by line, its process group ended on request."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], tail_lines: int = 40) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._process: subprocess.Popen[str] | None = None

    def run(self, on_line: Callable[[str], None]) -> int:
        """Start the process, hand each line it writes (stdout and stderr) to ``on_line``; its status."""
        self._process = process = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1, start_new_session=True,
        )  # fmt: skip
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n")
            self.tail.append(line)
            on_line(line)
        return process.wait()

    def terminate(self, grace: float = 5.0) -> None:
        """SIGTERM the process group (the job interrupts its server-side work), SIGKILL after ``grace`` s."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def job_failure(prog: str, status: int, tail: Sequence[str], server: str) -> str | None:
    """What a job's exit ``status`` says (``spark/job.py``): None for 0; else the message to fail with.

    2 is an error the user must act on, printed as ``<prog>: error: <Class>: <message>``; 1 is an
    unexpected failure whose traceback the task log holds; a negative status is a signal.
    """
    if status == 0:
        return None
    marker = _ERROR_LINE.format(prog=prog)
    said = [line.split(marker, 1)[1] for line in tail if marker in line]
    if status == 2 and said:
        return f"{prog} on the Spark Connect server {server}: {said[-1]}"
    if status < 0:
        return f"{prog} on the Spark Connect server {server} was ended by signal {-status}"
    last = next((line.strip() for line in reversed(tail) if line.strip()), "no output")
    return (
        f"{prog} failed on the Spark Connect server {server} (exit status {status}): {last}; "
        "the task log above holds its output"
    )


def check_staging(staging: str, url: str) -> None:
    """Refuse a staging location on this machine's disk when the server runs on another one."""
    host, _ = server_address(url)
    local = "://" not in staging or staging.startswith("file://")
    if local and not is_loopback(host):
        raise SparkConnectError(
            f"staging {staging} is a path on this worker, which the Spark Connect server {shown(url)} "
            "on another machine cannot read: use object storage or a path the server shares "
            "(s3://, gs://, hdfs://), or a Spark Connect server on this machine"
        )


def check_reachable(url: str, connection: str, timeout: float = 10.0) -> None:
    """Refuse a server nothing listens for at its host and port (in seconds, not after pyspark's retries)."""
    host, port = server_address(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise SparkConnectError(
            f"the Spark Connect server {shown(url)} of {connection} cannot be reached ({exc}): start it, "
            "or correct the connection's host and port"
        ) from None


def check_server(
    python: str,
    url: str,
    catalog_settings: Mapping[str, str],
    catalog: str,
    connection: str,
    *,
    timeout: float = CHECK_TIMEOUT,
) -> ServerFacts:
    """Refuse, naming the server and the fix, a Spark Connect server the jobs cannot run on.

    A socket is opened first (:func:`check_reachable`), then ``python`` runs a tiny client that
    opens a session with the lake's catalog set (``catalog_settings``) and reads ``spark.version``,
    the static ``spark.sql.extensions`` and ``<catalog>.system.iceberg_version()`` (a function of
    every Iceberg catalog). ``connection`` names where the URL came from.
    """
    server = shown(url)
    check_reachable(url, connection)
    with tempfile.TemporaryDirectory(prefix="postgres-cdc-check-") as scratch:
        conf = write_session_conf(scratch, catalog_settings)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env.update({REMOTE_ENV: url, SESSION_CONF_ENV: conf})
        try:
            done = subprocess.run(
                [python, "-c", _CHECK_SCRIPT, catalog], env=env, capture_output=True, text=True,
                errors="replace", timeout=timeout, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except FileNotFoundError:
            raise SparkConnectError(_no_client(python, "does not exist", server)) from None
        except subprocess.TimeoutExpired:
            raise SparkConnectError(
                f"the Spark Connect server {server} of {connection} did not answer within {timeout:.0f} s: "
                "check that it is a Spark Connect server and that it is not overloaded; nothing was drained"
            ) from None
    answer = _answer(done.stdout)
    if answer is None:
        text = (done.stderr or done.stdout).strip()
        if any(word in text for word in _CLIENT_MISSING):
            raise SparkConnectError(_no_client(python, "has no Spark Connect client", server))
        last = text.splitlines()[-1] if text else f"exit status {done.returncode}"
        raise SparkConnectError(
            f"the check of the Spark Connect server {server} with {python} failed: {last}"
        )
    if "client_error" in answer:
        raise SparkConnectError(
            _no_client(python, f"cannot open a Spark Connect session ({answer['client_error']})", server)
        )
    if "error" in answer:
        raise SparkConnectError(_session_refused(server, connection, url, str(answer["error"])))
    return _judge(server, catalog, answer)


def _answer(stdout: str) -> dict[str, object] | None:
    """The check script's JSON line, if it printed one."""
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                return found
    return None


def _no_client(python: str, what: str, server: str) -> str:
    return (
        f"the Spark Connect client Python {python} for the server {server} {what}: install pyspark-client "
        "(or pyspark[connect]) of the server's Spark version there, and name it by the operators' "
        f"connect_python or {PYTHON_ENV}"
    )


def _session_refused(server: str, connection: str, url: str, error: str) -> str:
    """The message for a session the server did not open (a token refused, not a Connect server)."""
    first = next((line.strip() for line in error.splitlines() if "details =" in line), error.splitlines()[0])
    params = _url_params(url)
    if "No authentication token" in error:
        return (
            f"the Spark Connect server {server} asks for a token and {connection} has none: set the "
            "connection's password to the server's token (spark.connect.authenticate.token)"
        )
    if "UNAUTHENTICATED" in error or "authentication token" in error:
        return (
            f"the Spark Connect server {server} refused the token of {connection} ({first}): set the "
            "connection's password to the server's token (spark.connect.authenticate.token)"
        )
    hint = ""
    tls = params.get("use_ssl", "").lower() == "true"
    if params.get("token") and not tls and server_address(url)[0] != "localhost":
        hint = (
            "; with a token, pyspark's client speaks TLS to any host but one named localhost: "
            "serve TLS, or name a server on this machine localhost"
        )
    return f"the Spark Connect server {server} of {connection} did not open a session ({first}){hint}"


def _judge(server: str, catalog: str, answer: Mapping[str, object]) -> ServerFacts:
    """Refuse a server whose Spark, extensions or Iceberg runtime the jobs cannot use."""
    spark = str(answer.get("spark") or "")
    line = ".".join(spark.split(".")[:2])
    runtime = ICEBERG_RUNTIME_ARTIFACT.format(spark=line, scala="2.13")
    restart = f"restart it with packages org.apache.iceberg:{runtime}:{TESTED_ICEBERG}"
    if _version(spark) < MIN_SPARK:
        raise SparkConnectError(
            f"the Spark Connect server {server} runs Spark {spark}; the jobs run over Spark Connect on "
            "Spark 4 with Iceberg 1.11 or later: use a Spark 4 server, or spark-submit (a 'spark' "
            "connection) for this Spark"
        )
    if SPARK_EXTENSIONS not in str(answer.get("extensions") or "").split(","):
        raise SparkConnectError(
            f"the Spark Connect server {server} was started without Iceberg's SQL extensions: restart it "
            f"with --conf spark.sql.extensions={SPARK_EXTENSIONS} (a session cannot set it)"
        )
    iceberg = str(answer.get("iceberg") or "")
    problem = str(answer.get("iceberg_error") or "")
    if not iceberg and "Cannot find catalog plugin class" in problem:
        raise IcebergRuntimeError(
            f"the Spark Connect server {server} has no Iceberg runtime for catalog {catalog!r}: {restart} "
            "(or its jar in --jars)"
        )
    if not iceberg and "UNRESOLVED_ROUTINE" not in problem:
        first = problem.strip().splitlines()[0] if problem.strip() else "no answer"
        raise SparkConnectError(
            f"the Spark Connect server {server} could not open the lake's catalog {catalog!r} ({first}): "
            "the server itself must reach the catalog and its warehouse; correct the lake connection "
            "or the server's network"
        )
    if _version(iceberg) < SESSION_PROPERTIES_SINCE:
        found = f"Iceberg {iceberg}'s" if iceberg else "an Iceberg"
        raise IcebergRuntimeError(
            f"the Spark Connect server {server} runs {found} Spark runtime, older than 1.11, which the jobs "
            "need to set commit summaries from the session (spark.sql.iceberg.snapshot-property.*): "
            f"{restart}"
        )
    return ServerFacts(spark=spark, iceberg=iceberg, client=str(answer.get("client") or ""))


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string (``"1.12.0-SNAPSHOT"`` -> ``(1, 12, 0)``)."""
    found = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


# Run by the client Python as ``python -c``: one JSON line on stdout, whatever happens after import.
_CHECK_SCRIPT = r"""
import json, os, sys


def check(catalog):
    import pyspark
    answer = {"client": pyspark.__version__}
    try:
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.getOrCreate()
    except ImportError as exc:  # a pyspark without the Connect client's packages (grpcio, ...)
        return {**answer, "client_error": str(exc)}
    try:
        from pyspark.sql.connect.client.retries import DefaultPolicy
        spark.client.set_retry_policies([DefaultPolicy(max_retries=3)])  # seconds, not minutes
    except Exception:
        pass
    try:
        answer["spark"] = spark.version
        answer["extensions"] = spark.conf.get("spark.sql.extensions", "") or ""
        with open(os.environ["POSTGRES_CDC_SESSION_CONF"], encoding="utf-8") as handle:
            for key, value in json.load(handle).items():
                spark.conf.set(key, value)
    except Exception as exc:
        return {**answer, "error": str(exc)}
    quoted = "`" + catalog.replace("`", "``") + "`"
    try:
        answer["iceberg"] = spark.sql(f"SELECT {quoted}.system.iceberg_version()").first()[0]
    except Exception as exc:
        answer["iceberg_error"] = str(exc)
    spark.stop()
    return answer


print(json.dumps(check(sys.argv[1])))
"""


__all__ = [
    "PYTHON_ENV",
    "REMOTE_ENV",
    "SESSION_CONF_ENV",
    "ClientProcess",
    "ServerFacts",
    "check_reachable",
    "check_server",
    "check_staging",
    "client_environment",
    "job_failure",
    "session_settings",
    "shown",
    "write_session_conf",
]
