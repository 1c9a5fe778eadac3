"""Which Spark line a test submits the jobs with: 3.5 with Iceberg 1.10, or 4.1 with Iceberg 1.12.

3.5 is the test virtualenv's own pyspark. pyspark 4 installs into the same ``pyspark/`` folder, so
4.1 lives in ``.venv-spark4`` beside it, holding pyspark with its ``connect`` extra, as a Spark
distribution on an Airflow worker would (the jobs import nothing else), whose Python is also a
Spark Connect client. Each line loads its own lake jars
(``make lake-jars SPARK_LINE=...``, under the test virtualenv). ``make test`` installs the 4.1 line
in the background while lint and the unit tests run; :func:`spark_line_named` waits for it.

A test parametrized with ``ALSO_ON_SPARK_41`` runs once per line (the ``spark_line`` fixture of
tests/conftest.py).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPARK_35 = "3.5"
SPARK_41 = "4.1"
SPARK4_VENV = ROOT / ".venv-spark4"
# How long a test waits for the background install `make test` started (about 50 s from a cold cache).
INSTALL_WAIT_SECONDS = 600


@dataclass(frozen=True)
class SparkLine:
    """One Spark line: the Python whose pyspark it is, and its lake jars."""

    name: str
    python: Path

    @property
    def spark_home(self) -> Path:
        """``SPARK_HOME``: the pip-installed pyspark package, which holds Spark's jars and scripts."""
        (home,) = self.python.parent.parent.glob("lib/python*/site-packages/pyspark")
        return home

    @property
    def spark_submit(self) -> Path:
        """The line's ``spark-submit`` script, as pip installed it beside its Python."""
        return self.python.with_name("spark-submit")

    def jars(self) -> str:
        """The line's lake jars, comma-separated (``tools/lake-jars``), as ``--jars`` takes them."""
        directory = Path(sys.prefix) / "lake-jars" / f"spark-{self.name}"
        listed = subprocess.run(
            [str(ROOT / "tools" / "lake-jars" / "jars.sh"), "list", self.name, str(directory)],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        missing = [jar for jar in listed.split(",") if not os.path.isfile(jar)]
        if missing:
            pytest.fail(f"Spark {self.name} lake jars missing ({missing[0]}): run `{_make(self.name)}`")
        return listed

    def submit_env(self) -> dict[str, str]:
        """What a worker sets for spark-submit of this line: its Python for the job (the driver's
        too, which ``spark-submit`` of a pip-installed pyspark also asks where Spark is), its jars."""
        python = str(self.python)
        return {
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            "POSTGRES_CDC_SPARK_JARS": self.jars(),
        }

    def worker_env(self) -> dict[str, str]:
        """:meth:`submit_env` plus ``SPARK_HOME`` with its ``bin`` first on ``PATH``: a worker whose
        plain ``spark-submit`` (the Spark connection's default) is this line's."""
        home = self.spark_home
        path = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**self.submit_env(), "SPARK_HOME": str(home), "PATH": path}


@functools.cache
def spark_line_named(name: str) -> SparkLine:
    """The line ``name``, installed and checked: its pyspark is of that line."""
    if name == SPARK_35:
        line = SparkLine(SPARK_35, Path(sys.executable))
    else:
        _wait_for_background_install()
        line = SparkLine(SPARK_41, SPARK4_VENV / "bin" / "python")
    version = _pyspark_version(line.python)
    if not version.startswith(f"{line.name}."):
        log = SPARK4_VENV.with_suffix(".log")
        detail = log.read_text(encoding="utf-8")[-3000:] if log.exists() else ""
        found = version or "no pyspark"
        pytest.fail(f"Spark {name} line: {line.python} has {found}; run `{_make(name)}`\n{detail}")
    return line


def _make(line: str) -> str:
    """The make command that installs ``line``."""
    return "make venv lake-jars" if line == SPARK_35 else "make spark4"


def _pyspark_version(python: Path) -> str:
    if not python.exists():
        return ""
    probe = [str(python), "-c", "import pyspark; print(pyspark.__version__)"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def _wait_for_background_install() -> None:
    """Wait while the install ``make test`` started in the background is running (its pid file)."""
    pid_file = SPARK4_VENV.with_suffix(".pid")
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text(encoding="utf-8").strip())
    deadline = time.monotonic() + INSTALL_WAIT_SECONDS
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(1)


def _running(pid: int) -> bool:
    """Whether ``pid`` is still the install (not a later process that got its number)."""
    try:
        return SPARK4_VENV.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


ALSO_ON_SPARK_41 = pytest.mark.parametrize(
    "spark_line",
    [pytest.param(SPARK_35, id="spark3.5"), pytest.param(SPARK_41, id="spark4.1")],
    indirect=True,
)
"""Submit the test's Spark jobs on Spark 3.5 and again on 4.1 (``spark_line`` parametrized)."""
