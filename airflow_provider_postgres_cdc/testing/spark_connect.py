"""A throwaway Spark Connect server for tests of Spark jobs that run as client sessions.

``SparkConnectServer`` starts Spark 4's ``SparkConnectServer`` application with ``spark-submit``
from a pip-installed pyspark 4 (its wheel holds the server's jar; there is no ``sbin/`` start
script), in local mode, with the caller's jars (the Iceberg runtime, JDBC drivers) and the Iceberg
SQL extensions, listening on a free loopback port. Each client that connects to :attr:`url` gets
a session of its own on the one warm driver: catalogs and ``spark.sql.iceberg.snapshot-property.*``
set with ``spark.conf.set`` stay in that session.

The server is its own process group, stopped on ``stop()``, on leaving the ``with`` block and at
interpreter exit; its log is kept when the block raised, and its directory printed. ``kill()``
and ``restart()`` (same port) are the faults a crash test needs.

With a ``token``, the server refuses every call that does not carry it as a bearer token (Spark's
pre-shared-key authentication). The token reaches the server in its environment
(``SPARK_CONNECT_AUTHENTICATE_TOKEN``), never on its command line, which any local user can read.

Example::

    with SparkConnectServer(spark_home, jars=lake_jars, token=secrets.token_urlsafe()) as server:
        connections["spark_connect"] = server.connection_uri()  # an Airflow `spark_connect` connection
        # or, in a client: SparkSession.builder.remote(server.url).getOrCreate()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from airflow_provider_postgres_cdc.engine.spark_conf import SHORT_JIT_OPTIONS, submit_settings
from airflow_provider_postgres_cdc.testing.errors import SparkNotFoundError
from airflow_provider_postgres_cdc.testing.processes import free_port, terminate_process_groups

__all__ = ["SERVER_CLASS", "SERVER_STARTED", "TOKEN_ENV", "SparkConnectServer", "find_connect_jar"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
"""The main class of the Spark Connect server application, in pyspark 4's ``spark-connect`` jar."""
SERVER_STARTED = "Spark Connect server started at:"
"""What the server logs once its gRPC service accepts calls (``SparkConnectServer.main``)."""
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""The server reads its pre-shared token here when ``spark.connect.authenticate.token`` is unset
(``Connect.getAuthenticateToken``); pyspark's client falls back to it too."""
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"

# Root logger at WARN, so a long-lived server's log stays readable; the server's own class at INFO,
# so that the line saying it is ready is still written.
_LOG_CONFIG = f"""\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n%ex
logger.server.name = {SERVER_CLASS}
logger.server.level = info
"""


class _PortTakenError(RuntimeError):
    """The server could not bind its port (taken since it was found free, or not yet released)."""


def _virtualenv_python(spark_home: Path) -> Path | None:
    """The Python of the virtualenv whose ``site-packages`` holds ``spark_home``, if it is one."""
    if spark_home.parent.name != "site-packages" or len(spark_home.parents) < 4:
        return None
    python = spark_home.parents[3] / "bin" / "python"
    return python if python.exists() else None


def find_connect_jar(spark_home: str | os.PathLike[str]) -> Path:
    """The Spark Connect server jar of ``spark_home`` (a pyspark 4 package folder or a Spark distribution)."""
    found = sorted(Path(spark_home, "jars").glob("spark-connect_*.jar"))
    if not found:
        raise SparkNotFoundError(
            f"no Spark Connect server in {spark_home} (jars/spark-connect_*.jar): give the folder of "
            "a pyspark 4 installation (pip install 'pyspark[connect]>=4.1'), or a Spark 4 distribution"
        )
    return found[0]


