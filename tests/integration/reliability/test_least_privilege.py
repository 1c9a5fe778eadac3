"""Least privilege and secrets: the whole pipeline run as a password-protected replication role.

The role has only ``LOGIN REPLICATION`` and ``SELECT`` on the published tables: no superuser,
no ownership, no ``CREATE`` on the database. It runs the initial
snapshot, the CDC DAG (lag sensor, drain, apply, ack) and a re-snapshot of one table copied by the
Spark JDBC engine (the one path that hands the role's password to Spark) through real
``airflow dags test``, and the lake must end equal to the source. The lake is a JDBC catalog in
PostgreSQL behind a role of its own with a password, and staging is on an S3 server with a secret
key. None of the three secrets may appear on any process's command line while the jobs run (spark
-submit's included), nor in the DAG runs' output, the task logs, the Airflow metadata database
(XCom), the staged manifests and files, the lake's catalog and metadata, nor in the CLI's output
and errors.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, ShopWorkload
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import PrivilegeError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.replication.publications import TableSpec, publish_tables
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.testing.s3 import S3Server
from tests.integration.e2e.e2e_support import (
    DAGS,
    CommandLineWatch,
    objects_containing,
    pipeline_conf,
    pipeline_sandbox,
)

SLOT = "lp_cdc"
# The example backfill DAG with the Spark JDBC copy engine: the one path that hands the password to Spark.
SPARK_BACKFILL_DAG = """
from airflow_provider_postgres_cdc.dag_factories import backfill_tables_dag

dag = backfill_tables_dag(copy_engine="spark")
"""
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]


def create_replication_role(cluster: PostgresCluster, dbname: str, role: str, password: str) -> None:
    """A role with LOGIN REPLICATION and SELECT on the shop's tables, reachable by password only."""
    cluster.execute(
        sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    cluster.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)), dbname
    )
    # pg_hba.conf is read top down: these lines come before initdb's trust lines.
    hba = cluster.datadir / "pg_hba.conf"
    lines = [f"host {db} {role} 127.0.0.1/32 scram-sha-256\n" for db in ("all", "replication")]
    hba.write_text("".join(lines) + hba.read_text())
    cluster.execute("SELECT pg_reload_conf()")


def assert_least_privilege(cluster: PostgresCluster, dbname: str, role: str) -> None:
    checks = cluster.execute(
        sql.SQL(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, "
            "has_database_privilege({role}, {db}, 'CREATE'), "
            "(SELECT count(*) FROM pg_class WHERE relowner = r.oid) FROM pg_roles r WHERE rolname = {role}"
        ).format(role=sql.Literal(role), db=sql.Literal(dbname)),
        dbname,
    )
    assert checks == [(False, False, False, True, False, 0)]


def create_catalog_database(cluster: PostgresCluster, role: str, password: str) -> str:
    """A database for a JDBC Iceberg catalog, owned by ``role``, reachable by password only."""
    cluster.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
    )
    cluster.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(role), sql.Identifier(role)))
    hba = cluster.datadir / "pg_hba.conf"
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    cluster.execute("SELECT pg_reload_conf()")
    return f"jdbc:postgresql://127.0.0.1:{cluster.port}/{role}"


