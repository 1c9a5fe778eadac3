"""The ``pgcdc`` console commands, run as a user would, against real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from airflow_provider_postgres_cdc.replication import TableSpec, connect, create_publication, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_check_ok_and_json(pg_dsn: str) -> None:
    result = run_cli("check", "--dsn", pg_dsn)
    assert result.returncode == 0, result.stderr
    assert "OK: ready for logical replication" in result.stdout
    data = json.loads(run_cli("check", "--dsn", pg_dsn, "--json").stdout)
    assert data["wal_level"] == "logical" and data["problems"] == []


def test_check_fails_on_wal_level_replica() -> None:
    with PostgresCluster({"wal_level": "replica"}) as cluster:
        result = run_cli("check", "--dsn", cluster.dsn())
    assert result.returncode == 1
    assert "FAIL WalLevelError" in result.stdout and "ALTER SYSTEM SET wal_level" in result.stdout


def test_slots_and_publications(pg_cluster: PostgresCluster, pg_dbname: str) -> None:
    conn = connect(pg_cluster.dsn(pg_dbname))
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
    create_publication(
        conn, "pub_a", [TableSpec("orders", row_filter="amount > 5", columns=["id", "amount"])]
    )
    create_slot(conn, "cli_slot")
    conn.close()
    env = {"AIRFLOW_CONN_CLI_PG": pg_cluster.uri(pg_dbname)}
    table = run_cli("slots", "--postgres-conn-id", "cli_pg", env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].startswith("slot_name")
    assert "cli_slot" in table.stdout and "pgoutput" in table.stdout
    (slot,) = json.loads(run_cli("slots", "--dsn", pg_cluster.dsn(pg_dbname), "--json").stdout)
    assert slot["slot_name"] == "cli_slot" and slot["wal_status"] == "reserved"
    pubs = json.loads(run_cli("publications", "--dsn", pg_cluster.dsn(pg_dbname), "--json").stdout)
    assert pubs == [
        {
            "publication": "pub_a",
            "all_tables": False,
            "publish": ["insert", "update", "delete", "truncate"],
            "via_root": False,
            "schemas": [],
            "table": "public.orders",
            "columns": ["id", "amount"],
            "row_filter": "(amount > 5)",
        }
    ]
    missing = run_cli("publications", "nope", "--dsn", pg_cluster.dsn(pg_dbname))
    assert missing.returncode == 1 and "PublicationNotFoundError" in missing.stderr


def test_unreachable_database_is_a_clean_failure(pg_cluster: PostgresCluster) -> None:
    result = run_cli("slots", "--dsn", f"host=127.0.0.1 port={pg_cluster.port} dbname=missing user=postgres")
    assert result.returncode == 1
    assert "database error" in result.stderr and "Traceback" not in result.stderr