class SparkConnectServer:
    """A Spark Connect server in local mode on loopback, as long as this object is started.

    :param spark_home: ``SPARK_HOME``: the ``pyspark`` package folder of a pyspark 4 installation
        (``.../site-packages/pyspark``), which holds ``bin/spark-submit`` and Spark's jars.
    :param jars: what ``--jars`` takes: the Iceberg runtime, JDBC drivers (comma-separated or a list).
    :param cores: the ``N`` of ``--master local[N]``.
    :param driver_memory: the server's heap (``--driver-memory``): it is the only JVM, and every
        session's queries run in it.
    :param conf: more Spark settings for the server, e.g. a catalog shared by every session. Those
        that hold secrets go into a private properties file, not on the command line.
    :param token: a pre-shared token clients must present; ``None`` for a server that takes any
        local client.
    :param java_options: the server JVM's options (``SPARK_SUBMIT_OPTS``, replacing the caller's).
        The client JIT only by default: test jobs are small, and on 2 cores the optimizing
        compiler costs more than it earns even in a server that lives for many of them (measured
        over 12 client runs of an Iceberg MERGE: start 3.8 s instead of 5.0 s, each run 1.6-2.0 s
        instead of 2.3-3.0 s).
    :param python: the Python of Python UDFs' workers; by default the one of ``spark_home``'s
        virtualenv, whose pyspark matches the server.
    :param keep_logs: keep the log directory after ``stop()``: ``"on-failure"`` (default: when the
        ``with`` block raised or a start failed), ``"always"`` or ``"never"``.
    """

    STARTUP_TIMEOUT = 120.0
    STOP_GRACE = 10.0

    def __init__(
        self,
        spark_home: str | os.PathLike[str],
        *,
        jars: str | Sequence[str] = (),
        cores: int = 2,
        driver_memory: str = "1g",
        conf: Mapping[str, str] | None = None,
        token: str | None = None,
        java_options: str = SHORT_JIT_OPTIONS,
        python: str | os.PathLike[str] | None = None,
        keep_logs: str = "on-failure",
    ) -> None:
        if cores < 1:
            raise ValueError("a Spark Connect server needs at least one core")
        if keep_logs not in ("on-failure", "always", "never"):
            raise ValueError(f"keep_logs must be 'on-failure', 'always' or 'never', not {keep_logs!r}")
        if token is not None and not (token.isascii() and token.isprintable() and token.strip() == token):
            # It travels as a gRPC header value: printable ASCII.
            raise ValueError("the token must be non-empty printable ASCII without surrounding spaces")
        self.spark_home = Path(spark_home)
        find_connect_jar(self.spark_home)
        self.spark_submit = self.spark_home / "bin" / "spark-submit"
        self.jars = ",".join(jar for jar in ([jars] if isinstance(jars, str) else jars) if jar)
        self.cores = cores
        self.driver_memory = driver_memory
        self.conf = dict(conf or {})
        self.token = token
        self.java_options = java_options
        self.python = Path(python) if python else _virtualenv_python(self.spark_home)
        self.keep_logs = keep_logs
        self.host = "127.0.0.1"
        self.port = 0
        self.root: Path | None = None
        # How long the last start took, from spark-submit to the server's ready line.
        self.started_seconds = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    # -- what clients use ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ``sc://`` URL of ``SparkSession.builder.remote``; with a token, as ``SparkConnectHook`` has it.

        pyspark's client sends a token only over a secure channel, and it opens a plaintext one (gRPC
        local credentials, which check that the peer is on loopback) for the host named
        ``localhost`` alone: any other name means TLS, which this server does not speak.
        """
        if self.token is None:
            return f"sc://{self.host}:{self.port}"
        return f"sc://localhost:{self.port}/;token={quote(self.token, safe='')}"

    def connection_uri(self) -> str:
        """An Airflow ``spark_connect`` connection URI (``AIRFLOW_CONN_<ID>``): the token as its password."""
        if self.token is None:
            return f"spark-connect://{self.host}:{self.port}"
        return f"spark-connect://:{quote(self.token, safe='')}@localhost:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive (``kill()`` leaves a started server not running)."""
        return self._process is not None and self._process.poll() is None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> SparkConnectServer:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(failed=exc_type is not None)

    def start(self, attempts: int = 3) -> None:
        """Start the server on a free port and wait until it accepts calls."""
        if self.root is not None:
            return
        self.root = Path(tempfile.mkdtemp(prefix="postgres-cdc-spark-connect-"))
        atexit.register(self.stop)
        try:
            (self.root / "log4j2.properties").write_text(_LOG_CONFIG, encoding="utf-8")
            for attempt in range(1, attempts + 1):
                self.port = free_port()
                try:
                    self._launch()
                    break
                except _PortTakenError:
                    if attempt == attempts:
                        raise  # another process took the free port before the server bound it
        except BaseException:
            self.stop(failed=True)
            raise

    def restart(self, attempts: int = 20) -> None:
        """SIGKILL the server (a crash: sessions and running queries are lost) and start it on the same port.

        Clients keep their URL. Binding the port again can fail for a moment after the kill, so a
        failed bind is retried.
        """
        if self.root is None:
            raise RuntimeError("the Spark Connect server was not started")
        self.kill()
        for attempt in range(1, attempts + 1):
            try:
                self._launch()
                return
            except _PortTakenError:
                if attempt == attempts:
                    raise
                time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL the server's process group now, as a crash would; ``restart()`` starts it again."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def stop(self, failed: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a grace); delete or keep its logs. Safe twice."""
        root, self.root = self.root, None
        process, self._process = self._process, None
        if root is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if process is not None:
            terminate_process_groups([process], self.STOP_GRACE)
        if self.keep_logs == "always" or (failed and self.keep_logs == "on-failure"):
            print(f"Spark Connect server logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------------

    def _command(self) -> list[str]:
        """``spark-submit`` of the server class, every setting but the secret ones on the command line."""
        assert self.root is not None
        settings = {
            "spark.sql.extensions": ICEBERG_EXTENSIONS,
            "spark.ui.enabled": "false",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.sql.warehouse.dir": str(self.root / "warehouse"),
            **self.conf,
            # What the URL says: this address and port, or no server (no retry on the next port).
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.port.maxRetries": "0",
        }
        public, properties_file = submit_settings(settings, str(self.root))
        log_config = f"-Dlog4j2.configurationFile=file:{self.root / 'log4j2.properties'}"
        command = [
            str(self.spark_submit), "--master", f"local[{self.cores}]", "--name", "spark-connect-server",
            "--driver-memory", self.driver_memory, "--driver-java-options", log_config,
            *(["--jars", self.jars] if self.jars else []),
            *(["--properties-file", properties_file] if properties_file else []),
        ]  # fmt: skip
        for key, value in public.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, "--class", SERVER_CLASS, "spark-internal"]

    def _environment(self) -> dict[str, str]:
        """The server's environment: this Spark, loopback, scratch in the root, the token if any."""
        assert self.root is not None
        env = {key: value for key, value in os.environ.items() if key not in (TOKEN_ENV, "SPARK_REMOTE")}
        env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOCAL_DIRS=str(self.root / "local"),
            SPARK_SUBMIT_OPTS=self.java_options,
        )
        if self.python is not None:
            env.update(PYSPARK_PYTHON=str(self.python), PYSPARK_DRIVER_PYTHON=str(self.python))
        if self.token is not None:
            env[TOKEN_ENV] = self.token
        return env

    def _launch(self) -> None:
        """Start the server process on ``self.port`` and wait for its ready line in the log."""
        assert self.root is not None
        log_path = self.root / "server.log"
        with open(log_path, "ab") as log:
            log.write(f"--- spark-submit {SERVER_CLASS} on {self.host}:{self.port}\n".encode())
            log.flush()
            offset = log.tell()
            began = time.monotonic()
            process = self._process = subprocess.Popen(
                self._command(), env=self._environment(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root,
            )  # fmt: skip
        deadline = began + self.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            exited = process.poll() is not None
            with open(log_path, "rb") as log:
                log.seek(offset)
                written = log.read()
            if exited:
                self._process = None
                error = _PortTakenError if b"BindException" in written else RuntimeError
                raise error(
                    f"the Spark Connect server exited ({process.returncode}) while starting\n{self.logs()}"
                )
            if SERVER_STARTED.encode() in written and self._accepts_connections():
                self.started_seconds = time.monotonic() - began
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(
            f"the Spark Connect server did not start within {self.STARTUP_TIMEOUT}s\n{self.logs()}"
        )

    def _accepts_connections(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=2):
            return True
        return False

    def logs(self, chars: int = 4000) -> str:
        """The tail of the server's log, for a failing test's message."""
        if self.root is None:
            return ""
        with contextlib.suppress(OSError):
            text = (self.root / "server.log").read_text(errors="replace")[-chars:]
            return f"--- {self.root / 'server.log'}\n{text}"
        return ""
