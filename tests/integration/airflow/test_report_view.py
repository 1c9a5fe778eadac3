"""The "Postgres CDC" view in the real Airflow API server, seen by a real browser after real pipeline runs.

An initial snapshot loaded in the shared Spark session and a CDC run of the example DAG
(``airflow dags test``, Spark apply, the ack's Asset event in Airflow's database) fill the lake;
then the API server starts with the provider's plugin and the simple auth manager with two real
users: ``reader`` (role op: may read connections) and ``viewer`` (may not). Headless chromium,
logged in as ``reader``, must show the pipeline's real numbers: its batch count, the slot's
confirmed LSN as the latest cut, each table's applied-end LSN from the lake, and the lag the
server reports. The same page carries the bad inputs, each as a message: a slot that does not
exist, a lake that cannot be reached, a table with no commits yet and a source that never answers.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg2 import sql
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.demo.shop import PUBLICATION, TABLES, ShopWorkload
from airflow_provider_postgres_cdc.engine.lake_catalog import pyiceberg_properties
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.plugins.pipelines import VARIABLE
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.testing import AirflowServices, PostgresCluster
from tests.integration.airflow.browser import HeadlessChromium, find_chromium
from tests.integration.e2e.e2e_support import (
    lake_state,
    load_initial_snapshot,
    make_lake,
    pipeline_conf,
    pipeline_sandbox,
    session_lake,
)
from tests.pipeline_lake import create_owned_table

SLOT = "shop_report"
SECRET = "s3cret-lake-pw"
USERS = {"reader": ("op", "reader-pw"), "viewer": ("viewer", "viewer-pw")}
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


class UserServices(AirflowServices):
    """The test kit's services with real users instead of the all-admins mode."""

    passwords: Path

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=",".join(f"{u}:{r}" for u, (r, _) in USERS.items()),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.passwords),
        )
        return env


@dataclass
class Deployment:
    services: UserServices
    dsn: str
    lake: LakeConfig
    tmp: Path

    def token(self, user: str) -> str:
        body = json.dumps({"username": user, "password": USERS[user][1]}).encode()
        request = urllib.request.Request(f"{self.services.api_url}/auth/token", body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])

    def get(self, path: str, token: str | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"{self.services.api_url}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")


def _lake_with_empty_table(root: Path) -> str:
    """A second lake whose only pipeline table was created and never committed to."""
    lake, conn_json = make_lake(root)
    (root / "warehouse").mkdir(exist_ok=True)
    catalog = load_catalog(lake.catalog, **pyiceberg_properties(lake))
    catalog.create_namespace("public")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    create_owned_table(catalog, lake, SLOT, ("public", "fresh"), schema)
    return conn_json


@pytest.fixture(scope="module")
def pg_cluster(pg_default_cluster: PostgresCluster) -> PostgresCluster:
    """The session's default server, for this module's module-scoped pipeline (tests/conftest.py)."""
    return pg_default_cluster


@pytest.fixture(scope="module")
def deployment(
    pg_cluster: PostgresCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("report_view")
    pg_cluster.execute("CREATE DATABASE shop_report")
    dsn = pg_cluster.dsn("shop_report")
    shop = ShopWorkload(dsn, seed=25)
    shop.create_schema()
    shop.initial_load()
    lake = session_lake(spark, tmp / "lake", "lake_report")
    lake_conn = connection_json(lake)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    dead = LakeConfig("lake", {"type": "jdbc", "uri": f"jdbc:postgresql://127.0.0.1:{free}/iceberg",
                               "jdbc.user": "iceberg", "jdbc.password": SECRET})  # fmt: skip
    silent = socket.socket()  # a source that accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    pipelines = [
        {
            "postgres_conn_id": "shop",
            "slot_name": SLOT,
            "lake_conn_id": "lake",
            "publications": [PUBLICATION],
        },
        {"postgres_conn_id": "shop", "slot_name": "no_such_slot", "lake_conn_id": "lake"},
        {"postgres_conn_id": "shop", "slot_name": SLOT, "lake_conn_id": "dead_lake", "timeout": 5},
        {"postgres_conn_id": "slow_source", "slot_name": SLOT, "lake_conn_id": "fresh_lake", "timeout": 2},
    ]
    sandbox = pipeline_sandbox(
        tmp / "airflow",
        pg_cluster.uri("shop_report"),
        lake_conn,
        connections={
            "slow_source": f"postgresql://nobody@127.0.0.1:{silent.getsockname()[1]}/x",
            "dead_lake": connection_json(dead),
            "fresh_lake": _lake_with_empty_table(tmp / "fresh_lake"),
        },
        env={f"AIRFLOW_VAR_{VARIABLE.upper()}": json.dumps(pipelines)},
    )
    conf = pipeline_conf(SLOT, tmp / "staging")
    load_initial_snapshot(spark, lake, dsn, SLOT, conf["staging"])
    shop.step()
    sandbox.dags_test("postgres_cdc_microbatch", conf).check()
    services = UserServices(sandbox)
    services.passwords = tmp / "passwords.json"
    services.passwords.write_text(json.dumps({user: password for user, (_, password) in USERS.items()}))
    try:
        with services:
            yield Deployment(services, dsn, lake, tmp)
    finally:
        silent.close()
        pg_cluster.drop_database("shop_report")  # and its slot: later tests list every slot of the server


