"""A private ``AIRFLOW_HOME``: the environment and the ``airflow`` CLI every Airflow tool of the kit uses.

:class:`AirflowHome` is the base of :class:`~.airflow_cli.AirflowSandbox` (``airflow dags test``)
and the home :class:`~.airflow_services.AirflowServices` start their components in: both build on
it, and neither needs the other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from airflow_provider_postgres_cdc.testing.processes import run_merged_output

__all__ = ["AirflowHome"]


class AirflowHome:
    """A private ``AIRFLOW_HOME`` (SQLite metadata DB, chosen DAG folder) and the ``airflow`` CLI in it.

    Connections are given as ``AIRFLOW_CONN_<ID>`` URIs in ``connections``; nothing of the
    caller's Airflow configuration leaks in. The metadata DB is migrated on first use.

    :param home: directory for ``AIRFLOW_HOME`` (created).
    :param dags_folder: the DAG files to load (e.g. the package's ``dags_examples``).
    :param connections: connection id -> URI.
    :param env: more environment variables for every ``airflow`` command.
    """

    def __init__(
        self,
        home: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str],
        connections: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = Path(home)
        self.dags_folder = Path(dags_folder)
        self.connections = dict(connections or {})
        self.extra_env = dict(env or {})
        self._migrated = False

    def environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")  # airflow and spark-submit of this venv
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        env.update({f"AIRFLOW_CONN_{conn_id.upper()}": uri for conn_id, uri in self.connections.items()})
        env.update(self.extra_env)
        return env

    def airflow(
        self,
        *args: str,
        timeout: float = 900,
        env: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command in the home (stdout and stderr merged).

        ``env`` replaces the home's environment (``AirflowServices`` adds its components' settings);
        ``on_line`` sees each output line as it is printed (see :func:`.processes.run_merged_output`).
        """
        airflow = str(Path(sys.executable).with_name("airflow"))
        environment = dict(env) if env is not None else self.environment()
        return run_merged_output([airflow, *args], env=environment, timeout=timeout, on_line=on_line)

    def migrate(self) -> None:
        if self._migrated:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        result = self.airflow("db", "migrate")
        if result.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-4000:]}")
        self._migrated = True
