"""What the Spark engine is handed: JDBC settings without the password; types it cannot cast refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.snapshot import SnapshotRun, jdbc_connection
from airflow_provider_postgres_cdc.errors import SparkEngineUnsupportedError
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = pytest.mark.integration


def test_jdbc_connection_keeps_the_password_out_of_the_properties() -> None:
    url, properties, password = jdbc_connection(
        "host=db.example port=6543 dbname='a b' user=cdc password=s3cret sslmode=verify-full "
        "application_name=pgl keepalives=1"
    )
    assert url == "jdbc:postgresql://db.example:6543/a%20b"
    assert properties == {
        "user": "cdc", "sslmode": "verify-full", "ApplicationName": "pgl", "tcpKeepAlive": "true",
    }  # fmt: skip
    assert password == "s3cret"
    with pytest.raises(SparkEngineUnsupportedError, match="Unix socket"):
        jdbc_connection({"host": "/var/run/postgresql", "dbname": "x"})


def test_spark_spec_imports_the_snapshot_and_refuses_arrays_before_submitting(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    db = pg_dbname
    pg_cluster.execute(
        "CREATE TABLE plain (id int PRIMARY KEY, code char(3));"
        "CREATE TABLE tagged (id int PRIMARY KEY, tags text[]);"
        "CREATE PUBLICATION plain_pub FOR TABLE plain; CREATE PUBLICATION tagged_pub FOR TABLE tagged;",
        db,
    )
    url, properties, _ = jdbc_connection(pg_cluster.dsn(db))
    with SnapshotRun(pg_cluster.dsn(db), "spec", ["plain_pub"], str(tmp_path)) as run:
        spec = run.spark_job_spec(url, properties)
        assert spec["session_init"].endswith(f"SET TRANSACTION SNAPSHOT '{run.snapshot_name}'")
        assert "row_security=off" in spec["properties"]["options"]
        (table,) = spec["tables"]
        assert table["output"].startswith("file:///") and table["output"].endswith("/public.plain")
        assert "format('%s', \"code\")" in table["queries"][0]
        with pytest.raises(ValueError, match="password"):
            run.spark_job_spec(url, {**properties, "password": "x"})
    with (
        pytest.raises(SparkEngineUnsupportedError, match=r"public\.tagged\.tags.*copy_engine='local'"),
        SnapshotRun(pg_cluster.dsn(db), "spec_arrays", ["tagged_pub"], str(tmp_path)) as run,
    ):
        run.spark_job_spec(url, properties)
    slots = pg_cluster.execute("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")
    assert ("spec_arrays",) not in slots and ("spec",) in slots
