"""PostgresCdcHook built from a real Airflow connection (AIRFLOW_CONN_* variable, no metadata DB)."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.replication import TableSpec
from airflow_provider_postgres_cdc.replication.connection import SESSION_OPTIONS
from airflow_provider_postgres_cdc.testing import PostgresCluster


@pytest.fixture
def hook(pg_cluster: PostgresCluster, pg_dbname: str, monkeypatch: pytest.MonkeyPatch) -> PostgresCdcHook:
    # A standard postgres connection, with an extra of PostgresHook's own (ignored here) among libpq's.
    query = "application_name=pgl-test&connect_timeout=5&cursor=dictcursor"
    uri = f"postgresql://postgres:s3cret-pass@127.0.0.1:{pg_cluster.port}/{pg_dbname}?{query}"
    monkeypatch.setenv("AIRFLOW_CONN_PGL_TEST", uri)
    return PostgresCdcHook("pgl_test")


def test_connection_params_pass_extras_through(hook: PostgresCdcHook, pg_dbname: str) -> None:
    params = hook.connection_params()
    assert params["dbname"] == pg_dbname
    assert params["application_name"] == "pgl-test"
    assert "cursor" not in params
    with hook.connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('application_name'), current_setting('TimeZone')")
        assert cur.fetchone() == ("pgl-test", "UTC")
        # Keepalives are client-side socket options: libpq reports them among the DSN parameters.
        dsn = conn.get_dsn_parameters()
        assert (dsn["keepalives"], dsn["keepalives_idle"]) == ("1", "30")


def test_replication_connection_and_slot_lifecycle(hook: PostgresCdcHook) -> None:
    assert hook.check_prerequisites().wal_level == "logical"
    assert hook.test_connection()[0] is True
    with hook.connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    hook.create_publication("pub", [TableSpec("t")])
    assert [t.qualified for t in hook.published_tables(["pub"])] == ["public.t"]
    created, holder = hook.create_slot_with_snapshot("hook_slot")
    try:
        # The holder runs with idle_in_transaction_session_timeout off, so the snapshot survives
        # (our decoding settings come after it in options, and none of them touches it).
        options = holder.get_dsn_parameters()["options"].split(" -c ")
        assert "idle_in_transaction_session_timeout=0" in [o.removeprefix("-c ") for o in options]
        assert not any(o.startswith("idle_in_transaction") for o in SESSION_OPTIONS.split(" -c "))
        assert created.snapshot_name
    finally:
        holder.close()
    assert [s.slot_name for s in hook.list_slots()] == ["hook_slot"]
    slot = hook.describe_slot("hook_slot")
    assert hook.advance_slot("hook_slot", str(slot.confirmed_flush_lsn)) == slot.confirmed_flush_lsn
    assert hook.slot_lag_bytes("hook_slot") >= 0
    assert hook.drop_slot("hook_slot")


def test_password_never_logged(hook: PostgresCdcHook, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with hook.connection():
        pass
    hook.check_prerequisites()
    assert "s3cret-pass" not in caplog.text
