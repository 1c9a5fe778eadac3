"""Preflight against real servers: a ready one, and one that is wrong in every fixable way."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg2
import pytest

from airflow_provider_postgres_cdc.errors import (
    PrivilegeError,
    ReplicationCapacityError,
    ServerVersionError,
    WalLevelError,
)
from airflow_provider_postgres_cdc.replication import check_prerequisites, connect
from airflow_provider_postgres_cdc.replication.preflight import inspect_prerequisites
from airflow_provider_postgres_cdc.testing import PostgresCluster


@pytest.fixture(scope="module")
def replica_cluster() -> Iterator[PostgresCluster]:
    """A server with wal_level=replica, one slot (taken) and no WAL senders."""
    settings = {"wal_level": "replica", "max_replication_slots": "1", "max_wal_senders": "0"}
    with PostgresCluster(settings) as cluster:
        cluster.execute("SELECT pg_create_physical_replication_slot('taken')")
        yield cluster


def test_ready_server_passes(pg_cluster: PostgresCluster, pg_dsn: str) -> None:
    conn = connect(pg_dsn)
    try:
        report = check_prerequisites(conn)
    finally:
        conn.close()
    assert report.wal_level == "logical"
    assert report.is_superuser
    assert report.server_version_num >= 150000
    assert report.server_encoding == "UTF8"
    assert report.problems() == []


def test_wal_level_error_names_the_fix(replica_cluster: PostgresCluster) -> None:
    conn = connect(replica_cluster.dsn())
    try:
        with pytest.raises(WalLevelError, match=r"ALTER SYSTEM SET wal_level = 'logical'.*restart"):
            check_prerequisites(conn)
    finally:
        conn.close()


def test_every_problem_is_reported(replica_cluster: PostgresCluster) -> None:
    conn = connect(replica_cluster.dsn())
    try:
        problems = inspect_prerequisites(conn).problems()
    finally:
        conn.close()
    kinds = [type(p) for p in problems]
    assert kinds == [WalLevelError, ReplicationCapacityError, ReplicationCapacityError]
    assert "max_replication_slots" in str(problems[1])
    assert "max_wal_senders" in str(problems[2])


def test_role_without_replication_or_login(pg_cluster: PostgresCluster, pg_dbname: str) -> None:
    pg_cluster.execute("DROP ROLE IF EXISTS plain_user")
    pg_cluster.execute("CREATE ROLE plain_user LOGIN")
    pg_cluster.execute("DROP ROLE IF EXISTS nologin_user")
    pg_cluster.execute("CREATE ROLE nologin_user NOLOGIN REPLICATION")
    try:
        conn = connect(pg_cluster.dsn(pg_dbname, user="plain_user"))
        try:
            with pytest.raises(PrivilegeError, match=r'ALTER ROLE "plain_user" REPLICATION'):
                check_prerequisites(conn)
        finally:
            conn.close()
        # A NOLOGIN role cannot connect at all; seen through SET ROLE, preflight names the fix.
        conn = connect(pg_cluster.dsn(pg_dbname))
        try:
            with conn.cursor() as cur:
                cur.execute("SET ROLE nologin_user")
            with pytest.raises(PrivilegeError, match=r'ALTER ROLE "nologin_user" LOGIN'):
                check_prerequisites(conn)
        finally:
            conn.close()
    finally:
        pg_cluster.execute("DROP ROLE plain_user")
        pg_cluster.execute("DROP ROLE nologin_user")


def test_old_server_version_is_refused(pg_cluster: PostgresCluster, pg_dsn: str) -> None:
    # No PostgreSQL 14 binaries here: judge the real report of this server with its version lowered.
    conn = connect(pg_dsn)
    try:
        report = inspect_prerequisites(conn)
    finally:
        conn.close()
    old = type(report)(**{**report.as_dict(), "server_version_num": 140011, "server_version": "14.11"})
    problems = old.problems()
    assert [type(p) for p in problems] == [ServerVersionError]
    assert "15 or later" in str(problems[0])


def test_unreachable_server_error_hides_password(pg_cluster: PostgresCluster) -> None:
    with pytest.raises(psycopg2.OperationalError) as info:
        connect(
            f"host=127.0.0.1 port={pg_cluster.port} dbname=nonexistent_db password=s3cr3t-pw user=postgres"
        )
    assert "s3cr3t-pw" not in str(info.value)
