"""A private ``AIRFLOW_HOME``: the environment and the ``airflow`` CLI every Airflow tool of the kit uses.

:class:`AirflowHome` is the base of :class:`~.airflow_cli.AirflowSandbox` (``airflow dags test``)
and the home :class:`~.airflow_services.AirflowServices` start their components in: both build on
it, and neither needs the other.

A new home does not run ``airflow db migrate``: it copies a template that one migration in this
virtualenv left (see :meth:`AirflowHome.migrate`).
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

from airflow_provider_postgres_cdc.testing.processes import run_merged_output

__all__ = ["AirflowHome"]

# What Airflow fills in when it writes a new airflow.cfg (airflow/configuration.py), under its own
# placeholder names: the template keeps the placeholders, each copy gets its home and new secrets.
_HOME_PLACEHOLDER = "{AIRFLOW_HOME}"
_SECRETS: dict[str, tuple[str, str, Callable[[], str]]] = {
    "{FERNET_KEY}": ("core", "fernet_key", lambda: base64.urlsafe_b64encode(os.urandom(32)).decode()),
    "{SECRET_KEY}": ("api", "secret_key", lambda: base64.b64encode(os.urandom(16)).decode()),
    "{JWT_SECRET_KEY}": ("api_auth", "jwt_secret", lambda: base64.b64encode(os.urandom(16)).decode()),
}


@functools.cache
def _template_name() -> str:
    """The installed Airflow's version and a digest of the interpreter and every installed distribution.

    A template is valid only for what migrated it: the schema follows Airflow and the DB managers
    providers bring, the generated airflow.cfg the options of every provider. The distributions are
    those the ``airflow`` command sees, the environment's site-packages, not the caller's ``sys.path``.
    """
    site_packages = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    dists = importlib.metadata.distributions(path=site_packages)
    installed = sorted(f"{dist.name}=={dist.version}" for dist in dists)
    digest = hashlib.sha256("\n".join([sys.prefix, sys.version, *installed]).encode()).hexdigest()
    return f"airflow-{importlib.metadata.version('apache-airflow-core')}-{digest[:16]}"


def _config_template(config: str, home: Path) -> str:
    """The airflow.cfg Airflow wrote in ``home``, with placeholders again for the home and the secrets."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read_string(config)
    for placeholder, (section, option, _) in _SECRETS.items():
        if value := parser.get(section, option, fallback=""):
            config = config.replace(value, placeholder)
    return config.replace(str(home), _HOME_PLACEHOLDER)


class AirflowHome:
    """A private ``AIRFLOW_HOME`` (SQLite metadata DB, chosen DAG folder) and the ``airflow`` CLI in it.

    Connections are given as ``AIRFLOW_CONN_<ID>`` URIs in ``connections``; nothing of the
    caller's Airflow configuration leaks in. The metadata DB is migrated on first use.

    ``template_dir`` holds the migrated templates new homes copy (see :meth:`migrate`). It lies
    in the virtualenv because a template is valid for exactly the Airflow and providers installed
    there: every process of a test run, and later runs, share it, another virtualenv (another
    Airflow) has its own, and it goes when the virtualenv does. ``None`` migrates every home.

    :param home: directory for ``AIRFLOW_HOME`` (created).
    :param dags_folder: the DAG files to load (e.g. the package's ``dags_examples``).
    :param connections: connection id -> URI.
    :param env: more environment variables for every ``airflow`` command.
    """

    template_dir: ClassVar[Path | None] = Path(sys.prefix) / "airflow-db-template"

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
        """Give the home a metadata DB at Airflow's head revision, once.

        ``airflow db migrate`` costs several CPU-seconds, most of a short test's, so a new home
        copies a template instead: the SQLite DB (``airflow.db``, Airflow's default
        ``sql_alchemy_conn``) and the ``airflow.cfg`` one migration wrote, with this home's paths
        and new secrets put in, as a migration here would have written it. The airflow.cfg is
        needed: the scheduler and API server start at once, and in a home without one each would
        write its own, with its own fernet key. The first home that finds no template makes it
        under a lock, so pytest-xdist workers share one migration, and renames it into place
        whole, so no process copies half of one. A home that already has a DB or an airflow.cfg,
        or whose ``env`` configures Airflow (``AIRFLOW__...``, ``AIRFLOW_CONFIG``: another
        database, say), is migrated for real.
        """
        if self._migrated:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        template = self._template()
        if template is None:
            self._run_migrate(self.environment())
        else:
            self._copy(template)
        self._migrated = True

    def _run_migrate(self, env: Mapping[str, str]) -> None:
        result = self.airflow("db", "migrate", env=env)
        if result.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-4000:]}")

    def _template(self) -> Path | None:
        """The template this home copies, made if missing; None when the home must migrate itself."""
        configured = [
            key
            for key in self.extra_env
            if key.startswith("AIRFLOW") and not key.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))
        ]
        existing = [name for name in ("airflow.db", "airflow.cfg") if (self.home / name).exists()]
        if self.template_dir is None or configured or existing:
            return None
        template = self.template_dir / _template_name()
        if template.exists():
            return template
        try:
            self.template_dir.mkdir(parents=True, exist_ok=True)
            lock = (self.template_dir / f"{template.name}.lock").open("a")
        except OSError:  # a read-only installation
            return None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not template.exists():
                self._make_template(template)
        return template

    def _make_template(self, template: Path) -> None:
        """Migrate a scratch home beside ``template``, then rename its DB and airflow.cfg into place."""
        scratch = Path(tempfile.mkdtemp(prefix=f"{template.name}.", dir=template.parent))
        try:
            home = scratch / "home"
            home.mkdir()
            self._run_migrate({**self.environment(), "AIRFLOW_HOME": str(home)})
            with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # Airflow's SQLite is in WAL mode
            files = scratch / "template"
            files.mkdir()
            os.replace(home / "airflow.db", files / "airflow.db")
            config = _config_template((home / "airflow.cfg").read_text(), home)
            (files / "airflow.cfg").write_text(config)
            os.replace(files, template)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _copy(self, template: Path) -> None:
        shutil.copyfile(template / "airflow.db", self.home / "airflow.db")
        config = (template / "airflow.cfg").read_text().replace(_HOME_PLACEHOLDER, str(self.home))
        for placeholder, (_, _, generate) in _SECRETS.items():
            config = config.replace(placeholder, generate())
        path = self.home / "airflow.cfg"
        path.touch(mode=0o600)  # as Airflow makes it: the file holds the fernet key
        path.write_text(config)
