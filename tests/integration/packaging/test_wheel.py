"""The built wheel, installed as a user installs it: into a fresh virtualenv, without any extra.

One module-scoped install (pip's cache makes it about half a minute): the wheel's content, the
weight of DAG-parse-time imports, Airflow's provider discovery and the ``pgcdc`` command are all
checked against that installation, not against this repository's editable one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import airflow_provider_postgres_cdc

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "airflow_provider_postgres_cdc"
HEAVY = ("pyarrow", "numpy", "pyiceberg", "pyspark")
# What a working tree holds beside its sources: virtualenvs, caches, build output, Git's store.
LEFT_BEHIND = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "demo-output",
)
# What DAG files import (tests/unit/test_dag_parsing.py checks every face; this, the wheel).
DAG_FACING = (f"{PACKAGE}.task_groups", f"{PACKAGE}.dag_factories")


class Installed:
    """A virtualenv holding only the wheel and its declared (non-extra) dependencies."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root = root
        self.wheel = wheel
        self.bin = root / "bin"

    def run(self, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        if home is not None:
            env |= {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        # From a directory without the repository: the package must come from the installed wheel.
        return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=self.root, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    # From a copy of the sources alone: setuptools would reuse a build/ directory left in the tree.
    source = tmp_path_factory.mktemp("source") / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("airflow_provider_postgres_cdc-*.whl")
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(root)
    pip = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "--quiet"]
    done = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    yield Installed(root, wheel)


def test_the_wheel_holds_the_product_and_nothing_of_its_tests(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert f"{PACKAGE}/dag_factories.py" in names and f"{PACKAGE}/testing/postgres.py" in names
    assert not [n for n in names if n.startswith(("tests/", "dags_examples/", "benchmarks/"))]
    assert not [n for n in names if n.endswith(("moved_modules.py", "browser.py"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(installed.wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_installed_package_is_the_wheel_without_pyspark(installed: Installed) -> None:
    probe = installed.run(
        str(installed.bin / "python"), "-c",
        "import importlib.util as u, airflow_provider_postgres_cdc as p; "
        "print(p.__file__); print(p.__version__); print(u.find_spec('pyspark') is None)",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    where, version, no_pyspark = probe.stdout.split()
    assert where.startswith(str(installed.root)) and version == airflow_provider_postgres_cdc.__version__
    assert no_pyspark == "True"  # the Airflow side needs no Spark: that is the `spark` extra's


def test_what_dag_files_import_loads_nothing_heavy(installed: Installed) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for module in {DAG_FACING!r}: importlib.import_module(module)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = installed.run(str(installed.bin / "python"), "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_airflow_lists_the_provider_and_its_lake_connection(installed: Installed, tmp_path: Path) -> None:
    airflow = str(installed.bin / "airflow")
    providers = installed.run(airflow, "providers", "list", "-o", "json", home=tmp_path)
    assert providers.returncode == 0, providers.stderr[-3000:]
    ours = [p for p in json.loads(providers.stdout) if p["package_name"] == "airflow-provider-postgres-cdc"]
    assert ours and ours[0]["version"] == airflow_provider_postgres_cdc.__version__


def test_the_command_runs(installed: Installed) -> None:
    result = installed.run(str(installed.bin / "pgcdc"), "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    for command in ("check", "slots", "publications", "lag", "peek", "report"):
        assert command in result.stdout
    assert "pglogical" not in result.stdout.lower()