def _lag(dsn: str) -> int:
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s", (SLOT,))  # fmt: skip
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _count(dsn: str, qualified: str) -> int:
    schema, table = qualified.split(".", 1)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (make test installs it)")
def test_browser_shows_the_pipelines_real_numbers(deployment: Deployment) -> None:
    conn = connect(deployment.dsn)
    confirmed = str(describe_slot(conn, SLOT).confirmed_flush_lsn)
    conn.close()
    applied = {table: str(lake_state(deployment.lake, table).applied_end_lsn) for table in TABLES}
    counts = {table: _count(deployment.dsn, table) for table in TABLES}
    token = deployment.token("reader")
    url = f"{deployment.services.api_url}/postgres-cdc/"
    screenshot = deployment.tmp / "postgres-cdc-view.png"
    with HeadlessChromium() as browser:
        browser.set_cookie(deployment.services.api_url, "_token", token)
        lag_before = _lag(deployment.dsn)
        started = time.monotonic()
        browser.open(
            url, "document.readyState === 'complete' && document.querySelector('#p0-tables') !== null"
        )
        seconds = time.monotonic() - started
        lag_after = _lag(deployment.dsn)
        card = "(id) => document.getElementById(id).querySelector('b').innerText"
        assert browser.evaluate(f"({card})('p0-batch-count')") == "2"  # the snapshot and the batch
        assert browser.evaluate("document.querySelectorAll('#p0-batches tbody tr').length") == 2
        assert browser.evaluate(f"({card})('p0-confirmed')") == confirmed
        assert browser.evaluate(f"({card})('p0-cut')") == confirmed  # the last ack's batch is the cut
        shown_lag = int(browser.evaluate(f"({card})('p0-lag-bytes')"))
        assert lag_before <= shown_lag <= lag_after
        shown = browser.evaluate("document.getElementById('p0-tables').innerText")
        rows = {line.split("\t")[0]: line.split("\t") for line in shown.splitlines()[1:]}
        for table, lsn in applied.items():  # applied-end LSN and live row count, as the lake and source say
            assert (rows[table][1], int(rows[table][5])) == (lsn, counts[table]), (table, lsn, shown)
        for chart in ("lag", "changes", "apply", "latency"):  # uPlot drew them: the lake's and acks' numbers
            assert browser.evaluate(f"document.querySelectorAll('#p0-chart-{chart} canvas').length") >= 1
        text = browser.text()
        browser.screenshot(screenshot)
        print(f"\nscreenshot of the Postgres CDC view: {screenshot}")
    assert "replication slot 'no_such_slot' does not exist" in text
    assert "the lake cannot be reached" in text
    assert "the source did not answer within 2 s (timed out" in text
    assert "table public.fresh has no commits yet" in text
    assert SECRET not in text and "Traceback" not in text
    assert seconds < 60  # the silent source costs its timeout, not a hang


def test_refuses_the_anonymous_and_users_without_permission(deployment: Deployment) -> None:
    status, body = deployment.get("/postgres-cdc/")
    assert status == 401 and SLOT not in body
    status, body = deployment.get("/postgres-cdc/", deployment.token("viewer"))
    assert status == 403 and SLOT not in body
    status, body = deployment.get("/postgres-cdc/", deployment.token("reader"))
    assert status == 200 and SLOT in body and SECRET not in body
    status, body = deployment.get("/api/v2/plugins", deployment.token("reader"))
    views = [view for plugin in json.loads(body)["plugins"] for view in plugin["external_views"]]
    assert {"name": "Postgres CDC", "href": "/postgres-cdc/", "url_route": "postgres-cdc"}.items() <= views[
        0
    ].items()
