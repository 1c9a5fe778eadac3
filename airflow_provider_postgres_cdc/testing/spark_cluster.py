"""A throwaway Spark standalone cluster for tests of Spark jobs, ours and our users'.

``SparkStandaloneCluster`` starts a master and N workers from pyspark's own jars with
``spark-class`` (pyspark ships no ``sbin/start-*`` scripts), each as its own process group on
free loopback ports, so a job submitted to :attr:`~SparkStandaloneCluster.master_url` runs on
executor JVMs that are separate processes, as on a real cluster. Everything is stopped on
``stop()``, on leaving the ``with`` block and at interpreter exit; the logs (the daemons' and
every executor's ``stderr``) are kept when the block raised, and their directory is printed.

Example::

    with SparkStandaloneCluster(workers=2, cores_per_worker=1) as spark:
        sandbox = AirflowSandbox(home, dags, connections={"spark_cluster": spark.connection_uri()})
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing.errors import SparkNotFoundError
from airflow_provider_postgres_cdc.testing.processes import (
    free_port,
    program_beside_python,
    terminate_process_groups,
)

__all__ = ["EXECUTOR_CLASS", "SparkNotFoundError", "SparkStandaloneCluster", "find_spark_class"]

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
"""The main class of a standalone executor JVM (how its processes are told apart from the daemons)."""


def find_spark_class() -> Path:
    """``spark-class`` beside this Python (pyspark's entry script in a virtualenv), else on ``PATH``."""
    found = program_beside_python("spark-class")
    if found is not None:
        return found
    raise SparkNotFoundError(
        "spark-class not found beside this Python or on PATH: install pyspark "
        "(pip install 'airflow-provider-postgres-cdc[spark]') or put Spark's bin/ on PATH"
    )


class SparkStandaloneCluster:
    """A Spark standalone master and ``workers`` workers on loopback, as long as this object is started.

    :param workers: number of worker daemons (each one host of executors).
    :param cores_per_worker: cores each worker offers (``--cores``).
    :param memory_per_worker: memory each worker offers to executors (``--memory``, e.g. ``"1g"``).
    :param daemon_memory: heap of the master and worker daemons themselves (``SPARK_DAEMON_MEMORY``).
    :param spark_class: the ``spark-class`` script; found by :func:`find_spark_class` when omitted.
    :param keep_logs: keep the log directory after ``stop()``: ``"on-failure"`` (default: when the
        ``with`` block raised or a start failed), ``"always"`` or ``"never"``.
    """

    STARTUP_TIMEOUT = 120.0
    STOP_GRACE = 10.0

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        daemon_memory: str = "256m",
        spark_class: str | os.PathLike[str] | None = None,
        keep_logs: str = "on-failure",
    ) -> None:
        if workers < 1 or cores_per_worker < 1:
            raise ValueError("a cluster needs at least one worker with at least one core")
        if keep_logs not in ("on-failure", "always", "never"):
            raise ValueError(f"keep_logs must be 'on-failure', 'always' or 'never', not {keep_logs!r}")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.daemon_memory = daemon_memory
        self.spark_class = Path(spark_class) if spark_class else find_spark_class()
        self.keep_logs = keep_logs
        self.host = "127.0.0.1"
        self.port = 0
        self.webui_port = 0
        self.root: Path | None = None
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> SparkStandaloneCluster:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(failed=exc_type is not None)

    @property
    def running(self) -> bool:
        return self._master is not None

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``, what ``--master`` and ``SparkSession.builder.master`` take."""
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def connection_uri(self, deploy_mode: str = "client") -> str:
        """An Airflow Spark connection URI for this cluster (``AIRFLOW_CONN_<ID>``), in ``deploy_mode``."""
        return f"spark://{self.host}:{self.port}?deploy-mode={deploy_mode}"

    def start(self, attempts: int = 3) -> None:
        """Start the master, then the workers, and wait until every worker is registered ALIVE."""
        if self._master is not None:
            return
        self.root = Path(tempfile.mkdtemp(prefix="postgres-cdc-spark-"))
        atexit.register(self.stop)
        try:
            for attempt in range(1, attempts + 1):
                self.port, self.webui_port = free_port(), free_port()
                self._master = self._spawn(
                    "master", "org.apache.spark.deploy.master.Master",
                    "--host", self.host, "--port", str(self.port), "--webui-port", str(self.webui_port),
                )  # fmt: skip
                try:
                    self._wait(lambda: self.master_state().get("status") == "ALIVE", "the master")
                    break
                except RuntimeError:
                    if self._master.poll() is None or attempt == attempts:
                        raise  # only a lost race for a port is worth another attempt
                    self._master = None
            for index in range(self.workers):
                self._workers.append(self._start_worker(index))
            self._wait(lambda: len(self.alive_workers()) == self.workers, f"{self.workers} worker(s)")
        except BaseException:
            self.stop(failed=True)
            raise

    def _start_worker(self, index: int) -> subprocess.Popen[bytes]:
        assert self.root is not None
        work_dir = self.root / f"worker-{index}"
        work_dir.mkdir()
        return self._spawn(
            f"worker-{index}", "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--host", self.host, "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
            "--work-dir", str(work_dir),
        )  # fmt: skip

    def _environment(self) -> dict[str, str]:
        """The daemons' environment: small heaps, this Python for executors, logs and scratch in the root."""
        assert self.root is not None
        env = dict(os.environ)
        env.update(
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_LOCAL_IP=self.host,
            SPARK_LOCAL_DIRS=str(self.root / "local"),
            SPARK_LOG_DIR=str(self.root),
        )
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        return env

    def _spawn(self, name: str, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        assert self.root is not None
        with open(self.root / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [str(self.spark_class), main_class, *args], env=self._environment(), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root,
            )  # fmt: skip

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            dead = [name for name, process in self._daemons().items() if process.poll() is not None]
            if dead:
                raise RuntimeError(f"Spark daemon(s) exited: {', '.join(dead)}\n{self.logs()}")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{what} did not come up within {self.STARTUP_TIMEOUT}s\n{self.logs()}")

    def stop(self, failed: bool = False) -> None:
        """Stop the workers (and their executors), then the master; delete or keep the logs. Safe twice."""
        root, self.root = self.root, None
        processes = [*self._workers, *([self._master] if self._master else [])]
        self._workers, self._master = [], None
        if root is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        terminate_process_groups(processes, self.STOP_GRACE)
        if self.keep_logs == "always" or (failed and self.keep_logs == "on-failure"):
            print(f"Spark standalone cluster logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    def _daemons(self) -> dict[str, subprocess.Popen[bytes]]:
        daemons = {f"worker-{i}": process for i, process in enumerate(self._workers)}
        if self._master is not None:
            daemons["master"] = self._master
        return daemons

    # -- state and faults ------------------------------------------------------------------------

    def master_state(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``: status, workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master sees ALIVE (its JSON records: id, host, cores, memory, ...)."""
        return [w for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE"]

    def executor_pids(self) -> dict[int, list[int]]:
        """The executor JVMs each worker runs right now, by worker index (children of its process group).

        A process an executor forks shows the executor's command line until it execs (the Python
        worker daemon, for one): a match whose parent matches too is such a fork, not an executor.
        """
        groups = {process.pid: index for index, process in enumerate(self._workers)}
        matches: dict[int, tuple[int, int]] = {}  # pid -> (worker index, parent pid)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                group = os.getpgid(int(entry.name))
                cmdline = (entry / "cmdline").read_bytes()
                # The parent pid is the field after the parenthesised command name in stat.
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ProcessLookupError, IndexError, ValueError):
                continue
            if group in groups and EXECUTOR_CLASS.encode() in cmdline:
                matches[int(entry.name)] = (groups[group], parent)
        found: dict[int, list[int]] = {index: [] for index in range(len(self._workers))}
        for pid, (index, parent) in matches.items():
            if parent not in matches:
                found[index].append(pid)
        return found

    def kill_executors(self) -> list[int]:
        """SIGKILL every executor JVM now (the workers stay and the master asks them for new ones)."""
        killed = [pid for pids in self.executor_pids().values() for pid in pids]
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return killed

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executors for good (a host lost), as a fault for tests."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._workers[index].pid, signal.SIGKILL)
        self._workers[index].wait(timeout=10)

    def logs(self, chars: int = 3000) -> str:
        """The tail of every daemon's log and of every executor's ``stderr``, for a failing test's message."""
        if self.root is None:
            return ""
        parts = []
        for path in sorted([*self.root.glob("*.log"), *self.root.glob("worker-*/*/*/stderr")]):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-chars:]
                parts.append(f"--- {path.relative_to(self.root)}\n{text}")
        return "\n".join(parts)