def files_containing(root: Path, secret: bytes) -> list[str]:
    """Every file below ``root`` whose bytes hold ``secret`` (logs, databases, Parquet, metadata)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


@pytest.mark.timeout(1800)
def test_replication_role_runs_everything_and_no_secret_leaks(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dsn = pg_cluster.dsn(pg_dbname)
    shop = ShopWorkload(dsn, seed=5)
    shop.create_schema()  # the tables and the publication: created by their owner, as a DBA would
    shop.initial_load()
    role = f"pgl_reader_{secrets.token_hex(4)}"
    password = "pw-" + secrets.token_urlsafe(18)
    create_replication_role(pg_cluster, pg_dbname, role, password)
    assert_least_privilege(pg_cluster, pg_dbname, role)

    uri = f"postgresql://{role}:{password}@{pg_cluster.host}:{pg_cluster.port}/{pg_dbname}"
    catalog_role, catalog_password = f"pgl_catalog_{secrets.token_hex(4)}", "cat-" + secrets.token_urlsafe(18)
    catalog_uri = create_catalog_database(pg_cluster, catalog_role, catalog_password)
    (tmp_path / "lake").mkdir()
    lake = LakeConfig("lake", {"type": "jdbc", "uri": catalog_uri, "warehouse": str(tmp_path / "lake")})
    lake_conn = json.loads(connection_json(lake)) | {"login": catalog_role, "password": catalog_password}
    s3 = S3Server(buckets=["staging"])
    s3.start()
    request.addfinalizer(s3.stop)
    staging = "s3://staging/lp"
    dags = tmp_path / "dags"
    dags.mkdir()
    for example in DAGS.glob("*.py"):
        (dags / example.name).write_text(example.read_text())
    (dags / "postgres_cdc_backfill_tables.py").write_text(SPARK_BACKFILL_DAG)
    sandbox = pipeline_sandbox(
        tmp_path / "airflow", uri, json.dumps(lake_conn), dags=dags,
        connections={"staging_store": s3.connection_json()},
    )  # fmt: skip
    conf = {**pipeline_conf(SLOT, staging), "staging_conn_id": "staging_store"}
    all_secrets = (password, catalog_password, s3.secret_key)
    with CommandLineWatch(all_secrets) as watch:
        outputs = [sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check().output]
        shop.step()  # pending in the slot while orders is re-snapshot; the CDC run after takes them
        shop.step()
        outputs.append(
            sandbox.dags_test("postgres_cdc_backfill_tables", {**conf, "tables": ["public.orders"]})
            .check()
            .output
        )
        outputs.append(sandbox.dags_test("postgres_cdc_microbatch", conf).check().output)
    assert watch.spark_submits > 0 and watch.leaks == []

    lake = LakeConfig(
        lake.catalog, {**lake.properties, "jdbc.user": catalog_role, "jdbc.password": catalog_password}
    )
    results = compare_tables(pg_cluster.dsn(pg_dbname), [PUBLICATION], lake)
    assert all(r.equal for r in results), format_report(results)

    # The CLI with the secret in its DSN: reports on pending changes, and an error (no such slot).
    shop.step()
    cli = str(Path(sys.executable).with_name("pgcdc"))
    role_dsn = pg_cluster.dsn(pg_dbname, user=role, password=password)
    commands = (
        ["check"],
        ["lag", "--slot-name", SLOT, "--publications", PUBLICATION],
        ["lag", "--slot-name", "no_such_slot"],
        ["peek", "--slot-name", SLOT, "--publications", PUBLICATION, "--limit", "5"],
    )
    for args in commands:
        run = subprocess.run([cli, "-v", *args[:1], "--dsn", role_dsn, *args[1:]],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.stdout or run.stderr, args
        outputs.append(run.stdout + run.stderr)

    for secret in all_secrets:
        assert not [i for i, text in enumerate(outputs) if secret in text]
        assert files_containing(tmp_path, secret.encode()) == []
        assert objects_containing(s3.filesystem(), "staging", secret.encode()) == []


@pytest.mark.integration
def test_publishing_without_ownership_names_the_grant(pg_cluster: PostgresCluster, pg_dbname: str) -> None:
    """Adding a table is the one step that needs more than REPLICATION and SELECT: the error says what."""
    dsn = pg_cluster.dsn(pg_dbname)
    ShopWorkload(dsn).create_schema()
    pg_cluster.execute("CREATE TABLE refunds (id int PRIMARY KEY, amount numeric)", pg_dbname)
    role = f"pgl_reader_{secrets.token_hex(4)}"
    create_replication_role(pg_cluster, pg_dbname, role, "pw")
    conn = psycopg2.connect(pg_cluster.dsn(pg_dbname, user=role, password="pw"))
    try:
        with pytest.raises(PrivilegeError) as caught:
            publish_tables(conn, PUBLICATION, [TableSpec.parse("public.refunds")])
    finally:
        conn.close()
    message = str(caught.value)
    assert f'GRANT "postgres" TO "{role}"' in message
    assert "public.refunds" in message and PUBLICATION in message
    members = pg_cluster.execute(
        sql.SQL("SELECT count(*) FROM pg_publication_tables WHERE pubname = {}").format(
            sql.Literal(PUBLICATION)
        ),
        pg_dbname,
    )
    assert members == [(6,)]  # nothing was changed
