"""Fixtures for the slot lag sensor tests (helpers in ``slot_lag_support``, importable by tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.testing import AirflowSandbox, PostgresCluster
from tests.integration.sensors.slot_lag_support import PublishedSlot, connection_uri, make_published_slot


@pytest.fixture
def published(pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch) -> PublishedSlot:
    """The session cluster's fresh database, published and slotted, reachable as ``pgl_lag``."""
    return make_published_slot(pg_cluster, pg_dbname, "pgl_lag", monkeypatch)


# --------------------------------------------------------------------------- airflow dags test


@pytest.fixture
def airflow_sandbox(published: PublishedSlot, tmp_path: Path) -> AirflowSandbox:
    """A private AIRFLOW_HOME (migrated on first use) reaching ``published``'s database as ``pgl_lag``.

    The connection URI carries the password, so a test can assert it never reaches the output.
    """
    dags_folder = tmp_path / "dags"
    dags_folder.mkdir()
    connections = {published.conn_id: connection_uri(published.cluster, published.dbname)}
    return AirflowSandbox(tmp_path / "airflow_home", dags_folder, connections=connections)
