"""Fixtures for the slot lag sensor tests (helpers in ``slot_lag_support``, importable by tests)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pglogical.testing import PostgresCluster
from tests.integration.sensors.slot_lag_support import (
    DagsTestResult,
    PublishedSlot,
    airflow_env,
    make_published_slot,
    run_dags_test,
)


@pytest.fixture
def published(pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch) -> PublishedSlot:
    """The session cluster's fresh database, published and slotted, reachable as ``pgl_lag``."""
    return make_published_slot(pg_cluster, pg_dbname, "pgl_lag", monkeypatch)


# --------------------------------------------------------------------------- airflow dags test


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private AIRFLOW_HOME with a migrated SQLite metadata DB (`dags test` needs one: ~3 s)."""
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "dags").mkdir()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        env=airflow_env(home, {}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return home


@pytest.fixture
def dags_test(airflow_home: Path) -> Iterator[Callable[..., DagsTestResult]]:
    """``run_dags_test`` bound to the session's AIRFLOW_HOME."""

    def run(dag_id: str, dag_source: str, **kwargs: Any) -> DagsTestResult:
        return run_dags_test(airflow_home, dag_id, dag_source, **kwargs)

    yield run
